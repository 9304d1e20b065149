"""Ingests into and reads from a `Store` in the test's own process (no daemon)."""

from __future__ import annotations


def store_ingest(store, name: str, files: dict[str, bytes], replace: bool = False):
    """Ingest `files` (path -> bytes) into an in-process `Store` and commit."""
    session = store.ingests.begin(name, replace)
    for path, data in files.items():
        session.start_file(path, len(data), 0o100644, 1)
        session.write(data)
    return store.ingests.commit(session)


def store_read(store, dataset, ids) -> list[bytes]:
    """Samples `ids` of `dataset` read through an in-process `Store`, in request order."""
    _, plan = store.reads.plan(dataset, ids=list(ids))
    payload = bytearray(plan.payload_bytes)
    for start, window in store.reads.read(dataset, plan):
        payload[start:start + len(window)] = window
    return [bytes(payload[o:o + n]) for o, n in zip(plan.request_offsets.tolist(),
                                                   plan.request_lengths.tolist())]
