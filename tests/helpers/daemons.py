"""What a test asks of running daemons: a dataset's bytes, their addresses, the samples
one stores, its metrics, its extents out of the page cache."""

from __future__ import annotations

import os
import time


def read_dataset(client, name: str, batch: int = 256) -> dict[str, bytes]:
    """Every sample of dataset `name` as path -> bytes, `batch` samples per get_batch."""
    ds = client.dataset(name)
    paths = ds.paths()  # one Lookup per 65,536 samples, not one per sample
    found = {}
    for start in range(0, len(ds), batch):
        ids = range(start, min(start + batch, len(ds)))
        found.update((paths[i], bytes(s)) for i, s in zip(ids, ds.get_batch(ids)))
    return found


def addresses(daemons) -> list[str]:
    return [d.address for d in daemons]


def local_samples(address: str, name: str) -> int:
    """Samples of dataset `name` the daemon at `address` stores itself (not remote)."""
    import grpc
    import numpy as np

    from dlfs.proto import dlfs_pb2 as pb
    from dlfs.proto import dlfs_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        extents = b"".join(c.extent for c in stub.GetIndex(pb.GetIndexRequest(dataset=name),
                                                           timeout=10))
    return int((np.frombuffer(extents, "<u4") != 0xFFFFFFFF).sum())


def metric_samples(client) -> dict[tuple[str, tuple], float]:
    """{(sample name, its labels as sorted (name, value) pairs): value} from the
    daemon's Prometheus endpoint (the daemon needs --metrics-listen)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    address = client.status().metrics_address
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def evict_extents(daemon) -> None:
    """Drop every extent file of `daemon` from the page cache (POSIX_FADV_DONTNEED): its
    next reads of them go to the device.  Pages the daemon has mapped (small samples
    are sent from mappings of cached extents) cannot be dropped until it unmaps them,
    within `limits.extent_map_idle_s` and a sweep of its last read: this waits for that."""
    from dlfs import limits
    from dlfs.server.read import residency

    extent_dir = os.path.join(daemon.data_dir, "extents")
    give_up = time.monotonic() + 2 * limits.extent_map_idle_s + 5
    while True:
        left = 0
        for dataset_dir in os.listdir(extent_dir):
            for name in os.listdir(os.path.join(extent_dir, dataset_dir)):
                fd = os.open(os.path.join(extent_dir, dataset_dir, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    left += residency.cached_pages(fd, 0, os.fstat(fd).st_size) or 0
                finally:
                    os.close(fd)
        if not left or time.monotonic() > give_up:
            return
        time.sleep(0.1)
