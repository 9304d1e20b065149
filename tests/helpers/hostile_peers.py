"""Hostile and careless data path clients, for tests against real daemons.

Each speaks (or breaks) the frames of `dlfs/proto/datapath.md` over a raw
socket: a client that trickles its HELLO, one that asks for a large reply
and never reads it, one that reads it slowly, one that sends garbage.  The
soak test runs them from a separate process (`python hostile_peers.py ...`,
see `main`), so that their sockets are another peer's (another pid on the
Unix socket, another source address over TCP) and their Python work does
not slow the measuring process's GIL.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import threading
import time

import numpy as np

from dlfs.formats import datapath_frames as frames
from dlfs.sockio import recv_exactly, unix_address


def connect(endpoint: tuple, *, source: str = "", timeout_s: float = 10.0) -> socket.socket:
    """A raw connection to ("tcp", port) or ("unix", socket name) of a daemon on this
    host; over TCP from address `source` (another 127.0.0.0/8 address is another
    peer to the daemon)."""
    kind, where = endpoint
    if kind == "tcp":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source:
            sock.bind((source, 0))
        sock.settimeout(timeout_s)
        sock.connect(("127.0.0.1", where))
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(unix_address(where))
    return sock


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """(kind, body) of the next frame; (0, b"") when the daemon closed between frames."""
    header = bytearray(frames.FRAME.size)
    if not recv_exactly(sock, memoryview(header), eof_ok=True):
        return 0, b""
    kind, _flags, length = frames.parse_frame(header)
    body = bytearray(length)
    recv_exactly(sock, memoryview(body))
    return kind, bytes(body)


def welcomed(endpoint: tuple, token: str = "", *, source: str = "") -> socket.socket:
    """A connection that said HELLO and got WELCOME (raises AssertionError otherwise)."""
    sock = connect(endpoint, source=source)
    sock.sendall(frames.hello(token))
    kind, body = read_frame(sock)
    assert kind == frames.Kind.WELCOME, (kind, body)
    return sock


def stall(endpoint: tuple, token: str, dataset: str, ids, *, source: str = "") -> socket.socket:
    """A connection that asked for samples `ids` and reads none of the reply: its
    receive buffer is made small so that the daemon really waits on it."""
    sock = connect(endpoint, source=source)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(frames.hello(token))
    kind, _ = read_frame(sock)
    assert kind == frames.Kind.WELCOME
    for buffer in frames.get_batch(dataset, np.asarray(ids, dtype=np.int64)):
        sock.sendall(buffer)
    return sock


class Trickler(threading.Thread):
    """Sends a HELLO (no token) one byte every `interval_s`; `closed_after_s` is how
    long after connecting the daemon hung up (None while it has not)."""

    def __init__(self, endpoint: tuple, interval_s: float, *, source: str = ""):
        super().__init__(daemon=True, name="trickler")
        self.sock = connect(endpoint, source=source)
        self.connected = time.monotonic()
        self.interval_s = interval_s
        self.closed_after_s: float | None = None
        self.hung_up = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        hello = frames.hello("") * 1000  # more bytes than the daemon will ever wait for
        try:
            for byte in hello:
                self.sock.sendall(bytes([byte]))
                # The daemon answers nothing to a partial HELLO, so any byte (or an
                # end of stream) that comes back means it gave up on this connection.
                self.sock.settimeout(self.interval_s)
                try:
                    self.sock.recv(65536, socket.MSG_PEEK)
                    break
                except socket.timeout:
                    pass
                if self.stop.is_set():
                    return
        except OSError:
            pass  # reset: the daemon gave up on it
        self.closed_after_s = time.monotonic() - self.connected
        self.hung_up.set()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


# --- the soak's hostile process -----------------------------------------------------------

def _trickle_forever(endpoint, stop: threading.Event, source: str) -> None:
    """Trickled HELLOs, one after the other (the daemon cuts each off at its budget)."""
    while not stop.is_set():
        try:
            # A byte a second: a HELLO takes 20 s, twice the daemon's budget for it.
            trickler = Trickler(endpoint, 1.0, source=source)
        except OSError:
            stop.wait(0.5)
            continue
        trickler.start()
        while not stop.is_set() and not trickler.hung_up.wait(0.5):
            pass
        trickler.close()


def _stall_forever(endpoint, token, dataset, ids, stop: threading.Event, source: str) -> None:
    """A stalled reader; when the daemon gives up on it, another."""
    while not stop.is_set():
        try:
            sock = stall(endpoint, token, dataset, ids, source=source)
        except (OSError, AssertionError):
            stop.wait(0.5)
            continue
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                if not sock.recv(1, socket.MSG_PEEK):
                    break  # the daemon hung up: stall again
            except socket.timeout:
                continue
            except OSError:
                break
            stop.wait(0.5)  # data waits unread: the daemon is still on it
        sock.close()


def _read_slowly_forever(endpoint, token, dataset, ids, stop: threading.Event,
                         source: str) -> None:
    """Asks for a large reply and reads it at about 256 KiB/s, again and again."""
    while not stop.is_set():
        try:
            sock = stall(endpoint, token, dataset, ids, source=source)
        except (OSError, AssertionError):
            stop.wait(0.2)
            continue
        try:
            sock.settimeout(5.0)
            while not stop.is_set() and sock.recv(16384):
                stop.wait(1 / 16)
        except OSError:
            pass  # the daemon gave up on it (too slow for the reply's deadline)
        finally:
            sock.close()


def _garbage_forever(endpoint, stop: threading.Event, source: str, seed: int) -> None:
    """Connections that send random bytes, bad frames or a HELLO with a wrong token."""
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            sock = connect(endpoint, source=source, timeout_s=5.0)
        except OSError:
            stop.wait(0.1)
            continue
        try:
            choice = rng.randrange(4)
            if choice == 0:
                sock.sendall(rng.randbytes(rng.randrange(1, 4096)))
            elif choice == 1:
                sock.sendall(frames.FRAME.pack(rng.randrange(256), 0, 0, rng.randrange(1 << 32)))
            elif choice == 2:
                sock.sendall(frames.hello("not-a-token-" + str(rng.random())))
            else:
                sock.sendall(frames.hello("")[:5])
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except OSError:
            pass
        finally:
            sock.close()
        stop.wait(0.02)


def main(argv=None) -> int:
    """Run hostile clients against a daemon until stdin closes; print "ready" once
    each kind has started."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tcp-port", type=int, required=True)
    parser.add_argument("--unix", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--big-ids", required=True, help="comma-separated sample ids")
    parser.add_argument("--each", type=int, default=4, help="clients of each kind per port")
    args = parser.parse_args(argv)
    ids = [int(x) for x in args.big_ids.split(",")]
    stop = threading.Event()
    threads = []
    endpoints = [(("tcp", args.tcp_port), "127.0.0.3"), (("unix", args.unix), "")]
    for k in range(args.each):
        for endpoint, source in endpoints:
            threads += [
                threading.Thread(target=_trickle_forever, args=(endpoint, stop, source)),
                threading.Thread(target=_stall_forever,
                                 args=(endpoint, args.token, args.dataset, ids, stop, source)),
                threading.Thread(target=_read_slowly_forever,
                                 args=(endpoint, args.token, args.dataset, ids, stop, source)),
                threading.Thread(target=_garbage_forever, args=(endpoint, stop, source, k)),
            ]
    for thread in threads:
        thread.daemon = True
        thread.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or dies)
    stop.set()
    for thread in threads:
        thread.join(10)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    raise SystemExit(main())
