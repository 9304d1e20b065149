"""Whatever disk operation fails, a restart finds one whole version of every dataset.

A randomized loop drives the daemon's fault hook (`dlfs.server.core.faults`,
``DLFS_FAULT=OP:N:ACTION``): an errno or a SIGKILL at a random step of an
ingest, a resumable ingest (then resumed), a replace, a delete, or the
catalog replay and compaction at start.
After each fault the daemon is restarted without one and checked: every
dataset name serves exactly one whole version whose bytes match a source
it was given (the old one or the new one, the new one if the call
succeeded), nothing acknowledged is lost, and the extents of deleted,
replaced and aborted datasets are gone from the disk.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

import dlfs
from dlfs import Client
from dlfs.tools.launch import LaunchError
from helpers.daemons import read_dataset
from helpers.trees import write_tree
from helpers.waiting import wait_until

# Injected faults the loop must see fire (each followed by a restart and the checks).
FAULTS_MIN = int(os.environ.get("DLFS_FAULTS_MIN", "50"))
ITERATIONS_MAX = 4 * FAULTS_MIN
# Disk operations one small ingest, replace or delete performs (measured with
# the hook's counting; a plan past the last call simply does not fire).
OP_CALLS = {
    "ingest": {"mkdir": 1, "create": 4, "write": 19, "fsync": 10, "any": 34},
    "resumable": {"mkdir": 1, "create": 4, "write": 30, "fsync": 24, "any": 60},
    "replace": {"mkdir": 1, "create": 4, "write": 19, "fsync": 11, "unlink": 1, "any": 36},
    "delete": {"write": 1, "fsync": 2, "unlink": 1, "any": 4},
    "restart": {"create": 2, "write": 2, "fsync": 6, "rename": 2, "unlink": 3, "truncate": 1,
                "any": 14},
}
ACTIONS = ("EIO", "ENOSPC", "EIO", "kill")
DAEMON_ARGS = ["--extent-bytes-max", "65536", "--catalog-compact-dead-bytes-min", "0",
               "--ingest-checkpoint-bytes", "60000"]  # several checkpoints per ingest


class Versions:
    """Source trees handed out, by content, and what each name may serve."""

    def __init__(self, root, rng: random.Random):
        self.root = root
        self.rng = rng
        self.trees: dict[str, dict[str, bytes]] = {}
        self.allowed: dict[str, set[str]] = {}  # name -> version keys it may serve
        self.to_resume: dict[str, str] = {}  # name -> key of a resumable ingest that failed

    def new(self) -> str:
        key = f"v{len(self.trees)}"
        files = {f"d{i % 3}/{key}_{i:02d}.bin": self.rng.randbytes(self.rng.randrange(1, 30000))
                 for i in range(12)}
        write_tree(self.root / key, files)
        self.trees[key] = files
        return key

    def path(self, key: str) -> str:
        return str(self.root / key)


def finish_resumes(daemon, versions: Versions) -> None:
    """`--resume` every resumable ingest that failed: each must end sealed and whole
    (from what it kept durably, or from the start if nothing was kept)."""
    with Client(daemon.address, timeout_s=60) as client:
        for name, key in sorted(versions.to_resume.items()):
            try:
                client.ingest(versions.path(key), name, resume=True)
            except dlfs.AlreadyExists:  # it had sealed before the fault: checked below
                continue
            versions.allowed[name] = {key}
    versions.to_resume.clear()


def check_whole_versions(daemon, versions: Versions) -> None:
    """Every name serves one allowed version whole; nothing else exists; no stray extents.
    Narrows each name's allowed versions to the one it serves."""
    with Client(daemon.address) as client:
        served = {info.name for info in client.dataset_infos()}
        unexpected = served - set(versions.allowed)
        assert not unexpected, f"unexpected datasets {unexpected}"
        for name, allowed in list(versions.allowed.items()):
            if name not in served:
                assert None in allowed, f"dataset {name!r} was lost (it may only be {allowed})"
                del versions.allowed[name]
                continue
            content = read_dataset(client, name)
            matches = [k for k in allowed if k is not None and versions.trees[k] == content]
            assert matches, (f"dataset {name!r} serves {len(content)} files matching none of "
                             f"its versions {sorted(k for k in allowed if k)}")
            versions.allowed[name] = {matches[0]}
    extent_dirs = os.listdir(os.path.join(daemon.data_dir, "extents"))
    assert len(extent_dirs) == len(served), (
        f"{len(extent_dirs)} extent directories for {len(served)} datasets: space not reclaimed")


@pytest.mark.slow
def test_random_faults_always_leave_one_whole_version(daemon_factory, tmp_path):
    rng = random.Random(int(os.environ.get("DLFS_FAULTS_SEED", "2026")))
    versions = Versions(tmp_path / "src", rng)
    daemon = daemon_factory(extra_args=DAEMON_ARGS)
    with Client(daemon.address) as client:
        for name in ("keep", "rep", "victim"):
            key = versions.new()
            client.ingest(versions.path(key), name)
            versions.allowed[name] = {key}
    outcomes: dict[str, int] = {}
    fired = iterations = 0
    while fired < FAULTS_MIN and iterations < ITERATIONS_MAX:
        iterations += 1
        scenario = rng.choice(("ingest", "resumable", "replace", "delete", "restart"))
        op = rng.choice(sorted(OP_CALLS[scenario]))
        spec = f"{op}:{rng.randint(1, OP_CALLS[scenario][op])}:{rng.choice(ACTIONS)}"
        if scenario == "restart":
            spec += ":startup"
        if "victim" not in versions.allowed:
            with Client(daemon.address) as client:
                key = versions.new()
                client.ingest(versions.path(key), "victim")
                versions.allowed["victim"] = {key}
        daemon.stop()
        before = daemon.log().count("fault injected:")
        daemon.extra_env = {"DLFS_FAULT": spec}
        try:
            daemon.start()
        except LaunchError:
            assert scenario == "restart", f"{spec}: the daemon did not start"
        else:
            outcome = run_scenario(daemon, scenario, versions, iterations)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if rng.random() < 0.5:
            daemon.kill()
        else:
            daemon.stop()
        now_fired = daemon.log().count("fault injected:")
        assert now_fired - before <= 1
        fired += now_fired - before
        daemon.extra_env = {}
        daemon.start()
        finish_resumes(daemon, versions)
        check_whole_versions(daemon, versions)
    print(f"fault loop: {fired} faults fired in {iterations} iterations; outcomes {outcomes}")
    assert fired >= FAULTS_MIN, f"only {fired} of {iterations} planned faults fired"
    assert versions.allowed.get("keep"), "the untouched dataset was lost"


def run_scenario(daemon, scenario: str, versions: Versions, iteration: int) -> str:
    """Run one change against a daemon armed with a fault; record what each name may
    serve now.  Returns "ok" or the error's class name."""
    name = {"ingest": f"new{iteration}", "resumable": f"res{iteration}", "replace": "rep",
            "delete": "victim"}.get(scenario)
    if name is None:
        return "restarted"
    key = versions.new() if scenario != "delete" else None
    before = versions.allowed.get(name, {None})
    versions.allowed[name] = before | {key}  # old or new until we know
    try:
        with Client(daemon.address, timeout_s=30) as client:
            if scenario == "delete":
                client.delete(name)
            else:
                client.ingest(versions.path(key), name, replace=scenario == "replace",
                              resumable=scenario == "resumable")
    except (dlfs.DlfsError, OSError) as exc:
        if scenario == "resumable":
            versions.to_resume[name] = key
        return type(exc).__name__
    versions.allowed[name] = {key}  # acknowledged: only the new state will do
    return "ok"


@pytest.mark.parametrize("spec", ["fsync:1:EIO", "write:1:ENOSPC"])
def test_a_failed_delete_keeps_the_dataset_listed_and_whole(daemon_factory, tmp_path, spec):
    files = {f"{i}.bin": os.urandom(1000 + i) for i in range(5)}
    write_tree(tmp_path / "src", files)
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    daemon.stop()
    daemon.extra_env = {"DLFS_FAULT": spec}
    daemon.start()
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.DlfsError) as raised:
            client.delete("ds")
        assert "restart" in str(raised.value) or "space" in str(raised.value)
        if spec.startswith("write"):  # the record was cut off cleanly: nothing changed
            assert read_dataset(client, "ds") == files
    daemon.extra_env = {}
    daemon.restart()
    with Client(daemon.address) as client:
        names = [i.name for i in client.dataset_infos()]
        if "ds" in names:
            assert read_dataset(client, "ds") == files
        assert len(os.listdir(os.path.join(daemon.data_dir, "extents"))) == len(names)


def test_a_replace_whose_seal_fsync_fails_keeps_one_whole_version(daemon_factory, tmp_path):
    old = {f"{i}.bin": os.urandom(2000) for i in range(6)}
    new = {f"{i}.bin": os.urandom(3000) for i in range(6)}
    write_tree(tmp_path / "old", old)
    write_tree(tmp_path / "new", new)
    daemon = daemon_factory()
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "old"), "ds")
    # The ingest's fsyncs: extent, its directory, the extents root, then the
    # catalog's SEAL fsync (the fourth): fail exactly that one.
    daemon.stop()
    daemon.extra_env = {"DLFS_FAULT": "fsync:4:EIO"}
    daemon.start()
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.FailedPrecondition, match="restart"):
            client.ingest(str(tmp_path / "new"), "ds", replace=True)
        assert read_dataset(client, "ds") == old  # still the old one until the restart
        with pytest.raises(dlfs.FailedPrecondition, match="accepts no changes"):
            client.delete("ds")
    assert "fault injected: fsync #4" in daemon.log()
    daemon.extra_env = {}
    daemon.restart()
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") in (old, new)
    assert len(os.listdir(os.path.join(daemon.data_dir, "extents"))) == 1


# --- the randomized loop over a cluster: a 3-member etcd and 3 daemons ------------------
# Each iteration runs a striped replace or a rebalance under a planned set of faults,
# while a reader thread reads the whole dataset again and again.  Afterwards every name
# serves one whole version, the same on every member; no batch the reader got mixed
# versions; no member keeps a stray extent directory.
#
# Fault kinds: "member-disk" (one member's disk operation fails with an errno or kills
# it, at a random step of the ingest and its commit), "member-commit-kill" (a member
# SIGKILLed at its commit step: just before its SEAL record, after etcd decided),
# "etcd-leader" (etcd's leader SIGKILLed as the client sends the commit, restarted a
# moment later) and "etcd-restart" (every etcd member SIGKILLed at the commit, then
# restarted).  The last three are required: until each fired REQUIRED_EACH times, an
# iteration runs a plan holding one that is missing with probability REQUIRED_SHARE
# (and always once FAULTS_MIN fired), so they occur by schedule, not by luck.
STRIPED_FAULTS_MIN = int(os.environ.get("DLFS_STRIPED_FAULTS_MIN", "50"))
REQUIRED_KINDS = ("member-commit-kill", "etcd-leader", "etcd-restart")
REQUIRED_EACH = 3
REQUIRED_SHARE = 0.3
# What one iteration may hold (drawn with these repeats); two faults in one iteration:
# an etcd fault at the commit and a member killed as it applies that commit.
PLANS = [("member-disk",)] * 3 + [
    ("member-commit-kill",), ("etcd-leader",), ("etcd-restart",),
    ("etcd-leader", "member-commit-kill"), ("etcd-restart", "member-commit-kill")]
# A member's lease as short as etcd grants: a killed member leaves the list in 2 s.
STRIPED_ARGS = ["--extent-bytes-max", "65536", "--member-lease-ttl-s", "2"]
# Disk operations of one member during a striped replace or rebalance and its commit
# (calls counted from the moment it serves; a plan past the last one does not fire).
STRIPED_OP_CALLS = [("fsync", 8), ("write", 12), ("create", 3), ("mkdir", 1), ("unlink", 1),
                    ("any", 30)]
# A bound for each wait on the cluster to settle (a hang, not a speed target).
SETTLE_S = 60.0


def ingests_running(daemons) -> int:
    """Ingests running (receiving or prepared) on all of `daemons`."""
    running = 0
    for daemon in daemons:
        with Client(daemon.address) as client:
            running += client.status().ingests_running
    return running


class MixedReadWatch:
    """A reader thread that reads dataset `name` whole, batch after batch, through its own
    cluster client, and records every batch that is not exactly one version of
    `versions` (by id, in path order).  Errors while the cluster changes are allowed."""

    def __init__(self, client: Client, name: str, versions: Versions, samples: int):
        self.client, self.name, self.versions, self.samples = client, name, versions, samples
        self.batches = 0
        self.mixed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        by_version = {key: [tree[p] for p in sorted(tree)] for key, tree in
                      self.versions.trees.items()}
        while not self._stop.wait(0.05):
            try:
                batch = [bytes(s) for s in self.client.get_batch(range(self.samples),
                                                                 dataset=self.name)]
            except (dlfs.DlfsError, OSError):
                continue
            self.batches += 1
            for key, files in list(self.versions.trees.items()):
                if key not in by_version:
                    by_version[key] = [files[p] for p in sorted(files)]
            if not any(batch == whole for whole in by_version.values()):
                self.mixed.append(f"batch {self.batches}: not one whole version")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(SETTLE_S)


@pytest.mark.cluster
def test_random_faults_during_striped_commits_and_rebalances(daemon_factory, tmp_path,
                                                               monkeypatch):
    from dlfs.client.cluster.etcd_commit import ClusterChange
    from dlfs.tools.launch import EtcdCluster

    rng = random.Random(int(os.environ.get("DLFS_FAULTS_SEED", "2026")) + 1)
    versions = Versions(tmp_path / "src", rng)
    commit = ClusterChange.commit
    started = time.monotonic()
    phases = {"arm": 0.0, "change": 0.0, "recover": 0.0, "settle": 0.0, "check": 0.0}
    with EtcdCluster(str(tmp_path / "etcd"), 3) as etcd:
        args = ["--etcd", etcd.urls, "--cluster", "faults"] + STRIPED_ARGS
        daemons = [daemon_factory(extra_args=args) for _ in range(3)]

        def client(**options) -> Client:
            return Client(etcd=etcd.urls, cluster="faults", **options)

        key = versions.new()
        with client() as c:
            c.ingest(versions.path(key), "s", replicas=2)
        versions.allowed["s"] = {key}
        fired = iterations = 0
        kinds: dict[str, int] = {}
        outcomes: dict[str, int] = {}

        def missing() -> list[str]:
            return [k for k in REQUIRED_KINDS if kinds.get(k, 0) < REQUIRED_EACH]

        reader = client(reconnect_timeout_s=1)
        watch = MixedReadWatch(reader, "s", versions, len(versions.trees[key]))
        try:
            while (fired < STRIPED_FAULTS_MIN or missing()) \
                    and iterations < 4 * STRIPED_FAULTS_MIN:
                iterations += 1
                if missing() and (fired >= STRIPED_FAULTS_MIN or rng.random() < REQUIRED_SHARE):
                    plan = rng.choice([p for p in PLANS if missing()[0] in p])
                else:
                    plan = rng.choice(PLANS)
                clock = time.monotonic()
                victim = rng.choice(daemons)
                before = victim.log().count("fault injected:")
                spec = ""
                if "member-disk" in plan:
                    op, calls = rng.choice(STRIPED_OP_CALLS)
                    spec = f"{op}:{rng.randint(1, calls)}:{rng.choice(ACTIONS)}"
                elif "member-commit-kill" in plan:
                    spec = "seal:1:kill"
                if spec:
                    victim.stop()
                    victim.extra_env = {"DLFS_FAULT": spec}
                    victim.start_again()
                etcd_faults: list[str] = []
                restarts: list[threading.Timer] = []
                etcd_kind = next((k for k in plan if k.startswith("etcd")), None)
                if etcd_kind is not None:
                    def faulty_commit(change, record, kind=etcd_kind):
                        # One etcd fault per change: a commit tried again must not kill an
                        # etcd that its restart timer is still bringing up.
                        if not etcd_faults:
                            if kind == "etcd-leader":
                                leader = etcd.leader()
                                leader.kill()
                                restart = leader.start_again
                            else:  # the whole etcd restarts while the commit waits
                                etcd.kill()
                                restart = etcd.start
                            timer = threading.Timer(rng.uniform(0.1, 1.0), restart)
                            timer.start()
                            restarts.append(timer)
                            etcd_faults.append(kind)
                        return commit(change, record)

                    monkeypatch.setattr(ClusterChange, "commit", faulty_commit)
                phases["arm"] += time.monotonic() - clock
                clock = time.monotonic()
                scenario = rng.choice(("replace", "rebalance"))
                new = versions.new() if scenario == "replace" else None
                if new is not None:
                    versions.allowed["s"] = versions.allowed["s"] | {new}
                try:
                    with client(reconnect_timeout_s=1, timeout_s=30) as c:
                        if new is not None:
                            c.ingest(versions.path(new), "s", replace=True, replicas=2)
                        else:
                            c.rebalance("s", replicas=rng.choice((1, 2, 3)))
                except (dlfs.DlfsError, OSError) as exc:
                    outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                else:
                    outcomes["ok"] = outcomes.get("ok", 0) + 1
                    if new is not None:
                        versions.allowed["s"] = {new}
                monkeypatch.undo()
                phases["change"] += time.monotonic() - clock
                clock = time.monotonic()
                member_fired = victim.log().count("fault injected:") - before
                assert member_fired <= 1
                for kind in etcd_faults + (["member-disk" if "member-disk" in plan else
                                            "member-commit-kill"] if member_fired else []):
                    kinds[kind] = kinds.get(kind, 0) + 1
                fired += member_fired + len(etcd_faults)
                for timer in restarts:  # etcd back and healthy before the next fault
                    timer.join(SETTLE_S)
                for member in etcd.members:
                    wait_until(member.alive, "etcd to be restarted", SETTLE_S)
                if spec:
                    victim.stop() if rng.random() < 0.5 else victim.kill()
                    victim.extra_env = {}
                    victim.start_again()
                phases["recover"] += time.monotonic() - clock
                clock = time.monotonic()
                wait_until(lambda: ingests_running(daemons) == 0,
                           "every prepared ingest to apply etcd's decision", SETTLE_S)
                with client() as c:
                    wait_until(lambda: len(c.transport.view.refresh().members) == 3,
                               "every member to hold a lease again", SETTLE_S)
                    wait_until(lambda: not c.dataset_infos()[0].disagreement,
                               "every member to publish the version etcd holds", SETTLE_S)
                    phases["settle"] += time.monotonic() - clock
                    clock = time.monotonic()
                    content = read_dataset(c, "s")  # every batch names one generation
                matches = [k for k in versions.allowed["s"] if versions.trees[k] == content]
                assert matches, f"{plan} on {victim.address} during {scenario}: no whole version"
                versions.allowed["s"] = {matches[0]}
                # No member keeps an older version's extents.  A member that was silent
                # when a replace began is left out of it and holds none (it was read
                # whole from the others just above).
                for daemon in daemons:
                    dirs = os.listdir(os.path.join(daemon.data_dir, "extents"))
                    assert len(dirs) <= 1, f"{daemon.address} keeps {len(dirs)} extent directories"
                phases["check"] += time.monotonic() - clock
        finally:
            watch.close()
            reader.close()
    took = time.monotonic() - started
    print(f"striped fault loop: {fired} faults fired in {iterations} iterations, {took:.0f} s "
          f"({', '.join(f'{k} {v:.0f} s' for k, v in phases.items())}); kinds {kinds}; "
          f"outcomes {outcomes}; the reader read {watch.batches} whole batches, "
          f"{len(watch.mixed)} mixed")
    assert not watch.mixed, watch.mixed[:5]
    assert watch.batches > 0
    assert fired >= STRIPED_FAULTS_MIN
    assert all(kinds.get(kind, 0) >= REQUIRED_EACH for kind in REQUIRED_KINDS), kinds
