"""Shared fixtures: real `dlfs-server` processes on 127.0.0.1:0, real files."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from dlfs import Client
from dlfs.tools.launch import (DaemonProcess, EtcdCluster, EtcdProcess, MountProcess,
                               etcd_unavailable, fuse_unavailable)

# A test that mounts: marked `mount`, and skipped on a developer machine without FUSE
# (under CI, which .ci/run sets, a missing FUSE is a failure, not a skip).
requires_fuse = pytest.mark.mount

# The markers (pyproject.toml registers them; --strict-markers refuses any other), each
# named for what its tests start or need, and the fixtures that give a test each one:
# a test using `etcd_server` starts etcd, so it is a `cluster` test.  `--fast` leaves
# out every test with one of these markers.
SLOW_KINDS = ("slow", "soak", "daemons", "cluster", "mount", "deploy", "dlio")
MARKER_OF_FIXTURE = {"daemon_factory": "daemons", "etcd_server": "cluster",
                     "cluster": "cluster", "mount_factory": "mount",
                     "slurm_cluster": "deploy"}
# Folders whose every test has the marker: tests/deploy runs Slurm, systemd's tools
# and the Kubernetes schemas; tests/bench runs the benchmarks' quick modes.
MARKER_OF_FOLDER = {"deploy": "deploy", "bench": "slow"}


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="leave out the tests marked " + ", ".join(SLOW_KINDS) +
                     " (./dev test --fast)")


def pytest_collection_modifyitems(config, items):
    tests_dir = os.path.dirname(__file__)
    no_fuse = not os.environ.get("CI") and fuse_unavailable()
    for item in items:
        for fixture in item.fixturenames:
            if fixture in MARKER_OF_FIXTURE:
                item.add_marker(MARKER_OF_FIXTURE[fixture])
        folder = os.path.relpath(str(item.path), tests_dir).split(os.sep)[0]
        if folder in MARKER_OF_FOLDER:
            item.add_marker(MARKER_OF_FOLDER[folder])
        if no_fuse and item.get_closest_marker("mount"):
            item.add_marker(pytest.mark.skip(reason=f"FUSE is not available: {no_fuse}"))
    if config.getoption("--fast"):
        fast = [item for item in items
                if not any(item.get_closest_marker(kind) for kind in SLOW_KINDS)]
        if len(fast) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in fast])
            items[:] = fast


# The test whose setup, call or teardown runs now (module fixtures start in its setup),
# and the scopes of the fixtures being set up for it now, innermost last.
_RUNNING: list[pytest.Item] = []
_SETTING_UP: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING.append(item)
    try:
        yield
    finally:
        _RUNNING.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    _SETTING_UP.append(fixturedef.scope)
    try:
        yield
    finally:
        _SETTING_UP.pop()


def _marked_to_start(cls, method: str, marker: str, what: str,
                     shared_ok: bool = False) -> None:
    """Make `cls.method` fail a test that starts `what` without `marker` (with
    `shared_ok`, unless a module's or session's fixture starts it: one for many
    tests), so that the markers stay true as tests are added."""
    start = getattr(cls, method)

    def checked(self, *args, **kwargs):
        shared = shared_ok and any(scope != "function" for scope in _SETTING_UP)
        if _RUNNING and not shared and not _RUNNING[-1].get_closest_marker(marker):
            raise AssertionError(f"{_RUNNING[-1].nodeid} starts {what}: mark it "
                                 f"@pytest.mark.{marker} (or use a fixture that does)")
        return start(self, *args, **kwargs)

    setattr(cls, method, checked)


def pytest_configure(config):
    _marked_to_start(EtcdProcess, "launch", "cluster", "etcd")
    _marked_to_start(MountProcess, "start", "mount", "a FUSE mount")
    _marked_to_start(DaemonProcess, "start", "daemons", "a dlfs-server of its own",
                     shared_ok=True)


@pytest.fixture
def daemon_factory(tmp_path):
    """Start daemons on fresh (or given) data dirs; all are killed at teardown."""
    started: list[DaemonProcess] = []

    def make(data_dir: str | None = None, extra_args: list[str] | None = None,
             start: bool = True) -> DaemonProcess:
        index = len(started)
        data_dir = data_dir or str(tmp_path / f"data{index}")
        daemon = DaemonProcess(data_dir, str(tmp_path / f"daemon{index}.log"), extra_args)
        started.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield make
    for daemon in started:
        daemon.kill()


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    """One etcd on loopback per test module (Debian's etcd-server); each test makes its
    own cluster in it (`cluster`), so tests never see each other's keys."""
    assert not etcd_unavailable(), etcd_unavailable()
    with EtcdCluster(str(tmp_path_factory.mktemp("etcd")), 1) as etcd:
        yield etcd


class ClusterFixture:
    """A DLFS cluster of this test in `etcd` (an `EtcdCluster`): daemons started with
    --etcd and a cluster name of its own, and clients that find them there."""

    def __init__(self, etcd, daemon_factory):
        self.etcd = etcd
        self.urls = etcd.urls
        self.name = unique_name("cluster")
        self._daemon_factory = daemon_factory

    def args(self) -> list[str]:
        return ["--etcd", self.urls, "--cluster", self.name]

    def start(self, count: int, extra_args: list[str] | None = None) -> list[DaemonProcess]:
        return [self._daemon_factory(extra_args=self.args() + list(extra_args or []))
                for _ in range(count)]

    def client(self, **options) -> Client:
        return Client(etcd=self.urls, cluster=self.name, **options)

    def cli(self) -> list[str]:
        return ["--etcd", self.urls, "--cluster", self.name]


@pytest.fixture
def cluster(etcd_server, daemon_factory) -> ClusterFixture:
    return ClusterFixture(etcd_server, daemon_factory)


@pytest.fixture
def daemon(daemon_factory) -> DaemonProcess:
    return daemon_factory()


@pytest.fixture
def client(daemon):
    with Client(daemon.address, reconnect_timeout_s=5.0) as c:
        yield c


@pytest.fixture(params=["native", "python"])
def exchange(request, monkeypatch):
    """Which exchange a client's GET_BATCH takes in this process: the C one (it must
    have been built here: `./dev setup` installs the compiler) or the Python one."""
    from dlfs.client.transport import datapath_conn

    if request.param == "native":
        assert datapath_conn.native is not None, "the C exchange was not built"
    else:
        monkeypatch.setattr(datapath_conn, "native", None)
    return request.param


@pytest.fixture(params=["native", "python"])
def daemon_send(request, monkeypatch):
    """Which send daemons started in this test use for whole replies from mappings: the C
    one (it must have been built here) or the Python one (DLFS_NATIVE=0 in their
    environment; this process's client keeps the exchange it imported)."""
    from dlfs.server.read import mapped_sends

    if request.param == "native":
        assert mapped_sends.native is not None, "the daemon's C send was not built"
    else:
        monkeypatch.setenv("DLFS_NATIVE", "0")
    return request.param


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory):
    """One daemon per test module, for tests that only add uniquely named datasets."""
    root = tmp_path_factory.mktemp("shared")
    d = DaemonProcess(str(root / "data"), str(root / "daemon.log"))
    d.start()
    yield d
    d.kill()


@pytest.fixture
def shared_client(shared_daemon):
    with Client(shared_daemon.address, reconnect_timeout_s=5.0) as c:
        yield c


def write_tree(root, files: dict[str, bytes]) -> None:
    """Create `files` (relative path -> contents) below `root`."""
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def read_dataset(client, name: str, batch: int = 256) -> dict[str, bytes]:
    """Every sample of dataset `name` as path -> bytes, `batch` samples per get_batch."""
    ds = client.dataset(name)
    paths = ds.paths()  # one Lookup per 65,536 samples, not one per sample
    found = {}
    for start in range(0, len(ds), batch):
        ids = range(start, min(start + batch, len(ds)))
        found.update((paths[i], bytes(s)) for i, s in zip(ids, ds.get_batch(ids)))
    return found


def wait_until(condition, what: str, timeout_s: float) -> None:
    """Poll `condition()` until it holds; fail naming `what` after `timeout_s` (a bound
    for a hang on a loaded machine, not a speed target)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened within {timeout_s:g} s: {what}"
        time.sleep(0.1)


def unique_name(prefix: str = "ds") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


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
