"""TLS and token rules, each with a real TLS channel and certificates made here."""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest

import dlfs
from dlfs import Client
from dlfs.tools.launch import DaemonProcess
from helpers.trees import write_tree

READ_TOKEN = "r" * 8 + "-read-token-0123"
ADMIN_TOKEN = "a" * 8 + "-admin-token-456"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=dlfs-test-ca", cwd=d)
    for name, san in (("server", "IP:127.0.0.1,DNS:localhost"), ("client", "DNS:client")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
                cwd=d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other-ca.key", "-out",
            "other-ca.pem", "-days", "2", "-subj", "/CN=someone-else", cwd=d)
    tokens = d / "tokens"
    tokens.write_text(f"# role token\nread {READ_TOKEN}\nadmin {ADMIN_TOKEN}\n")
    os.chmod(tokens, 0o600)
    return d


@pytest.fixture(scope="module")
def secure_daemon(pki, tmp_path_factory):
    root = tmp_path_factory.mktemp("secure")
    daemon = DaemonProcess(str(root / "data"), str(root / "daemon.log"), [
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tokens-file", str(pki / "tokens")])
    daemon.start()
    source = root / "src"
    write_tree(source, {"a": b"alpha", "b/c": b"gamma"})
    with Client(daemon.address, token=ADMIN_TOKEN, tls_ca=str(pki / "ca.pem")) as admin:
        admin.ingest(str(source), "ds")
    yield daemon
    daemon.kill()


def test_read_token_reads_over_tls(secure_daemon, pki):
    with Client(secure_daemon.address, token=READ_TOKEN, tls_ca=str(pki / "ca.pem")) as c:
        assert c.datasets() == ["ds"]
        assert [bytes(s) for s in c.get_batch(["a", "b/c"], dataset="ds")] == [b"alpha", b"gamma"]


def test_only_admin_tokens_are_told_the_data_dir(secure_daemon, pki):
    with Client(secure_daemon.address, token=READ_TOKEN, tls_ca=str(pki / "ca.pem")) as c:
        assert c.status().data_dir == ""
    with Client(secure_daemon.address, token=ADMIN_TOKEN, tls_ca=str(pki / "ca.pem")) as c:
        assert c.status().data_dir == os.path.abspath(secure_daemon.data_dir)


@pytest.mark.parametrize("version, accepted", [("-tls1_1", False), ("-tls1_2", True)])
def test_tls_below_1_2_is_refused(secure_daemon, version, accepted):
    port = secure_daemon.address.rpartition(":")[2]
    done = subprocess.run(["openssl", "s_client", version, "-connect", f"127.0.0.1:{port}",
                           "-alpn", "h2"], input=b"", capture_output=True, timeout=30)
    assert (done.returncode == 0) == accepted, done.stderr.decode(errors="replace")


def test_read_token_cannot_ingest_or_delete(secure_daemon, pki, tmp_path):
    write_tree(tmp_path / "src", {"x": b"1"})
    with Client(secure_daemon.address, token=READ_TOKEN, tls_ca=str(pki / "ca.pem")) as c:
        with pytest.raises(dlfs.PermissionDenied, match="Ingest needs an admin token"):
            c.ingest(str(tmp_path / "src"), "new")
        with pytest.raises(dlfs.PermissionDenied, match="DeleteDataset needs an admin token"):
            c.delete("ds")
        assert c.datasets() == ["ds"]


def test_admin_token_can_ingest_and_delete(secure_daemon, pki, tmp_path):
    write_tree(tmp_path / "src", {"x": b"1"})
    with Client(secure_daemon.address, token=ADMIN_TOKEN, tls_ca=str(pki / "ca.pem")) as c:
        assert c.ingest(str(tmp_path / "src"), "tmp").samples == 1
        assert c.delete("tmp").samples == 1


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token"])
def test_without_a_valid_token_every_call_is_refused(secure_daemon, pki, token):
    with Client(secure_daemon.address, token=token or "", tls_ca=str(pki / "ca.pem")) as c:
        for call in (c.datasets, lambda: c.get_batch([0], dataset="ds"), c.status,
                     lambda: c.stat("ds", "a")):
            with pytest.raises(dlfs.Unauthenticated, match="requires a token"):
                call()


def test_health_stays_open_for_probes(secure_daemon, pki):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    with grpc.secure_channel(secure_daemon.address, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_and_untrusted_clients_cannot_connect(secure_daemon, pki):
    with Client(secure_daemon.address, token=READ_TOKEN, reconnect_timeout_s=0) as c:
        with pytest.raises(dlfs.Unavailable):
            c.datasets()
    with Client(secure_daemon.address, token=READ_TOKEN, tls_ca=str(pki / "other-ca.pem"),
                reconnect_timeout_s=0) as c:
        with pytest.raises(dlfs.Unavailable):
            c.datasets()


def test_mutual_tls_requires_a_client_certificate(pki, daemon_factory):
    daemon = daemon_factory(extra_args=[
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem")])
    with Client(daemon.address, tls_ca=str(pki / "ca.pem"), reconnect_timeout_s=0) as c:
        with pytest.raises(dlfs.Unavailable):
            c.datasets()
    with Client(daemon.address, tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "client.pem"),
                tls_key=str(pki / "client.key")) as c:
        assert c.datasets() == []


def test_cli_takes_token_and_ca(secure_daemon, pki):
    import sys

    base = [sys.executable, "-m", "dlfs.cli", "--server", secure_daemon.address, "--tls-ca",
            str(pki / "ca.pem")]
    ok = subprocess.run(base + ["--token", READ_TOKEN, "datasets"], capture_output=True,
                        timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith(b"ds\t")
    denied = subprocess.run(base + ["datasets"], capture_output=True, timeout=60,
                            env={**os.environ, "DLFS_TOKEN": ""})
    assert denied.returncode == 1 and b"Unauthenticated" in denied.stderr


def test_bad_tokens_file_is_refused_at_start(tmp_path, daemon_factory):
    bad = tmp_path / "tokens"
    bad.write_text("superuser short\n")
    daemon = daemon_factory(extra_args=["--tokens-file", str(bad)], start=False)
    with pytest.raises(RuntimeError, match="expected 'ROLE TOKEN'"):
        daemon.start()


def test_an_exposed_listener_needs_tls_and_tokens_or_insecure(tmp_path, daemon_factory, pki):
    exposed = daemon_factory(start=False)
    with pytest.raises(RuntimeError, match="--insecure"):
        exposed.start("0.0.0.0:0")
    assert "anyone who reaches it could read, ingest and delete" in exposed.log()

    insecure = daemon_factory(extra_args=["--insecure"], start=False)
    port = insecure.start("0.0.0.0:0").rpartition(":")[2]
    with Client(f"127.0.0.1:{port}") as client:
        assert client.dataset_infos() == []
    assert "without TLS (--tls-cert, --tls-key) and --tokens-file (--insecure)" in insecure.log()

    secure = daemon_factory(extra_args=[
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tokens-file", str(pki / "tokens")], start=False)
    secure.start("0.0.0.0:0")  # TLS and tokens: no --insecure needed
    assert "--insecure" not in secure.log()


def test_a_metrics_port_alone_listens_on_loopback(daemon_factory):
    daemon = daemon_factory(extra_args=["--metrics-listen", "0"])
    with Client(daemon.address) as client:
        assert client.status().metrics_address.startswith("127.0.0.1:")
