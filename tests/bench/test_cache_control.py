"""bench.measure.CacheControl.make_cold against real files and a real mapping: pages a
mapping holds leave once it is gone, and the wait for that starts after the release
hooks, however long they took."""

from __future__ import annotations

import mmap
import os

import pytest

from bench import measure


class Clock:
    """A clock the test moves (make_cold's waits are bounded by it)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def mapped(tmp_path):
    """(path, the mapping): a 1 MiB file, every page cached and mapped here."""
    path = tmp_path / "data"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())  # clean pages: DONTNEED drops them at once
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    assert sum(mapping[k] for k in range(0, len(mapping), 4096)) >= 0  # every page touched
    yield str(path), mapping
    if not mapping.closed:
        mapping.close()


def evicting(control: measure.CacheControl, on_evict) -> None:
    """Per-file eviction (DONTNEED: never the whole machine's cache, even as root),
    calling `on_evict(count)` before each."""
    control.root = False
    count = [0]
    evict = control._evict

    def counted(files):
        count[0] += 1
        on_evict(count[0])
        evict(files)

    control._evict = counted


def test_a_mapping_let_go_after_a_slow_release_hook_still_leaves_the_file_cold(mapped):
    """A remount that takes longer than the whole wait (seconds on a loaded machine),
    and the mapping gone only at the eviction after it: the file ends up cold.  With
    the wait counted from before the hook, this failed "1 files stayed in the page
    cache after eviction ... mapped by no process"."""
    path, mapping = mapped
    clock = Clock()
    control = measure.CacheControl(clock=clock)
    hooked = []

    def slow_remount(files):
        hooked.append(files)
        clock.now += 10 * measure._UNMAPPED_WITHIN_S

    control.release_hooks.append(slow_remount)
    evicting(control, lambda count: count == 3 and mapping.close())
    control.make_cold([path])
    assert hooked == [[path]]
    assert not measure._still_cached(path)


def test_pages_mapped_for_good_fail_the_cold_run_naming_the_mapper(mapped):
    path, _mapping = mapped
    clock = Clock()
    control = measure.CacheControl(clock=clock)
    evicting(control, lambda count: setattr(clock, "now", clock.now + 1.0))
    with pytest.raises(RuntimeError, match=r"1 files stayed in the page cache after eviction "
                                           rf"\(first: {path}, mapped by {os.getpid()} "):
        control.make_cold([path])
