"""Listing one open directory page by page, at the offsets the kernel asks for.

The kernel lists a directory in many readdir calls, each filling a small
buffer (a few KiB: tens of entries) and resuming at an offset the file system
handed out.  Here the offset of an entry is its index in name order plus one,
and entries come from the daemon in pages of `page_entries` (ListDir with a
`start_after` name).  A `DirStream` keeps the current page, so one RPC serves
many readdir calls, and the first name of every page it has seen, so an offset
from earlier (rewinddir, seekdir, a restarted listing) costs at most one RPC
instead of re-reading the directory from the start.  A 100,000-entry
directory costs 100,000 / `page_entries` RPCs and holds one page at a time.

Runs on the trio loop; `fetch_page` does the blocking work in a thread.
"""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator, Awaitable, Callable

from dlfs import errors
from dlfs.fuse.inodes import Attrs, Key


@dataclasses.dataclass(frozen=True, slots=True)
class Child:
    """One directory entry: its name, the key of its node and its attributes."""

    name: str
    key: Key
    attrs: Attrs


# fetch_page(start_after, page_entries) -> (children in name order, more follow)
FetchPage = Callable[[str, int], Awaitable[tuple[list[Child], bool]]]


class DirStream:
    """The entries of one open directory, by offset.

    Memory: one page plus one name per page seen.  Cost of `entries_from`:
    O(page) when `offset` is in the current page, one `fetch_page` when it
    starts the next or a known page, and one per page between the last
    known page and `offset` otherwise (only for offsets this stream never
    handed out).
    """

    def __init__(self, fetch_page: FetchPage, page_entries: int):
        assert page_entries >= 1
        self._fetch_page = fetch_page
        self.page_entries = page_entries
        # _page_starts[p] is the start_after name that fetches page p.
        self._page_starts: list[str] = [""]
        self._page_number = -1
        self._page: list[Child] = []
        self._more = True
        self.pages_fetched = 0  # RPCs issued, for tests

    async def entries_from(self, offset: int) -> AsyncIterator[tuple[int, Child]]:
        """Yield (offset of the entry after it, child) from entry number `offset` on.

        Stops at the end of the directory; the caller stops earlier when the
        kernel's buffer is full.  Raises what `fetch_page` raises.
        """
        assert offset >= 0
        page_number, skip = divmod(offset, self.page_entries)
        while True:
            if not await self._load(page_number):
                return
            for position in range(skip, len(self._page)):
                index = page_number * self.page_entries + position
                yield index + 1, self._page[position]
            if not self._more:
                return
            page_number, skip = page_number + 1, 0

    async def _load(self, page_number: int) -> bool:
        """Make page `page_number` current; False if the directory ends before it."""
        if page_number == self._page_number:
            return True
        while len(self._page_starts) <= page_number:  # walk to the first unknown page
            known = len(self._page_starts) - 1
            if not await self._load(known) or not self._more:
                return False
        children, more = await self._fetch_page(self._page_starts[page_number],
                                                self.page_entries)
        self.pages_fetched += 1
        if more and len(children) != self.page_entries:
            # Pages must be full for offsets to map to pages; the daemon's
            # ListDir returns exactly page_size entries whenever more follow.
            raise errors.Internal(
                f"ListDir returned {len(children)} entries with more to come; "
                f"expected {self.page_entries}")
        self._page_number, self._page, self._more = page_number, children, more
        if more and len(self._page_starts) == page_number + 1:
            self._page_starts.append(children[-1].name)
        return True
