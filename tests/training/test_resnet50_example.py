"""examples/train_resnet50.py runs, checkpoints mid-epoch and resumes there (CPU form, tiny model).

The example's data path is the one it shows for a GPU (ReadAhead of encoded
JPEGs, StatefulDataLoader, DecodedBatches) on a CPU device; resnet50 needs
torchvision, which does not import beside the CPU torch build, so the test
trains the example's small CNN.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")
from PIL import Image  # noqa: E402

from dlfs import Client  # noqa: E402
from helpers.trees import unique_name, write_tree  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_resnet50.py")


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (30 + seed % 5, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def run(address, name, checkpoint, *extra) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, EXAMPLE, "--server", address, "--dataset", name, "--root", "train",
         "--model", "tiny", "--device", "cpu", "--size", "16", "--batch-size", "4",
         "--epochs", "2", "--read-ahead", "2", "--checkpoint", checkpoint, *extra],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")], lines


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_example_trains_stops_mid_epoch_and_resumes_there(shared_daemon, tmp_path):
    files = {f"train/{c}/{i:02d}.jpg": jpeg(10 * k + i)
             for k, c in enumerate(("cat", "dog", "owl")) for i in range(8)}  # 24: 6 batches
    write_tree(tmp_path / "tree", files)
    name = unique_name("example")
    with Client(shared_daemon.address) as client:
        client.ingest(str(tmp_path / "tree"), name, progress=False)
    checkpoint = str(tmp_path / "ckpt.pt")
    epochs, _ = run(shared_daemon.address, name, checkpoint, "--max-steps", "4")
    assert [(e["epoch"], e["images"]) for e in epochs] == [(0, 16)]
    epochs, lines = run(shared_daemon.address, name, checkpoint)
    assert f"resumed from {checkpoint} in epoch 0" in lines
    # The rest of epoch 0 (2 batches of 4), then a whole epoch 1.
    assert [(e["epoch"], e["images"]) for e in epochs] == [(0, 8), (1, 24)]
    assert all(np.isfinite(e["loss"]) for e in epochs)
