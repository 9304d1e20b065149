"""The storage core against a plain-dict model: ingest, replace, delete, abort, restart."""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlfs.server.config import ServerConfig
from dlfs.server.store import Store

names = st.sampled_from(["alpha", "beta", "gamma"])
# Directory names and file names come from disjoint sets, so no path is both.
trees = st.dictionaries(
    st.tuples(st.lists(st.sampled_from(["a", "b", "c d"]), max_size=2),
              st.sampled_from(["x.bin", "y", "z ü"])).map(lambda t: "/".join([*t[0], t[1]])),
    st.binary(max_size=300), min_size=1, max_size=12,
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.data_dir = tempfile.mkdtemp(prefix="dlfs-sm-")
        # Tiny extents so datasets span several files.
        self.config = ServerConfig(data_dir=self.data_dir, extent_bytes_max=8192, reader_threads=3,
                                   chunk_bytes=4096)
        self.store = Store.open(self.config)
        self.model: dict[str, dict[str, bytes]] = {}

    def ingest(self, name, tree, replace=False):
        session = self.store.ingests.begin(name, replace)
        for path in sorted(tree, reverse=True):  # arrival order differs from id order
            data = tree[path]
            session.start_file(path, len(data), 0o100644, 1)
            for start in range(0, len(data), 100):
                session.write(data[start:start + 100])
        self.store.ingests.commit(session)

    @rule(name=names, tree=trees)
    def ingest_new(self, name, tree):
        if name in self.model:
            return
        self.ingest(name, tree)
        self.model[name] = tree

    @precondition(lambda self: self.model)
    @rule(data=st.data(), tree=trees)
    def replace(self, data, tree):
        name = data.draw(st.sampled_from(sorted(self.model)))
        self.ingest(name, tree, replace=True)
        self.model[name] = tree

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete(self, data):
        name = data.draw(st.sampled_from(sorted(self.model)))
        self.store.delete(name)
        del self.model[name]

    @rule(name=names, tree=trees, keep=st.integers(0, 20))
    def abort_midway(self, name, tree, keep):
        if name in self.model:
            return
        session = self.store.ingests.begin(name)
        for path in sorted(tree)[:keep]:
            session.start_file(path, len(tree[path]), 0o100644, 1)
            session.write(tree[path])
        self.store.ingests.abort(session, "test")

    @rule()
    def restart(self):
        self.store.close()
        self.store = Store.open(self.config)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def read_batch(self, data):
        name = data.draw(st.sampled_from(sorted(self.model)))
        tree = self.model[name]
        paths = sorted(tree)
        ids = data.draw(st.lists(st.integers(0, len(paths) - 1), max_size=30))
        dataset = self.store.dataset(name)
        _, plan = self.store.reads.plan(dataset, ids=ids)
        payload = bytearray(plan.payload_bytes)
        for start, window in self.store.reads.read(dataset, plan):
            payload[start:start + len(window)] = window
        got = [bytes(payload[o:o + n]) for o, n in zip(plan.request_offsets.tolist(),
                                                          plan.request_lengths.tolist())]
        assert got == [tree[paths[i]] for i in ids]

    @invariant()
    def directory_matches_model(self):
        assert self.store.directory.names() == sorted(self.model)
        for name, tree in self.model.items():
            dataset = self.store.directory.get(name)
            dataset.check_invariants()
            assert [dataset.path(i) for i in range(len(dataset))] == sorted(tree)
        live = {d.dataset_id for d in self.store.directory.all()}
        assert set(self.store.extents.dataset_ids_on_disk()) == live
        self.store.check_invariants()

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
TestStore = StoreMachine.TestCase
