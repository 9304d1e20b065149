"""Run every contender on one workload, warm then cold, with the same batch sequence.

Per contender and cache state:

- warm: the workload's files are read once through the page cache
  (`CacheControl.make_warm`), then one untimed warm-up run over the whole
  batch sequence, then `runs` timed runs;
- cold: a two-batch warm-up (connections, open files, code paths), then
  `runs` timed runs, each right after the page cache was emptied.

The first batch is checked sample by sample against the generated CRC32C
before timing starts, and the row's transport (`Contender.check_transport`);
every timed batch is checked for its byte count.  Each timed run records
the CPU seconds of the daemon (or a ceiling's sender) and of this process
(`CpuMeter`).  A contender that fails gets a row that says so; the run
goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback

import numpy as np

from bench.contenders import Contender
from bench.datagen import Prepared, batch_sequence
from bench.measure import CacheControl, CpuMeter, Measurement, check_samples

log = logging.getLogger("bench")


@dataclasses.dataclass(frozen=True)
class Settings:
    runs: int  # timed runs per contender and cache state
    cold_budget_s: float  # wall time one timed run may take (it stops after that batch)
    warm_budget_s: float
    fio_runtime_s: float


def run_workload(prepared: Prepared, contenders: list[Contender], caches: list[str],
                 settings: Settings, cache_control: CacheControl, progress=print
                 ) -> list[Measurement]:
    batches = batch_sequence(prepared.workload)
    expected = [int(prepared.sizes[b].sum()) for b in batches]
    results: list[Measurement] = []
    for cache in caches:
        if cache == "warm":
            seconds = warm_up_files(prepared, batches, cache_control)
            progress(f"bench: {prepared.workload.name} page cache filled in {seconds:.1f} s")
        for contender in contenders:
            if cache not in contender.caches:
                continue
            m = measure(contender, prepared, cache, batches, expected, settings, cache_control)
            summary = m.summary()
            if m.available:
                progress(f"bench: {prepared.workload.name:>4} {cache} {contender.key:<18} "
                         f"{summary['samples_per_s']:>10,.0f} samples/s "
                         f"{summary['mb_per_s']:>8,.0f} MB/s")
            else:
                progress(f"bench: {prepared.workload.name:>4} {cache} {contender.key:<18} {m.note}")
            results.append(m)
    return results


def measure(contender: Contender, prepared: Prepared, cache: str, batches: list[np.ndarray],
            expected: list[int], settings: Settings, cache_control: CacheControl) -> Measurement:
    m = Measurement(contender.key, prepared.workload.name, cache)
    reason = contender.availability()
    if reason:
        m.available, m.note = False, reason
        return m
    try:
        contender.open(prepared, cache)
        try:
            budget = settings.warm_budget_s if cache == "warm" else settings.cold_budget_s
            if contender.measure_self(m, settings.runs, budget):
                return m
            if cache == "warm":
                warmed = len(batches)
                batches, expected = warm_pass(contender, batches, expected, budget)
                if len(batches) < warmed:
                    m.extra["warm_batches"] = len(batches)
            else:
                contender.run(batches[:2], expected[:2], float("inf"))
            check_samples(contender.read_batch(batches[0]), batches[0], prepared.crcs)
            m.extra.update(contender.check_transport())
            for _ in range(settings.runs):
                if cache == "cold":
                    contender.evict(cache_control)
                with CpuMeter(contender.server_pids(), contender.helper_pids()) as cpu:
                    run = contender.run(batches, expected, budget)
                m.runs.append(cpu.record(run))
            m.note = contender.note()
        finally:
            contender.close()
    except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
        log.error("contender %s failed on %s %s:\n%s", contender.key, prepared.workload.name,
                  cache, traceback.format_exc())
        m.available = False
        m.runs = []
        m.note = f"failed: {type(exc).__name__}: {exc}"[:300]
    return m


def warm_pass(contender: Contender, batches: list[np.ndarray], expected: list[int],
              budget_s: float) -> tuple[list[np.ndarray], list[int]]:
    """One untimed pass of `contender` over the batch sequence (within three times a
    run's `budget_s`); returns the batches (and their byte counts) it read.

    Timed runs read only what the warm-up read: a slow row (the FUSE mount's
    first epoch) would otherwise run on into batches it never read and time a
    cold pass."""
    warmed = len(contender.run(batches, expected, 3 * budget_s).batch_latencies_s)
    return batches[:warmed], expected[:warmed]


def warm_up_files(prepared: Prepared, batches: list[np.ndarray],
                   cache_control: CacheControl) -> float:
    """Fill the page cache with what the warm runs read (sequentially, so it is quick)."""
    ids = np.unique(np.concatenate(batches)).tolist()
    files = [prepared.file_path(i) for i in ids]
    files += prepared.lmdb_files() + prepared.extent_files()
    return cache_control.make_warm(files)
