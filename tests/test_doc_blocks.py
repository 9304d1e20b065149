"""Every code block of README.md and docs/*.md is run by a test or marked as a sketch
(tests/helpers/doc_blocks.py): a newcomer can tell which examples work as written."""

from __future__ import annotations

import os

from helpers.doc_blocks import REPO, SKETCH, blocks, documents


def test_every_block_is_run_by_a_test_or_marked_a_sketch():
    unmarked, missing = [], []
    for doc in documents():
        for block in blocks(doc):
            where = f"{block.doc}:{block.line}"
            if block.runs_in is None and block.mark != SKETCH:
                unmarked.append(where)
            elif block.runs_in is not None:
                if not _runs(block.runs_in, block.doc):
                    missing.append(f"{where} -> {block.runs_in}")
    assert not unmarked, f"blocks neither run nor marked '{SKETCH}': {unmarked}"
    assert not missing, f"blocks marked as run by a test that does not run them: {missing}"


def _runs(test: str, doc: str) -> bool:
    """Whether the test file `test` exists, names `doc` and takes its marked blocks (with
    `doc_blocks.marked_blocks`, or by the mark itself)."""
    path = os.path.join(REPO, test)
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        text = f.read()
    takes = "marked_blocks" in text or f"<!-- runs: {test} -->" in text
    return os.path.basename(doc) in text and takes


def test_the_first_examples_run():
    """The README's examples before its deployment sections, and the first examples of
    docs/training.md, are the ones a newcomer pastes: they run."""
    first = [b for b in blocks("README.md") if b.language == "python"]
    first += [b for b in blocks("docs/training.md") if b.language == "python"][:2]
    assert all(b.runs_in for b in first), [f"{b.doc}:{b.line}" for b in first if not b.runs_in]
