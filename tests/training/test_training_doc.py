"""The code of docs/training.md marked ``<!-- runs: ... -->`` runs as written, against a daemon.

The only changes made to each snippet: the daemon's address and the
dataset's name (a fresh daemon and a unique name), and the checkpoint file
put in the test's directory.  The snippets run one after another in one
namespace, as a reader pasting them into one session would (later ones use
the first one's ``decode``); what each leaves there is checked.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")
from PIL import Image  # noqa: E402

from dlfs import Client  # noqa: E402
from helpers.trees import unique_name, write_tree  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "training.md")
MARK = "<!-- runs: tests/training/test_training_doc.py -->"


def snippets() -> list[str]:
    text = open(DOC).read()
    found = re.findall(re.escape(MARK) + r"\n```python\n(.*?)```", text, flags=re.S)
    assert len(found) == text.count(MARK)
    return found


@pytest.fixture(scope="module")
def photos(shared_daemon, tmp_path_factory):
    """24 JPEGs (and one PNG) in three class folders below train/."""
    files = {}
    for i in range(24):
        pixels = np.random.default_rng(i).integers(0, 255, (30, 40, 3), dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "PNG" if i == 5 else "JPEG")
        files[f"train/{('cat', 'dog', 'owl')[i % 3]}/{i:02d}.{'png' if i == 5 else 'jpg'}"] = \
            out.getvalue()
    root = tmp_path_factory.mktemp("photos")
    write_tree(root, files)
    name = unique_name("photos")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
    return shared_daemon.address, name


def run_snippet(number: int, photos, tmp_path, namespace: dict) -> dict:
    address, name = photos
    code = snippets()[number]
    assert '"127.0.0.1:7010"' in code and '"photos"' in code
    code = code.replace('"127.0.0.1:7010"', repr(address)).replace('"photos"', repr(name))
    code = code.replace("/tmp/dlfs-ckpt.pt", str(tmp_path / "ckpt.pt"))
    exec(compile(code, f"docs/training.md snippet {number}", "exec"), namespace)
    return namespace


def test_the_snippets_run_as_written(photos, tmp_path):
    assert len(snippets()) == 4  # resume (StatefulDataLoader, plain), elastic, GPU decode
    ns: dict = {"__name__": "doc_snippets"}

    run_snippet(0, photos, tmp_path, ns)  # resume with a StatefulDataLoader
    assert ns["epoch"] == 1 and ns["saved"]["epoch"] == 0

    run_snippet(1, photos, tmp_path, ns)  # resume with a plain DataLoader
    assert sum(len(labels) for labels in ns["rest"]) == 24 - 12

    run_snippet(2, photos, tmp_path, ns)  # elastic: two ranks, then three
    # 24 samples, 2 ranks x 2 steps x 2 done; 16 left over 3 ranks: 6 each with padding.
    assert ns["states"][0] == ns["states"][1]
    assert sum(len(labels) for _samples, labels in ns["batches"]) == 6

    run_snippet(3, photos, tmp_path, ns)  # GPU decode, in its CPU form here
    assert ns["batches"].stats.images == 24 and ns["images"].shape[1:] == (3, 32, 32)
