"""The fenced code blocks of README.md and docs/*.md, and the marks that say what each is.

Every block is preceded by one of:

    <!-- runs: tests/PATH.py -->   the test at PATH runs it as written (`marked_blocks`)
    <!-- sketch -->                 an outline to adapt (placeholders, paths of a real cluster)

`tests/test_doc_blocks.py` holds every block to that.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKETCH = "<!-- sketch -->"
_RUNS = re.compile(r"<!-- runs: (\S+) -->")


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    mark: str  # the line before the fence
    code: str

    @property
    def runs_in(self) -> str | None:
        """The test that runs it, by its `<!-- runs: PATH -->` mark; None otherwise."""
        found = _RUNS.fullmatch(self.mark)
        return found.group(1) if found else None


def documents() -> list[str]:
    """README.md and docs/*.md, relative to the repository."""
    return ["README.md"] + sorted(os.path.relpath(p, REPO)
                                  for p in glob.glob(os.path.join(REPO, "docs", "*.md")))


def blocks(doc: str) -> list[Block]:
    """The fenced blocks of `doc`, in order."""
    with open(os.path.join(REPO, doc)) as f:
        lines = f.read().split("\n")
    found, start = [], None
    for number, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = number
            continue
        mark = lines[start - 1].strip() if start else ""
        found.append(Block(doc, start + 1, lines[start][3:].strip(), mark,
                           "\n".join(lines[start + 1:number]) + "\n"))
        start = None
    assert start is None, f"{doc}: a fence opened at line {start + 1} is never closed"
    return found


# The address the documents' examples name: ./dev demo's daemon.
DEMO_ADDRESS = "127.0.0.1:7010"


def marked_blocks(doc: str, test: str) -> list[str]:
    """The code of the blocks of `doc` marked as run by `test` (its path), in order."""
    return [b.code for b in blocks(doc) if b.runs_in == test]
