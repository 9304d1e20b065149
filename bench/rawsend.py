"""The sending side of the transport ceilings (`bench.ceilings`), run as a child process.

    python -m bench.rawsend tcp HOST PORT BATCH_BYTES
    python -m bench.rawsend unix-sendfile FD PLAN FILE...

`tcp` connects to HOST:PORT and `sendall`s one buffer of BATCH_BYTES,
allocated once, over and over.  `unix-sendfile` writes to FD, a connected
Unix stream socket inherited from the parent; PLAN is a file of int64
triples (file index, offset, length): the samples of the batch sequence in
order, each sent with `os.sendfile` from FILE[index], the plan over and
over.  Both stream without waiting for requests (the receiver's socket
buffer is the only flow control) and exit 0 when the receiver closes.

Standard library only, and nothing per batch but the send calls: this
process's CPU time is what sending costs.
"""

from __future__ import annotations

import array
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
    plan = array.array("q")
    with open(plan_path, "rb") as f:
        plan.frombytes(f.read())
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


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "tcp" and len(argv) == 4:
        send_tcp(argv[1], int(argv[2]), int(argv[3]))
    elif mode == "unix-sendfile" and len(argv) >= 4:
        send_unix_sendfile(int(argv[1]), argv[2], argv[3:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
