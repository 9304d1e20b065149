"""`dlfs-server --config FILE` (TOML), flags over it, `--print-config`, `--version`, --help."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

import dlfs
from dlfs import Client
from dlfs.server.config_file import read_config_file
from dlfs.tools.launch import DaemonProcess


def server(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlfs.server.server_cli", *args],
                          capture_output=True, text=True, timeout=60)


def test_print_config_shows_flags_over_the_file_over_defaults(tmp_path):
    config = tmp_path / "server.toml"
    config.write_text('data_dir = "/srv/dlfs"\nlisten = "127.0.0.1:7100"\n'
                      'batch-bytes-max = "256MiB"\nwarm_on_first_read = false\n'
                      'log_format = "json"\n')
    done = server("--config", str(config), "--listen", "127.0.0.1:7200", "--chunk-bytes",
                  "2MiB", "--print-config")
    assert done.returncode == 0, done.stderr
    printed = tomllib.loads(done.stdout)
    assert printed["data_dir"] == "/srv/dlfs"  # the file
    assert printed["listen"] == "127.0.0.1:7200"  # the flag beats the file
    assert printed["batch_bytes_max"] == 256 * 1024 * 1024  # a size with its unit
    assert printed["chunk_bytes"] == 2 * 1024 * 1024
    assert printed["warm_on_first_read"] is False and printed["log_format"] == "json"
    assert printed["rpc_threads"] == 32  # a default
    assert "batch_bytes_max = 268435456  # 256 MiB" in done.stdout
    # What it prints is a config file that reads back to the same settings.
    again = tmp_path / "again.toml"
    again.write_text(done.stdout)
    assert server("--config", str(again), "--print-config").stdout == done.stdout


@pytest.mark.parametrize("text, message", [
    ("bath_bytes_max = 3\n", "unknown setting 'bath_bytes_max'; did you mean 'batch_bytes_max'?"),
    ("demo = 1\n", "demo must be true or false, not 1"),
    ("batch_bytes_max = \"lots\"\n", "batch_bytes_max: 'lots' is not a size"),
    ("listen = [\n", "not valid TOML"),
    ("chunk_bytes = 100\n", "chunk_bytes must be in 4096 .. message_bytes_max - 1 MiB"),
])
def test_a_bad_config_file_is_refused_naming_the_setting(tmp_path, text, message):
    config = tmp_path / "server.toml"
    config.write_text('data_dir = "/srv/dlfs"\n' + text)
    done = server("--config", str(config), "--print-config")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("dlfs-server: ") and message in done.stderr, done.stderr


@pytest.mark.daemons
def test_a_daemon_runs_on_its_config_file(tmp_path):
    config = tmp_path / "server.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\ndemo = true\n'
                      'metrics_listen = "127.0.0.1:0"\nlog_format = "json"\n')
    daemon = DaemonProcess(str(tmp_path / "ignored"), str(tmp_path / "daemon.log"),
                           ["--config", str(config)])
    # DaemonProcess passes --data-dir itself: the flag beats the file's data_dir.
    with daemon:
        with Client(daemon.address) as client:
            assert client.datasets() == ["demo"]
            assert client.status().metrics_address.startswith("127.0.0.1:")
            assert client.status().data_dir == str(tmp_path / "ignored")
        assert daemon.log().lstrip().startswith("{")


def test_data_dir_is_required_somewhere():
    done = server("--listen", "127.0.0.1:0")
    assert done.returncode == 2
    assert done.stderr.strip() == "dlfs-server: give --data-dir DIR, or data_dir in the " \
                                  "--config file"


def test_version_and_help():
    assert server("--version").stdout.strip() == f"dlfs-server {dlfs.__version__}"
    text = server("--help").stdout
    assert "(default: None)" not in text
    assert all(line.count("(default:") <= 1 for line in text.split("\n  -"))
    assert "--batch-bytes-max SIZE" in text and "(default: 2GiB)" in text
    assert "--data-dir DIR" in text and "required, here or in --config" in text
    assert "--config FILE" in text and "--print-config" in text


def test_the_deployed_config_example_is_valid():
    """deploy/dlfs-server.toml is the file docs/deploy.md tells operators to start from."""
    import pathlib

    example = pathlib.Path(__file__).resolve().parents[2] / "deploy/dlfs-server.toml"
    settings = read_config_file(str(example))
    assert settings["data_dir"] == "/var/lib/dlfs"
    done = server("--config", str(example), "--print-config")
    assert done.returncode == 0, done.stderr


def test_cluster_settings_come_from_flags_the_file_or_the_environment(tmp_path):
    """etcd, cluster, advertise and member_lease_ttl_s are settings like the others; the
    environment's $DLFS_ETCD and $DLFS_CLUSTER stand in for a missing flag and key."""
    import os

    config = tmp_path / "server.toml"
    config.write_text('data_dir = "/srv/dlfs"\ncluster = "from-file"\n'
                      'member_lease_ttl_s = 3\n')
    env = {**os.environ, "DLFS_ETCD": "http://10.0.0.1:2379", "DLFS_CLUSTER": "from-env"}

    def printed(*args: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "dlfs.server.server_cli", "--config",
                               str(config), *args, "--print-config"], capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return tomllib.loads(done.stdout)

    settings = printed()
    assert (settings["etcd"], settings["cluster"], settings["member_lease_ttl_s"]) == \
        ("http://10.0.0.1:2379", "from-file", 3)  # the environment, the file, the file
    assert settings["advertise"] == ""
    settings = printed("--etcd", "http://e1:2379,http://e2:2379", "--cluster", "flag",
                       "--advertise", "n1:7010")
    assert (settings["etcd"], settings["cluster"], settings["advertise"]) == \
        ("http://e1:2379,http://e2:2379", "flag", "n1:7010")
    config.write_text('data_dir = "/srv/dlfs"\nmember_lease_ttl_s = 1\n')
    done = server("--config", str(config), "--print-config")
    assert done.returncode == 2
    assert "member_lease_ttl_s must be at least 2 (etcd's shortest lease)" in done.stderr
