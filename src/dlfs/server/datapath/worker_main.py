"""A data path worker process: `python -m dlfs.server.datapath.worker_main`.

Started by the daemon's main process (workers.py) as a fresh interpreter,
never forked from it (a fork of a process running gRPC's threads is not
safe), with three kinds of inherited descriptors: its control channel
(`--control-fd`, control.py) and the data path's listening sockets
(`--listen-fd`, TCP and Unix), which every worker shares.

Its life: receive `start` (its settings), then one `publish` per dataset
(each a sealed shared index, mapped read-only: core/shared_index.py) and
`state_end`, answered with `ready`; once the main process says `go`, accept
connections and serve them (listener.py, the main process's own code), while
the main thread applies `publish` / `remove` (each acknowledged with its
sequence number), answers `stats`, and passes answers to the serving
threads' questions.  An INGEST_START is handed to the main process with its
connection.  `stop` ends it cleanly; the end of its channel (the main
process died) ends it at once, and so does the death of its parent
(PR_SET_PDEATHSIG): a worker never outlives its daemon, so a restarted
daemon finds its ports free.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time

from dlfs import limits, logs
from dlfs import errors as error_types
from dlfs.errors import DlfsError, InvalidArgument
from dlfs.formats import datapath_frames as frames
from dlfs.formats.datapath_writes import FileOpenRequest
from dlfs.server.auth import Authorizer
from dlfs.server.core import shared_index
from dlfs.server.datapath.control import ChannelClosed, ControlChannel
from dlfs.server.datapath.listener import DataPathServer
from dlfs.server.datapath.worker_store import WorkerSettings, WorkerStore

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlfs.server.datapath.worker_main",
                                     description=__doc__)
    parser.add_argument("--index", type=int, required=True, help="this worker's slot")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    _die_with_parent()
    channel = ControlChannel(socket.socket(fileno=args.control_fd))
    try:
        message, _fds = channel.receive()
    except ChannelClosed:
        return 0
    assert message["type"] == "start", message
    settings = WorkerSettings.from_message(message["settings"])
    # The daemon's program name: its log is one stream; the pid tells the processes
    # apart (`dlfs status` lists the workers' pids).
    logs.configure(settings.log_level, settings.log_format, program="dlfs-server")
    listeners = [socket.socket(fileno=fd) for fd in args.listen_fd]
    worker = Worker(args.index, settings, channel, listeners)
    worker.send({"type": "hello", "pid": os.getpid()})
    code = worker.run()
    logging.shutdown()
    # Accept threads block on listeners other workers share; nothing else is left.
    os._exit(code)


def _die_with_parent() -> None:
    """SIGKILL this process when the thread that started it (the main process's
    supervisor thread) ends: a daemon killed with -9 leaves no worker holding its
    ports.  The parent may already be gone: then exit now."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent or parent == 1:
        os._exit(0)


class Worker:
    """One worker's main loop, its store and server (see the module docstring)."""

    def __init__(self, index: int, settings: WorkerSettings, channel: ControlChannel,
                 listeners: list[socket.socket]):
        self.index = index
        self.channel = channel
        self.started = time.monotonic()
        self.store = WorkerStore(settings, self)
        self.server = DataPathServer(
            self.store, tcp_host=None, tcp_port=0, unix_socket="",
            authorizer=Authorizer(settings.tokens) if settings.tokens is not None else None,
            instance=bytes.fromhex(settings.instance),
            connections_max=settings.connections_max,
            connections_per_peer_max=settings.connections_per_peer_max,
            handshakes_max=settings.handshakes_max,
            handshakes_per_peer_max=settings.handshakes_per_peer_max,
            processes=settings.processes,
            daemon_connections_max=settings.daemon_connections_max,
            daemon_per_peer_max=settings.daemon_per_peer_max,
            idle_timeout_s=settings.idle_timeout_s, stall_timeout_s=settings.stall_timeout_s,
            buffer_bytes_max=settings.buffer_bytes_max, listeners=listeners)
        self.server.ingest = self._hand_over
        self.server.write_file = self._hand_over
        self._applied = 0  # the sequence number of the last change applied
        self._questions = itertools.count(1)
        self._answers: dict[int, list] = {}  # question id -> [Event, answer]
        self._answers_lock = threading.Lock()

    def run(self) -> int:
        """Apply control messages until `stop` (0) or the end of the channel (0)."""
        while True:
            try:
                message, fds = self.channel.receive()
            except ChannelClosed:
                return 0  # the main process is gone: so are its clients' reasons to be here
            kind = message["type"]
            if kind == "publish":
                try:
                    dataset = shared_index.load(fds[0])
                finally:
                    for fd in fds:
                        os.close(fd)
                self.store.publish(dataset)
                self._ack(message["seq"])
            elif kind == "remove":
                self.store.remove(message["name"], message["dataset_id"])
                self._ack(message["seq"])
            elif kind == "state_end":
                self.send({"type": "ready", "seq": self._applied, "pid": os.getpid()})
            elif kind == "go":
                self.server.start()
                log.debug("data path worker %d serving (pid %d)", self.index, os.getpid())
            elif kind == "stats":
                self.send(self._stats(message["id"]))
            elif kind == "missing_reply":
                self._answer(message["id"], message["error"])
            elif kind == "stop":
                self.server.stop()
                self.store.close()
                return 0
            else:
                log.warning("data path worker %d: unknown control message %r", self.index,
                            kind)

    # --- answers to the main process ------------------------------------------------------

    def _ack(self, seq: int) -> None:
        self._applied = seq
        self.send({"type": "ack", "seq": seq})

    def _stats(self, question: int) -> dict:
        """This worker's figures, and the samples of its registry that add up over the
        daemon's processes: its dlfs_* counters and histograms, and its data connections
        and handshakes (not gauges such as dlfs_build_info, nor the process_* and python_*
        families)."""
        metrics = self.store.metrics
        additive = {gauge.describe()[0].name
                    for gauge in (metrics.data_connections, metrics.data_handshakes)}
        samples = [[s.name, s.labels, s.value]
                   for family in metrics.registry.collect()
                   if family.name.startswith("dlfs_") and (
                       family.type in ("counter", "histogram") or family.name in additive)
                   for s in family.samples if not s.name.endswith("_created")]
        times = os.times()
        served = self.store.metrics.bytes_served.collect()[0].samples
        return {"type": "stats_reply", "id": question, "samples": samples, "pid": os.getpid(),
                "cpu_s": times.user + times.system, "connections": self.server.connections,
                "requests": self.server.requests,
                "bytes_served": next((s.value for s in served if s.name.endswith("_total")), 0),
                "uptime_s": time.monotonic() - self.started}

    def send(self, message: dict, fds=()) -> None:
        try:
            self.channel.send(message, fds)
        except ChannelClosed:
            os._exit(0)  # the main process died: this worker goes with it

    # --- what the store asks of the main process (worker_store.MainProcess) --------------

    def explain_missing(self, name: str, generation: int) -> DlfsError | None:
        question = next(self._questions)
        answer = [threading.Event(), None]
        with self._answers_lock:
            self._answers[question] = answer
        self.send({"type": "missing", "id": question, "name": name, "generation": generation})
        try:
            if not answer[0].wait(limits.worker_stats_timeout_s):
                return error_types.Unavailable(
                    "the daemon did not say in time whether dataset "
                    f"{name!r} exists; retry")
        finally:
            with self._answers_lock:
                self._answers.pop(question, None)
        if answer[1] is None:
            return None
        kind, text = answer[1]
        error_type = getattr(error_types, kind, None)
        if not (isinstance(error_type, type) and issubclass(error_type, DlfsError)):
            error_type = error_types.NotFound
        return error_type(text)

    def first_read(self, name: str, generation: int) -> None:
        self.send({"type": "first_read", "name": name, "generation": generation})

    def released(self, dataset_id: int) -> None:
        self.send({"type": "released", "dataset_id": dataset_id})

    def _answer(self, question: int, answer) -> None:
        with self._answers_lock:
            waiting = self._answers.get(question)
        if waiting is not None:
            waiting[1] = answer
            waiting[0].set()

    # --- ingests belong to the main process ---------------------------------------------

    def _hand_over(self, connection, request) -> None:
        """Send `connection` (its socket and the INGEST_START or FILE_OPEN it carried) to
        the main process, which serves the ingest or the file on it; this process lets
        go of it."""
        body = bytes(connection.request_body)
        kind = (frames.Kind.FILE_OPEN if isinstance(request, FileOpenRequest)
                else frames.Kind.INGEST_START)
        message = {"type": "ingest", "role": connection.role, "kind": int(kind),
                   "body": base64.b64encode(body).decode()}
        try:
            self.channel.send(message, [connection.sock.fileno()])
        except ValueError:
            raise InvalidArgument(f"a {kind.name} of {len(body)} bytes is too large to "
                                  "serve") from None
        except ChannelClosed:
            os._exit(0)
        connection.detached = True


if __name__ == "__main__":
    sys.exit(main())
