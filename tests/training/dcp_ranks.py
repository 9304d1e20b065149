"""The ranks of tests/training/test_dcp_checkpoint.py: spawned processes (gloo on the CPU)
that save and load a checkpoint together, and the state dicts they hold.

A rank's state dict is the same in every process that builds it for that
rank and world (fixed seeds): a model and its optimizer after one step
(identical on every rank, as data parallelism keeps them), a tensor sharded
over the ranks (a DTensor), tensors of several dtypes, nested dicts,
non-tensor values and a BytesIO of the rank's own.
"""

from __future__ import annotations

import io
import os
import signal
import traceback

import torch

from dlfs.torch.checkpoint import DLFSReader, DLFSWriter

SHARDED_ROWS = 12


def state_dict(rank: int, world: int, *, zeros: bool = False) -> dict:
    """Rank `rank`'s state (see the module); `zeros`: the same shapes, other values, to
    load into.  Without torch.distributed initialised (`world` 0) the sharded tensor is
    left out."""
    torch.manual_seed(1 if not zeros else 2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(3, 8)).sum().backward()
    optimizer.step()
    generator = torch.Generator().manual_seed(100 + rank + (1000 if zeros else 0))
    own = {
        "f32": torch.rand(33, 7, generator=generator),
        "f16": torch.rand(100, generator=generator).half(),
        "bf16": torch.rand(5, 5, generator=generator).bfloat16(),
        "f64": torch.rand(3, generator=generator).double(),
        "i64": torch.randint(-2**40, 2**40, (17,), generator=generator),
        "u8": torch.randint(0, 255, (1000,), dtype=torch.uint8, generator=generator),
        "bool": torch.rand(9, generator=generator) > 0.5,
        "c64": torch.rand(4, dtype=torch.complex64, generator=generator),
        "nested": {"deeper": {"t": torch.rand(2, 3, 4, generator=generator)},
                   "name": "" if zeros else f"rank {rank}"},
        "blob": io.BytesIO(b"" if zeros else bytes(range(256)) * (rank + 1)),
    }
    state = {"model": model.state_dict(), "optim": optimizer.state_dict(),
             "step": 0 if zeros else 1234, "config": {"lr": 1e-3, "tags": ["a", "b"]},
             f"rank{rank}": own}
    if world:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        full = torch.zeros(SHARDED_ROWS, 5) if zeros else \
            torch.arange(SHARDED_ROWS * 5, dtype=torch.float32).reshape(SHARDED_ROWS, 5)
        state["sharded"] = distribute_tensor(full, init_device_mesh("cpu", (world,)), [Shard(0)])
    return state


def differences(got, want, at: str = "") -> list[str]:
    """Where two state dicts differ (keys, values, dtypes), as readable lines."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{at}: keys {sorted(map(str, got))} != {sorted(map(str, want))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{at}/{k}")]
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{at}: {got!r} != {want!r}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{at}[{i}]")]
    if hasattr(want, "to_local"):  # a DTensor: this rank's shard
        return differences(got.to_local(), want.to_local(), at)
    if isinstance(want, torch.Tensor):
        same = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        return [] if same else [f"{at}: tensor differs"]
    if isinstance(want, io.BytesIO):
        return [] if got.getvalue() == want.getvalue() else [f"{at}: bytes differ"]
    return [] if got == want else [f"{at}: {got!r} != {want!r}"]


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _report(results, rank: int, body) -> None:
    """Run `body()` and put (rank, its result or a traceback) on `results`."""
    try:
        results.put((rank, body()))
    except BaseException:
        results.put((rank, "failed:\n" + traceback.format_exc()))
        raise


def save_then_load(rank: int, world: int, port: int, base: str, results) -> None:
    """`dcp.save` to BASE/sync and `dcp.async_save` (thread) to BASE/async; then load
    both into other values.  Reports the differences found (none: [])."""
    def body():
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        _init(rank, world, port)
        state = state_dict(rank, world)
        dcp.save(state, storage_writer=DLFSWriter(f"{base}/sync", thread_count=3))
        dcp.async_save(state, storage_writer=DLFSWriter(f"{base}/async")).result()
        found = []
        for name in ("sync", "async"):
            out = state_dict(rank, world, zeros=True)
            dcp.load(out, storage_reader=DLFSReader(f"{base}/{name}"))
            found += [f"{name}: {d}" for d in differences(out, state_dict(rank, world))]
        dist.destroy_process_group()
        return found
    _report(results, rank, body)


def async_save_in_a_process(rank: int, world: int, port: int, base: str, results) -> None:
    """`dcp.async_save` with the process-based executor (a checkpoint process per rank,
    the writer pickled into it), then a load here.  Reports the differences."""
    def body():
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        _init(rank, world, port)
        state = state_dict(rank, world)
        future = dcp.async_save(state, storage_writer=DLFSWriter(base),
                                async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        future.result()
        out = state_dict(rank, world, zeros=True)
        dcp.load(out, storage_reader=DLFSReader(base))
        found = differences(out, state_dict(rank, world))
        dist.barrier()
        dist.destroy_process_group()
        return found
    _report(results, rank, body)


class DiesBeforeTheRename(DLFSWriter):
    """A coordinator killed (SIGKILL) in its finish, after `.metadata.tmp` is closed and
    before the rename that commits the checkpoint."""

    def _publish(self, space, temporary, final) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def save_twice_dying_in_the_second(rank: int, world: int, port: int, base: str,
                                   results) -> None:
    """Save BASE/step1 whole, report, then save BASE/step2 with a coordinator that dies
    before its commit (the other ranks wait for it until they are killed)."""
    import torch.distributed.checkpoint as dcp

    _init(rank, world, port)
    state = state_dict(rank, world)
    dcp.save(state, storage_writer=DLFSWriter(f"{base}/step1"))
    results.put((rank, "step1 saved"))
    writer = DiesBeforeTheRename if rank == 0 else DLFSWriter
    dcp.save(state, storage_writer=writer(f"{base}/step2"))
    results.put((rank, "step2 saved: the coordinator did not die"))
