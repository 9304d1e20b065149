"""The sending side of the transport ceilings (`bench.ceilings`), run as a child process.

    python -m bench.rawsend tcp HOST PORT BATCH_BYTES
    python -m bench.rawsend unix-sendfile FD PLAN FILE...
    python -m bench.rawsend tcp-mapped HOST PORT BATCH_SAMPLES PLAN FILE...

`tcp` connects to HOST:PORT and `sendall`s one buffer of BATCH_BYTES,
allocated once, over and over.  `unix-sendfile` writes to FD, a connected
Unix stream socket inherited from the parent; PLAN is a file of int64
triples (file index, offset, length): the samples of the batch sequence in
order, each sent with `os.sendfile` from FILE[index], the plan over and
over.  `tcp-mapped` connects to HOST:PORT, maps FILE... read-only and sends
the same plan BATCH_SAMPLES samples at a time, each batch one `sendmsg`
whose iovecs point into the mappings (built once, before the first send):
what the daemon's sends from mappings cost with nothing else around them.
All three stream without waiting for requests (the receiver's socket
buffer is the only flow control) and exit 0 when the receiver closes.

Standard library only, and nothing per batch but the send calls: this
process's CPU time is what sending costs.
"""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import socket
import sys

# The receiver closing its end shows up as one of these on the next send.
_CLOSED = (BrokenPipeError, ConnectionResetError)


def send_tcp(host: str, port: int, batch_bytes: int) -> None:
    sock = socket.create_connection((host, port))
    buffer = bytearray(batch_bytes)
    try:
        while True:
            sock.sendall(buffer)
    except _CLOSED:
        pass
    finally:
        sock.close()


def send_unix_sendfile(fd: int, plan_path: str, files: list[str]) -> None:
    plan = _read_plan(plan_path)
    fds = [os.open(path, os.O_RDONLY) for path in files]
    ranges = [(fds[plan[i]], plan[i + 1], plan[i + 2]) for i in range(0, len(plan), 3)]
    sendfile = os.sendfile
    try:
        while True:
            for in_fd, offset, length in ranges:
                while length:
                    sent = sendfile(fd, in_fd, offset, length)
                    if sent == 0:
                        raise RuntimeError(f"sendfile hit the end of {files[fds.index(in_fd)]} "
                                           f"at {offset}: the plan does not fit the file")
                    offset += sent
                    length -= sent
    except _CLOSED:
        pass
    finally:
        os.close(fd)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.c_void_p), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


def send_tcp_mapped(host: str, port: int, batch_samples: int, plan_path: str,
                    files: list[str]) -> None:
    plan = _read_plan(plan_path)
    libc = ctypes.CDLL(None, use_errno=True)
    bases = [_map_read_only(libc, path) for path in files]
    samples = len(plan) // 3
    batches = []  # (msghdr, its iovec array, bytes), one per batch, built once
    for first in range(0, samples, batch_samples):
        count = min(batch_samples, samples - first)
        iovecs = (_IoVec * count)()
        total = 0
        for k in range(count):
            i = 3 * (first + k)
            iovecs[k].base = bases[plan[i]] + plan[i + 1]
            iovecs[k].len = plan[i + 2]
            total += plan[i + 2]
        message = _MsgHdr(iov=ctypes.addressof(iovecs), iovlen=count)
        batches.append((message, iovecs, total))
    sendmsg = libc.sendmsg
    sendmsg.restype = ctypes.c_ssize_t
    sendmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    sock = socket.create_connection((host, port))
    fd = sock.fileno()
    try:
        while True:
            for message, iovecs, total in batches:
                sent = sendmsg(fd, ctypes.byref(message), socket.MSG_NOSIGNAL)
                if sent < 0:
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code))
                if sent < total:  # cut short (a signal): the rest, the slow way
                    rest = b"".join(ctypes.string_at(v.base, v.len) for v in iovecs)
                    sock.sendall(rest[sent:])
    except _CLOSED:
        pass
    finally:
        sock.close()


def _map_read_only(libc, path: str) -> int:
    """The address of `path` mapped read-only, MADV_RANDOM (as the daemon maps extents;
    a read-only mmap.mmap cannot give ctypes its address)."""
    mmap_ = libc.mmap
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        address = mmap_(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)  # the mapping keeps the file
    if address in (None, ctypes.c_void_p(-1).value):
        code = ctypes.get_errno()
        raise OSError(code, f"mmap {path}: {os.strerror(code)}")
    libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(size), mmap.MADV_RANDOM)
    return address


def _read_plan(plan_path: str) -> array.array:
    plan = array.array("q")
    with open(plan_path, "rb") as f:
        plan.frombytes(f.read())
    return plan


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "tcp" and len(argv) == 4:
        send_tcp(argv[1], int(argv[2]), int(argv[3]))
    elif mode == "unix-sendfile" and len(argv) >= 4:
        send_unix_sendfile(int(argv[1]), argv[2], argv[3:])
    elif mode == "tcp-mapped" and len(argv) >= 6:
        send_tcp_mapped(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
