"""Page cache residency asked without reading (server/read/residency.py), both ways:
cachestat(2) where the kernel has it, and the mincore(2) fallback older kernels get.
Against a real file whose pages are evicted and read back; the two ways must agree."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dlfs.server.read import residency

PAGE = residency.PAGE_BYTES
PAGES = 64


@pytest.fixture(params=["cachestat", "mincore"])
def way(request, monkeypatch) -> str:
    if request.param == "cachestat":
        if not residency.supported():
            pytest.skip("this kernel has no cachestat(2) (Linux 6.5+)")
    else:
        monkeypatch.setattr(residency, "_available", False)  # as on a kernel without it
    assert residency.method() == request.param
    return request.param


@pytest.fixture
def fd(tmp_path):
    """A 64-page file on disk, none of it in the page cache, read-ahead off."""
    path = tmp_path / "extent"
    path.write_bytes(np.random.default_rng(3).bytes(PAGES * PAGE))
    descriptor = os.open(path, os.O_RDONLY)
    os.fsync(descriptor)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)  # a read fills its own pages
    yield descriptor
    os.close(descriptor)


def _all(fd: int, ranges: list[tuple[int, int]]) -> bool:
    offsets, sizes = zip(*ranges)
    return residency.all_cached(np.full(len(ranges), fd), np.array(offsets), np.array(sizes))


def test_an_evicted_file_is_not_cached_and_a_read_one_is(way, fd):
    assert residency.cached_pages(fd, 0, PAGES * PAGE) == 0
    assert not _all(fd, [(0, PAGE)])
    os.pread(fd, PAGES * PAGE, 0)
    assert residency.cached_pages(fd, 0, PAGES * PAGE) == PAGES
    assert _all(fd, [(0, PAGE), (5 * PAGE + 7, 3 * PAGE), (PAGES * PAGE - 1, 1)])


def test_ranges_are_cached_only_where_every_page_they_touch_is(way, fd):
    os.pread(fd, 16 * PAGE, 0)  # pages 0-15 only
    assert residency.cached_pages(fd, 0, PAGES * PAGE) == 16
    assert residency.cached_pages(fd, 10 * PAGE + 100, 10 * PAGE) == 6  # pages 10-20
    assert _all(fd, [(0, 16 * PAGE), (15 * PAGE, PAGE), (3 * PAGE + 5, 100)])
    assert not _all(fd, [(0, PAGE), (15 * PAGE + 1, PAGE)])  # the second ends in page 16
    assert not _all(fd, [(40 * PAGE, 10)])
    assert _all(fd, [(40 * PAGE, 0)])  # an empty range needs no page


def test_ranges_of_several_files_at_once(way, fd, tmp_path):
    other_path = tmp_path / "other"
    other_path.write_bytes(bytes(8 * PAGE))
    other = os.open(other_path, os.O_RDONLY)
    try:
        os.pread(other, 8 * PAGE, 0)
        os.pread(fd, PAGE, 0)
        fds = np.array([fd, other, other])
        assert residency.all_cached(fds, np.array([0, 0, 7 * PAGE]), np.array([PAGE, 10, PAGE]))
        assert not residency.all_cached(fds, np.array([PAGE, 0, 0]), np.array([PAGE, 1, 1]))
    finally:
        os.close(other)


def test_past_the_end_of_the_file_is_never_cached(way, fd):
    """A truncated extent: its pieces take the read path, which reports it."""
    os.pread(fd, PAGES * PAGE, 0)
    assert not _all(fd, [(PAGES * PAGE, PAGE)])
    assert not _all(fd, [(PAGES * PAGE - 10, 20)])


def test_the_two_ways_agree(fd, monkeypatch):
    if not residency.supported():
        pytest.skip("this kernel has no cachestat(2) (Linux 6.5+)")
    rng = np.random.default_rng(8)
    for page in rng.choice(PAGES, 20, replace=False).tolist():
        os.pread(fd, PAGE, page * PAGE)
    offsets = rng.integers(0, PAGES * PAGE - 3 * PAGE, 200)
    sizes = rng.integers(0, 3 * PAGE, 200)
    answers = {}
    for available in (True, False):
        monkeypatch.setattr(residency, "_available", available)
        answers[available] = (
            [residency.cached_pages(fd, int(o), int(s)) for o, s in zip(offsets, sizes)],
            [_all(fd, [(int(o), int(s))]) for o, s in zip(offsets, sizes)])
    assert answers[True] == answers[False]
    assert any(answers[True][1]) and not all(answers[True][1])  # both answers occur
