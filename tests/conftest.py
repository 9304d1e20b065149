"""The fixtures of several folders (real `dlfs-server` processes on 127.0.0.1:0, etcd,
the C or Python exchange and send), and the markers by what a test starts.  Helpers
are in tests/helpers/, never imported from here."""

from __future__ import annotations

import os

import pytest

from dlfs import Client
from dlfs.tools.launch import (DaemonProcess, EtcdCluster, EtcdProcess, MountProcess,
                               etcd_unavailable, fuse_unavailable)
from helpers.trees import unique_name

# The markers (pyproject.toml registers them; --strict-markers refuses any other), each
# named for what its tests start or need, and the fixtures that give a test each one:
# a test using `etcd_server` starts etcd, so it is a `cluster` test.  `--fast` leaves
# out every test with one of these markers.  A `mount` test is skipped on a developer
# machine without FUSE (under CI, which .ci/run sets, a missing FUSE is a failure).
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
            kept = set(fast)
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
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


@pytest.fixture
def mount_factory(tmp_path):
    """mount(address, *args) -> MountProcess: a foreground mount on a fresh directory."""
    mounts: list[MountProcess] = []

    def mount(address: str, *args: str) -> MountProcess:
        index = len(mounts)
        m = MountProcess(address, str(tmp_path / f"mnt{index}"),
                         str(tmp_path / f"mount{index}.log"), list(args))
        mounts.append(m)
        return m.start()

    yield mount
    for m in mounts:
        m.unmount()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The address of a daemon started as `./dev demo` starts it (`dlfs-server --demo`),
    on a port of its own: what the examples' DEMO_ADDRESS becomes."""
    root = tmp_path_factory.mktemp("demo")
    daemon = DaemonProcess(str(root / "data"), str(root / "daemon.log"), ["--demo"])
    daemon.start()
    yield daemon.address
    daemon.kill()
