"""deploy/: Kubernetes manifests against the official schemas, systemd units
with systemd's own tools, Slurm scripts with shellcheck, plus the structural
rules that tie them to the daemon (ports, probes, paths, users).

Tools that are not Python packages (systemd-analyze, systemd-sysusers,
shellcheck) are skipped with the apt package to install when missing;
kubernetes-validate (the `test` extra) is a failure under CI.
"""

from __future__ import annotations

import copy
import glob
import os
import re
import shutil
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers.systemd_units import (INSTALL_BIN, MOUNT_ENV, MOUNT_UNIT, REPO, SERVER_ENV, SERVER_UNIT,
                           SYSUSERS, one, parse_env_file, parse_unit, referenced_variables)

K8S_DIR = os.path.join(REPO, "deploy", "kubernetes")
SLURM_DIR = os.path.join(REPO, "deploy", "slurm")
# 1.27: the oldest release with gRPC probes generally available; and the
# newest the installed kubernetes-validate knows.
K8S_VERSION_OLDEST = "1.27"
TOOL_TIMEOUT_S = 60
# systemd-analyze security --offline: 0 (locked down) .. 10 (unprotected).
SERVER_EXPOSURE_MAX = 2.0
MOUNT_EXPOSURE_MAX = 4.5  # a FUSE mount cannot have its own mount namespace
HEALTH_TIMEOUT_S = 10.0


def _import_test_extra(module: str, package: str):
    """A package of the `test` extra: missing is a skip here, a failure under CI."""
    try:
        return __import__(module)
    except ImportError:
        message = f"{package} is not installed (pip install {package}; it is in the `test` extra)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


yaml = _import_test_extra("yaml", "PyYAML")


def _require_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install {package})")
    return path


def _manifest_files(include_examples: bool = True) -> list[str]:
    files = sorted(glob.glob(os.path.join(K8S_DIR, "*.yaml")))
    files = [f for f in files if os.path.basename(f) != "kustomization.yaml"]
    if not include_examples:
        files = [f for f in files if not f.endswith(".example.yaml")]
    return files


def _load(name: str) -> list[dict]:
    with open(os.path.join(K8S_DIR, name)) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def _only(name: str, kind: str) -> dict:
    docs = [d for d in _load(name) if d["kind"] == kind]
    assert len(docs) == 1, f"{name}: expected one {kind}, found {len(docs)}"
    return docs[0]


def _flags(args: list[str]) -> dict[str, str | bool]:
    """A container's dlfs-server args as {--flag: value} (True for a switch), after
    checking that dlfs-server's own parser takes them."""
    from dlfs.server.server_cli import build_parser

    build_parser().parse_args(args)  # exits (SystemExit) on a flag it does not know
    flags: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            flags[arg] = args[i + 1] if has_value else True
    return flags


_QUANTITY_SUFFIXES = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                      "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _quantity(value) -> float:
    match = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti|)", str(value))
    assert match, f"not a Kubernetes quantity: {value!r}"
    return float(match.group(1)) * _QUANTITY_SUFFIXES[match.group(2)]


# --- Kubernetes ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kv():
    return _import_test_extra("kubernetes_validate", "kubernetes-validate")


@pytest.mark.parametrize("path", _manifest_files(), ids=os.path.basename)
def test_manifests_match_the_official_schemas(kv, path):
    """Strict: unknown fields are errors, as `kubectl apply --validate=strict`."""
    docs = _load(os.path.basename(path))
    assert docs, f"{path} holds no resource"
    for version in (K8S_VERSION_OLDEST, kv.latest_version()):
        for doc in docs:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{path}: {doc['kind']} is invalid for Kubernetes {version} "
                            f"at {where}: {exc.message}")
            except kv.SchemaNotFoundError as exc:
                pytest.fail(f"{path}: {exc.message}")


def test_the_validator_rejects_broken_manifests(kv):
    """The schema check is not vacuous: a misspelt field and a named gRPC probe
    port (the probe takes a number) are both refused."""
    daemonset = _only("daemonset.yaml", "DaemonSet")
    misspelt = copy.deepcopy(daemonset)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    named_port = copy.deepcopy(daemonset)
    named_port["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = "grpc"
    for broken in (misspelt, named_port):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, kv.latest_version(), strict=True)


def test_kustomization_lists_every_manifest_and_the_image():
    with open(os.path.join(K8S_DIR, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(os.path.basename(p) for p in _manifest_files(False)), \
        "kustomization.yaml must list every manifest except the *.example.yaml ones"
    spec = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"].partition(":")[0]
              for c in spec["containers"] + spec.get("initContainers", [])}
    assert images == {entry["name"] for entry in kustomization["images"]}


def test_daemonset_runs_the_daemon_on_labelled_nvme_nodes():
    daemonset = _only("daemonset.yaml", "DaemonSet")
    template = daemonset["spec"]["template"]
    spec = template["spec"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert spec["nodeSelector"] == {"dlfs.io/nvme": "true"}

    (container,) = spec["containers"]
    assert container["command"] == ["dlfs-server"]
    flags = _flags(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert flags["--listen"] == f"0.0.0.0:{ports['grpc']}"
    assert flags["--metrics-listen"] == f"0.0.0.0:{ports['metrics']}"

    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    data_volume = volumes[mounts[flags["--data-dir"]]]
    assert data_volume["hostPath"]["type"] == "DirectoryOrCreate"
    tokens_dir = os.path.dirname(flags["--tokens-file"])
    assert tokens_dir in mounts, "--tokens-file must lie in a mounted volume"
    # The init container installs the tokens file where the daemon reads it.
    (init,) = spec["initContainers"]
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    assert init_mounts[tokens_dir] == mounts[tokens_dir]
    assert flags["--tokens-file"] in init["command"][-1]
    assert init_mounts[flags["--data-dir"]] == mounts[flags["--data-dir"]]

    # The daemon stops within about 5 s of grace plus the catalog flush.
    assert spec["terminationGracePeriodSeconds"] >= 15
    priority = _only("priorityclass.yaml", "PriorityClass")
    assert spec["priorityClassName"] == priority["metadata"]["name"]


def test_daemonset_probes_use_grpc_health_on_the_served_port():
    spec = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
        assert set(container[probe]) - {"periodSeconds", "failureThreshold", "timeoutSeconds",
                                         "initialDelaySeconds", "successThreshold"} == {"grpc"}
    assert container["readinessProbe"]["grpc"]["service"] == "dlfs.v1.Dlfs"
    # Liveness must not fail while the startup probe still allows time.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_probed_health_services_are_served_by_the_daemon(daemon):
    """Every service name the probes ask for answers SERVING on a real daemon."""
    spec = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    services = {container[p]["grpc"].get("service", "")
                for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    with grpc.insecure_channel(daemon.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in services:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service),
                               timeout=HEALTH_TIMEOUT_S)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_daemonset_limits_resources_and_privileges():
    spec = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"] + spec["initContainers"]:
        resources = container["resources"]
        for resource in ("cpu", "memory"):
            request = _quantity(resources["requests"][resource])
            limit = _quantity(resources["limits"][resource])
            assert 0 < request <= limit, (container["name"], resource)
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
    (server,) = spec["containers"]
    assert "add" not in server["securityContext"]["capabilities"]
    assert "runAsUser" not in server["securityContext"]  # the pod's non-root user
    (init,) = spec["initContainers"]
    assert sorted(init["securityContext"]["capabilities"]["add"]) == ["CHOWN", "FOWNER"]


def test_headless_service_selects_the_daemon_pods():
    service = _only("service.yaml", "Service")
    daemonset = _only("daemonset.yaml", "DaemonSet")
    template = daemonset["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for port in service["spec"]["ports"]:
        assert ports[port["targetPort"]] == port["port"], port


def test_network_policy_selects_the_daemon_pods_and_named_ports():
    policy = _only("networkpolicy.yaml", "NetworkPolicy")
    template = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    names = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    used = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    assert used == names


def _substituted(value: str, env: dict[str, str]) -> str:
    """`value` with Kubernetes' $(VAR) references replaced from `env`."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def _etcd_parts() -> tuple[dict, dict, dict]:
    """The etcd StatefulSet, its container and its Service (etcd.yaml)."""
    statefulset = _only("etcd.yaml", "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return statefulset, container, _only("etcd.yaml", "Service")


def _etcd_flags(container: dict) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


def test_etcd_statefulset_forms_one_cluster_under_its_headless_service():
    statefulset, container, service = _etcd_parts()
    spec = statefulset["spec"]
    name, members = statefulset["metadata"]["name"], spec["replicas"]
    assert members % 2 == 1 and members >= 3, "an odd quorum that survives one loss"
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True  # the first election
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert spec["podManagementPolicy"] == "Parallel"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == ports
    flags = _etcd_flags(container)
    domain = f"{name}-{{i}}.{service['metadata']['name']}"
    assert flags["initial-cluster"] == ",".join(
        f"{name}-{i}=http://{domain.format(i=i)}:{ports['peer']}" for i in range(members))
    pod = {"POD_NAME": f"{name}-1"}
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]} == \
        {"POD_NAME": "metadata.name"}
    assert _substituted(flags["name"], pod) == f"{name}-1"
    assert _substituted(flags["advertise-client-urls"], pod) == \
        f"http://{domain.format(i=1)}:{ports['client']}"
    assert _substituted(flags["initial-advertise-peer-urls"], pod) == \
        f"http://{domain.format(i=1)}:{ports['peer']}"
    assert flags["listen-client-urls"].endswith(f":{ports['client']}")
    assert flags["listen-peer-urls"].endswith(f":{ports['peer']}")
    (claim,) = spec["volumeClaimTemplates"]
    (mount,) = container["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    assert flags["data-dir"].startswith(mount["mountPath"] + "/")
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_etcd_flags_are_etcds_own():
    """Every flag the StatefulSet gives is one the etcd program knows (the installed
    one: Debian's 3.4; the image is 3.5, which keeps them)."""
    from dlfs.tools.launch import ETCD_BINARY, etcd_unavailable

    assert not etcd_unavailable(), etcd_unavailable()
    known = subprocess.run([ETCD_BINARY, "--help"], capture_output=True, text=True,
                           timeout=TOOL_TIMEOUT_S)
    text = known.stdout + known.stderr
    _, container, _ = _etcd_parts()
    for flag in _etcd_flags(container):
        assert re.search(rf"^\s+--{re.escape(flag)}\b", text, re.M), f"etcd has no --{flag}"
    assert not re.search(r"^\s+--no-such-flag\b", text, re.M)


def test_daemonset_joins_the_cluster_of_the_configmap(tmp_path):
    """The daemons' --etcd is the ConfigMap's list, which names every etcd member;
    each advertises its pod IP; with those values substituted, dlfs-server takes
    the command line and prints them as its settings."""
    statefulset, container, service = _etcd_parts()
    config = _only("dlfs-cluster.yaml", "ConfigMap")
    name, domain = statefulset["metadata"]["name"], service["metadata"]["name"]
    client_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "client")
    from dlfs.coord.etcd_grpc import parse_endpoints

    assert parse_endpoints(config["data"]["etcd"]) == tuple(
        f"{name}-{i}.{domain}:{client_port}" for i in range(statefulset["spec"]["replicas"]))
    server = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in server["env"]}
    assert env["DLFS_ETCD"]["valueFrom"]["configMapKeyRef"] == \
        {"name": config["metadata"]["name"], "key": "etcd"}
    assert env["DLFS_CLUSTER"]["valueFrom"]["configMapKeyRef"] == \
        {"name": config["metadata"]["name"], "key": "cluster"}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    flags = _flags(server["args"])
    grpc_port = next(p["containerPort"] for p in server["ports"] if p["name"] == "grpc")
    assert (flags["--etcd"], flags["--cluster"], flags["--advertise"]) == \
        ("$(DLFS_ETCD)", "$(DLFS_CLUSTER)", f"$(POD_IP):{grpc_port}")
    values = {"DLFS_ETCD": config["data"]["etcd"], "DLFS_CLUSTER": config["data"]["cluster"],
              "POD_IP": "10.1.2.3"}
    args = [_substituted(a, values) for a in server["args"]]
    args[args.index("--data-dir") + 1] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "dlfs.server.server_cli", *args,
                           "--print-config"], capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    import tomllib

    printed = tomllib.loads(done.stdout)
    assert (printed["etcd"], printed["cluster"], printed["advertise"]) == \
        (config["data"]["etcd"], config["data"]["cluster"], f"10.1.2.3:{grpc_port}")


def test_etcd_network_policy_lets_daemons_and_clients_in_and_members_talk():
    policy = _only("networkpolicy-etcd.yaml", "NetworkPolicy")
    statefulset, container, _ = _etcd_parts()
    etcd_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    server_labels = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= etcd_labels.items()
    rules = {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}
    assert set(rules) == {p["name"] for p in container["ports"]}
    client_from = [peer["podSelector"]["matchLabels"] for peer in rules["client"]]
    assert any(labels.items() <= server_labels.items() for labels in client_from)
    assert {"dlfs.io/client": "true"} in client_from
    assert [peer["podSelector"]["matchLabels"] for peer in rules["peer"]] == \
        [policy["spec"]["podSelector"]["matchLabels"]]


def test_etcd_pods_limit_resources_and_privileges():
    statefulset, container, _ = _etcd_parts()
    spec = statefulset["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    for resource in ("cpu", "memory"):
        request = _quantity(container["resources"]["requests"][resource])
        assert 0 < request <= _quantity(container["resources"]["limits"][resource])
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]


def test_containerfile_matches_the_daemonset():
    with open(os.path.join(K8S_DIR, "Containerfile")) as f:
        text = f.read()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    spec = _only("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    uid = spec["securityContext"]["runAsUser"]
    gid = spec["securityContext"]["runAsGroup"]
    assert re.search(rf"^USER {uid}:{gid}$", text, re.M)
    assert f"--uid {uid}" in text and f"--gid {gid}" in text
    for copied in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for source in copied.split():
            assert os.path.exists(os.path.join(REPO, source)), f"COPY {source}: no such path"
    assert re.search(r'^ENTRYPOINT \["dlfs-server"\]$', text, re.M)
    exposed = set(re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split())
    assert exposed == {str(p["containerPort"]) for p in spec["containers"][0]["ports"]}


# --- systemd ------------------------------------------------------------------------------

_MOUNT_NAMESPACE_OPTIONS = (
    "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectProc", "ProcSubset", "ReadWritePaths", "ReadOnlyPaths",
    "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths",
    "RootDirectory", "RootImage", "MountFlags", "StateDirectory", "RuntimeDirectory",
    "CacheDirectory", "LogsDirectory", "ConfigurationDirectory", "DynamicUser", "PrivateUsers")


def test_server_unit_is_hardened():
    unit = parse_unit(SERVER_UNIT)
    expected = {
        "Type": "simple", "User": "dlfs", "Restart": "on-failure",
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
        "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes", "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "CapabilityBoundingSet": "", "StateDirectory": "dlfs", "StateDirectoryMode": "0700",
        "UMask": "0077", "KillSignal": "SIGTERM",
    }
    for key, value in expected.items():
        assert one(unit, "Service", key) == value, key
    assert int(one(unit, "Service", "LimitNOFILE")) >= 4096
    assert re.fullmatch(r"\d+[KMGT]", one(unit, "Service", "MemoryMax"))
    # The default data dir lies inside what ProtectSystem=strict leaves writable.
    env = dict(a.split("=", 1) for a in unit["Service"]["Environment"])
    writable = one(unit, "Service", "ReadWritePaths")
    assert env["DLFS_DATA_DIR"].startswith(writable + "/")
    assert writable == "%S/" + one(unit, "Service", "StateDirectory")
    assert "%t/dlfs/address" in one(unit, "Service", "ExecStart")
    assert one(unit, "Service", "RuntimeDirectory") == "dlfs"


def test_mount_unit_needs_fuse_and_no_mount_namespace():
    """Every option in _MOUNT_NAMESPACE_OPTIONS would hide the FUSE mount in a
    namespace of the service's own."""
    unit = parse_unit(MOUNT_UNIT)
    service = unit["Service"]
    present = sorted(set(service) & set(_MOUNT_NAMESPACE_OPTIONS))
    assert not present, f"these options would hide the mount from the host: {present}"
    assert one(unit, "Service", "DeviceAllow") == "/dev/fuse rw"
    assert one(unit, "Service", "DevicePolicy") == "closed"
    assert one(unit, "Service", "CapabilityBoundingSet") == "CAP_SYS_ADMIN"
    assert "dlfs-server.service" in " ".join(unit["Unit"]["After"]).split()
    assert "dlfs-server.service" in " ".join(unit["Unit"]["Wants"]).split()
    start = one(unit, "Service", "ExecStart").split()
    assert "--foreground" in start and start[start.index("--dataset") + 1] == "%I"
    assert one(unit, "Service", "ExecStop").lstrip("-").split()[:2] == ["/usr/bin/fusermount3", "-u"]
    assert one(unit, "Service", "UMask") == "0022"  # mount point dirs stay traversable
    # %i is the escaped instance name ("imagenet\\x2d1k"); dataset names may hold "-".
    for key in ("Environment", "EnvironmentFile", "ExecStartPre", "ExecStart", "ExecStop"):
        for value in service[key]:
            assert "%i" not in value, f"{key}={value} should use %I"


@pytest.mark.parametrize("unit_path,env_path", [(SERVER_UNIT, SERVER_ENV), (MOUNT_UNIT, MOUNT_ENV)],
                         ids=["server", "mount"])
def test_environment_files_match_their_units(unit_path, env_path):
    """Every variable an Exec line uses has a default in the unit; the example
    file sets nothing the unit ignores."""
    unit = parse_unit(unit_path)
    defaults = {a.split("=", 1)[0] for a in unit["Service"]["Environment"]}
    used = set()
    for key in ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop"):
        for line in unit["Service"].get(key, []):
            used |= referenced_variables(line)
    assert used - defaults == set(), "used in Exec lines without an Environment= default"
    assert defaults - used == set(), "Environment= defaults no Exec line uses"
    example = parse_env_file(env_path)
    assert set(example) <= used, f"{env_path} sets variables the unit ignores"
    loaded = [p.lstrip("-") for p in unit["Service"]["EnvironmentFile"]]
    assert f"/etc/dlfs/{os.path.basename(env_path)}" in loaded


def _units_for_systemd(tmp_path) -> list[str]:
    """Copies whose ExecStart points at this test run's virtualenv (the units
    name /opt/dlfs/venv), the template as instance dlfs-mount@demo."""
    bin_dir = os.path.dirname(sys.executable) + "/"
    copies = []
    for source, name in ((SERVER_UNIT, "dlfs-server.service"),
                         (MOUNT_UNIT, "dlfs-mount@demo.service")):
        with open(source) as f:
            text = f.read()
        assert INSTALL_BIN in text
        target = tmp_path / name
        target.write_text(text.replace(INSTALL_BIN, bin_dir))
        copies.append(str(target))
    return copies


def _verify(paths: list[str]) -> tuple[int, list[str]]:
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *paths],
                            capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    names = [os.path.basename(p) for p in paths]
    # Lines about other units of this machine are not ours to judge.
    ours = [line for line in (result.stdout + result.stderr).splitlines()
            if any(name in line for name in names)]
    return result.returncode, ours


def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    _require_tool("systemd-analyze", "systemd")
    returncode, messages = _verify(_units_for_systemd(tmp_path))
    assert returncode == 0 and messages == [], "\n".join(messages)


def test_systemd_analyze_verify_reports_a_misspelt_option(tmp_path):
    """The check above is not vacuous: a misspelt hardening option is reported."""
    _require_tool("systemd-analyze", "systemd")
    server, _ = _units_for_systemd(tmp_path)
    with open(server) as f:
        text = f.read()
    with open(server, "w") as f:
        f.write(text.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    _, messages = _verify([server])
    assert any("ProtectSytem" in line for line in messages), messages


@pytest.mark.parametrize("index,exposure_max", [(0, SERVER_EXPOSURE_MAX), (1, MOUNT_EXPOSURE_MAX)],
                         ids=["server", "mount"])
def test_systemd_security_exposure_stays_low(tmp_path, index, exposure_max):
    _require_tool("systemd-analyze", "systemd")
    path = _units_for_systemd(tmp_path)[index]
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", path],
                            capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= exposure_max, result.stdout


def test_sysusers_creates_the_dlfs_user(tmp_path):
    _require_tool("systemd-sysusers", "systemd")
    (tmp_path / "etc").mkdir()
    result = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", SYSUSERS],
                            capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    entries = [line.split(":") for line in (tmp_path / "etc" / "passwd").read_text().splitlines()]
    (dlfs,) = [e for e in entries if e[0] == "dlfs"]
    assert int(dlfs[2]) < 1000 and dlfs[5] == "/var/lib/dlfs" and dlfs[6] == "/usr/sbin/nologin"


# --- Slurm scripts ------------------------------------------------------------------------

# Every script there: the batch script, the per-node daemon and the job's etcd.
SLURM_SCRIPTS = sorted(glob.glob(os.path.join(SLURM_DIR, "*.sh"))
                       + glob.glob(os.path.join(SLURM_DIR, "*.sbatch")))
assert len(SLURM_SCRIPTS) == 4, SLURM_SCRIPTS


def test_slurm_scripts_parse():
    for script in SLURM_SCRIPTS:
        result = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_slurm_scripts_pass_shellcheck(tmp_path):
    _require_tool("shellcheck", "shellcheck")
    result = subprocess.run(["shellcheck", "--severity=style", "--external-sources", *SLURM_SCRIPTS],
                            capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    # Not vacuous: the same call reports an unquoted expansion.
    planted = tmp_path / "planted.sh"
    planted.write_text('#!/usr/bin/env bash\nrm -rf $1/data\n')
    result = subprocess.run(["shellcheck", "--severity=style", str(planted)],
                            capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert result.returncode != 0 and "SC2086" in result.stdout
