"""One FUSE session on libfuse's low-level API: libfuse's threads read, trio answers.

libfuse's multi-threaded loop (`fuse_session_loop_mt`) runs in a thread of
its own with the GIL released: its worker threads read requests from
/dev/fuse and answer the ones no handler is registered for in C, without
Python (FLUSH, GETXATTR, ...).  A request with a handler becomes a call on
the trio thread (`TrioToken.run_sync_soon`, in arrival order), where the
handler either answers at once (a plain method that calls one of the
`reply_*` functions) or returns a coroutine, which runs as a task of the
session's nursery and answers when it is done: requests that need the
daemon never hold up the ones answered from memory, and many of them are
in flight at once.  Handlers marked `inline` touch only thread-safe state
and are answered in the worker thread itself (no trip through trio); one
may still return a coroutine, which then runs on trio as above (a read of
a small file is answered in the worker thread, one of a large file by a
trio task).

The contract with a handler object (`fs.DlfsOperations`): a method named
after a libfuse operation (``lookup(req, parent, name)``, ``read(req,
inode, size, offset)``, ...; see `_ARGUMENTS`) answers `req` exactly
once, or returns a coroutine that does.  `FuseError` raised by either is
answered with its errno; anything else is logged as a bug and answered
with EIO.  ``forget`` gets ``[(inode, count), ...]`` and answers nothing.
Slots the handler lacks stay NULL: libfuse answers them (mostly ENOSYS,
which the kernel remembers for OPEN, FLUSH, GETXATTR and the like).

`counts` holds how many requests of each kind reached Python: the mount
logs them at exit and on SIGUSR1, and the bench derives requests per
`open()` from them.

Stopping: `exit` marks the session finished and wakes the loop's thread
(a signal, `signal_wake`); libfuse then cancels its workers, which sit in
`read`, and returns.  `fusermount3 -u` ends the loop by itself.  `close`
unmounts and frees the session: only after every answer was sent (the
nursery is done), since an answer names memory the session owns.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import os
import signal
import threading
from typing import Any, Callable, Iterable

import numpy as np
import trio

from dlfs.fuse import lowlevel as ll
from dlfs.fuse.errno_map import FuseError

log = logging.getLogger(__name__)

# A signal with a do-nothing handler: sent to the loop's thread, it interrupts
# libfuse's sem_wait so that the loop sees the session has exited.
signal_wake = signal.SIGUSR2


_pinned = threading.local()


def _pin_thread_state() -> None:
    """Keep this (libfuse) thread's Python thread state for its life.

    A ctypes callback from a thread Python did not start makes a thread
    state on entry and frees it on return (PyGILState_Ensure/Release), every
    request (docs/DESIGN.md, "The mount's writes", has what that cost).  One
    Ensure more, never released, keeps it: libfuse's workers live as long as
    the loop (`serve` keeps idle ones), at most `mount_fuse_threads_max` of
    them."""
    ctypes.pythonapi.PyGILState_Ensure()
    _pinned.done = True


def inline(method: Callable) -> Callable:
    """Mark a handler to run in libfuse's worker thread (no trio hop): it may
    only touch thread-safe state, and may block that worker thread."""
    method.fuse_inline = True
    return method


class MountFailed(Exception):
    """libfuse could not create or mount the session (its own message went to stderr)."""


def _forget_one(req: int, inode: int, count: int) -> tuple:
    return ([(inode, count)],)


def _forget_many(req: int, count: int, items: Any) -> tuple:
    return ([(items[i].ino, items[i].nlookup) for i in range(count)],)


# How each C callback's arguments reach the handler (req is always passed first,
# except to forget).  The file_info pointer is reduced to what handlers use.
_ARGUMENTS: dict[str, Callable[..., tuple]] = {
    "lookup": lambda req, parent, name: (req, parent, name),
    "forget": _forget_one,
    "forget_multi": _forget_many,
    "getattr": lambda req, inode, fi: (req, inode),
    "setattr": lambda req, inode, attr, to_set, fi: (req, inode, attr.contents.st_size, to_set,
                                                     fi.contents.fh if fi else 0),
    "mknod": lambda req, parent, name, mode, rdev: (req, parent, name),
    "mkdir": lambda req, parent, name, mode: (req, parent, name, mode),
    "unlink": lambda req, parent, name: (req, parent, name),
    "rmdir": lambda req, parent, name: (req, parent, name),
    "symlink": lambda req, link, parent, name: (req, parent, name),
    "rename": lambda req, parent, name, new_parent, new_name, flags: (req, parent, name,
                                                                      new_parent, new_name,
                                                                      flags),
    "link": lambda req, inode, new_parent, new_name: (req, new_parent, new_name),
    "open": lambda req, inode, fi: (req, inode, fi.contents.flags),
    "read": lambda req, inode, size, offset, fi: (req, inode, size, offset, fi.contents.fh),
    # The bytes stay libfuse's: valid until the handler (inline, synchronous) returns.
    "write": lambda req, inode, buf, size, offset, fi: (req, inode, _borrowed(buf, size),
                                                        offset, fi.contents.fh),
    "flush": lambda req, inode, fi: (req, inode, fi.contents.fh),
    "release": lambda req, inode, fi: (req, inode, fi.contents.fh),
    "fsync": lambda req, inode, datasync, fi: (req, inode, fi.contents.fh),
    "opendir": lambda req, inode, fi: (req, inode),
    "readdirplus": lambda req, inode, size, offset, fi: (req, inode, size, offset,
                                                         fi.contents.fh),
    "releasedir": lambda req, inode, fi: (req, inode, fi.contents.fh),
    "statfs": lambda req, inode: (req,),
    "setxattr": lambda req, inode, name, value, size, flags: (req, inode),
    "removexattr": lambda req, inode, name: (req, inode),
    "create": lambda req, parent, name, mode, fi: (req, parent, name, mode, fi.contents.flags),
    "ioctl": lambda req, inode, cmd, arg, fi, flags, in_buf, in_size, out_size: (req, inode,
                                                                                 cmd),
    "fallocate": lambda req, inode, mode, offset, length, fi: (req, inode, mode, offset, length,
                                                               fi.contents.fh),
}
_NO_REPLY = frozenset({"forget", "forget_multi"})


def _borrowed(address: int, size: int) -> memoryview:
    """`size` bytes at `address` (a request's buffer), not copied."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B") if size else \
        memoryview(b"")


def _pointer(data: bytes | memoryview) -> tuple[int, Any]:
    """(address, owner) of `data`'s bytes; keep `owner` alive while C reads them.
    No copy (numpy maps read-only buffers too)."""
    array = np.frombuffer(data, dtype=np.uint8)
    return array.ctypes.data, array


class Session:
    """A FUSE file system mounted at `mountpoint`, answered by `handlers`.

    `options`: mount options (``ro``, ``fsname=...``, ...), as for mount -o.
    `unanswered`: operations `handlers` has but libfuse is to answer (their
    slots stay NULL); `want`/`unwant`: capability bits to ask for / refuse at INIT;
    `max_background`: how many asynchronous requests (read-ahead) the
    kernel keeps in flight.  Raises MountFailed.  Call `serve` in a trio
    run, then `close`.
    """

    def __init__(self, handlers: Any, mountpoint: str, options: Iterable[str], *,
                 debug: bool = False, unanswered: Iterable[str] = (), want: int = 0,
                 unwant: int = 0, max_background: int = 0):
        self._lib = ll.library()
        self.handlers = handlers
        self.counts: collections.Counter[str] = collections.Counter()
        self.capable = 0  # what the kernel offered at INIT
        self._want, self._unwant, self._max_background = want, unwant, max_background
        self._counts_lock = threading.Lock()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread: int | None = None
        self._callbacks: list[Any] = []  # ctypes keeps no reference of its own
        self._ops = ll.LowlevelOps()
        unanswered = frozenset(unanswered)
        for name, ctype in ll.OPERATION_TYPES:
            if name in unanswered:
                continue
            if name == "init":
                function = ctype(self._init)
            elif ctype is not None and name in _ARGUMENTS and hasattr(handlers, name):
                function = ctype(self._trampoline(name))
            elif name == "forget_multi" and hasattr(handlers, "forget"):
                function = ctype(self._trampoline(name))
            else:
                continue
            self._callbacks.append(function)
            setattr(self._ops, name, ctypes.cast(function, ctypes.c_void_p))
        argv = [b"dlfs-mount", b"-o", ",".join(options).encode()] + ([b"-d"] if debug else [])
        self._argv = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
        args = ll.Args(len(argv), self._argv, 0)
        self._se = self._lib.fuse_session_new(ctypes.byref(args), ctypes.byref(self._ops),
                                              ctypes.sizeof(self._ops), None)
        if not self._se:
            raise MountFailed("libfuse refused the mount options " + ",".join(options))
        if self._lib.fuse_session_mount(self._se, os.fsencode(mountpoint)) != 0:
            self._lib.fuse_session_destroy(self._se)
            self._se = None
            raise MountFailed(f"mounting {mountpoint} failed")

    # --- the loop ------------------------------------------------------------------------

    async def serve(self, nursery: trio.Nursery, *, threads_max: int = 0) -> None:
        """Answer requests until the file system is unmounted or `exit` is
        called; handlers' tasks run in `nursery`.  `threads_max`: libfuse's
        worker threads (0: libfuse's default).  Call from the main thread."""
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()
        signal.signal(signal_wake, lambda number, frame: None)
        done = trio.Event()
        outcome: list[int] = []

        def loop() -> None:
            self._loop_thread = threading.get_ident()
            try:
                outcome.append(self._run_loop(threads_max))
            finally:
                self._token.run_sync_soon(done.set)

        self._thread = threading.Thread(target=loop, name="fuse-loop", daemon=True)
        self._thread.start()
        await done.wait()
        self._thread.join()
        if outcome and outcome[0] not in (0, -errno.ENODEV):
            raise OSError(abs(outcome[0]), f"the FUSE loop failed: {os.strerror(abs(outcome[0]))}")

    def _run_loop(self, threads_max: int) -> int:
        loop_312 = getattr(self._lib, "fuse_session_loop_mt_312", None)
        if loop_312 is None:  # libfuse before 3.12: default thread counts
            return self._lib.fuse_session_loop_mt_31(self._se, 0)
        config = self._lib.fuse_loop_cfg_create()
        try:
            if threads_max:
                self._lib.fuse_loop_cfg_set_max_threads(config, threads_max)
                # Idle workers stay (each keeps its Python thread state: _pin_thread_state).
                self._lib.fuse_loop_cfg_set_idle_threads(config, threads_max)
            return loop_312(self._se, config)
        finally:
            self._lib.fuse_loop_cfg_destroy(config)

    def exit(self) -> None:
        """Stop `serve`: libfuse stops reading requests (those already started
        still get their answers while the nursery runs)."""
        if self._se:
            self._lib.fuse_session_exit(self._se)
        if self._loop_thread is not None and self._thread.is_alive():
            signal.pthread_kill(self._loop_thread, signal_wake)

    def close(self) -> None:
        """Unmount (a no-op after `fusermount3 -u`) and free the session."""
        if self._se:
            self._lib.fuse_session_unmount(self._se)
            self._lib.fuse_session_destroy(self._se)
            self._se = None

    # --- callbacks ------------------------------------------------------------------------

    def _init(self, userdata: int, conn: Any) -> None:
        info = conn.contents
        self.capable = info.capable
        info.want = (info.want | (self._want & info.capable)) & ~self._unwant
        if self._max_background:
            info.max_background = self._max_background
            info.congestion_threshold = self._max_background * 3 // 4

    def request_counts(self) -> dict[str, int]:
        """Requests the kernel sent so far, by operation: a copy (the metrics read it)."""
        with self._counts_lock:
            return dict(self.counts)

    def _trampoline(self, name: str) -> Callable:
        """The C callback of operation `name`: runs in a libfuse worker thread."""
        arguments = _ARGUMENTS[name]
        method = getattr(self.handlers, "forget" if name == "forget_multi" else name)
        in_worker = getattr(method, "fuse_inline", False)
        replies = name not in _NO_REPLY
        lock, counts = self._counts_lock, self.counts

        def call(*c_args: Any) -> None:
            if not getattr(_pinned, "done", False):
                _pin_thread_state()
            with lock:
                counts[name] += 1
            req = c_args[0]
            try:
                args = arguments(*c_args)  # copies what C owns (names, flags)
                if not replies:
                    self._lib.fuse_reply_none(req)
                if in_worker:
                    result = method(*args)
                    if result is not None:  # it needs the trio thread after all
                        self._token.run_sync_soon(self._start, name, req, result)
                else:
                    self._token.run_sync_soon(self._dispatch, name, method, req, args, replies)
            except BaseException as exc:  # noqa: BLE001 - C must never see an exception
                self._fail(name, req, exc, replies)

        return call

    def _dispatch(self, name: str, method: Callable, req: int, args: tuple,
                  replies: bool) -> None:
        """Run a handler on the trio thread; start its task if it returned one."""
        try:
            result = method(*args)
            if result is not None:  # a coroutine: answered by its task
                self._nursery.start_soon(self._finish, name, req, result)
        except BaseException as exc:  # noqa: BLE001 - the request must be answered
            self._fail(name, req, exc, replies)

    def _start(self, name: str, req: int, coroutine: Any) -> None:
        """On the trio thread: run the coroutine an inline handler returned as a task."""
        self._nursery.start_soon(self._finish, name, req, coroutine)

    async def _finish(self, name: str, req: int, coroutine: Any) -> None:
        try:
            await coroutine
        except BaseException as exc:  # noqa: BLE001 - the request must be answered
            self._fail(name, req, exc, True)
            if not isinstance(exc, Exception):
                raise  # cancelled at shutdown: let trio unwind

    def _fail(self, name: str, req: int, exc: BaseException, replies: bool) -> None:
        if not replies:
            if isinstance(exc, Exception):
                log.error("%s failed unexpectedly (a bug in dlfs-mount)", name, exc_info=exc)
            return  # already answered
        if isinstance(exc, FuseError):
            number = exc.errno
        else:
            if isinstance(exc, Exception):
                log.error("%s failed unexpectedly (a bug in dlfs-mount); answering EIO", name,
                          exc_info=exc)
            number = errno.EIO
        self._lib.fuse_reply_err(req, number)

    # --- answers (each answers req once) -------------------------------------------------------

    def reply_err(self, req: int, number: int) -> None:
        self._lib.fuse_reply_err(req, number)

    def reply_entry(self, req: int, entry: ll.EntryParam) -> None:
        self._lib.fuse_reply_entry(req, ctypes.byref(entry))

    def reply_attr(self, req: int, attr: ll.Stat, timeout_s: float) -> None:
        self._lib.fuse_reply_attr(req, ctypes.byref(attr), timeout_s)

    def reply_open(self, req: int, fh: int, *, keep_cache: bool = False,
                   cache_readdir: bool = False, direct_io: bool = False,
                   noflush: bool = False) -> None:
        """`direct_io`: reads and writes bypass the page cache; `noflush`: close(2)
        sends no FLUSH."""
        self._lib.fuse_reply_open(req, ctypes.byref(_file_info(fh, keep_cache, cache_readdir,
                                                               direct_io, noflush)))

    def reply_create(self, req: int, entry: ll.EntryParam, fh: int, *,
                     direct_io: bool = False) -> None:
        self._lib.fuse_reply_create(req, ctypes.byref(entry),
                                    ctypes.byref(_file_info(fh, False, False, direct_io, False)))

    def reply_write(self, req: int, count: int) -> None:
        self._lib.fuse_reply_write(req, count)

    def reply_data(self, req: int, data: bytes | memoryview) -> None:
        address, owner = _pointer(data)
        self._lib.fuse_reply_buf(req, address, len(data))
        del owner

    def reply_none(self, req: int) -> None:
        """Free `req` without sending anything: its reply was written to the device
        some other way (splicereads.py)."""
        self._lib.fuse_reply_none(req)

    def device_fd(self) -> int:
        """The /dev/fuse descriptor replies are written to (one: the loop clones none)."""
        return self._lib.fuse_session_fd(self._se)

    def reply_statfs(self, req: int, stats: ll.Statvfs) -> None:
        self._lib.fuse_reply_statfs(req, ctypes.byref(stats))

    def directory_buffer(self, req: int, size: int) -> "DirectoryBuffer":
        return DirectoryBuffer(self._lib, req, size)

    # --- notifications --------------------------------------------------------------------

    def notify_store(self, inode: int, offset: int, data: bytes | memoryview) -> None:
        """Copy `data` into the kernel's page cache of `inode` at `offset`.
        Any thread.  Raises OSError (e.g. ENOENT: the kernel forgot the inode)."""
        address, owner = _pointer(data)
        vector = ll.BufVec(1, 0, 0)
        vector.buf[0].size, vector.buf[0].mem = len(data), address
        result = self._lib.fuse_lowlevel_notify_store(self._se, inode, offset,
                                                      ctypes.byref(vector), 0)
        del owner
        if result < 0:
            raise OSError(-result, f"notify_store: {os.strerror(-result)}")

    def notify_inval_entry(self, parent: int, name: bytes) -> None:
        """Drop the kernel's cached entry `name` of directory `parent` (not from
        inside a handler: the kernel may hold the directory's lock)."""
        result = self._lib.fuse_lowlevel_notify_inval_entry(self._se, parent, name, len(name))
        if result < 0 and result != -errno.ENOENT:
            raise OSError(-result, f"notify_inval_entry: {os.strerror(-result)}")


    def notify_inval_inode(self, inode: int) -> None:
        """Drop the kernel's cached attributes, pages and listing of `inode`
        (same rule as `notify_inval_entry`)."""
        result = self._lib.fuse_lowlevel_notify_inval_inode(self._se, inode, 0, 0)
        if result < 0 and result != -errno.ENOENT:
            raise OSError(-result, f"notify_inval_inode: {os.strerror(-result)}")


def _file_info(fh: int, keep_cache: bool, cache_readdir: bool, direct_io: bool,
               noflush: bool) -> ll.FileInfo:
    info = ll.FileInfo()
    info.fh, info.keep_cache, info.cache_readdir = fh, keep_cache, cache_readdir
    info.direct_io, info.noflush = direct_io, noflush
    return info


class DirectoryBuffer:
    """The reply to one READDIRPLUS: entries packed until `size` bytes are used."""

    def __init__(self, lib: ctypes.CDLL, req: int, size: int):
        self._lib, self._req, self.size = lib, req, size
        self._buffer = ctypes.create_string_buffer(size)
        self.used = 0

    def add(self, name: bytes, entry: ll.EntryParam, next_offset: int) -> bool:
        """Pack one entry; False (and nothing packed) if it does not fit."""
        needed = self._lib.fuse_add_direntry_plus(
            self._req, ctypes.byref(self._buffer, self.used), self.size - self.used, name,
            ctypes.byref(entry), next_offset)
        if needed > self.size - self.used:
            return False
        self.used += needed
        return True

    def reply(self) -> None:
        self._lib.fuse_reply_buf(self._req, self._buffer, self.used)
