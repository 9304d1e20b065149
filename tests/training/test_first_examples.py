"""The first DataLoader examples a newcomer pastes, run as written against a demo daemon
(`dlfs-server --demo`, as `./dev demo` starts it): README.md's "Training with DLFS"
blocks and the first two of docs/training.md (those marked
`<!-- runs: tests/training/test_first_examples.py -->`).

The only change made to a block: the daemon's address (127.0.0.1:7010 is the demo's;
here a fresh daemon on port 0).  What each leaves behind is checked.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers.doc_blocks import DEMO_ADDRESS, marked_blocks  # noqa: E402

TEST = "tests/training/test_first_examples.py"
# The demo's train/ samples: 3 classes, .npy files of 3,200 bytes.
DEMO_TRAIN_SAMPLES = 300


def run(doc: str, number: int, address: str, namespace: dict) -> dict:
    code = marked_blocks(doc, TEST)[number]
    assert DEMO_ADDRESS in code, code
    exec(compile(code.replace(DEMO_ADDRESS, address), f"{doc} block {number}", "exec"),
         namespace)
    return namespace


def test_the_blocks_are_the_ones_this_test_knows():
    assert len(marked_blocks("README.md", TEST)) == 2
    assert len(marked_blocks("docs/training.md", TEST)) == 2


@pytest.mark.parametrize("doc", ["README.md", "docs/training.md"])
def test_the_dataloader_example_runs_as_written(demo, doc):
    ns = run(doc, 0, demo, {"__name__": "first_example"})
    images, labels = ns["images"], ns["labels"]  # the last batch of the second epoch
    assert ns["epoch"] == 1 and len(ns["ds"]) == DEMO_TRAIN_SAMPLES
    assert images.shape[1:] == (3200,) and images.shape[0] == labels.shape[0] <= 64
    assert set(labels.tolist()) <= set(range(len(ns["ds"].classes)))


def test_the_readme_first_example_reads_ahead_from_the_extents(demo):
    ns = run("README.md", 0, demo, {"__name__": "first_example"})
    assert ns["ds"].reads == "extents" and ns["batches"].ring is None  # closed


def test_the_readme_transform_example_runs_after_the_first_as_written(demo):
    ns = run("README.md", 0, demo, {"__name__": "first_example"})
    ns = run("README.md", 1, demo, ns)
    assert tuple(ns["images"].shape[1:]) == (32, 32, 3)


def test_the_training_doc_read_ahead_example_runs_as_written(demo):
    ns = run("docs/training.md", 1, demo, {"__name__": "first_example"})
    assert ns["epoch"] == 1 and ns["samples"].shape[1:] == (3200,)
