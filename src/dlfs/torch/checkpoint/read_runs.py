"""Which ranges a restore reads: a load plan's items as few, large, sorted reads.

`plan_runs` sorts the (file, offset, length) spans of a load plan's items
by file and offset and joins neighbours into runs: one read each, of at
most `run_bytes_max` (a single larger item is a run of its own, and an
item inside a run joins it), across gaps of at most `gap_bytes_max`
(bytes read and dropped, cheaper than a round trip).  `pieces` cuts a run
into the requests that go out, each of at most `piece_bytes`;
`PiecesReader` reads an item's bytes back from the pieces they arrived in,
without joining them.  Cost: O(n log n) for n items.
"""

from __future__ import annotations

import bisect
import io
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class ReadRun:
    """Bytes [offset, offset + length) of `file`, read at once; `items` are
    (index of the span, its offset inside the run, its length), in offset order."""

    file: str
    offset: int
    length: int
    items: list[tuple[int, int, int]] = field(default_factory=list)


def plan_runs(spans: Sequence[tuple[str, int, int]], *, gap_bytes_max: int,
              run_bytes_max: int) -> list[ReadRun]:
    """The runs that read every span (see the module), sorted by file and offset."""
    runs: list[ReadRun] = []
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1])):
        file, offset, length = spans[i]
        run = runs[-1] if runs else None
        if run is not None and run.file == file:
            end = run.offset + run.length
            grown = max(end, offset + length) - run.offset
            if offset - end <= gap_bytes_max and grown <= max(run_bytes_max, run.length):
                run.length = grown
                run.items.append((i, offset - run.offset, length))
                continue
        runs.append(ReadRun(file, offset, length, [(i, 0, length)]))
    return runs


def pieces(run: ReadRun, piece_bytes: int) -> list[tuple[int, int]]:
    """(offset in the file, length) of the requests that read `run`, in order."""
    return [(run.offset + at, min(piece_bytes, run.length - at))
            for at in range(0, run.length, piece_bytes)] or [(run.offset, 0)]


class PiecesReader(io.RawIOBase):
    """Bytes [start, start + length) of a run that arrived as consecutive `views`
    (buffers), as a seekable binary file; reads copy straight out of them."""

    def __init__(self, views: Sequence[memoryview], start: int, length: int):
        super().__init__()
        self._views = [memoryview(v).cast("B") for v in views]
        self._starts = []
        at = 0
        for view in self._views:
            self._starts.append(at)
            at += len(view)
        if start + length > at:
            raise ValueError(f"bytes {start}..{start + length} are past the run's {at}")
        self._start, self._length, self._pos = start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        out = memoryview(buffer).cast("B")
        want = min(len(out), self._length - self._pos)
        done = 0
        while done < want:
            at = self._start + self._pos + done
            n = bisect.bisect_right(self._starts, at) - 1
            view, inside = self._views[n], at - self._starts[n]
            take = min(want - done, len(view) - inside)
            out[done:done + take] = view[inside:inside + take]
            done += take
        self._pos += done
        return done

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(0, base + offset), self._length)
        return self._pos

    def tell(self) -> int:
        return self._pos
