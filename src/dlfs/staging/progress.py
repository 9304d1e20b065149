"""Progress of an ingest, for people: bytes/s, files/s, ETA, and a summary.

`IngestProgress` counts what the ingest stream sent (files, data bytes) and
how far the sources were read (file bytes of trees, archive bytes of
archives: what is known up front, so it gives the ETA).  With `mode`
"bar" it redraws one line on stderr twice a second (a terminal), with
"log" it prints a line every `log_interval_s` (a batch job's log), with
"none" nothing until the caller prints `summary()`.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

from dlfs.units import counted


def human_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def bytes_text(n: int) -> str:
    """"6 bytes", "50000 bytes (48.8 KiB)": the exact count, and a readable size where
    it says more."""
    text = f"{n} byte{'' if n == 1 else 's'}"
    return text if n < 1024 else f"{text} ({human_bytes(n)})"


def human_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


@dataclasses.dataclass
class IngestStats:
    """What one ingest did: filled by `upload` / `ingest_striped` when passed in."""

    files: int = 0  # sent by this run
    data_bytes: int = 0  # sent by this run
    source_bytes: int = 0  # of the sources, read by this run
    elapsed_s: float = 0.0
    resumed_files: int = 0  # already durable on the daemon(s), skipped
    resumed_bytes: int = 0
    readers: int = 0
    via: str = ""  # "datapath" or "grpc" (one daemon); "" for striped ingests

    def rate_line(self) -> str:
        s = max(self.elapsed_s, 1e-9)
        line = (f"sent {counted(self.files, 'file')}, {human_bytes(self.data_bytes)} in "
                f"{self.elapsed_s:.1f} s "
                f"({human_bytes(self.data_bytes / s)}/s, {self.files / s:,.0f} files/s, "
                f"{self.readers} readers{', over ' + self.via if self.via else ''})")
        if self.resumed_files:
            line += f"; resumed after {counted(self.resumed_files, 'file')} already on the daemon"
        return line


class IngestProgress:
    """Counters of one ingest and, depending on `mode`, a live display."""

    def __init__(self, desc: str, total_source_bytes: int, *, mode: str = "none",
                 known_files: int | None = None, stream=None, log_interval_s: float = 10.0):
        assert mode in ("bar", "log", "none")
        self.desc = desc
        self.total = total_source_bytes
        self.known_files = known_files
        self.mode = mode
        self.stream = stream or sys.stderr
        self.interval = 0.5 if mode == "bar" else log_interval_s
        self.files = 0
        self.data_bytes = 0
        self.source_bytes = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = None
        self._width = 0
        if mode != "none":
            self._thread = threading.Thread(target=self._run, name="dlfs-progress", daemon=True)
            self._thread.start()

    def skip(self, source_bytes: int) -> None:
        """Sources already durable on the daemon (resumed): counted as done, not timed."""
        self.total = max(0, self.total - source_bytes)

    def advance(self, source_bytes: int = 0, data_bytes: int = 0, files: int = 0) -> None:
        self.source_bytes += source_bytes
        self.data_bytes += data_bytes
        self.files += files

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.data_bytes / elapsed
        files_rate = self.files / elapsed
        parts = [f"{self.desc}:"]
        if self.total:
            fraction = min(1.0, self.source_bytes / self.total)
            parts.append(f"{100 * fraction:3.0f}% of {human_bytes(self.total)}")
        files = f"{self.files:,}" + (f"/{self.known_files:,}" if self.known_files else "")
        parts.append(f"| {files} files, {human_bytes(self.data_bytes)} "
                     f"| {human_bytes(rate)}/s, {files_rate:,.0f} files/s")
        source_rate = self.source_bytes / elapsed
        if self.total and source_rate > 0 and self.source_bytes < self.total:
            parts.append(f"| ETA {human_duration((self.total - self.source_bytes) / source_rate)}")
        parts.append(f"| {human_duration(elapsed)}")
        return " ".join(parts)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def _draw(self, end: bool = False) -> None:
        text = self.line()
        try:
            if self.mode == "bar":
                pad = max(0, self._width - len(text))
                self._width = len(text)
                self.stream.write("\r" + text + " " * pad + ("\n" if end else ""))
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> float:
        """Stop the display (a final line for "bar"); return the elapsed seconds."""
        elapsed = time.monotonic() - self.started
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self.mode == "bar":
                self._draw(end=True)
        return elapsed


def progress_mode(progress) -> str:
    """`progress` as given to the ingest functions -> "bar", "log" or "none".

    None: a bar when stderr is a terminal, else nothing; True: a bar; False: nothing;
    or the mode's name.
    """
    if progress is None:
        return "bar" if sys.stderr.isatty() else "none"
    if progress is True:
        return "bar"
    if progress is False:
        return "none"
    if progress not in ("bar", "log", "none"):
        raise ValueError(f"progress must be None, a bool, 'bar', 'log' or 'none', not {progress!r}")
    return progress
