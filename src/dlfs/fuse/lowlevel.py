"""A small ctypes binding of libfuse 3's low-level API: what `dlfs-mount` uses, nothing more.

Why our own binding (docs/DESIGN.md, "The mount on libfuse's low-level
API"): the low-level API names every file by inode, so a read can be
served without an OPEN having been seen, and the kernel can then skip
OPEN, FLUSH and RELEASE on every `open()`/`close()` (FUSE's no-open
support).  pyfuse3's `read()` gets only a file handle; mfusepy binds the
high-level (path) API.  ctypes needs no compiler: only libfuse3.so.3 (the
``fuse3`` package) at run time.

Declared here, after libfuse 3's public headers (ABI of version 3.0, which
later 3.x releases keep): `struct stat` and `struct statvfs` of 64-bit
Linux (x86_64 and aarch64), `fuse_file_info`, `fuse_conn_info`,
`fuse_entry_param`, `fuse_buf`/`fuse_bufvec`, `fuse_args`, the operation
table `fuse_lowlevel_ops` (every slot, in header order; unused ones NULL,
which libfuse answers itself, mostly with ENOSYS) and the functions called.

Nothing here knows DLFS: `session.py` drives a session from trio and
`fs.py` answers the requests.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64,
                    c_size_t, c_uint, c_uint32, c_uint64, c_ulong, c_void_p)

ROOT_INODE = 1  # FUSE_ROOT_ID: the kernel names the mount root so

# Capability bits of fuse_conn_info.capable / .want (fuse_common.h).
CAP_ASYNC_READ = 1 << 0
CAP_ATOMIC_O_TRUNC = 1 << 3
CAP_SPLICE_WRITE = 1 << 7
CAP_SPLICE_MOVE = 1 << 8
CAP_SPLICE_READ = 1 << 9
CAP_READDIRPLUS = 1 << 13
CAP_READDIRPLUS_AUTO = 1 << 14
CAP_WRITEBACK_CACHE = 1 << 16
CAP_NO_OPEN_SUPPORT = 1 << 17
CAP_PARALLEL_DIROPS = 1 << 18
CAP_NO_OPENDIR_SUPPORT = 1 << 24

c_off_t = c_int64
c_ino_t = c_uint64  # fuse_ino_t
c_mode_t = c_uint32
c_dev_t = c_uint64
c_req_t = c_void_p  # fuse_req_t: opaque, valid until replied to


class LibfuseMissing(OSError):
    """libfuse3.so.3 cannot be loaded; the message says what to install."""


class Timespec(Structure):
    _fields_ = [("tv_sec", c_int64), ("tv_nsec", c_int64)]


def _stat_fields() -> list:
    machine = platform.machine()
    times = [("st_atim", Timespec), ("st_mtim", Timespec), ("st_ctim", Timespec)]
    if machine in ("x86_64", "AMD64"):
        return [("st_dev", c_uint64), ("st_ino", c_uint64), ("st_nlink", c_uint64),
                ("st_mode", c_uint32), ("st_uid", c_uint32), ("st_gid", c_uint32),
                ("_pad0", c_uint32), ("st_rdev", c_uint64), ("st_size", c_int64),
                ("st_blksize", c_int64), ("st_blocks", c_int64), *times,
                ("_reserved", c_int64 * 3)]
    if machine in ("aarch64", "arm64"):  # the generic 64-bit layout
        return [("st_dev", c_uint64), ("st_ino", c_uint64), ("st_mode", c_uint32),
                ("st_nlink", c_uint32), ("st_uid", c_uint32), ("st_gid", c_uint32),
                ("st_rdev", c_uint64), ("_pad1", c_uint64), ("st_size", c_int64),
                ("st_blksize", c_int32), ("_pad2", c_int32), ("st_blocks", c_int64),
                *times, ("_unused", c_uint32 * 2)]
    raise LibfuseMissing(f"dlfs-mount knows struct stat of x86_64 and aarch64 Linux only, "
                         f"not of {machine}")


class Stat(Structure):
    _fields_ = _stat_fields()


class Statvfs(Structure):
    _fields_ = [("f_bsize", c_ulong), ("f_frsize", c_ulong), ("f_blocks", c_uint64),
                ("f_bfree", c_uint64), ("f_bavail", c_uint64), ("f_files", c_uint64),
                ("f_ffree", c_uint64), ("f_favail", c_uint64), ("f_fsid", c_ulong),
                ("f_flag", c_ulong), ("f_namemax", c_ulong), ("_spare", c_int * 6)]


class FileInfo(Structure):
    _fields_ = [("flags", c_int),
                ("writepage", c_uint, 1), ("direct_io", c_uint, 1), ("keep_cache", c_uint, 1),
                ("flush", c_uint, 1), ("nonseekable", c_uint, 1), ("flock_release", c_uint, 1),
                ("cache_readdir", c_uint, 1), ("noflush", c_uint, 1), ("padding", c_uint, 24),
                ("padding2", c_uint, 32),
                ("fh", c_uint64), ("lock_owner", c_uint64), ("poll_events", c_uint32)]


class ConnInfo(Structure):
    _fields_ = [("proto_major", c_uint), ("proto_minor", c_uint), ("max_write", c_uint),
                ("max_read", c_uint), ("max_readahead", c_uint), ("capable", c_uint),
                ("want", c_uint), ("max_background", c_uint),
                ("congestion_threshold", c_uint), ("time_gran", c_uint),
                ("reserved", c_uint * 22)]


class EntryParam(Structure):
    _fields_ = [("ino", c_ino_t), ("generation", c_uint64), ("attr", Stat),
                ("attr_timeout", c_double), ("entry_timeout", c_double)]


class Buf(Structure):
    _fields_ = [("size", c_size_t), ("flags", c_int), ("mem", c_void_p), ("fd", c_int),
                ("pos", c_off_t)]


class BufVec(Structure):
    _fields_ = [("count", c_size_t), ("idx", c_size_t), ("off", c_size_t), ("buf", Buf * 1)]


class Args(Structure):
    _fields_ = [("argc", c_int), ("argv", POINTER(c_char_p)), ("allocated", c_int)]


class ForgetData(Structure):
    _fields_ = [("ino", c_ino_t), ("nlookup", c_uint64)]


_FI = POINTER(FileInfo)

# The C signature of every operation slot, in the order of struct
# fuse_lowlevel_ops.  None: a slot this binding never fills (stays NULL).
OPERATION_TYPES: tuple[tuple[str, object], ...] = (
    ("init", CFUNCTYPE(None, c_void_p, POINTER(ConnInfo))),
    ("destroy", CFUNCTYPE(None, c_void_p)),
    ("lookup", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p)),
    ("forget", CFUNCTYPE(None, c_req_t, c_ino_t, c_uint64)),
    ("getattr", CFUNCTYPE(None, c_req_t, c_ino_t, _FI)),
    ("setattr", CFUNCTYPE(None, c_req_t, c_ino_t, POINTER(Stat), c_int, _FI)),
    ("readlink", CFUNCTYPE(None, c_req_t, c_ino_t)),
    ("mknod", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p, c_mode_t, c_dev_t)),
    ("mkdir", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p, c_mode_t)),
    ("unlink", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p)),
    ("rmdir", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p)),
    ("symlink", CFUNCTYPE(None, c_req_t, c_char_p, c_ino_t, c_char_p)),
    ("rename", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p, c_ino_t, c_char_p, c_uint)),
    ("link", CFUNCTYPE(None, c_req_t, c_ino_t, c_ino_t, c_char_p)),
    ("open", CFUNCTYPE(None, c_req_t, c_ino_t, _FI)),
    ("read", CFUNCTYPE(None, c_req_t, c_ino_t, c_size_t, c_off_t, _FI)),
    ("write", CFUNCTYPE(None, c_req_t, c_ino_t, c_void_p, c_size_t, c_off_t, _FI)),
    ("flush", CFUNCTYPE(None, c_req_t, c_ino_t, _FI)),
    ("release", CFUNCTYPE(None, c_req_t, c_ino_t, _FI)),
    ("fsync", CFUNCTYPE(None, c_req_t, c_ino_t, c_int, _FI)),
    ("opendir", CFUNCTYPE(None, c_req_t, c_ino_t, _FI)),
    ("readdir", CFUNCTYPE(None, c_req_t, c_ino_t, c_size_t, c_off_t, _FI)),
    ("releasedir", CFUNCTYPE(None, c_req_t, c_ino_t, _FI)),
    ("fsyncdir", CFUNCTYPE(None, c_req_t, c_ino_t, c_int, _FI)),
    ("statfs", CFUNCTYPE(None, c_req_t, c_ino_t)),
    ("setxattr", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p, c_void_p, c_size_t, c_int)),
    ("getxattr", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p, c_size_t)),
    ("listxattr", CFUNCTYPE(None, c_req_t, c_ino_t, c_size_t)),
    ("removexattr", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p)),
    ("access", CFUNCTYPE(None, c_req_t, c_ino_t, c_int)),
    ("create", CFUNCTYPE(None, c_req_t, c_ino_t, c_char_p, c_mode_t, _FI)),
    ("getlk", None),
    ("setlk", None),
    ("bmap", None),
    ("ioctl", CFUNCTYPE(None, c_req_t, c_ino_t, c_uint, c_void_p, _FI, c_uint, c_void_p,
                        c_size_t, c_size_t)),
    ("poll", None),
    ("write_buf", None),  # left NULL: libfuse then never splices requests in
    ("retrieve_reply", None),
    ("forget_multi", CFUNCTYPE(None, c_req_t, c_size_t, POINTER(ForgetData))),
    ("flock", None),
    ("fallocate", CFUNCTYPE(None, c_req_t, c_ino_t, c_int, c_off_t, c_off_t, _FI)),
    ("readdirplus", CFUNCTYPE(None, c_req_t, c_ino_t, c_size_t, c_off_t, _FI)),
    ("copy_file_range", None),
    ("lseek", None),
)


class LowlevelOps(Structure):
    _fields_ = [(name, c_void_p) for name, _ in OPERATION_TYPES]


def _declare(lib: ctypes.CDLL) -> None:
    def fn(name: str, restype, *argtypes) -> None:
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = list(argtypes)

    fn("fuse_session_new", c_void_p, POINTER(Args), POINTER(LowlevelOps), c_size_t, c_void_p)
    fn("fuse_session_mount", c_int, c_void_p, c_char_p)
    fn("fuse_session_fd", c_int, c_void_p)
    fn("fuse_session_loop_mt_31", c_int, c_void_p, c_int)
    fn("fuse_session_exit", None, c_void_p)
    fn("fuse_session_exited", c_int, c_void_p)
    fn("fuse_session_unmount", None, c_void_p)
    fn("fuse_session_destroy", None, c_void_p)
    fn("fuse_reply_err", c_int, c_req_t, c_int)
    fn("fuse_reply_none", None, c_req_t)
    fn("fuse_reply_entry", c_int, c_req_t, POINTER(EntryParam))
    fn("fuse_reply_attr", c_int, c_req_t, POINTER(Stat), c_double)
    fn("fuse_reply_open", c_int, c_req_t, _FI)
    fn("fuse_reply_create", c_int, c_req_t, POINTER(EntryParam), _FI)
    fn("fuse_reply_write", c_int, c_req_t, c_size_t)
    fn("fuse_reply_buf", c_int, c_req_t, c_void_p, c_size_t)
    fn("fuse_reply_statfs", c_int, c_req_t, POINTER(Statvfs))
    fn("fuse_add_direntry_plus", c_size_t, c_req_t, c_void_p, c_size_t, c_char_p,
       POINTER(EntryParam), c_off_t)
    fn("fuse_lowlevel_notify_store", c_int, c_void_p, c_ino_t, c_off_t, POINTER(BufVec), c_int)
    fn("fuse_lowlevel_notify_inval_entry", c_int, c_void_p, c_ino_t, c_char_p, c_size_t)
    fn("fuse_lowlevel_notify_inval_inode", c_int, c_void_p, c_ino_t, c_off_t, c_off_t)
    if hasattr(lib, "fuse_session_loop_mt_312"):  # libfuse 3.12+: thread counts can be set
        fn("fuse_session_loop_mt_312", c_int, c_void_p, c_void_p)
        fn("fuse_loop_cfg_create", c_void_p)
        fn("fuse_loop_cfg_set_max_threads", None, c_void_p, c_uint)
        fn("fuse_loop_cfg_set_idle_threads", None, c_void_p, c_uint)
        fn("fuse_loop_cfg_destroy", None, c_void_p)


_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """libfuse3, loaded and declared once.  Raises LibfuseMissing with what to install."""
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("fuse3") or "libfuse3.so.3"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise LibfuseMissing(f"cannot load libfuse 3 ({exc}); install it: apt-get install "
                                 "fuse3 (Debian, Ubuntu) or dnf install fuse3-libs") from None
        _declare(lib)
        _lib = lib
    return _lib
