"""Two rows compared by alternating runs: a ratio that the machine's drift cannot fake.

The rows of the table are measured one after another: a row's three runs
and the row it is compared with can be minutes apart.  On a shared machine
whose speed drifts by a third within minutes (the 2-core VM: LMDB one thread
read 402 k to 739 k samples/s at 4 KB across runs of the same code), that
drift is larger than the margin a target asks about.  Here both contenders
are open at once and their runs alternate, so each pair of runs sees the
same machine: ABBA order (A B, then B A), so neither always runs first;
the ratio reported is the median of the pairs' ratios.

Used for the issue's 4 KB target (DLFS TCP with 4 batches in flight against
LMDB one thread, warm); its rows in the table stay as they are.
"""

from __future__ import annotations

import statistics

import numpy as np

from bench.contenders import Contender
from bench.datagen import Prepared, batch_sequence
from bench.measure import CacheControl
from bench.runner import Settings, warm_pass, warm_up_files

PAIRS = 7  # pairs of alternating runs (odd: the median is one of them)


def run_paired(prepared: Prepared, first: Contender, second: Contender, settings: Settings,
               cache_control: CacheControl, pairs: int = PAIRS, progress=print) -> dict:
    """`pairs` warm runs of each of `first` and `second`, alternating, over the
    workload's batch sequence; both are open the whole time.

    Returns {"workload", "first", "second", "pairs": [{"first_sps",
    "second_sps", "ratio"}...], "ratio_median", "ratio_min", "ratio_max",
    "first_sps_median", "second_sps_median"}, where ratio is the second's
    samples/s over the first's; or {"skipped": why} when either is not
    available or fails (the rest of the run goes on).
    """
    batches = batch_sequence(prepared.workload)
    expected = [int(prepared.sizes[b].sum()) for b in batches]
    out = {"workload": prepared.workload.name, "first": first.key, "second": second.key}
    for contender in (first, second):
        reason = contender.availability()
        if reason:
            return {**out, "skipped": f"{contender.key}: {reason}"}
    warm_up_files(prepared, batches, cache_control)
    opened: list[Contender] = []
    try:
        for contender in (first, second):
            contender.open(prepared, "warm")
            opened.append(contender)
            # Both time the batches both warmed; each on the path its key names.
            batches, expected = warm_pass(contender, batches, expected,
                                          settings.warm_budget_s)
            contender.check_transport()
        rounds = []
        for k in range(pairs):
            order = (first, second) if k % 2 == 0 else (second, first)
            rates = {c.key: _rate(c, batches, expected, settings.warm_budget_s) for c in order}
            a, b = rates[first.key], rates[second.key]
            rounds.append({"first_sps": a, "second_sps": b, "ratio": b / a})
    except Exception as exc:  # noqa: BLE001 - reported in the results, the run goes on
        return {**out, "skipped": f"failed: {type(exc).__name__}: {exc}"[:300]}
    finally:
        for contender in opened:
            contender.close()
    ratios = [r["ratio"] for r in rounds]
    out.update(pairs=rounds, ratio_median=statistics.median(ratios),
               ratio_min=min(ratios), ratio_max=max(ratios),
               first_sps_median=statistics.median(r["first_sps"] for r in rounds),
               second_sps_median=statistics.median(r["second_sps"] for r in rounds))
    progress(f"bench: paired {first.key} / {second.key} on {prepared.workload.name} warm: "
             f"{second.key} at {out['ratio_median']:.2f}x (pairs {out['ratio_min']:.2f}-"
             f"{out['ratio_max']:.2f})")
    return out


def _rate(contender: Contender, batches: list[np.ndarray], expected: list[int],
          budget_s: float) -> float:
    """Samples/s of one timed run."""
    run = contender.run(batches, expected, budget_s)
    return run.samples / run.elapsed_s
