"""DLFS benchmark harness (issue 4): `python -m bench [--quick]`.

Every contender reads the same generated data with the same seeded batch
sequence, cold and warm, in one run; `report.py` prints the ratios to ext4
one-file-per-sample.  See bench/README.md.

Modules, in the order data flows:

- `datagen`     generate the workloads (cached between runs) in three stores:
                a one-file-per-sample tree, an LMDB, a DLFS data dir
- `processes`   the daemon as `dlfs.tools.launch` starts it, logging warnings only
- `contenders`  one class per way of reading a batch
- `ceilings`    the limits, timing themselves: fio, raw TCP, raw Unix sendfile
- `rawsend`     the sender child process of the raw ceilings
- `measure`     timed runs, latency percentiles, CPU seconds, cold/warm page cache, RSS
- `runner`      warm-up and timed runs of every contender on one workload
- `scaling`     1 vs 4 client processes against one daemon (warm 110 KB, TCP)
- `memory`      the sample directory's memory per sample (1,000,000 samples)
- `report`      markdown table, JSON, PNG chart, target checks
- `__main__`    the command line that runs it all
- `profile_dlfs` py-spy on the daemon, pyinstrument on the client (not part of a run)
"""
