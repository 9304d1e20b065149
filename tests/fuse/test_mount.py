"""A real `dlfs-mount` over a real daemon, read the way unmodified readers read."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import random
import re
import select
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers.trees import unique_name, write_tree
from dlfs import Client
from dlfs.tools.launch import POLL_INTERVAL_S, STOP_GRACE_S, is_mounted, unmount
from helpers.mounts import splice_reads

pytestmark = pytest.mark.mount

MiB = 1024 * 1024
DIR_MODE = stat.S_IFDIR | 0o555
# Added to a bound derived from the mount's configured timeouts: room for a
# loaded 2-core machine, and still finite where the failure is a hang.
SCHEDULING_SLACK_S = 30.0


def source_tree(root) -> dict[str, bytes]:
    """Files covering every read path: empty, tiny, page, image-sized, whole
    sample with a pushed tail, the whole/unit boundary, and unit-read files."""
    rng = np.random.default_rng(7)
    tree = {
        "empty.bin": b"",
        "one.txt": b"x",
        "train/cat/0001.jpg": rng.bytes(4096),
        "train/cat/0002.jpg": rng.bytes(110 * 1024),
        "train/dog/0001.jpg": rng.bytes(3 * MiB + 5),
        "train/dog/ünïcödé name 名前.bin": rng.bytes(12345),
        "val/exactly-8MiB.bin": rng.bytes(8 * MiB),
        "val/8MiB-plus-one.bin": rng.bytes(8 * MiB + 1),
        "volumes/large.raw": rng.bytes(21 * MiB + 12345),
        "deep/" + "/".join(f"level{i}" for i in range(12)) + "/leaf.txt": b"leaf\n",
    }
    write_tree(root, tree)
    os.makedirs(os.path.join(root, "arrays"))
    np.save(os.path.join(root, "arrays", "small.npy"),
            np.arange(3 * 256 * 1024, dtype=np.float32).reshape(-1, 256))  # 3 MB: whole
    np.save(os.path.join(root, "arrays", "big.npy"),
            rng.standard_normal((3000, 1000)))  # 24 MB: read in units
    modes = {"one.txt": 0o600, "train/cat/0001.jpg": 0o755, "val/exactly-8MiB.bin": 0o444,
             "volumes/large.raw": 0o640}
    for i, rel in enumerate(sorted(tree)):
        path = os.path.join(root, *rel.split("/"))
        os.chmod(path, modes.get(rel, 0o644))
        os.utime(path, ns=(1_600_000_000_123_456_789 + i, 1_500_000_000_987_654_321 + i * 1001))
    return tree


def snapshot(root: str) -> dict[str, tuple]:
    """Every file and directory below `root`: (kind, mode, size, mtime_ns, sha256)."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames:
            st = os.stat(os.path.join(dirpath, name))
            result[os.path.normpath(os.path.join(rel_dir, name))] = ("dir", st.st_mode)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            result[os.path.normpath(os.path.join(rel_dir, name))] = (
                "file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return result


@pytest.fixture(scope="module")
def dataset(shared_daemon, tmp_path_factory):
    """(daemon address, dataset name, source dir) of a dataset ingested once per module."""
    source = tmp_path_factory.mktemp("source")
    source_tree(str(source))
    name = unique_name("tree")
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), name, progress=False)
    return shared_daemon.address, name, str(source)


def test_tree_matches_source(dataset, mount_factory):
    address, name, source = dataset
    m = mount_factory(address)
    root = os.path.join(m.mountpoint, name)
    expected = snapshot(source)
    for rel, value in expected.items():
        if value[0] == "dir":
            expected[rel] = ("dir", DIR_MODE)  # directories are read-only, r-x for all
    assert snapshot(root) == expected
    assert stat.S_ISDIR(os.stat(root).st_mode) and name in os.listdir(m.mountpoint)
    # Owner: the user who mounted; blocks: what du needs.
    st = os.stat(os.path.join(root, "volumes/large.raw"))
    assert (st.st_uid, st.st_gid, st.st_nlink) == (os.getuid(), os.getgid(), 1)
    assert st.st_blocks == -(-st.st_size // 512)


def test_standard_tools(dataset, mount_factory):
    address, name, source = dataset
    m = mount_factory(address, "--dataset", name)  # the dataset's root is the mount root

    def run(*argv, cwd):
        return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout

    assert sorted(run("find", ".", cwd=m.mountpoint).splitlines()) == \
        sorted(run("find", ".", cwd=source).splitlines())
    assert sorted(run("find", ".", "-type", "f", cwd=m.mountpoint).splitlines()) == \
        sorted(run("find", ".", "-type", "f", cwd=source).splitlines())
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(source) for f in fs)
    assert run("du", "-s", "-b", "--apparent-size", ".", cwd=m.mountpoint).split()[0] == str(total)
    files = ["train/cat/0002.jpg", "volumes/large.raw", "train/dog/ünïcödé name 名前.bin"]
    assert run("md5sum", *files, cwd=m.mountpoint) == run("md5sum", *files, cwd=source)
    assert run("cat", "deep/" + "/".join(f"level{i}" for i in range(12)) + "/leaf.txt",
               cwd=m.mountpoint) == "leaf\n"
    listing = run("ls", "-l", "--time-style=+%s", "train/cat", cwd=m.mountpoint)
    assert re.search(r"-rwxr-xr-x 1 \S+ \S+ +4096 1500000000 0001\.jpg", listing), listing
    assert run("stat", "-c", "%s %a %Y", "one.txt", cwd=m.mountpoint) == \
        run("stat", "-c", "%s %a %Y", "one.txt", cwd=source)
    entries = {e.name: (e.is_dir(), e.is_file(), e.stat().st_size)
               for e in os.scandir(os.path.join(m.mountpoint, "train", "cat"))}
    assert entries == {"0001.jpg": (False, True, 4096), "0002.jpg": (False, True, 110 * 1024)}


def test_seek_and_partial_reads(dataset, mount_factory):
    address, name, source = dataset
    m = mount_factory(address)  # fresh mount: nothing cached, every read goes to the daemon
    rng = random.Random(3)
    for rel in ("volumes/large.raw", "val/8MiB-plus-one.bin", "train/dog/0001.jpg"):
        with open(os.path.join(source, rel), "rb") as f:
            data = f.read()
        with open(os.path.join(m.mountpoint, name, rel), "rb", buffering=0) as f:
            for _ in range(60):
                offset = rng.randrange(len(data) + 100)
                length = rng.choice([1, 100, 4096, 131072, 1 << 20, 3 << 20])
                f.seek(offset)
                assert f.read(length) == data[offset:offset + length], (rel, offset, length)
                assert os.pread(f.fileno(), length, offset) == data[offset:offset + length]
            f.seek(-10, os.SEEK_END)
            assert f.read() == data[-10:]
            assert f.read(5) == b""
        with open(os.path.join(m.mountpoint, name, rel), "rb") as f:  # sequential, whole file
            assert f.read() == data


def test_mmap_and_numpy(dataset, mount_factory):
    address, name, source = dataset
    m = mount_factory(address)
    for rel in ("arrays/small.npy", "arrays/big.npy"):
        expected = np.load(os.path.join(source, rel))
        mapped = np.load(os.path.join(m.mountpoint, name, rel), mmap_mode="r")
        assert isinstance(mapped, np.memmap)
        rows = np.random.default_rng(5).integers(0, len(expected), 50)
        assert np.array_equal(mapped[rows], expected[rows])  # random page faults first
        assert np.array_equal(mapped, expected)
        del mapped
    with open(os.path.join(source, "volumes/large.raw"), "rb") as f:
        data = f.read()
    with open(os.path.join(m.mountpoint, name, "volumes/large.raw"), "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as view:
            assert len(view) == len(data)
            rng = random.Random(11)
            for _ in range(200):
                offset = rng.randrange(len(data))
                assert view[offset:offset + 5000] == data[offset:offset + 5000]


def _errno_of(call, *args) -> int:
    with pytest.raises(OSError) as info:
        call(*args)
    return info.value.errno


def test_writes_fail_with_erofs(dataset, mount_factory):
    address, name, source = dataset
    m = mount_factory(address)
    root = os.path.join(m.mountpoint, name)
    file = os.path.join(root, "one.txt")
    directory = os.path.join(root, "train")
    new = os.path.join(root, "new")
    attempts = {
        "open for writing": (os.open, file, os.O_WRONLY),
        "open read-write": (os.open, file, os.O_RDWR),
        "truncate on open": (os.open, file, os.O_WRONLY | os.O_TRUNC),
        "append": (open, file, "ab"),
        "create": (os.open, new, os.O_WRONLY | os.O_CREAT, 0o644),
        "mkdir": (os.mkdir, new),
        "rename file": (os.rename, file, new),
        "rename dir": (os.rename, directory, new),
        "unlink": (os.unlink, file),
        "rmdir": (os.rmdir, os.path.join(root, "deep")),
        "rmdir dataset": (os.rmdir, root),
        "chmod": (os.chmod, file, 0o777),
        "chown": (os.chown, file, 1, 1),
        "utime": (os.utime, file, (1, 1)),
        "truncate": (os.truncate, file, 0),
        "symlink": (os.symlink, "one.txt", new),
        "hard link": (os.link, file, new),
        "mknod": (os.mkfifo, new),
        "setxattr": (os.setxattr, file, "user.test", b"1"),
    }
    for what, (call, *args) in attempts.items():
        assert _errno_of(call, *args) == errno.EROFS, what
    # The root holds datasets and checkpoint spaces (`mkdir` there makes a space:
    # tests/fuse/test_space_writes.py), nothing else.
    assert _errno_of(os.open, os.path.join(m.mountpoint, "x"),
                     os.O_CREAT | os.O_WRONLY) == errno.EPERM
    assert _errno_of(os.rename, root, os.path.join(m.mountpoint, "renamed")) == errno.EPERM
    with Client(address) as client:  # and nothing changed on the daemon
        assert bytes(client.dataset(name).get("one.txt")) == b"x"
    assert snapshot(root)["one.txt"][1:3] == (stat.S_IFREG | 0o600, 1)


def test_missing_names(dataset, mount_factory):
    address, name, source = dataset
    m = mount_factory(address)
    root = os.path.join(m.mountpoint, name)
    assert _errno_of(os.stat, os.path.join(root, "nope")) == errno.ENOENT
    assert _errno_of(os.stat, os.path.join(root, "nope")) == errno.ENOENT  # cached negative
    assert _errno_of(open, os.path.join(root, "train", "cat", "missing.jpg")) == errno.ENOENT
    assert _errno_of(os.stat, os.path.join(m.mountpoint, "no-such-dataset")) == errno.ENOENT
    assert _errno_of(os.stat, os.path.join(m.mountpoint, ".Trash-0")) == errno.ENOENT
    assert _errno_of(os.stat, os.path.join(root, "one.txt", "child")) == errno.ENOTDIR
    assert _errno_of(os.listdir, os.path.join(root, "one.txt")) == errno.ENOTDIR
    assert _errno_of(os.stat, os.path.join(root, "x" * 300)) == errno.ENAMETOOLONG
    assert _errno_of(os.stat, os.path.join(root, "train").encode() + b"/bad\xff") == \
        errno.ENOENT
    assert _errno_of(os.open, root, os.O_RDONLY | os.O_DIRECTORY | os.O_WRONLY) in (
        errno.EISDIR, errno.EROFS)


def _asleep_in_call_on(tid: int, fd: int) -> bool:
    """Whether thread `tid` of this process sleeps in a system call on file
    descriptor `fd`.  /proc/self/task/TID/syscall holds the call's number
    and arguments while the thread sleeps in one, else "running" or -1."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except FileNotFoundError:  # the thread ended
        return False
    return len(fields) > 1 and fields[0] not in ("running", "-1") and int(fields[1], 16) == fd


def test_concurrent_readers_share_the_loop(daemon, tmp_path, mount_factory):
    """A read waiting for a frozen daemon does not hold up anything the
    mount can answer from memory; many readers are served concurrently."""
    read_timeout_s = 20.0  # while the daemon is frozen, no read ends sooner
    tree = {f"c{i % 4}/{i:04d}.bin": os.urandom(2000 + i) for i in range(64)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds", progress=False)
    m = mount_factory(daemon.address, "--read-timeout", str(read_timeout_s),
                      "--metadata-timeout", str(read_timeout_s))
    root = os.path.join(m.mountpoint, "ds")
    for c in range(4):
        os.listdir(os.path.join(root, f"c{c}"))  # names and attributes now in the mount
    cached = os.path.join(root, "c0/0000.bin")
    os.close(os.open(cached, os.O_RDONLY))

    results: dict[str, bytes] = {}
    errors_seen: list[BaseException] = []
    reading: dict[str, tuple[int, int]] = {}  # rel -> (thread id, fd) once its read starts

    def reader(rel: str) -> None:
        try:
            with open(os.path.join(root, rel), "rb") as f:
                reading[rel] = (threading.get_native_id(), f.fileno())
                results[rel] = f.read()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)

    def answered_from_memory() -> None:
        try:
            for _ in range(20):
                os.stat(os.path.join(root, "c3/0063.bin"))
                os.close(os.open(cached, os.O_RDONLY))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)

    def all_waiting_for_the_mount() -> bool:
        return len(reading) == len(waiting) and all(
            _asleep_in_call_on(tid, fd) for tid, fd in reading.values())

    daemon.process.send_signal(signal.SIGSTOP)  # every RPC now hangs
    try:
        waiting = [threading.Thread(target=reader, args=(rel,)) for rel in sorted(tree)[1:40]]
        for t in waiting:
            t.start()
        # Every reader is inside its read(2), waiting for the mount, which
        # waits for the daemon.  (A reader stuck elsewhere ends at a deadline.)
        while not all_waiting_for_the_mount():
            assert all(t.is_alive() for t in waiting), \
                f"reads returned while the daemon was frozen: {errors_seen}"
            time.sleep(POLL_INTERVAL_S)
        # Requests the mount answers from memory: lookup and getattr from the
        # inode table, open and release (open goes to the mount even when the
        # bytes are in the page cache).
        from_memory = threading.Thread(target=answered_from_memory)
        from_memory.start()
        # Done before any read could end: none was queued behind the reads,
        # which end only when the daemon answers or at their deadline.
        from_memory.join(read_timeout_s)
        assert not from_memory.is_alive(), "requests answered from memory waited for reads"
        assert all_waiting_for_the_mount(), "requests answered from memory waited for reads"
        assert not errors_seen, errors_seen
    finally:
        daemon.process.send_signal(signal.SIGCONT)
    for t in waiting:
        t.join(30)
    with open(cached, "rb") as f:
        assert f.read() == tree["c0/0000.bin"]
    assert not errors_seen, errors_seen
    assert {rel: results[rel] for rel in results} == {rel: tree[rel] for rel in results}
    assert len(results) == 39


def test_daemon_restart_while_mounted(daemon, tmp_path, mount_factory):
    tree = {f"f{i:03d}.bin": os.urandom(5000 + i) for i in range(40)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds", progress=False)
    reconnect_timeout_s, read_timeout_s = 1.0, 3.0
    # Reads through the daemon (a co-located mount reads files from the extents
    # and does not need it: test_extent_reads).
    m = mount_factory(daemon.address, "--reconnect-timeout", str(reconnect_timeout_s),
                      "--metadata-timeout", str(read_timeout_s),
                      "--read-timeout", str(read_timeout_s), "--extent-reads", "off")
    root = os.path.join(m.mountpoint, "ds")
    names = sorted(os.listdir(root))
    assert names == sorted(tree)
    with open(os.path.join(root, names[0]), "rb") as f:
        assert f.read() == tree[names[0]]

    port = daemon.address.rpartition(":")[2]
    daemon.stop()
    # Down: uncached reads fail with EIO, in bounded time (the daemon is not
    # coming back by itself: a read waiting for it would never end), and the
    # log names the daemon.  One read is one call: its retries end with the
    # reconnect window, its last attempt at the read deadline.
    started = time.monotonic()
    assert _errno_of(lambda: open(os.path.join(root, names[1]), "rb").read()) == errno.EIO
    assert time.monotonic() - started < reconnect_timeout_s + read_timeout_s + SCHEDULING_SLACK_S
    assert _errno_of(os.stat, os.path.join(m.mountpoint, "other-dataset")) == errno.EIO
    # A long outage: gRPC's reconnect backoff would grow past the retry window.
    outage_s = 10.0
    until = time.monotonic() + outage_s
    index = 0
    while time.monotonic() < until:
        uncached = names[2 + index % (len(names) - 2)]  # a failed read caches nothing
        assert _errno_of(lambda: open(os.path.join(root, uncached), "rb").read()) == errno.EIO
        index += 1
    log = m.log()
    assert f"DLFS daemon at {daemon.address} is not answering" in log, log
    assert re.search(r"read failed with EIO \(daemon " + re.escape(daemon.address), log), log

    daemon.start(f"127.0.0.1:{port}")  # back, same port, no remount
    # Every read succeeds, so each reached the daemon within the reconnect
    # window: a mount still in gRPC's grown backoff would fail them with EIO.
    for name in names[1:]:
        with open(os.path.join(root, name), "rb") as f:
            assert f.read() == tree[name], name
    assert "answers again" in m.log()
    assert m.unmount() == 0


def test_frozen_daemon_gives_eio_in_bounded_time(daemon, tmp_path, mount_factory):
    write_tree(tmp_path / "src", {"a.bin": b"a" * 10000, "b.bin": b"b" * 10000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds", progress=False)
    read_timeout_s = 2.0
    m = mount_factory(daemon.address, "--read-timeout", str(read_timeout_s),
                      "--metadata-timeout", str(read_timeout_s))
    root = os.path.join(m.mountpoint, "ds")
    os.listdir(root)
    daemon.process.send_signal(signal.SIGSTOP)  # connected, never answers
    try:
        started = time.monotonic()
        assert _errno_of(lambda: open(os.path.join(root, "a.bin"), "rb").read()) == errno.EIO
        elapsed_s = time.monotonic() - started
        # It waited for the read deadline, not less (the daemon is connected,
        # nothing says it is down), and not until the daemon thaws.
        assert 0.75 * read_timeout_s < elapsed_s < read_timeout_s + SCHEDULING_SLACK_S
    finally:
        daemon.process.send_signal(signal.SIGCONT)
    with open(os.path.join(root, "a.bin"), "rb") as f:
        assert f.read() == b"a" * 10000
    assert "DeadlineExceeded" in m.log() and daemon.address in m.log()


def test_new_and_replaced_datasets(daemon, tmp_path, mount_factory):
    write_tree(tmp_path / "v1", {"x.bin": b"1" * 1000, "y.bin": b"y"})
    write_tree(tmp_path / "v2", {"x.bin": b"2" * 2000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "v1"), "ds", progress=False)
        m = mount_factory(daemon.address)
        assert os.listdir(m.mountpoint) == ["ds"]
        f = open(os.path.join(m.mountpoint, "ds", "x.bin"), "rb", buffering=0)
        client.ingest(str(tmp_path / "v1"), "added", progress=False)
        assert sorted(os.listdir(m.mountpoint)) == ["added", "ds"]  # no remount needed
        with open(os.path.join(m.mountpoint, "added", "y.bin"), "rb") as g:
            assert g.read() == b"y"
        client.ingest(str(tmp_path / "v2"), "ds", replace=True, progress=False)
    # The open file's size no longer matches what the daemon serves: ESTALE,
    # never a mix of old size and new bytes.
    assert _errno_of(f.read, 100) == errno.ESTALE
    f.close()
    assert "ESTALE" in m.log()


def test_an_open_file_never_reads_a_same_size_replacement(daemon, tmp_path, mount_factory):
    """Same paths, same sizes, other bytes: the open file is of the old version.  What
    it already fetched it may serve again, and a mount reading large files from the
    extents (splice, co-located) the rest of the old version while it still has
    them; anything else is ESTALE, never new bytes."""
    size = 20 * 1024 * 1024  # read in units: a far offset needs the daemon again
    write_tree(tmp_path / "v1", {"x.bin": b"1" * size, "y.bin": b"1" * 100_000})
    write_tree(tmp_path / "v2", {"x.bin": b"2" * size, "y.bin": b"2" * 100_000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "v1"), "ds", progress=False)
        m = mount_factory(daemon.address)
        big = open(os.path.join(m.mountpoint, "ds", "x.bin"), "rb", buffering=0)
        small = open(os.path.join(m.mountpoint, "ds", "y.bin"), "rb", buffering=0)
        assert big.read(10) == b"1" * 10 and small.read(10) == b"1" * 10
        client.ingest(str(tmp_path / "v2"), "ds", replace=True, progress=False)
    for f in (big, small):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    big.seek(15 * 1024 * 1024)
    try:
        assert big.read(100) == b"1" * 100  # the old extent, still open (splice)
        assert splice_reads(m)["reads"] > 0  # only a co-located mount still has them
    except OSError as exc:
        assert exc.errno == errno.ESTALE
    small.seek(50_000)
    try:
        assert small.read(100) == b"1" * 100  # fetched whole at open: still the old bytes
    except OSError as exc:
        assert exc.errno == errno.ESTALE
    big.close()
    small.close()


def test_sigterm_unmounts_cleanly(dataset, mount_factory):
    address, name, _ = dataset
    m = mount_factory(address)
    os.listdir(os.path.join(m.mountpoint, name))
    m.process.terminate()
    assert m.process.wait(STOP_GRACE_S) == 0
    assert not is_mounted(m.mountpoint)
    assert "SIGTERM: unmounting" in m.log() and "unmounted" in m.log()


def test_background_mode_returns_when_usable(dataset, tmp_path):
    address, name, source = dataset
    mountpoint = str(tmp_path / "bg")
    os.mkdir(mountpoint)
    log_path = str(tmp_path / "bg.log")
    result = subprocess.run([sys.executable, "-m", "dlfs.fuse.mount_cli", address, mountpoint,
                             "--log-file", log_path], capture_output=True, text=True, timeout=60)
    try:
        assert result.returncode == 0, result.stderr
        # Usable the moment the command returned: no polling.
        with open(os.path.join(mountpoint, name, "one.txt"), "rb") as f:
            assert f.read() == b"x"
        pid = int(re.search(r"dlfs-mount\[(\d+)\]", open(log_path).read()).group(1))
        assert pid != os.getpid()
        pidfd = os.pidfd_open(pid)  # readable once the process has exited
    finally:
        unmount(mountpoint)
    try:
        exited = select.select([pidfd], [], [], STOP_GRACE_S)[0]
    finally:
        os.close(pidfd)
    assert exited, "the mount process outlived its unmount"
    assert not is_mounted(mountpoint)


def test_mount_errors_are_clear(dataset, tmp_path):
    address, name, _ = dataset
    mountpoint = str(tmp_path / "m")
    os.mkdir(mountpoint)

    def mount(*argv):
        return subprocess.run([sys.executable, "-m", "dlfs.fuse.mount_cli", *argv],
                              capture_output=True, text=True, timeout=60)

    result = mount("127.0.0.1:1", mountpoint, "--reconnect-timeout", "1")
    assert result.returncode == 1
    assert "cannot reach the DLFS daemon at 127.0.0.1:1" in result.stderr
    result = mount(address, mountpoint, "--dataset", "no-such-dataset")
    assert result.returncode == 1 and "no-such-dataset" in result.stderr
    result = mount(address, str(tmp_path / "missing"))
    assert result.returncode == 1 and "does not exist" in result.stderr
    result = mount(",", mountpoint)
    assert result.returncode == 1 and "no daemon address given" in result.stderr
    assert not is_mounted(mountpoint)
