"""The benchmark's rows, in table order: baselines, DLFS, then the self-timed ceilings."""

from __future__ import annotations

from bench.ceilings import Fio, RawTcp, RawTcpMapped, RawUnixSendfile
from bench.contenders import (BenchEnv, Contender, DlfsDirect, DlfsFuse, DlfsGetBatch, DlfsOut,
                              DlfsPrefetch, Ext4Files, Lmdb)


def all_contenders(env: BenchEnv) -> list[Contender]:
    """Every row, in table order: baselines, DLFS, then the self-timed ceilings."""
    return [Ext4Files(env, 1), Ext4Files(env, 8), Lmdb(env), Lmdb(env, readahead=False),
            DlfsGetBatch(env, "grpc", 1), DlfsGetBatch(env, "grpc", 4), DlfsPrefetch(env, "grpc"),
            DlfsGetBatch(env, "tcp", 1), DlfsGetBatch(env, "tcp", 4), DlfsPrefetch(env, "tcp"),
            DlfsOut(env, "tcp"), DlfsGetBatch(env, "unix", 1),
            DlfsFuse(env), DlfsDirect(env), Fio(env), RawTcp(env), RawUnixSendfile(env),
            RawTcpMapped(env)]
