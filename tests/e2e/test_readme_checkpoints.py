"""README.md's checkpoint example runs as written against a daemon (the block marked
`<!-- runs: tests/e2e/test_readme_checkpoints.py -->`); only the address changes."""

from __future__ import annotations

import pytest

from helpers.doc_blocks import DEMO_ADDRESS, marked_blocks

torch = pytest.importorskip("torch")

DOC = "README.md"
TEST = "tests/e2e/test_readme_checkpoints.py"


def test_the_checkpoint_example_runs_and_loads_what_it_saved(daemon):
    (block,) = marked_blocks(DOC, TEST)
    namespace: dict = {}
    exec(compile(block.replace(DEMO_ADDRESS, daemon.address), DOC, "exec"), namespace)
    assert torch.equal(namespace["state"]["weights"], torch.ones(1000))
    info = namespace["space"].info()
    assert (info.kind, info.samples) == ("space", 1)
