"""deploy/slurm/: the per-node helper on its own, then the whole batch script
on a real Slurm cluster on this machine, started by the `slurm_cluster`
fixture.

The cluster (munged, slurmctld and two slurmd, from Debian's slurmctld,
slurmd, slurm-client and munge packages) runs as root from a private
directory with its own munge socket and free ports, so it touches no system
Slurm or munge.  The two slurmd are two Slurm nodes on one host (each its own
name and port, half the CPUs), so a job on both runs two daemons and passes
a list of two addresses.  Its tests are skipped, with the reason, when those
programs are missing, when not root (slurmd must be root to start job
steps), or when the cluster does not come up here; every other failure is a
test failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from dlfs import Client
from helpers.trees import write_tree

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
JOB_SCRIPT = os.path.join(REPO, "deploy", "slurm", "dlfs-job.sbatch")
NODE_SCRIPT = os.path.join(REPO, "deploy", "slurm", "dlfs-node.sh")
ETCD_SCRIPT = os.path.join(REPO, "deploy", "slurm", "dlfs-etcd.sh")
BIN_DIR = os.path.dirname(sys.executable)

NODE_START_TIMEOUT_S = 30.0
NODE_STOP_TIMEOUT_S = 30.0
CLUSTER_START_ATTEMPTS = 3
CLUSTER_START_TIMEOUT_S = 30.0
JOB_TIMEOUT_S = 90.0            # one sbatch --wait, from submission to the end of teardown
CANCEL_TIMEOUT_S = 40.0         # scancel until the job has left the queue
DAEMON_STOP_TIMEOUT_S = 10      # DLFS_STOP_TIMEOUT_S given to the scripts
SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel",
                  "squeue", "sinfo")
SLURM_PACKAGES = "slurmctld slurmd slurm-client munge"

FILES = {f"train/{label}/{i:03d}.bin": bytes([i]) * (100 + i)
         for label in ("cat", "dog") for i in range(10)}
FILES["README.txt"] = b"tiny dataset\n"

# The "training command": reads every sample through the Python client from
# the daemon named by DLFS_SERVER, or the cluster in DLFS_ETCD (Client() with
# no address), compares them with the source files, and writes what it saw to
# a marker file.  Exit status 1 on any mismatch.
TRAIN_PY = """\
import json, os, sys
from dlfs import Client
source, marker = sys.argv[1], sys.argv[2]
with open(marker + ".started", "w") as f:
    f.write("started")
with Client(os.environ.get("DLFS_SERVER")) as client:
    dataset = client.dataset(os.environ["DLFS_DATASET"])
    paths = dataset.paths()
    samples = dataset.get_batch(list(range(len(dataset))))
    for path, sample in zip(paths, samples):
        with open(os.path.join(source, path), "rb") as f:
            if f.read() != bytes(sample):
                sys.exit(f"sample {path} differs from the source")
with open(os.environ["DLFS_ADDRESS_FILE"]) as f:
    listed = f.read().strip()
with open(marker, "w") as f:
    json.dump({"samples": len(paths), "server": os.environ.get("DLFS_SERVER"),
               "etcd": os.environ.get("DLFS_ETCD"), "cluster": os.environ.get("DLFS_CLUSTER"),
               "members": list(dataset.info.members), "listed": listed,
               "dataset": os.environ["DLFS_DATASET"], "job_dir": os.environ["DLFS_JOB_DIR"]}, f)
if len(sys.argv) > 3:
    import time
    time.sleep(float(sys.argv[3]))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Slurm's or DLFS's own variables (a
    developer may run the tests inside a Slurm job, or with DLFS_SERVER set)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "DLFS_"))}
    env.update(extra)
    return env


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def _wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s")
        time.sleep(0.1)


# --- dlfs-node.sh without Slurm -------------------------------------------------------------

LOCAL_DIR = "dlfs-77.node1"   # $DLFS_LOCAL_ROOT/dlfs-$SLURM_JOB_ID.$SLURMD_NODENAME


def _node_env(tmp_path, **extra: str) -> dict[str, str]:
    return _clean_env(SLURMD_NODENAME="node1", SLURM_JOB_ID="77", SLURM_STEP_ID="0",
                      DLFS_JOB_DIR=str(tmp_path / "job"), DLFS_LOCAL_ROOT=str(tmp_path / "nvme"),
                      DLFS_BIN_DIR=BIN_DIR, DLFS_LISTEN_HOST="127.0.0.1",
                      DLFS_STOP_TIMEOUT_S=str(DAEMON_STOP_TIMEOUT_S), **extra)


def test_node_script_serves_publishes_and_cleans_up_on_sigterm(tmp_path):
    (tmp_path / "nvme").mkdir()
    env = _node_env(tmp_path)
    address_file = tmp_path / "job" / "nodes" / "node1.address"
    process = subprocess.Popen(["bash", NODE_SCRIPT], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until(lambda: address_file.exists() or process.poll() is not None,
                    NODE_START_TIMEOUT_S, "address file")
        assert process.poll() is None, process.stdout.read()
        address = address_file.read_text().strip()
        assert address.startswith("127.0.0.1:")
        with Client(address) as client:
            assert client.datasets() == []
        assert (tmp_path / "job" / "daemon-step").read_text().strip() == "77.0"
        assert (tmp_path / "nvme" / LOCAL_DIR / "data").is_dir()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=NODE_STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert "dlfs-server stopped" in output
    assert not (tmp_path / "nvme" / LOCAL_DIR).exists()
    assert _processes_mentioning(str(tmp_path / "nvme")) == []
    assert "serving on" in (tmp_path / "job" / "logs" / "node1.log").read_text()


@pytest.mark.daemons
def test_etcd_script_serves_publishes_and_cleans_up_on_sigterm(tmp_path):
    """dlfs-etcd.sh alone: a one-member etcd on loopback in its node-local dir, its URL
    published once healthy; a daemon joins a cluster there; SIGTERM stops etcd and
    removes the dir."""
    from dlfs.tools.launch import DaemonProcess

    (tmp_path / "nvme").mkdir()
    url_file = tmp_path / "job" / "etcd-url"
    process = subprocess.Popen(["bash", ETCD_SCRIPT], env=_node_env(tmp_path),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until(lambda: url_file.exists() or process.poll() is not None,
                    NODE_START_TIMEOUT_S, "etcd URL file")
        assert process.poll() is None, process.stdout.read()
        url = url_file.read_text().strip()
        assert url.startswith("http://127.0.0.1:")
        assert (tmp_path / "job" / "etcd-step").read_text().strip() == "77.0"
        assert (tmp_path / "nvme" / f"{LOCAL_DIR}.etcd" / "data").is_dir()
        with DaemonProcess(str(tmp_path / "member"), str(tmp_path / "member.log"),
                           ["--etcd", url, "--cluster", "job-77"]) as member:
            with Client(etcd=url, cluster="job-77") as client:
                assert client.transport.addresses == (member.address,)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=NODE_STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert "etcd stopped" in output
    assert not (tmp_path / "nvme" / f"{LOCAL_DIR}.etcd").exists()
    assert _processes_mentioning(str(tmp_path / "nvme")) == []


def test_node_script_never_adopts_an_existing_directory(tmp_path):
    existing = tmp_path / "nvme" / LOCAL_DIR
    existing.mkdir(parents=True)
    (existing / "precious").write_text("not ours")
    result = subprocess.run(["bash", NODE_SCRIPT], env=_node_env(tmp_path), capture_output=True,
                            text=True, timeout=NODE_START_TIMEOUT_S)
    assert result.returncode == 1
    assert "exists already" in result.stderr
    assert (existing / "precious").read_text() == "not ours"


def test_node_script_reports_a_daemon_that_cannot_start(tmp_path):
    (tmp_path / "nvme").mkdir()
    env = _node_env(tmp_path, DLFS_SERVER_ARGS="--reader-threads many")
    result = subprocess.run(["bash", NODE_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=NODE_START_TIMEOUT_S)
    assert result.returncode == 1
    assert "dlfs-server exited with status 2 before serving" in result.stderr
    assert "--reader-threads: invalid int value" in result.stderr   # the log's tail
    assert not (tmp_path / "nvme" / LOCAL_DIR).exists()


def test_node_script_refuses_to_run_outside_a_job_step(tmp_path):
    env = _node_env(tmp_path)
    del env["SLURMD_NODENAME"]
    result = subprocess.run(["bash", NODE_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=NODE_START_TIMEOUT_S)
    assert result.returncode == 1 and "only as a task of an srun step" in result.stderr


def test_job_script_refuses_to_run_outside_slurm(tmp_path):
    result = subprocess.run(["bash", JOB_SCRIPT, str(tmp_path), "tiny", "true"], env=_clean_env(),
                            capture_output=True, text=True, timeout=NODE_START_TIMEOUT_S)
    assert result.returncode == 1 and "submit this script with sbatch" in result.stderr
    result = subprocess.run(["bash", JOB_SCRIPT, str(tmp_path)], env=_clean_env(),
                            capture_output=True, text=True, timeout=NODE_START_TIMEOUT_S)
    assert result.returncode == 2 and "usage: sbatch -N NODES" in result.stderr


# --- a real single-node Slurm cluster ---------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


class SlurmCluster:
    """munged + slurmctld + one slurmd per node, in the foreground, as children
    of the tests."""

    nodes = ("n1", "n2")

    def __init__(self, root: str):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(root, "slurm.conf")
        self.env = _clean_env(SLURM_CONF=self.conf)
        self.processes: list[subprocess.Popen] = []

    def write_config(self) -> None:
        munge_dir = os.path.join(self.root, "munge")
        os.mkdir(munge_dir, 0o700)
        with open(os.path.join(munge_dir, "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(munge_dir, "munge.key"), 0o600)
        for name in ("state", "log"):
            os.mkdir(os.path.join(self.root, name))
        # Each node gets half the CPUs (configuring fewer than the hardware
        # has is fine; more would drain the node).
        cpus = max(1, (os.cpu_count() or 2) // len(self.nodes))
        node_lines = "".join(
            f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={_free_port()} "
            f"CPUs={cpus} State=UNKNOWN\n" for node in self.nodes)
        r = self.root
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=dlfstest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=10
InactiveLimit=0
{node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
""")

    def _start(self, argv: list[str], log_name: str) -> None:
        with open(os.path.join(self.root, "log", log_name), "ab") as log:
            self.processes.append(subprocess.Popen(argv, env=self.env, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL))

    def start(self) -> str | None:
        """Start the daemons and wait for every node to be idle; None, or why not (the
        daemons stopped again, their logs' ends included)."""
        r = self.root
        self._start(["munged", "--foreground", "--force", f"--socket={r}/munge/munge.socket",
                     f"--key-file={r}/munge/munge.key", f"--log-file={r}/log/munged.log",
                     f"--pid-file={r}/munge/munged.pid", f"--seed-file={r}/munge/seed"],
                    "munged.out")
        failure = self._wait(lambda: os.path.exists(f"{r}/munge/munge.socket"), "munged")
        if failure:
            return failure
        self._start(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld.out")
        for node in self.nodes:
            self._start(["slurmd", "-D", "-f", self.conf, "-N", node], f"slurmd-{node}.out")
        return self._wait(lambda: self.node_states() == ["idle"] * len(self.nodes),
                          "slurmctld and slurmd (all nodes idle)")

    def node_states(self) -> list[str]:
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env,
                                capture_output=True, text=True, timeout=30)
        return result.stdout.split()

    def _wait(self, ready, what: str) -> str | None:
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while not ready():
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {name}\n{_tail(os.path.join(self.root, 'log', name))}"
                                 for name in sorted(os.listdir(os.path.join(self.root, "log"))))
                self.stop()
                return (f"{what} not ready within {CLUSTER_START_TIMEOUT_S} s "
                        f"(exited: {dead or 'none'})\n{logs}")
            time.sleep(0.2)
        return None

    def queue(self, *args: str) -> list[str]:
        result = subprocess.run(["squeue", "-h", *args], env=self.env, capture_output=True,
                                text=True, timeout=30)
        return result.stdout.split()

    def stop(self) -> None:
        jobs = self.queue("-o", "%i") if self.processes else []
        if jobs:
            subprocess.run(["scancel", *jobs], env=self.env, timeout=30)
            deadline = time.monotonic() + CANCEL_TIMEOUT_S
            while self.queue("-o", "%i") and time.monotonic() < deadline:
                time.sleep(0.5)
        for process in reversed(self.processes):   # slurmd, slurmctld, then munged
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    missing = [p for p in SLURM_PROGRAMS if shutil.which(p) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): "
                    f"apt-get install {SLURM_PACKAGES}")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm cluster needs root: slurmd starts job steps as root")
    # The ports are picked free, then bound by the daemons: another process may take one
    # in between (a slurmd then exits with "Address already in use"), so a failed start
    # is tried again on fresh ports before the tests are skipped.
    for _attempt in range(CLUSTER_START_ATTEMPTS):
        cluster = SlurmCluster(str(tmp_path_factory.mktemp("slurm")))
        cluster.write_config()
        failure = cluster.start()
        if failure is None:
            break
    else:
        pytest.skip(f"Slurm cannot run here ({CLUSTER_START_ATTEMPTS} tries): {failure}")
    yield cluster
    cluster.stop()


class Job:
    def __init__(self, tmp_path, job_id: str, returncode: int | None):
        self.tmp_path = tmp_path
        self.id = job_id
        self.returncode = returncode
        self.marker = tmp_path / "marker.json"
        self.local_root = tmp_path / "nvme"
        self.job_dir = tmp_path / f"dlfs-{job_id}"

    def output(self) -> str:
        path = self.tmp_path / f"job-{self.id}.out"
        return path.read_text(errors="replace") if path.exists() else "(no job output)"

    def assert_torn_down(self) -> None:
        """No daemon and no node-local directory is left behind."""
        assert list(self.local_root.iterdir()) == [], self.output()
        assert _processes_mentioning(str(self.local_root)) == [], self.output()


def _submit(cluster: SlurmCluster, tmp_path, *command: str, wait: bool = True, nodes: int = 1,
            **env_extra: str) -> Job:
    """sbatch the job script as a user would: from the submit directory, by
    its path in deploy/slurm (where it finds dlfs-node.sh)."""
    source = tmp_path / "pfs" / "tiny"
    if not source.exists():
        write_tree(source, FILES)
        (tmp_path / "nvme").mkdir(exist_ok=True)
        (tmp_path / "train.py").write_text(TRAIN_PY)
    env = dict(cluster.env, DLFS_BIN_DIR=BIN_DIR, DLFS_LOCAL_ROOT=str(tmp_path / "nvme"),
               DLFS_LISTEN_HOST="127.0.0.1", DLFS_START_TIMEOUT_S="30",
               DLFS_STOP_TIMEOUT_S=str(DAEMON_STOP_TIMEOUT_S))
    env.update(env_extra)
    argv = ["sbatch", "--parsable", f"--nodes={nodes}", "--time=3", "--output",
            str(tmp_path / "job-%j.out"), *(["--wait"] if wait else []),
            JOB_SCRIPT, str(source), "tiny", *command]
    process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if not wait:
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        return Job(tmp_path, out.strip().split(";")[0], None)
    try:
        out, err = process.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        job_id = out.strip().split(";")[0]
        pytest.fail(f"job {job_id} did not finish within {JOB_TIMEOUT_S} s:\n"
                    + Job(tmp_path, job_id, None).output())
    job_id = out.strip().split(";")[0]
    assert job_id.isdigit(), out + err
    return Job(tmp_path, job_id, process.returncode)


def _train(tmp_path, *extra: str) -> list[str]:
    return [sys.executable, str(tmp_path / "train.py"), str(tmp_path / "pfs" / "tiny"),
            str(tmp_path / "marker.json"), *extra]


def test_job_stages_trains_and_tears_down(slurm_cluster, tmp_path):
    job = _submit(slurm_cluster, tmp_path, *_train(tmp_path))
    output = job.output()
    assert job.returncode == 0, output
    seen = json.loads(job.marker.read_text())
    assert seen["samples"] == len(FILES)
    assert seen["dataset"] == "tiny"
    # One node today: one address, published in the job dir and exported.
    assert seen["server"] == seen["listed"] == (job.job_dir / "addresses").read_text().strip()
    assert seen["server"].startswith("127.0.0.1:") and "," not in seen["server"]
    assert seen["job_dir"] == str(job.job_dir)
    assert f"ingested tiny: {len(FILES)} samples" in output
    assert "daemons stopped, node-local dirs removed" in output
    job.assert_torn_down()
    assert slurm_cluster.queue("-j", job.id, "-s", "-o", "%i") == []


def test_two_node_job_stripes_over_both_daemons(slurm_cluster, tmp_path):
    """Two Slurm nodes: the job's own etcd on the first node (loopback here), two
    daemons joining it, one ingest with --replicas 2 striped over both, training
    through the cluster found in etcd; everything stopped and removed after."""
    job = _submit(slurm_cluster, tmp_path, *_train(tmp_path), nodes=2, DLFS_REPLICAS="2")
    output = job.output()
    assert job.returncode == 0, output
    seen = json.loads(job.marker.read_text())
    published = [(job.job_dir / "nodes" / f"{node}.address").read_text().strip()
                 for node in slurm_cluster.nodes]
    assert len(set(published)) == 2
    assert seen["listed"] == ",".join(published)
    etcd_url = (job.job_dir / "etcd-url").read_text().strip()
    assert etcd_url.startswith("http://127.0.0.1:")
    assert (seen["server"], seen["etcd"], seen["cluster"]) == (None, etcd_url, f"job-{job.id}")
    assert sorted(seen["members"]) == sorted(published)  # striped over both daemons
    assert seen["samples"] == len(FILES)
    assert f"starting the job's etcd on {slurm_cluster.nodes[0]}" in output
    first_etcd_log = job.job_dir / "logs" / f"{slurm_cluster.nodes[0]}.etcd.log"
    assert first_etcd_log.exists()
    for node in slurm_cluster.nodes:
        log = (job.job_dir / "logs" / f"{node}.log").read_text()
        assert f"joined cluster 'job-{job.id}' at {etcd_url.removeprefix('http://')}" in log, log
        assert "'tiny' generation" in log and "committed in etcd; published here" in log, log
    assert "daemons stopped, node-local dirs removed" in output
    assert "the job's etcd stopped, its node-local dir removed" in output
    job.assert_torn_down()
    assert _processes_mentioning(etcd_url.rpartition(":")[2]) == []


@pytest.mark.cluster
def test_a_job_joins_the_sites_etcd_and_leaves_it_clean(slurm_cluster, tmp_path):
    """DLFS_ETCD names the site's etcd: the job starts none, its daemons join cluster
    job-ID there, and the job's keys are gone from that etcd after it."""
    from dlfs.coord.etcd_grpc import EtcdClient
    from dlfs.tools.launch import EtcdProcess

    with EtcdProcess(str(tmp_path / "site-etcd"), str(tmp_path / "site-etcd.log")) as site:
        job = _submit(slurm_cluster, tmp_path, *_train(tmp_path), nodes=2, DLFS_ETCD=site.url)
        output = job.output()
        assert job.returncode == 0, output
        seen = json.loads(job.marker.read_text())
        assert (seen["etcd"], seen["cluster"]) == (site.url, f"job-{job.id}")
        assert len(seen["members"]) == 2
        assert "starting the job's etcd" not in output
        assert not (job.job_dir / "etcd-url").exists()
        assert f"removed the job's cluster job-{job.id} from etcd {site.url}" in output
        etcd = EtcdClient(site.url)
        try:
            assert etcd.get_prefix(f"/dlfs/job-{job.id}/")[0] == []
        finally:
            etcd.close()
    job.assert_torn_down()


@pytest.mark.cluster
def test_without_etcdctl_a_job_prints_the_command_that_cleans_the_sites_etcd(slurm_cluster,
                                                                             tmp_path):
    """No etcdctl where the job runs (DLFS_ETCDCTL names one that is not there): the job
    leaves its keys in the site's etcd and says how to remove them; that command, run
    as printed, removes them."""
    from dlfs.coord.etcd_grpc import EtcdClient
    from dlfs.tools.launch import EtcdProcess

    with EtcdProcess(str(tmp_path / "site-etcd"), str(tmp_path / "site-etcd.log")) as site:
        job = _submit(slurm_cluster, tmp_path, *_train(tmp_path), nodes=2, DLFS_ETCD=site.url,
                      DLFS_ETCDCTL=str(tmp_path / "no-etcdctl"))
        output = job.output()
        assert job.returncode == 0, output
        prefix = f"/dlfs/job-{job.id}/"
        advice = re.search(r"not found \(Debian's etcd-client; or set DLFS_ETCDCTL\); "
                           r"remove them with: (.*)$", output, re.MULTILINE)
        assert advice, output
        assert advice.group(1) == (f"ETCDCTL_API=3 etcdctl --endpoints={site.url} del "
                                   f"--prefix {prefix}")
        etcd = EtcdClient(site.url)
        try:
            assert etcd.get_prefix(prefix)[0], "the job's keys should still be there"
            done = subprocess.run(["sh", "-c", advice.group(1)], capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert etcd.get_prefix(prefix)[0] == []
        finally:
            etcd.close()
    job.assert_torn_down()


def test_job_returns_the_training_status_and_still_tears_down(slurm_cluster, tmp_path):
    job = _submit(slurm_cluster, tmp_path, "sh", "-c", "exit 3")
    assert job.returncode == 3, job.output()
    assert "the training command exited with status 3" in job.output()
    assert "daemons stopped, node-local dirs removed" in job.output()
    job.assert_torn_down()


def test_job_reports_daemons_that_cannot_start(slurm_cluster, tmp_path):
    missing = tmp_path / "no-nvme-here"
    job = _submit(slurm_cluster, tmp_path, *_train(tmp_path), DLFS_LOCAL_ROOT=str(missing))
    output = job.output()
    assert job.returncode == 1, output
    assert f"{missing} does not exist on" in output and "DLFS_LOCAL_ROOT" in output
    assert "the daemon step ended before" in output
    assert not job.marker.exists() and not missing.exists()
    job.assert_torn_down()


def test_cancelled_job_stops_training_and_daemons(slurm_cluster, tmp_path):
    job = _submit(slurm_cluster, tmp_path, *_train(tmp_path, "600"), wait=False)
    _wait_until(lambda: job.marker.exists(), JOB_TIMEOUT_S, "training started and read the data")
    subprocess.run(["scancel", job.id], env=slurm_cluster.env, check=True, timeout=30)
    _wait_until(lambda: slurm_cluster.queue("-j", job.id, "-o", "%i") == [], CANCEL_TIMEOUT_S,
                f"job {job.id} gone from the queue")
    output = job.output()
    assert "got SIGTERM" in output, output
    job.assert_torn_down()
    assert _processes_mentioning(str(tmp_path / "train.py")) == []
