"""The data path on many cores: worker processes that serve it, and their supervisor.

Why (docs/DESIGN.md, "The data path on many cores"): one Python process
serving every data connection on threads tops out near two cores (the
interpreter lock, and the kernel work its threads queue behind it).  So
the daemon's main process keeps gRPC, the catalog, ingests and every change
of state, and the data path's connections are served by `count` worker
processes (worker_main.py), each running the same connection code
(listener.py, conn_handler.py, replies.py) over a read-only store
(worker_store.py).  PostgreSQL's postmaster is the model for the rest.

- Sockets: the main process binds the TCP port and the Unix socket once and
  every worker accepts on the same two listening sockets (inherited
  descriptors), so port 0 and abstract names work and the kernel hands each
  connection to one worker blocked in accept().  Rejected: SO_REUSEPORT (no
  Unix sockets; connections hashed, so a few connections often leave
  workers idle; a dead worker's queued connections are reset).
- State: each published dataset's arrays are exported once into a sealed
  memfd that the main process's own index and every worker map
  (core/shared_index.py).  The supervisor is the directory's mirror
  (core/sealed_datasets.py): every publish and remove goes to every worker
  over its control channel (control.py) with a sequence number, and the
  change is acknowledged to its client only once every serving worker
  applied it; a worker that does not within `limits.worker_ack_timeout_s`
  is killed (its replacement starts from the current state).
- Extents of a retired dataset are freed once no process reads them: the
  main process's read leases end, and every worker that held the dataset
  said `released` (or died).
- A worker starts: `start` (its settings), the current datasets,
  `state_end`; it says `ready`, and once it applied every change sent to it
  the supervisor says `go` and it accepts.  A worker that dies is logged and
  started again (with a backoff if it dies young); its clients' connections
  break and the client retries on another worker.
- Limits stay per daemon: each worker gets an even share of
  --datapath-connections-max (so the sum is the daemon's limit; a connection
  that lands on a full worker is refused even if another has room), of the
  window buffers (one window stays with the main process, for ingests it
  is handed) and of the read budget.
- Counters: `metric_samples` sums the workers' counters into the daemon's
  (with the last figures of dead workers, so totals never go back) and
  `worker_statuses` shows each worker; both ask every worker afresh.

Nothing here imports grpc.
"""

from __future__ import annotations

import base64
import collections
import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dlfs import limits
from dlfs.errors import DlfsError
from dlfs.server.core import shared_index
from dlfs.server.core.sample_arrays import SampleArrays
from dlfs.server.datapath.control import ChannelClosed, ControlChannel
from dlfs.server.datapath.worker_store import WorkerSettings
from dlfs.types import DataWorkerStatus

log = logging.getLogger(__name__)

WORKER_MODULE = "dlfs.server.datapath.worker_main"
# Samples whose values only grow: a dead worker's last ones stay in the totals.
_CUMULATIVE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def worker_shares(total: int, count: int) -> list[int]:
    """`total` split into `count` shares that differ by at most one and sum to it."""
    return [total // count + (1 if k < total % count else 0) for k in range(count)]


class _Worker:
    """One started worker process, as the supervisor tracks it (under its lock)."""

    def __init__(self, slot: int, process: subprocess.Popen, channel: ControlChannel,
                 restarts: int):
        self.slot = slot
        self.process = process
        self.pid = process.pid
        self.channel = channel
        self.started = time.monotonic()
        self.restarts = restarts
        self.loaded = False  # sent the current datasets: changes reach it from now on
        self.ready = False  # applied those datasets
        self.serving = False  # told to accept: changes wait for its acks
        self.alive = True
        self.sent = 0  # sequence number of the last change sent to it
        self.acked = 0  # ... and of the last it applied
        self.stats: dict | None = None  # its last stats reply
        self.answers: dict[int, dict] = {}  # stats question id -> reply


class WorkerSupervisor:
    """Starts `count` data path workers accepting on `listeners` and keeps them going.

    `store` is the daemon's Store (its directory, warm-ups and read checks);
    `settings(slot)` is each worker's `WorkerSettings`; `adopt(sock, role,
    kind, body)` serves a connection a worker handed over (an INGEST_START)
    in the main process.  `port` and `unix_socket` are where `listeners`
    listen.  Thread-safe.  Use `start()`, then `stop()`.
    """

    def __init__(self, store, listeners: list[socket.socket], *, port: int, unix_socket: str,
                 count: int, settings: Callable[[int], WorkerSettings],
                 adopt: Callable[[socket.socket, str | None, int, bytes], None]):
        assert 1 <= count <= limits.datapath_workers_max
        self.store = store
        self.port = port
        self.unix_socket = unix_socket
        self.count = count
        self._listeners = listeners
        self._settings = settings
        self._adopt = adopt
        self._lock = threading.Condition()
        self._slots: list[_Worker | None] = [None] * count
        self._restarts = [0] * count
        self._seq = 0  # sequence number of the last change of the directory
        # name -> (dataset, its shared index): what a starting worker is sent.
        self._datasets: dict[str, tuple[SampleArrays, shared_index.SharedIndex]] = {}
        self._holders: dict[int, set[_Worker]] = collections.defaultdict(set)
        self._pending_free: dict[int, Callable[[], None]] = {}
        self._retired: dict[tuple, float] = collections.defaultdict(float)
        self._questions = itertools.count(1)
        self._spawns: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        # Every worker is started from this one long-lived thread: a worker dies with
        # the thread that started it (PR_SET_PDEATHSIG), so not from a passing one.
        self._spawner = threading.Thread(target=self._spawn_loop, daemon=True,
                                         name="dlfs-data-workers")

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, timeout_s: float = limits.worker_start_timeout_s) -> None:
        """Start every worker and return once all serve.  Raises RuntimeError when they
        do not within `timeout_s` (the daemon's log says why)."""
        self._spawner.start()
        for slot in range(self.count):
            self._spawns.put((slot, 0.0))
        give_up = time.monotonic() + timeout_s
        with self._lock:
            while not all(w is not None and w.serving for w in self._slots):
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    serving = sum(1 for w in self._slots if w is not None and w.serving)
                    raise RuntimeError(
                        f"{serving} of {self.count} data path workers serve after "
                        f"{timeout_s:g} s; see the daemon's log (or --datapath-workers 0)")
                self._lock.wait(remaining)

    def stop(self) -> None:
        """Stop every worker (a `stop`, then SIGKILL after limits.worker_stop_grace_s),
        close the index descriptors.  The caller closes the listeners first, so no
        worker accepts meanwhile.  Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._spawns.put(None)
        with self._lock:
            workers = [w for w in self._slots if w is not None]
        for worker in workers:
            try:
                worker.channel.send({"type": "stop"})
            except (ChannelClosed, OSError):
                pass
        give_up = time.monotonic() + limits.worker_stop_grace_s
        for worker in workers:
            try:
                worker.process.wait(max(0.0, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("data path worker %d (pid %d) did not stop in %g s; killing it",
                            worker.slot, worker.pid, limits.worker_stop_grace_s)
                worker.process.kill()
                worker.process.wait()
        self._spawner.join(limits.worker_stop_grace_s)
        with self._lock:
            for _dataset, index in self._datasets.values():
                index.close()
            self._datasets.clear()

    # --- starting workers -------------------------------------------------------------------

    def _spawn_loop(self) -> None:
        while True:
            item = self._spawns.get()
            if item is None:
                return
            slot, delay = item
            if delay and self._stopping.wait(delay):
                return
            if self._stopping.is_set():
                return
            try:
                self._spawn(slot)
            except Exception:  # noqa: BLE001 - logged; the slot is tried again
                log.exception("could not start data path worker %d", slot)
                self._spawns.put((slot, limits.worker_restart_backoff_s_max))

    def _spawn(self, slot: int) -> None:
        channel, theirs = ControlChannel.pair()
        try:
            command = [sys.executable, "-m", WORKER_MODULE, "--index", str(slot),
                       "--control-fd", str(theirs.fileno())]
            for listener in self._listeners:
                command += ["--listen-fd", str(listener.fileno())]
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, close_fds=True,
                pass_fds=[theirs.fileno()] + [listener.fileno() for listener in self._listeners])
        except BaseException:
            channel.close()
            raise
        finally:
            theirs.close()
        worker = _Worker(slot, process, channel, self._restarts[slot])
        channel.send({"type": "start", "settings": self._settings(slot).to_message()})
        with self._lock:
            self._slots[slot] = worker
        threading.Thread(target=self._read, args=(worker,), daemon=True,
                         name=f"dlfs-data-worker-{slot}").start()

    def _load(self, worker: _Worker) -> None:
        """Send `worker` (which said hello: its interpreter is up and reading) every
        current dataset, then `state_end`; from now on it gets every change.  Caller
        holds the lock (no change can come in between)."""
        try:
            for dataset, index in self._datasets.values():
                worker.channel.send(self._publish_message(dataset, self._seq), [index.fd])
                self._holders[dataset.dataset_id].add(worker)
            worker.channel.send({"type": "state_end", "seq": self._seq})
        except (ChannelClosed, OSError) as exc:
            log.warning("data path worker %d (pid %d) did not take its datasets (%s); "
                        "killing it", worker.slot, worker.pid, exc)
            worker.process.kill()
        worker.sent = self._seq
        worker.loaded = True

    # --- one worker's messages -----------------------------------------------------------------

    def _read(self, worker: _Worker) -> None:
        """The messages of one worker, until its channel ends (it exited)."""
        while True:
            try:
                message, fds = worker.channel.receive()
            except ChannelClosed:
                break
            except ValueError as exc:
                log.error("data path worker %d (pid %d) sent a bad control message (%s); "
                          "killing it", worker.slot, worker.pid, exc)
                worker.process.kill()
                break
            try:
                self._handle(worker, message, fds)
            except Exception:  # noqa: BLE001 - a bug here must not stop the supervision
                log.exception("data path worker %d: handling %r failed", worker.slot,
                              message.get("type"))
        self._died(worker)

    def _handle(self, worker: _Worker, message: dict, fds: list[int]) -> None:
        kind = message["type"]
        if kind == "hello":
            with self._lock:
                self._load(worker)
        elif kind == "ack":
            with self._lock:
                worker.acked = max(worker.acked, message["seq"])
                self._maybe_go(worker)
                self._lock.notify_all()
        elif kind == "ready":
            with self._lock:
                worker.ready = True
                worker.acked = max(worker.acked, message["seq"])
                self._maybe_go(worker)
        elif kind == "released":
            self._released(worker, message["dataset_id"])
        elif kind == "stats_reply":
            with self._lock:
                worker.answers[message["id"]] = message
                worker.stats = message
                self._lock.notify_all()
        elif kind == "missing":
            # Not on this thread: the answer may wait for the ingest lock, whose holder
            # may be waiting for this worker's ack, which this thread must read.
            threading.Thread(target=self._answer_missing, args=(worker, message),
                             daemon=True, name="dlfs-data-worker-question").start()
        elif kind == "first_read":
            self.store.first_read_elsewhere(message["name"], message["generation"])
        elif kind == "ingest":
            sock = socket.socket(fileno=fds.pop(0))
            self._adopt(sock, message["role"], message["kind"],
                        base64.b64decode(message["body"]))
        else:
            log.warning("data path worker %d sent an unknown control message %r", worker.slot,
                        kind)
        for fd in fds:
            os.close(fd)

    def _maybe_go(self, worker: _Worker) -> None:
        """Let a loaded worker accept once it applied every change sent to it (lock held)."""
        if worker.serving or not worker.ready or worker.acked < worker.sent:
            return
        try:
            worker.channel.send({"type": "go"})
        except (ChannelClosed, OSError):
            return  # it is dying: its reader will see its channel end
        worker.serving = True
        self._lock.notify_all()
        if worker.restarts:
            log.info("data path worker %d serves again (pid %d)", worker.slot, worker.pid)

    def _answer_missing(self, worker: _Worker, message: dict) -> None:
        """Tell `worker` why the dataset it lacks cannot be read: [error class, message],
        or None when it can (its publish is then ahead of this answer on the channel)."""
        try:
            self.store.check_readable(message["name"], message["generation"])
            error = None
        except DlfsError as exc:
            error = [type(exc).__name__, exc.message]
        try:
            worker.channel.send({"type": "missing_reply", "id": message["id"], "error": error})
        except (ChannelClosed, OSError):
            pass  # it died: the question died with it

    def _died(self, worker: _Worker) -> None:
        """A worker's channel ended: reap it, forget what it held, start another."""
        try:
            code = worker.process.wait(limits.worker_stop_grace_s)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            code = worker.process.wait()
        worker.channel.close()
        frees = []
        with self._lock:
            worker.alive = False
            if self._slots[worker.slot] is worker:
                self._slots[worker.slot] = None
            for dataset_id, holders in list(self._holders.items()):
                holders.discard(worker)
                if not holders:
                    del self._holders[dataset_id]
                    if dataset_id in self._pending_free:
                        frees.append(self._pending_free.pop(dataset_id))
            for name, labels, value in (worker.stats or {}).get("samples", ()):
                if name.endswith(_CUMULATIVE_SUFFIXES):
                    self._retired[(name, tuple(sorted(labels.items())))] += value
            self._lock.notify_all()
        for free in frees:
            free()
        if self._stopping.is_set():
            return
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        log.warning("data path worker %d (pid %d) %s; its connections broke (clients retry) "
                    "and another is starting", worker.slot, worker.pid, how)
        young = time.monotonic() - worker.started < limits.worker_stable_s
        self._restarts[worker.slot] += 1
        delay = min(limits.worker_restart_backoff_s_max,
                    limits.worker_restart_backoff_s * (2 ** min(worker.restarts, 16)
                                                       if young else 1))
        self._spawns.put((worker.slot, delay))

    # --- the directory's mirror (core/sealed_datasets.DirectoryMirror) -------------------

    def prepare(self, dataset: SampleArrays) -> None:
        """Export `dataset` into a shared index and make it use that copy, before its
        publishing is durable (core/shared_index.share: a copy of its arrays).  Raises
        OSError."""
        dataset.shared_index = shared_index.share(dataset)

    def attached(self, datasets: list[SampleArrays]) -> None:
        """The datasets published before the workers: exported now."""
        for dataset in datasets:
            self.prepare(dataset)
            with self._lock:
                self._datasets[dataset.name] = (dataset, dataset.shared_index)

    def published(self, dataset: SampleArrays,
                  previous: SampleArrays | None) -> Callable[[], None]:
        if getattr(dataset, "shared_index", None) is None:
            self.prepare(dataset)  # attached between its `prepare` and its publishing
        index = dataset.shared_index
        with self._lock:
            old = self._datasets.pop(dataset.name, None)
            if old is not None:
                old[1].close()  # workers have theirs; no new worker needs this one
            self._datasets[dataset.name] = (dataset, index)
            self._seq += 1
            return self._broadcast(self._publish_message(dataset, self._seq), [index.fd],
                                   holds=dataset.dataset_id)

    def removed(self, dataset: SampleArrays) -> Callable[[], None]:
        with self._lock:
            old = self._datasets.pop(dataset.name, None)
            if old is not None:
                old[1].close()
            self._seq += 1
            return self._broadcast({"type": "remove", "seq": self._seq, "name": dataset.name,
                                    "dataset_id": dataset.dataset_id}, [])

    @staticmethod
    def _publish_message(dataset: SampleArrays, seq: int) -> dict:
        return {"type": "publish", "seq": seq, "name": dataset.name,
                "dataset_id": dataset.dataset_id}

    def _broadcast(self, message: dict, fds: list[int], holds: int = 0) -> Callable[[], None]:
        """Send a change to every loaded worker (lock held); the wait for the serving
        ones to apply it."""
        seq = message["seq"]
        targets = []
        for worker in self._slots:
            if worker is None or not worker.loaded or not worker.alive:
                continue
            try:
                worker.channel.send(message, fds)
            except (ChannelClosed, OSError) as exc:
                log.error("data path worker %d (pid %d) does not take changes (%s); killing "
                          "it", worker.slot, worker.pid, exc)
                worker.process.kill()
                continue
            worker.sent = seq
            if holds:
                self._holders[holds].add(worker)
            if worker.serving:
                targets.append(worker)
        return lambda: self._wait_applied(seq, targets)

    def _wait_applied(self, seq: int, targets: list[_Worker]) -> None:
        """Return once each of `targets` applied change `seq` or is dead; kill those
        that do not within limits.worker_ack_timeout_s (and wait for their end)."""
        give_up = time.monotonic() + limits.worker_ack_timeout_s
        with self._lock:
            while True:
                late = [w for w in targets if w.alive and w.acked < seq]
                remaining = give_up - time.monotonic()
                if not late or remaining <= 0:
                    break
                self._lock.wait(remaining)
        if not late:
            return
        for worker in late:
            log.error("data path worker %d (pid %d) did not apply a dataset change within "
                      "%g s; killing it (a new one starts from the current state)",
                      worker.slot, worker.pid, limits.worker_ack_timeout_s)
            worker.process.kill()
        with self._lock:
            while any(w.alive for w in late):
                self._lock.wait(limits.worker_stop_grace_s)

    def free_when_released(self, dataset_id: int, free: Callable[[], None]) -> None:
        """Call `free()` (remove a retired dataset's extents) once no worker holds the
        dataset: now, or when the last holder says `released` or dies."""
        with self._lock:
            if self._holders.get(dataset_id):
                self._pending_free[dataset_id] = free
                return
            self._holders.pop(dataset_id, None)
        free()

    def _released(self, worker: _Worker, dataset_id: int) -> None:
        free = None
        with self._lock:
            holders = self._holders.get(dataset_id)
            if holders is not None:
                holders.discard(worker)
                if not holders:
                    del self._holders[dataset_id]
                    free = self._pending_free.pop(dataset_id, None)
        if free is not None:
            free()

    def holding(self, dataset_id: int) -> int:
        """Workers that still read (or have not yet retired) dataset `dataset_id`."""
        with self._lock:
            return len(self._holders.get(dataset_id, ()))

    # --- counters --------------------------------------------------------------------------------

    def pull_stats(self) -> dict[int, dict]:
        """Each live worker's counters and figures, asked for now (slot -> its stats
        reply); a worker that does not answer within limits.worker_stats_timeout_s
        is reported with its last answer, if any."""
        asked = []
        with self._lock:
            for worker in self._slots:
                if worker is None or not worker.serving:
                    continue
                question = next(self._questions)
                try:
                    worker.channel.send({"type": "stats", "id": question})
                except (ChannelClosed, OSError):
                    continue
                asked.append((worker, question))
            give_up = time.monotonic() + limits.worker_stats_timeout_s
            while any(q not in w.answers for w, q in asked if w.alive):
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            found = {}
            for worker, question in asked:
                worker.answers.pop(question, None)
                if worker.stats is not None:
                    found[worker.slot] = worker.stats
            return found

    def metric_samples(self) -> list[tuple[str, dict, float]]:
        """Every worker's dlfs_* samples, summed per name and labels, with the counters
        of workers that died: what the daemon's own counters need added (Metrics)."""
        totals: dict[tuple, float] = collections.defaultdict(float)
        for stats in self.pull_stats().values():
            for name, labels, value in stats["samples"]:
                totals[(name, tuple(sorted(labels.items())))] += value
        with self._lock:
            for key, value in self._retired.items():
                totals[key] += value
        return [(name, dict(labels), value) for (name, labels), value in totals.items()]

    def worker_statuses(self) -> tuple[DataWorkerStatus, ...]:
        """One line per worker slot for `dlfs status`: its process and what it served."""
        stats = self.pull_stats()
        result = []
        with self._lock:
            for slot, worker in enumerate(self._slots):
                found = stats.get(slot)
                serving = worker is not None and worker.serving and worker.alive
                result.append(DataWorkerStatus(
                    index=slot, pid=worker.pid if worker is not None else 0,
                    state="serving" if serving else "starting",
                    connections=found["connections"] if found and serving else 0,
                    requests=found["requests"] if found else 0,
                    bytes_served=int(found["bytes_served"]) if found else 0,
                    cpu_s=found["cpu_s"] if found else 0.0,
                    restarts=self._restarts[slot]))
        return tuple(result)

    def collect(self):
        """Per-worker families for Prometheus (a collector of the daemon's registry),
        from each worker's last answer (a scrape asks them first: Metrics.refresh)."""
        families = {
            "connections": GaugeMetricFamily(
                "dlfs_data_worker_connections", "Data path connections a worker serves",
                labels=["worker"]),
            "requests": CounterMetricFamily(
                "dlfs_data_worker_requests", "Data path requests a worker answered",
                labels=["worker"]),
            "bytes_served": CounterMetricFamily(
                "dlfs_data_worker_served_bytes", "Payload bytes a worker sent",
                labels=["worker"]),
            "cpu_s": CounterMetricFamily(
                "dlfs_data_worker_cpu_seconds", "CPU seconds (user + system) of a worker",
                labels=["worker"]),
        }
        restarts = CounterMetricFamily("dlfs_data_worker_restarts",
                                       "Workers that died in a slot and were started again",
                                       labels=["worker"])
        with self._lock:
            for slot, worker in enumerate(self._slots):
                stats = worker.stats if worker is not None and worker.alive else None
                for key, family in families.items():
                    family.add_metric([str(slot)], stats[key] if stats else 0)
                restarts.add_metric([str(slot)], self._restarts[slot])
        yield from families.values()
        yield restarts
