"""Dataset warm-up on a real daemon: `dlfs warm`, the first read, the memory budget.

Residency is asked of the kernel with cachestat(2), which reads nothing
(tests/helpers/page_cache.py says why a RWF_NOWAIT probe would not do).  Each test
first drops its own extent files' pages (POSIX_FADV_DONTNEED), nobody else's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from dlfs import Client
from dlfs.server.read.warmup import memory_bytes
from helpers.daemons import metric_samples
from helpers.trees import write_tree
from helpers.page_cache import cached

MiB = 1024 * 1024
PAGE = 4096


def extent_files(daemon) -> list[str]:
    root = os.path.join(daemon.data_dir, "extents")
    return sorted(os.path.join(root, d, f) for d in os.listdir(root)
                  for f in os.listdir(os.path.join(root, d)))


def drop_cache(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: str, offset: int) -> bool:
    """Whether the page at `offset` of `path` is in the page cache (no I/O to find out)."""
    return cached(path, offset)


def resident_pages(path: str, start: int, stop: int, step: int = 256 * 1024) -> list[bool]:
    return [resident(path, offset) for offset in range(start, stop, step)]


def cache_drops() -> int:
    """How often anyone on this machine dropped the whole page cache (drop_caches)."""
    with open("/proc/vmstat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("drop_pagecache "))


# Share of probed pages that must still be cached after a warm-up.  Not all
# of them: the kernel may reclaim a few idle pages before the test probes
# (proactive reclaim runs on the shared CI machines), while a warm-up that did
# not read the range leaves none of it cached after `drop_cache`.
RESIDENT_SHARE_MIN = 0.75


def assert_resident(path: str, start: int, stop: int, drops_before: int) -> None:
    """Nearly every page of [start, stop) of `path` is cached, unless some other
    process on this shared machine dropped the whole page cache meanwhile (then
    it says nothing)."""
    pages = resident_pages(path, start, stop)
    if cache_drops() == drops_before:
        assert sum(pages) >= RESIDENT_SHARE_MIN * len(pages), \
            f"{sum(pages)} of {len(pages)} probed pages cached"


def make_dataset(daemon, tmp_path, total_mib: int) -> None:
    rng = np.random.default_rng(1)
    write_tree(tmp_path / "src", {f"s/{i:03d}.bin": rng.bytes(256 * 1024)
                                  for i in range(total_mib * 4)})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")


def wait_done(client: Client) -> list:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        infos = client.warm_status("ds")
        if all(i.done for i in infos):
            return infos
        time.sleep(0.05)
    raise AssertionError(f"the warm-up did not finish: {infos}")


def test_dlfs_warm_reads_the_whole_dataset_into_the_page_cache(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=["--warm-on-first-read", "off",
                                        "--metrics-listen", "127.0.0.1:0"])
    make_dataset(daemon, tmp_path, 8)
    [extent] = extent_files(daemon)
    size = os.path.getsize(extent)
    drop_cache([extent])
    assert not any(resident_pages(extent, 4096, size))
    drops = cache_drops()
    result = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                             "warm", "ds"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ds: warm," in result.stdout
    with Client(daemon.address) as client:
        [info] = client.warm_status("ds")
    assert (info.state, info.fits, info.bytes_warmed, info.bytes_total) == \
        ("warm", True, size, size)
    assert info.budget_bytes == int(0.5 * memory_bytes())
    assert_resident(extent, 0, size, drops)
    with Client(daemon.address) as client:
        values = metric_samples(client)
    assert values[("dlfs_warm_bytes_total", ())] == size
    assert values[("dlfs_warmups_total", (("state", "warm"),))] == 1
    assert values[("dlfs_warmups_active", ())] == 0
    assert values[("dlfs_warm_budget_bytes", ())] == info.budget_bytes
    assert "dataset 'ds' is warm" in daemon.log()
    listing = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                              "datasets"], capture_output=True, text=True, timeout=60)
    assert re.search(r"\(warm, \d+% cached now\)$", listing.stdout.rstrip()), listing.stdout


def test_after_an_eviction_the_warm_state_says_nothing_is_cached_now(daemon_factory, tmp_path):
    """`dlfs datasets` and `dlfs warm --status` after drop_caches (DONTNEED here): the
    warm-up is done, and nothing of it is in the page cache any more; they say both."""
    daemon = daemon_factory()
    make_dataset(daemon, tmp_path, 4)
    [extent] = extent_files(daemon)
    cli = [sys.executable, "-m", "dlfs.cli", "--server", daemon.address]
    assert subprocess.run([*cli, "warm", "ds"], capture_output=True, timeout=120).returncode == 0
    drop_cache([extent])
    assert not any(resident_pages(extent, 0, os.path.getsize(extent)))
    listing = subprocess.run([*cli, "datasets"], capture_output=True, text=True, timeout=60)
    assert listing.stdout.splitlines()[0].endswith("  (warm, 0% cached now)"), listing.stdout
    status = subprocess.run([*cli, "warm", "--status", "ds"], capture_output=True, text=True,
                            timeout=60)
    assert status.returncode == 0
    [line] = status.stdout.splitlines()
    assert line.startswith("ds: warm, 4.0 MiB of 4.0 MiB read into the page cache (budget ")
    assert line.endswith("; 0 B (0%) of it cached now"), line


# A budget within the advised tail (read-ahead off from the start), and one past it (the
# kernel's sequential read-ahead first, then the advised tail: it must not run past).
@pytest.mark.parametrize("budget_mib, data_mib", [(2, 8), (40, 72)])
def test_a_dataset_over_the_budget_is_warmed_up_to_it_and_says_so(daemon_factory, tmp_path,
                                                                    budget_mib, data_mib):
    budget = budget_mib * MiB
    share = budget / memory_bytes()
    daemon = daemon_factory(extra_args=["--warm-memory-share", repr(share),
                                        "--warm-on-first-read", "off",
                                        "--metrics-listen", "127.0.0.1:0"])
    make_dataset(daemon, tmp_path, data_mib)
    [extent] = extent_files(daemon)
    size = os.path.getsize(extent)
    drop_cache([extent])
    drops = cache_drops()
    with Client(daemon.address) as client:
        [started] = client.warm("ds")
        assert not started.fits and "does not fit the warm-up budget" in started.message
        [info] = client.warm("ds", wait=True, timeout_s=120)
        values = metric_samples(client)
    assert info.state == "partial" and not info.fits
    # (the second Warm starts another warm-up if the first one had ended already)
    partial = values[("dlfs_warmups_total", (("state", "partial"),))]
    assert partial in (1, 2)
    assert values[("dlfs_warm_bytes_total", ())] == partial * info.bytes_warmed
    assert ("dlfs_warmups_total", (("state", "warm"),)) not in values
    assert 0 < info.bytes_warmed <= info.budget_bytes <= budget
    assert info.bytes_total == size
    assert_resident(extent, 0, info.bytes_warmed - PAGE, drops)
    # Nothing far past the budget was read (the kernel's own read-ahead aside).
    assert not any(resident_pages(extent, info.budget_bytes + 2 * MiB, size))
    assert "does not fit the warm-up budget" in daemon.log()
    result = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", daemon.address,
                             "warm", "ds", "--status"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "partial" in result.stdout \
        and "does not fit" in result.stdout


def test_the_first_read_of_a_dataset_warms_it_and_later_reads_do_not_again(daemon, tmp_path):
    make_dataset(daemon, tmp_path, 4)
    [extent] = extent_files(daemon)
    size = os.path.getsize(extent)
    drop_cache([extent])
    drops = cache_drops()
    with Client(daemon.address) as client:
        assert [i.state for i in client.warm_status("ds")] == ["none"]
        client.get_batch([3], dataset="ds")
        [info] = wait_done(client)
        assert (info.state, info.bytes_warmed) == ("warm", size)
        assert_resident(extent, 0, size, drops)
        generation = info.generation
        drop_cache([extent])
        client.get_batch([5], dataset="ds")
        [again] = client.warm_status("ds")
        assert (again.generation, again.state) == (generation, "warm")
        assert not any(resident_pages(extent, 2 * MiB, size))  # not warmed a second time


def test_first_reads_do_not_warm_when_turned_off(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=["--warm-on-first-read", "off"])
    make_dataset(daemon, tmp_path, 1)
    with Client(daemon.address) as client:
        client.get_batch([0], dataset="ds")
        assert [i.state for i in client.warm_status("ds")] == ["none"]


@pytest.mark.parametrize("share", ["-0.1", "0.95"])
def test_a_share_out_of_range_is_refused(tmp_path, share):
    result = subprocess.run([sys.executable, "-m", "dlfs.server.server_cli", "--data-dir",
                             str(tmp_path / "d"), "--warm-memory-share", share],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "warm_memory_share must be in 0..0.9" in result.stderr
