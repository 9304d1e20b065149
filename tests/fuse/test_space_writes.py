"""Checkpoint spaces written through a real mount by unmodified programs: every call,
exact errno values, and what readers see while files are written and replaced."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest

from dlfs import Client
from dlfs.tools.launch import LaunchError, unmount
from helpers.small_disks import ext4_disk
from helpers.trees import write_tree
from helpers.waiting import wait_until

pytestmark = pytest.mark.mount

MiB = 1024 * 1024
# Bounds a hang on a loaded 2-core machine; not a speed target.
HANG_TIMEOUT_S = 120.0

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
FALLOC_FL_KEEP_SIZE = 1


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as info:
        call(*args)
    return info.value.errno


def renameat2(source: str, target: str, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target),
                       flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number), source)


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, mode, offset, length) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


@pytest.fixture
def space(daemon, tmp_path, mount_factory):
    """(mount, MNT/ck: a space made by `mkdir` through the mount, dataset dir MNT/ds)."""
    write_tree(tmp_path / "src", {"a.txt": b"dataset bytes"})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds", progress=False)
    m = mount_factory(daemon.address)
    root = os.path.join(m.mountpoint, "ck")
    os.makedirs(root)  # what a program's own os.makedirs(checkpoint_folder) does
    return m, root


def client_bytes(address: str, space: str, path: str) -> bytes:
    with Client(address) as client:
        return bytes(client.space(space).read(path))


def test_mkdir_at_the_root_makes_a_space_and_rmdir_removes_it(daemon, space):
    m, root = space
    with Client(daemon.address) as client:
        assert {i.name: i.kind for i in client.dataset_infos()} == {"ck": "space",
                                                                    "ds": "dataset"}
    assert sorted(os.listdir(m.mountpoint)) == ["ck", "ds"]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755
    assert errno_of(os.mkdir, root) == errno.EEXIST
    assert errno_of(os.mkdir, os.path.join(m.mountpoint, "ds")) == errno.EEXIST
    assert errno_of(os.mkdir, os.path.join(m.mountpoint, "bad name!")) == errno.EINVAL
    with open(os.path.join(root, "f"), "wb") as f:
        f.write(b"x")
    assert errno_of(os.rmdir, root) == errno.ENOTEMPTY
    assert errno_of(os.rmdir, os.path.join(m.mountpoint, "ds")) == errno.EROFS
    os.unlink(os.path.join(root, "f"))
    os.rmdir(root)
    assert sorted(os.listdir(m.mountpoint)) == ["ds"]
    with Client(daemon.address) as client:
        assert client.datasets() == ["ds"]
    os.mkdir(root)  # the name again: a new, empty space
    assert os.listdir(root) == []


def test_files_written_in_order_and_at_offsets(daemon, space):
    m, root = space
    os.makedirs(os.path.join(root, "step1", "sub"))
    path = os.path.join(root, "step1", "model.bin")
    data = np.random.default_rng(1).bytes(5 * MiB + 123)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        os.write(fd, data[:MiB])
        # Seen while written: in stat and in the listing, with its size so far.
        assert os.stat(path).st_size == MiB
        assert os.listdir(os.path.join(root, "step1")) == ["model.bin", "sub"]
        assert errno_of(open, path, "rb") == errno.EBUSY  # never closed: nothing to read
        with Client(daemon.address) as client:
            assert client.space("ck").stat("step1/model.bin").version == 0
        os.write(fd, data[MiB:])
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    st = os.stat(path)
    assert (st.st_size, stat.S_IMODE(st.st_mode), stat.S_ISREG(st.st_mode)) == \
        (len(data), 0o640, True)
    with open(path, "rb") as f:
        assert f.read() == data
    assert client_bytes(daemon.address, "ck", "step1/model.bin") == data

    # pwrite at any offset, holes read as zeros; ftruncate shrinks and grows.
    sparse = os.path.join(root, "sparse.bin")
    fd = os.open(sparse, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, b"tail", 3 * MiB)
        os.pwrite(fd, b"head", 0)
        os.pwrite(fd, b"mid", MiB + 7)
        assert os.fstat(fd).st_size == 3 * MiB + 4
        assert os.pread(fd, 8, 0) == b"head\0\0\0\0"  # through its own handle
        os.ftruncate(fd, 2 * MiB)
        os.ftruncate(fd, 2 * MiB + 10)
    finally:
        os.close(fd)
    expected = bytearray(2 * MiB + 10)
    expected[0:4], expected[MiB + 7:MiB + 10] = b"head", b"mid"
    with open(sparse, "rb") as f:
        assert f.read() == bytes(expected)

    # w+: read back what the handle wrote, before any close.
    with open(os.path.join(root, "wplus"), "w+b") as f:
        f.write(b"0123456789")
        f.flush()
        f.seek(3)
        assert f.read(4) == b"3456"
    # O_TRUNC empties, O_APPEND continues, r+ changes in place.
    with open(path, "wb") as f:
        f.write(b"short")
    with open(path, "ab") as f:
        f.write(b"+more")
    with open(path, "r+b") as f:
        f.seek(1)
        f.write(b"H")
    with open(path, "rb") as f:
        assert f.read() == b"sHort+more"
    os.truncate(path, 3)  # by path, no descriptor
    with open(path, "rb") as f:
        assert f.read() == b"sHo"
    assert errno_of(os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL) == errno.EEXIST
    assert errno_of(os.open, os.path.join(root, "missing"), os.O_WRONLY) == errno.ENOENT
    assert errno_of(os.open, os.path.join(root, "no", "f"), os.O_WRONLY | os.O_CREAT) == \
        errno.ENOENT


def test_directories_unlink_and_rename(daemon, space):
    m, root = space
    other = os.path.join(m.mountpoint, "other")
    os.mkdir(other)
    os.makedirs(os.path.join(root, "a", "b"))
    for name, data in (("a/b/x", b"x1"), ("a/y", b"y1"), ("z", b"z1")):
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    assert errno_of(os.mkdir, os.path.join(root, "a")) == errno.EEXIST
    assert errno_of(os.rmdir, os.path.join(root, "a")) == errno.ENOTEMPTY
    assert errno_of(os.rmdir, os.path.join(root, "z")) == errno.ENOTDIR
    assert errno_of(os.unlink, os.path.join(root, "a")) == errno.EISDIR
    assert errno_of(os.unlink, os.path.join(root, "nope")) == errno.ENOENT

    # A directory renamed: what is below it follows, by its new name.
    os.rename(os.path.join(root, "a"), os.path.join(root, "c"))
    assert sorted(os.listdir(root)) == ["c", "z"]
    assert sorted(os.listdir(os.path.join(root, "c"))) == ["b", "y"]
    with open(os.path.join(root, "c", "b", "x"), "rb") as f:
        assert f.read() == b"x1"
    with open(os.path.join(root, "c", "b", "new"), "wb") as f:
        f.write(b"new")
    assert client_bytes(daemon.address, "ck", "c/b/new") == b"new"

    # A file renamed over another replaces it, atomically; NOREPLACE refuses.
    os.rename(os.path.join(root, "z"), os.path.join(root, "c", "y"))
    with open(os.path.join(root, "c", "y"), "rb") as f:
        assert f.read() == b"z1"
    assert not os.path.exists(os.path.join(root, "z"))
    with open(os.path.join(root, "z"), "wb") as f:
        f.write(b"z2")
    assert errno_of(renameat2, os.path.join(root, "z"), os.path.join(root, "c", "y"),
                    RENAME_NOREPLACE) == errno.EEXIST
    renameat2(os.path.join(root, "z"), os.path.join(root, "w"), RENAME_NOREPLACE)
    assert sorted(os.listdir(root)) == ["c", "w"]

    # Elsewhere: another space (EXDEV), a dataset (EROFS), the root (EPERM).
    assert errno_of(os.rename, os.path.join(root, "w"), os.path.join(other, "w")) == errno.EXDEV
    assert errno_of(os.rename, os.path.join(root, "w"),
                    os.path.join(m.mountpoint, "ds", "w")) == errno.EROFS
    assert errno_of(os.rename, os.path.join(root, "w"),
                    os.path.join(m.mountpoint, "w")) == errno.EPERM
    assert errno_of(os.rename, root, os.path.join(m.mountpoint, "renamed")) == errno.EPERM

    # A file being written holds its path.
    with open(os.path.join(root, "open"), "wb") as f:
        f.write(b"...")
        f.flush()
        assert errno_of(os.rename, os.path.join(root, "open"),
                        os.path.join(root, "moved")) == errno.EBUSY
    os.rename(os.path.join(root, "open"), os.path.join(root, "moved"))  # closed: free

    os.unlink(os.path.join(root, "c", "b", "x"))
    os.unlink(os.path.join(root, "c", "b", "new"))
    os.rmdir(os.path.join(root, "c", "b"))
    os.makedirs(os.path.join(root, "c", "b"))  # made again: empty
    assert os.listdir(os.path.join(root, "c", "b")) == []
    with Client(daemon.address) as client:
        ck = client.space("ck")
        assert sorted(e.name for e in ck.listdir("")) == ["c", "moved", "w"]
        assert sorted(e.name for e in ck.listdir("c")) == ["b", "y"]


def test_what_a_space_does_not_keep_is_refused(space):
    m, root = space
    path = os.path.join(root, "f")
    with open(path, "wb") as f:
        f.write(b"12345")
    refused = {
        "symlink": (errno.EPERM, os.symlink, "f", os.path.join(root, "l")),
        "hard link": (errno.EPERM, os.link, path, os.path.join(root, "l")),
        "fifo": (errno.EPERM, os.mkfifo, os.path.join(root, "p")),
        "chmod": (errno.EPERM, os.chmod, path, 0o600),
        "chown": (errno.EPERM, os.chown, path, 1, 1),
        "utime": (errno.EPERM, os.utime, path, (1, 1)),
        "setxattr": (errno.ENOTSUP, os.setxattr, path, "user.x", b"1"),
    }
    for what, (number, call, *args) in refused.items():
        assert errno_of(call, *args) == number, what
    os.utime(path)  # touch: "now" is accepted (the time stays the last close's)
    fd = os.open(path, os.O_RDWR)
    try:
        assert errno_of(fallocate, fd, FALLOC_FL_KEEP_SIZE, 0, 100) == errno.EOPNOTSUPP
        os.posix_fallocate(fd, 0, 100)  # mode 0: grows the file with zeros
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"12345" + bytes(95)
    # Datasets stay read-only beside the space.
    assert errno_of(open, os.path.join(m.mountpoint, "ds", "a.txt"), "r+b") == errno.EROFS
    assert errno_of(open, os.path.join(m.mountpoint, "ds", "new"), "wb") == errno.EROFS
    with open(os.path.join(m.mountpoint, "ds", "a.txt"), "rb") as f:
        assert f.read() == b"dataset bytes"


def test_dcp_commit_by_rename_and_readers_of_the_old_version(daemon, space):
    """torch.distributed.checkpoint's pattern: write x.tmp, fsync, close, rename over x.
    A reader holding the old x keeps reading it (or gets ESTALE), never a mix; an
    open after the rename reads the new bytes."""
    m, root = space
    target = os.path.join(root, ".metadata")
    versions = [bytes([i]) * (3 * MiB + i) for i in range(1, 4)]
    with open(target, "wb") as f:
        f.write(versions[0])
    held = open(target, "rb", buffering=0)
    assert held.read(4096) == versions[0][:4096]
    for data in versions[1:]:
        tmp = target + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, target)
        with open(target, "rb") as f:
            assert f.read() == data
    assert sorted(os.listdir(root)) == [".metadata"]
    os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        rest = held.read()
        assert rest == versions[0][4096:]
    except OSError as exc:
        assert exc.errno == errno.ESTALE
    held.close()


def test_close_to_open_across_writers(daemon, space):
    """A file replaced by another client is read afresh by the next open here."""
    m, root = space
    path = os.path.join(root, "shared.bin")
    with Client(daemon.address) as client:
        ck = client.space("ck")
        for i in range(3):
            data = bytes([65 + i]) * (MiB + i)
            with ck.open("shared.bin", "wb") as f:
                f.write(data)
            with open(path, "rb") as f:
                assert f.read() == data
            assert os.stat(path).st_size == len(data)  # the name now has the new version


def test_torch_and_numpy_through_the_mount(daemon, space):
    torch = pytest.importorskip("torch")
    m, root = space
    step = os.path.join(root, "global_epoch1_step2")
    os.makedirs(step, exist_ok=True)
    state = {"w": torch.arange(300_000, dtype=torch.float32).reshape(300, 1000),
             "b": torch.ones(7, dtype=torch.int64), "step": 2}
    torch.save(state, os.path.join(step, "model.pt"))
    loaded = torch.load(os.path.join(step, "model.pt"))
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    assert loaded["step"] == 2
    mapped = torch.load(os.path.join(step, "model.pt"), mmap=True)
    assert torch.equal(mapped["w"], state["w"])
    with open(os.path.join(step, "opt.pt"), "wb") as f:  # a file object, as DLIO's
        torch.save({"m": torch.zeros(1000)}, f)
    assert torch.equal(torch.load(os.path.join(step, "opt.pt"))["m"], torch.zeros(1000))

    array = np.random.default_rng(2).standard_normal((512, 1024))
    np.save(os.path.join(step, "array.npy"), array)
    view = np.load(os.path.join(step, "array.npy"), mmap_mode="r")
    assert np.array_equal(view, array)
    del view


def test_torch_distributed_checkpoint_through_the_mount(space):
    """DCP's own FileSystemWriter and FileSystemReader, unmodified, twice into one
    folder (the second save replaces .metadata by its rename)."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    m, root = space
    folder = os.path.join(root, "dcp")
    for step in (1, 2):
        state = {"w": torch.arange(1_000_000, dtype=torch.float32) * step,
                 "nested": {"b": torch.full((1000,), float(step))}}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
        loaded = {"w": torch.zeros(1_000_000), "nested": {"b": torch.zeros(1000)}}
        dcp.load(loaded, storage_reader=dcp.FileSystemReader(folder))
        assert torch.equal(loaded["w"], state["w"])
        assert torch.equal(loaded["nested"]["b"], state["nested"]["b"])
    assert ".metadata" in os.listdir(folder)
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]


WRITER = r"""
import os, sys
root, rank = sys.argv[1], int(sys.argv[2])
for i in range(5):
    folder = os.path.join(root, f"step{i}")
    os.makedirs(folder, exist_ok=True)
    data = bytes([rank * 16 + i]) * (1024 * 1024 + rank * 1000 + i)
    tmp = os.path.join(folder, f"rank{rank}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(folder, f"rank{rank}.bin"))
"""


def test_four_processes_write_one_space_while_others_read(daemon, space):
    m, root = space
    reference = os.path.join(root, "reference.bin")
    versions = {bytes([200 + i]) * (2 * MiB + i) for i in range(2)}
    with open(reference, "wb") as f:
        f.write(sorted(versions)[0])
    stop = threading.Event()
    seen: list[bytes] = []
    failures: list[BaseException] = []

    def reader() -> None:  # whole versions only, while the writers write
        try:
            while not stop.is_set():
                try:
                    with open(reference, "rb") as f:
                        seen.append(f.read())
                except OSError as exc:
                    if exc.errno != errno.ESTALE:  # replaced during the open
                        raise
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    def replacer() -> None:
        try:
            for data in sorted(versions) * 3:
                with open(reference + ".tmp", "wb") as f:
                    f.write(data)
                os.replace(reference + ".tmp", reference)
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=reader), threading.Thread(target=replacer)]
    for t in threads:
        t.start()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, root, str(rank)])
               for rank in range(4)]
    codes = [w.wait(HANG_TIMEOUT_S) for w in writers]
    threads[1].join(HANG_TIMEOUT_S)
    stop.set()
    threads[0].join(HANG_TIMEOUT_S)
    assert not failures, failures
    assert codes == [0, 0, 0, 0]
    assert seen and all(s in versions for s in seen)
    with Client(daemon.address) as client:
        ck = client.space("ck")
        for i in range(5):
            assert sorted(e.name for e in ck.listdir(f"step{i}")) == \
                [f"rank{r}.bin" for r in range(4)]
            for rank in range(4):
                expected = bytes([rank * 16 + i]) * (MiB + rank * 1000 + i)
                assert bytes(ck.read(f"step{i}/rank{rank}.bin")) == expected
                with open(os.path.join(root, f"step{i}", f"rank{rank}.bin"), "rb") as f:
                    assert f.read() == expected


def test_a_space_removed_under_an_open_reader(daemon, space):
    m, root = space
    path = os.path.join(root, "f.bin")
    data = np.random.default_rng(3).bytes(3 * MiB)
    with open(path, "wb") as f:
        f.write(data)
    held = open(path, "rb", buffering=0)
    assert held.read(MiB) == data[:MiB]
    with Client(daemon.address) as client:
        client.delete("ck")
    os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        assert held.read() == data[MiB:]  # the old bytes, or:
    except OSError as exc:
        assert exc.errno in (errno.ESTALE, errno.ENOENT)
    held.close()
    wait_until(lambda: not os.path.exists(path), "the removed space is gone from the mount",
               HANG_TIMEOUT_S)


HALF_WRITER = r"""
import os, sys
root = sys.argv[1]
with open(os.path.join(root, "closed.bin"), "wb") as f:
    f.write(b"c" * (2 * 1024 * 1024 + 1))
synced = open(os.path.join(root, "synced.bin"), "wb")
synced.write(b"s" * (1024 * 1024))
synced.flush()
os.fsync(synced.fileno())
synced.write(b"lost" * 1000)
synced.flush()
never = open(os.path.join(root, "never.bin"), "wb")
never.write(b"n" * (3 * 1024 * 1024))
never.flush()
print("writing", flush=True)
sys.stdin.read()
"""


def test_kill_9_of_the_mount_mid_write_loses_only_unclosed_files(daemon, space,
                                                                 mount_factory):
    m, root = space
    writer = subprocess.Popen([sys.executable, "-c", HALF_WRITER, root],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert writer.stdout.readline() == b"writing\n"
    m.process.send_signal(signal.SIGKILL)
    m.process.wait(HANG_TIMEOUT_S)
    writer.kill()
    writer.wait(HANG_TIMEOUT_S)
    unmount(m.mountpoint)
    with Client(daemon.address) as client:
        ck = client.space("ck")
        wait_until(lambda: sorted(e.name for e in ck.listdir("")) == ["closed.bin",
                                                                       "synced.bin"],
                   "the daemon dropped the files that were never closed", HANG_TIMEOUT_S)
    fresh = mount_factory(daemon.address)
    again = os.path.join(fresh.mountpoint, "ck")
    assert sorted(os.listdir(again)) == ["closed.bin", "synced.bin"]
    with open(os.path.join(again, "closed.bin"), "rb") as f:
        assert f.read() == b"c" * (2 * MiB + 1)
    with open(os.path.join(again, "synced.bin"), "rb") as f:
        assert f.read() == b"s" * MiB  # what its fsync made durable, whole


def test_dataset_files_in_a_writable_mount_cost_an_open_and_a_release(daemon, space):
    """OPEN is answered now (a space's files need handles): a dataset's file costs
    OPEN and RELEASE per open(), no FLUSH, and keeps its pages across opens."""
    m, root = space
    path = os.path.join(m.mountpoint, "ds", "a.txt")
    with open(path, "rb") as f:
        assert f.read() == b"dataset bytes"
    before = m.request_counts()
    opens = 20
    for _ in range(opens):
        with open(path, "rb") as f:
            assert f.read() == b"dataset bytes"
    after = m.request_counts()
    added = {k: after.get(k, 0) - before.get(k, 0) for k in after
             if after[k] != before.get(k, 0)}
    reads = added.pop("read", 0)
    for revalidation in ("lookup", "getattr"):  # MNT/ds's entry times out after 5 s
        assert added.pop(revalidation, 0) <= 2, revalidation
    assert added == {"open": opens, "release": opens}, added
    assert reads <= opens  # only where the host reclaimed the pages (mounting.py)


@pytest.mark.parametrize("size", [MiB + 5, 12 * MiB + 5], ids=["whole", "units"])
def test_a_file_rewritten_in_place_reads_new_for_new_readers(space, size):
    """r+ on an open file's inode: once closed, new opens read the new bytes (the
    node is another version now, fetched afresh), and the reader that held the old
    version open gets old bytes, a short file or ESTALE, never new bytes."""
    m, root = space
    path = os.path.join(root, "model.bin")
    old = bytes([1]) * size
    new = bytes([2]) * size
    with open(path, "wb") as f:
        f.write(old)
    held = open(path, "rb", buffering=0)
    assert held.read(4096) == old[:4096]
    with open(path, "r+b") as f:
        f.write(new)
    with open(path, "rb") as f:
        assert f.read() == new
    os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        rest = held.read()
        assert rest == old[4096:4096 + len(rest)]
    except OSError as exc:
        assert exc.errno == errno.ESTALE
    held.close()


def test_a_full_disk_is_enospc_at_write_or_close_and_loses_nothing_else(
        daemon_factory, tmp_path, mount_factory):
    with ext4_disk(tmp_path / "disk", 48) as disk:
        daemon = daemon_factory(data_dir=str(disk / "data"))
        m = mount_factory(daemon.address)
        root = os.path.join(m.mountpoint, "ck")
        os.mkdir(root)
        with open(os.path.join(root, "kept.bin"), "wb") as f:
            f.write(b"k" * MiB)
        chunk = b"x" * (4 * MiB)
        fd = os.open(os.path.join(root, "big.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
        failed = None
        try:
            for _ in range(32):  # 128 MiB onto a 48 MiB disk
                os.write(fd, chunk)
        except OSError as exc:
            failed = exc.errno
        try:
            os.close(fd)
        except OSError as exc:
            failed = failed or exc.errno
        assert failed == errno.ENOSPC
        assert sorted(os.listdir(root)) == ["kept.bin"]
        with open(os.path.join(root, "kept.bin"), "rb") as f:
            assert f.read() == b"k" * MiB
        with open(os.path.join(root, "after.bin"), "wb") as f:  # its space was given back
            f.write(b"a" * (8 * MiB))
        with open(os.path.join(root, "after.bin"), "rb") as f:
            assert f.read() == b"a" * (8 * MiB)
        m.unmount()
        daemon.kill()


def test_threads_writing_one_descriptor_at_once(space):
    """Writes to one open file from several threads reach its writer one at a time."""
    m, root = space
    path = os.path.join(root, "shared.bin")
    blocks = 16
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def write(first: int) -> None:
        for index in range(first, blocks, 4):
            os.pwrite(fd, bytes([index]) * MiB, index * MiB)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_TIMEOUT_S)
    os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"".join(bytes([i]) * MiB for i in range(blocks))


def test_a_space_is_mounted_with_the_whole_daemon_not_alone(daemon, space, mount_factory):
    with pytest.raises(LaunchError, match="'ck' is a checkpoint space: mount the whole daemon"):
        mount_factory(daemon.address, "--dataset", "ck")
    # A one-dataset mount stays read-only, also where the daemon has spaces.
    single = mount_factory(daemon.address, "--dataset", "ds")
    assert errno_of(os.mkdir, os.path.join(single.mountpoint, "x")) == errno.EROFS
    with open(os.path.join(single.mountpoint, "a.txt"), "rb") as f:
        assert f.read() == b"dataset bytes"


def test_a_daemon_killed_mid_write_is_eio_and_the_mount_writes_again_after(daemon, space):
    m, root = space
    with open(os.path.join(root, "before.bin"), "wb") as f:
        f.write(b"b" * MiB)
    fd = os.open(os.path.join(root, "lost.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"l" * MiB)
    daemon.kill()
    failed = []
    try:
        for _ in range(64):  # until the broken connection shows
            os.write(fd, b"l" * MiB)
    except OSError as exc:
        failed.append(exc.errno)
    try:
        os.close(fd)
    except OSError as exc:
        failed.append(exc.errno)
    assert failed and set(failed) == {errno.EIO}, failed
    daemon.start_again()
    wait_until(lambda: os.path.exists(os.path.join(root, "before.bin")),
               "the mount serves the restarted daemon", HANG_TIMEOUT_S)
    assert sorted(os.listdir(root)) == ["before.bin"]  # never closed: gone, nothing torn
    with open(os.path.join(root, "before.bin"), "rb") as f:
        assert f.read() == b"b" * MiB
    with open(os.path.join(root, "after.bin"), "wb") as f:
        f.write(b"a" * MiB)
    assert client_bytes(daemon.address, "ck", "after.bin") == b"a" * MiB
