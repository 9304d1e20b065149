"""How a cluster client lists a striped ingest its members hold parked
(`dlfs.client.metadata.cluster_listing`, a pure function of etcd's state and the
members' own listings)."""

from __future__ import annotations

import types

from dlfs.client.metadata import cluster_listing
from dlfs.types import DatasetInfo

NO_STATE = types.SimpleNamespace(datasets={}, intents={})


def unsealed(name: str, samples: int, state: str) -> DatasetInfo:
    return DatasetInfo(name, samples, samples * 1000, False, 0, 0, ingest_state=state)


def test_an_ingest_every_member_parked_is_parked_with_all_of_them():
    found, = cluster_listing(NO_STATE, {"a:1": [unsealed("pets", 160, "parked")],
                                        "b:1": [unsealed("pets", 150, "parked")]})
    assert (found.name, found.ingest_state, found.members) == ("pets", "parked",
                                                               ("a:1", "b:1"))
    assert (found.samples, found.bytes) == (160, 310_000)


def test_an_ingest_a_member_still_receives_is_not_parked_yet():
    """The member that has not noticed the stream's end yet (or began a resume) counts:
    `dlfs ingest` interrupted waits for it before it says how many members keep files."""
    found, = cluster_listing(NO_STATE, {"a:1": [unsealed("pets", 160, "parked")],
                                        "b:1": [unsealed("pets", 90, "receiving")],
                                        "c:1": RuntimeError("unreachable")})
    assert (found.ingest_state, found.members) == ("receiving", ("a:1", "b:1"))
