"""A directory's names learned at its first lookup, so its other lookups need no RPC.

A reader that opens paths it already knows (a file list, a DLIO index)
without listing their directory makes the kernel look up every name once.
One Stat RPC per name would cost a daemon round trip per file of a first
epoch.  Instead, the first lookup that misses the inode table in a
directory fetches the directory's first listing page (one ListDir of up to
`page_entries` entries, as a listing would); if that is the whole
directory, every entry goes into the inode table as an idle node, and the
lookups of its siblings are answered from memory.  Larger directories are
not listed this way (their later lookups each cost a Stat).  Each directory
is tried once while it is among the last `dirs_max` tried.

Runs on the trio loop; `fetch_page` does its blocking work in a thread.
"""

from __future__ import annotations

import collections
from typing import Awaitable, Callable

import trio

from dlfs import errors
from dlfs.fuse.dirlist import Child
from dlfs.fuse.errno_map import DAEMON_DOWN
from dlfs.fuse.inodes import InodeTable, Key, Node

# fetch_page(directory, start_after, count) -> (children in name order, more follow)
FetchPage = Callable[[Node, str, int], Awaitable[tuple[list[Child], bool]]]


class SiblingNames:
    """Lists small directories into the inode table, once each.

    Memory: one key per directory tried (at most `dirs_max`).  Cost: one
    `fetch_page` per directory tried, shared by concurrent lookups in it.
    """

    def __init__(self, table: InodeTable, fetch_page: FetchPage, *, page_entries: int,
                 dirs_max: int):
        assert page_entries >= 1 and dirs_max >= 1
        self._table = table
        self._fetch_page = fetch_page
        self.page_entries = page_entries
        self.dirs_max = dirs_max
        self._tried: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self._in_flight: dict[Key, trio.Event] = {}
        self.listings = 0  # fetch_page calls, for tests

    async def learn(self, directory: Node) -> None:
        """Make sure `directory` was tried: its entries are in the table if it
        fits one page.  Raises the daemon-down errors of `fetch_page` (a Stat
        would fail the same way); other errors are left to the caller's Stat."""
        key = directory.key
        if key in self._tried:
            self._tried.move_to_end(key)
            return
        waiting = self._in_flight.get(key)
        if waiting is not None:  # another lookup in this directory is listing it
            await waiting.wait()
            return
        done = self._in_flight[key] = trio.Event()
        try:
            self.listings += 1
            children, more = await self._fetch_page(directory, "", self.page_entries)
            if not more:
                for child in children:
                    self._table.node_for(child.key, lambda child=child: child.attrs)
        except DAEMON_DOWN:
            raise
        except errors.DlfsError:
            pass  # the caller's Stat reports what is wrong
        else:
            self._tried[key] = None
            if len(self._tried) > self.dirs_max:
                self._tried.popitem(last=False)
        finally:
            del self._in_flight[key]
            done.set()
