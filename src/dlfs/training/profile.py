"""I/O timeline of a training loop: where each batch's time goes, and a trace to look at.

    from dlfs.training.profile import Timeline

    with Timeline("trace.json") as tl:
        for epoch in range(2):
            for images, labels in tl.wrap(loader, label=f"epoch {epoch}"):
                with tl.decode():
                    x = decode(images)
                with tl.step():
                    train_step(x, labels)
    # prints the summary; trace.json opens in Perfetto (ui.perfetto.dev) or chrome://tracing

Per batch the timeline records three spans on the training thread:
*wait* (inside the loader's ``next()``: the loop is starved of data),
*decode* and *step* (whatever the caller wraps in ``tl.decode()`` and
``tl.step()``).  The summary gives, per ``wrap`` (a *phase*, e.g. an epoch)
and overall, the I/O-bound fraction (wait / wall time), the accelerator
utilisation (step / wall time) and samples/s.

Background work shows up on its own tracks, so the overlap of I/O and
compute is visible: `dlfs.training.pipeline` records each get_batch on its pool
thread (pass ``timeline=tl``), and a `dlfs.torch.DLFSDataset` inside a
DataLoader records each ``__getitems__`` in whichever worker process ran it.
Worker processes cannot append to this object, so they write their spans to
small per-process files in a spool directory (`spool_span`); `wrap` hands
the directory to the loader's dataset before the workers start, and the
timeline merges the files when it is written.

Output: Chrome trace event format (the JSON Perfetto imports):
``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`` with
``"ph": "X"`` complete events (``ts``/``dur`` in microseconds from the first
event, ``pid``, ``tid``) and ``"ph": "M"`` process/thread names.
Timestamps are ``time.perf_counter_ns()``: CLOCK_MONOTONIC on Linux, shared by
all processes of the host, so worker spans line up with the main thread's.

Cost: a few microseconds and ~200 bytes per span; spans are held in memory
until written (bounded by `limits.timeline_spans_max`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable, Iterator

from dlfs import limits
from dlfs.errors import InvalidArgument


SPOOL_PREFIX = "spans-"
_MAIN_CATEGORIES = ("wait", "decode", "step")


class Timeline:
    """Records wait/decode/step spans per batch; writes a summary and a Chrome trace.

    Use it from the training thread (``record`` alone is thread-safe).
    ``path=None`` keeps everything in memory (`summary`, `trace`) and
    writes no file.  Spans taken outside `wrap` are kept in the trace but
    belong to no batch.  Close it (or leave the ``with``) to remove the
    worker spool directory.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, name: str = "training",
                 print_summary: bool = True, out=None):
        self.path = os.fspath(path) if path is not None else None
        self.name = name
        self.print_summary = print_summary
        self.out = out
        self._lock = threading.Lock()
        self._events: list[tuple] = []  # (name, cat, start_ns, end_ns, pid, tid, args)
        self._thread_names: dict[tuple[int, int], str] = {}
        self._dropped = 0
        self._phases: list[dict] = []  # per wrap: label, batches list
        self._current: dict | None = None  # the batch being processed
        self._spool_dir: str | None = None
        self._closed = False

    # --- context manager ------------------------------------------------------

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Write the trace file (if a path was given) and print the summary.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._merge_spool()
        if self.path is not None:
            self.write(self.path)
        if self.print_summary:
            print(format_summary(self.summary(), self.path), file=self.out or sys.stdout)

    # --- recording --------------------------------------------------------------

    def wrap(self, loader: Iterable, *, label: str | None = None,
             count: Callable[[object], int] | None = None) -> Iterator:
        """Iterate `loader`, recording the wait for each batch; starts a new phase.

        `count(batch)` gives the samples in a batch; the default takes
        ``len(batch[0])`` for a tuple/list batch (``(images, labels)``,
        ``(ids, samples)``), else ``len(batch)``, else 1.  When
        ``loader.dataset`` can record its fetches (`DLFSDataset`), it is told
        to spool them here before ``iter(loader)`` starts the workers.
        """
        dataset = getattr(loader, "dataset", None)
        if hasattr(dataset, "trace_to"):
            dataset.trace_to(self.spool_dir())
        phase = {"label": label or f"phase {len(self._phases)}", "batches": []}
        self._phases.append(phase)
        count = count or _default_count
        iterator = iter(loader)
        try:
            while True:
                start = time.perf_counter_ns()
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                end = time.perf_counter_ns()
                record = {"number": len(phase["batches"]), "wait_ns": end - start,
                          "decode_ns": 0, "step_ns": 0, "samples": count(batch),
                          "start_ns": start, "end_ns": end}
                phase["batches"].append(record)
                self._current = record
                self.record("wait", start, end, cat="wait",
                            args={"phase": phase["label"], "batch": record["number"]})
                yield batch
        finally:
            self._current = None
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    @contextlib.contextmanager
    def step(self):
        """Span of the training step of the current batch (compute)."""
        with self._span("step"):
            yield

    @contextlib.contextmanager
    def decode(self):
        """Span of decoding / augmenting the current batch on the training thread."""
        with self._span("decode"):
            yield

    @contextlib.contextmanager
    def _span(self, kind: str):
        record = self._current
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            args = None
            if record is not None:
                record[kind + "_ns"] += end - start
                record["end_ns"] = max(record["end_ns"], end)
                args = {"batch": record["number"]}
            self.record(kind, start, end, cat=kind, args=args)

    def record(self, name: str, start_ns: int, end_ns: int, *, cat: str = "io",
               args: dict | None = None, pid: int | None = None, tid: int | None = None,
               thread_name: str | None = None) -> None:
        """Add one span (perf_counter_ns times).  Thread-safe; dropped past `limits.timeline_spans_max`."""
        if end_ns < start_ns:
            raise InvalidArgument(f"span {name!r} ends ({end_ns}) before it starts ({start_ns})")
        if pid is None:
            pid = os.getpid()
        if tid is None:
            tid = threading.get_native_id()
            thread_name = thread_name or threading.current_thread().name
        with self._lock:
            if len(self._events) >= limits.timeline_spans_max:
                self._dropped += 1
                return
            self._events.append((name, cat, start_ns, end_ns, pid, tid, args))
            if thread_name and (pid, tid) not in self._thread_names:
                self._thread_names[(pid, tid)] = thread_name

    def spool_dir(self) -> str:
        """Directory where worker processes write their spans (created on first use)."""
        if self._spool_dir is None:
            self._spool_dir = tempfile.mkdtemp(prefix="dlfs-timeline-")
        return self._spool_dir

    # --- results ------------------------------------------------------------------

    def summary(self) -> dict:
        """Totals per phase and overall: seconds waiting/decoding/stepping, fractions, rates."""
        phases = [_phase_summary(p["label"], p["batches"]) for p in self._phases]
        batches = [b for p in self._phases for b in p["batches"]]
        overall = _phase_summary("all", batches)
        # Overall wall time is the sum of the phases' (the gaps between them are not training).
        overall["wall_s"] = sum(p["wall_s"] for p in phases)
        _fractions(overall)
        overall["phases"] = phases
        overall["spans_dropped"] = self._dropped
        return overall

    def trace(self) -> dict:
        """The Chrome trace event document (what `write` saves)."""
        self._merge_spool()
        with self._lock:
            events = list(self._events)
            names = dict(self._thread_names)
        origin = min((e[2] for e in events), default=0)
        main_pid = os.getpid()
        out: list[dict] = []
        pids = sorted({e[4] for e in events} | {main_pid})
        for pid in pids:
            label = self.name if pid == main_pid else "DataLoader worker"
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                        "args": {"name": f"{label} (pid {pid})"}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                        "args": {"sort_index": 0 if pid == main_pid else 1}})
        for (pid, tid), thread_name in sorted(names.items()):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"name": thread_name}})
        for name, cat, start, end, pid, tid, args in sorted(events, key=lambda e: e[2]):
            event = {"name": name, "cat": cat, "ph": "X", "ts": (start - origin) / 1000.0,
                     "dur": (end - start) / 1000.0, "pid": pid, "tid": tid}
            if args:
                event["args"] = args
            out.append(event)
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"dlfs_summary": json.dumps(_without_phases(self.summary()))}}

    def write(self, path: str | os.PathLike) -> None:
        """Save the trace as JSON (atomically: a temp file renamed over `path`)."""
        path = os.fspath(path)
        document = self.trace()
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(document, f, separators=(",", ":"))
        os.replace(tmp, path)

    def _merge_spool(self) -> None:
        """Move the worker spool files' spans into this timeline and delete them."""
        if self._spool_dir is None:
            return
        for entry in sorted(os.listdir(self._spool_dir)):
            if not entry.startswith(SPOOL_PREFIX):
                continue
            file_path = os.path.join(self._spool_dir, entry)
            with open(file_path) as f:
                lines = f.read().split("\n")
            os.unlink(file_path)
            for line in lines:
                if not line:
                    continue
                try:
                    span = json.loads(line)
                except json.JSONDecodeError:
                    # Only a worker killed mid-write leaves a torn line; its spans are
                    # lost, the rest of the trace is still good.
                    self._dropped += 1
                    continue
                self.record(span["name"], span["start_ns"], span["end_ns"],
                            cat=span.get("cat", "io"), args=span.get("args"),
                            pid=span["pid"], tid=span["tid"],
                            thread_name=span.get("thread_name"))
        if self._closed:
            shutil.rmtree(self._spool_dir, ignore_errors=True)
            self._spool_dir = None


# --- worker side ----------------------------------------------------------------

_spool_files: dict[str, tuple[int, object]] = {}
_spool_lock = threading.Lock()


def spool_span(spool_dir: str, name: str, start_ns: int, end_ns: int, *, cat: str = "io",
               args: dict | None = None) -> None:
    """Append one span of this process to ``spool_dir/spans-PID.jsonl`` (one write).

    Safe after fork: each process opens its own file.  Stops writing past
    `limits.timeline_spool_file_bytes_max` bytes per file.  A spool directory that is gone
    (the timeline was closed) is ignored: tracing never breaks training.
    """
    pid = os.getpid()
    line = json.dumps({"name": name, "cat": cat, "start_ns": start_ns, "end_ns": end_ns,
                       "pid": pid, "tid": threading.get_native_id(),
                       "thread_name": threading.current_thread().name, "args": args},
                      separators=(",", ":")) + "\n"
    with _spool_lock:
        held = _spool_files.get(spool_dir)
        if held is None or held[0] != pid:
            try:
                handle = open(os.path.join(spool_dir, f"{SPOOL_PREFIX}{pid}.jsonl"), "a")
            except FileNotFoundError:
                return
            held = _spool_files[spool_dir] = (pid, handle)
        handle = held[1]
        if handle.tell() + len(line) > limits.timeline_spool_file_bytes_max:
            return
        handle.write(line)
        handle.flush()


class SpoolTimeline:
    """A `Timeline` stand-in for another process: each recorded span goes to `spool_span`.

    What a process that cannot reach the training process's `Timeline` (a
    read-ahead helper) passes as ``timeline=`` to `dlfs.training.pipeline.iter_batches`;
    the spans reach the Timeline when it merges `spool_dir`.  Picklable.
    Cost: one `spool_span` per span.
    """

    def __init__(self, spool_dir: str):
        self.spool_dir = spool_dir

    def record(self, name: str, start_ns: int, end_ns: int, *, cat: str = "io",
               args: dict | None = None) -> None:
        """Spool one span of this process (perf_counter_ns times); see `Timeline.record`."""
        spool_span(self.spool_dir, name, start_ns, end_ns, cat=cat, args=args)


# --- summaries ------------------------------------------------------------------

def _default_count(batch) -> int:
    try:
        if isinstance(batch, (tuple, list)) and batch and hasattr(batch[0], "__len__"):
            return len(batch[0])
        return len(batch)
    except TypeError:
        return 1


def _phase_summary(label: str, batches: list[dict]) -> dict:
    wait = sum(b["wait_ns"] for b in batches) / 1e9
    decode = sum(b["decode_ns"] for b in batches) / 1e9
    step = sum(b["step_ns"] for b in batches) / 1e9
    wall = ((max(b["end_ns"] for b in batches) - batches[0]["start_ns"]) / 1e9
            if batches else 0.0)
    waits = sorted(b["wait_ns"] / 1e9 for b in batches)
    summary = {
        "label": label, "batches": len(batches), "samples": sum(b["samples"] for b in batches),
        "wall_s": wall, "wait_s": wait, "decode_s": decode, "step_s": step,
        "wait_p50_s": waits[len(waits) // 2] if waits else 0.0,
        "wait_max_s": waits[-1] if waits else 0.0,
    }
    _fractions(summary)
    return summary


def _fractions(summary: dict) -> None:
    wall = summary["wall_s"]
    summary["other_s"] = max(0.0, wall - summary["wait_s"] - summary["decode_s"]
                             - summary["step_s"])
    summary["io_bound_fraction"] = summary["wait_s"] / wall if wall > 0 else 0.0
    summary["utilisation"] = summary["step_s"] / wall if wall > 0 else 0.0
    summary["samples_per_s"] = summary["samples"] / wall if wall > 0 else 0.0


def _without_phases(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "phases"} | {
        "phases": [dict(p) for p in summary.get("phases", [])]}


def format_summary(summary: dict, trace_path: str | None = None) -> str:
    """The summary as a small text table (what `Timeline.close` prints)."""
    lines = []
    rows = summary.get("phases", []) + ([summary] if len(summary.get("phases", [])) != 1 else [])
    lines.append(f"{'phase':<14} {'batches':>7} {'samples':>8} {'wall s':>8} {'wait s':>8} "
                 f"{'decode s':>8} {'step s':>8} {'I/O-bound':>9} {'util':>6} {'samples/s':>10}")
    for row in rows:
        lines.append(
            f"{row['label'][:14]:<14} {row['batches']:>7} {row['samples']:>8} "
            f"{row['wall_s']:>8.2f} {row['wait_s']:>8.2f} {row['decode_s']:>8.2f} "
            f"{row['step_s']:>8.2f} {row['io_bound_fraction']:>8.1%} "
            f"{row['utilisation']:>6.1%} {row['samples_per_s']:>10.1f}")
    if summary.get("spans_dropped"):
        lines.append(f"({summary['spans_dropped']} spans dropped: more than {limits.timeline_spans_max} "
                     "or torn by a killed worker)")
    if trace_path:
        lines.append(f"trace: {trace_path} (open in ui.perfetto.dev or chrome://tracing)")
    return "\n".join(lines)
