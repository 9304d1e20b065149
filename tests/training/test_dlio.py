"""The DLIO benchmark reads a workload from DLFS through dlfs.dlio's loader and reader.

DLIO (dlio_benchmark 2.0.0) cannot live in the project's environment (it
imports tensorflow and needs an MPI library; see docs/training.md), so this
runs only when DLFS_TEST_DLIO_PYTHON names a Python that has it and dlfs
installed, e.g. ``DLFS_TEST_DLIO_PYTHON=/tmp/venv-dlio/bin/python``.

To prove the samples come from DLFS, the local files DLIO lists are
overwritten with garbage after the ingest: DLIO's own JPEG reader then
fails on them (checked), while the DLFS loader and reader decode the real
images from the daemon.
"""

from __future__ import annotations

import io
import os
import re
import subprocess

import pytest

from dlfs import Client
from helpers.trees import unique_name

DLIO_PYTHON = os.environ.get("DLFS_TEST_DLIO_PYTHON", "")
CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "dlio")
FILES = 24
DLIO_TIMEOUT_S = 240

pytestmark = [pytest.mark.dlio,
              pytest.mark.skipif(not DLIO_PYTHON, reason="set DLFS_TEST_DLIO_PYTHON to a Python "
                                 "with dlio_benchmark installed (docs/training.md)")]


@pytest.fixture(scope="module")
def workload(shared_daemon, tmp_path_factory):
    Image = pytest.importorskip("PIL.Image")
    import numpy as np

    data = tmp_path_factory.mktemp("dlio") / "data"
    rng = np.random.default_rng(0)
    for split, count in (("train", FILES), ("valid", 0)):
        os.makedirs(data / split)
        for i in range(count):
            buffer = io.BytesIO()
            pixels = rng.integers(0, 256, size=(48, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(buffer, format="JPEG")
            (data / split / f"img_{i:02d}_of_{count}.jpeg").write_bytes(buffer.getvalue())
    name = unique_name("dlio")
    with Client(shared_daemon.address) as client:
        client.ingest(str(data), name, progress=False)
    for path in (data / "train").iterdir():  # DLIO still lists these; only DLFS has the images
        path.write_bytes(b"not a jpeg")
    return shared_daemon.address, name, str(data)


def run_dlio(workload, tmp_path, *overrides) -> subprocess.CompletedProcess:
    address, name, data = workload
    env = dict(os.environ, DLFS_SERVER=address, DLFS_DATASET=name,
               TF_CPP_MIN_LOG_LEVEL="3")
    command = [DLIO_PYTHON, "-m", "dlio_benchmark.main", "--config-dir", CONFIG,
               "workload=dlfs_jpeg", f"++workload.dataset.data_folder={data}",
               f"++workload.dataset.num_files_train={FILES}", "++workload.reader.batch_size=4",
               "++workload.reader.read_threads=2", "++workload.train.computation_time=0.005",
               f"++hydra.run.dir={tmp_path}/out", *overrides]
    return subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=DLIO_TIMEOUT_S, cwd=tmp_path)


def metrics(result: subprocess.CompletedProcess) -> dict[str, float]:
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    found = dict(re.findall(r"\[METRIC\] Training (Accelerator Utilization|Throughput) "
                            r"[^:]*: ([0-9.]+)", out))
    assert set(found) == {"Accelerator Utilization", "Throughput"}, out[-4000:]
    return {k: float(v) for k, v in found.items()}


def test_dlfs_data_loader_fetches_batches_from_dlfs(workload, tmp_path):
    result = run_dlio(workload, tmp_path)  # the example config names DLFSDataLoader
    assert "Discovered custom data loader DLFSDataLoader" in result.stdout + result.stderr
    assert metrics(result)["Throughput"] > 0


def test_dlfs_reader_under_dlios_own_loader(workload, tmp_path):
    result = run_dlio(workload, tmp_path, "~workload.reader.data_loader_classname",
                      "~workload.reader.data_loader_sampler",
                      "++workload.reader.reader_classname=dlfs.dlio.reader.DLFSFormatReader")
    assert "Discovered custom data reader DLFSFormatReader" in result.stdout + result.stderr
    assert metrics(result)["Throughput"] > 0


def test_control_dlios_own_reader_fails_on_the_garbage_files(workload, tmp_path):
    result = run_dlio(workload, tmp_path, "~workload.reader.data_loader_classname",
                      "~workload.reader.data_loader_sampler")
    assert result.returncode != 0
    assert "UnidentifiedImageError" in result.stdout + result.stderr


def test_missing_dataset_setting_is_a_clear_error(workload, tmp_path):
    address, _name, data = workload
    result = run_dlio((address, "", data), tmp_path)
    assert result.returncode != 0
    assert "set DLFS_DATASET" in result.stdout + result.stderr
