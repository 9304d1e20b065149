"""The `dlfs` command line against a real daemon, run as users run it."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.trees import write_tree


def dlfs(address, *args, check=True):
    result = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", address, *args],
                            capture_output=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_cli_tour(daemon, tmp_path):
    source = tmp_path / "src"
    write_tree(source, {"train/cat/1.jpg": b"meow", "train/dog/2.jpg": b"woof!", "readme": b"hi\n"})
    os.utime(source / "readme", ns=(1_700_000_000_000_000_000,) * 2)
    out = dlfs(daemon.address, "ingest", str(source), "pets").stdout.decode()
    assert out.splitlines()[0] == "ingested pets: 3 samples, 12 bytes"
    assert dlfs(daemon.address, "datasets").stdout.decode().startswith("pets\t3 samples\t12 B")
    assert dlfs(daemon.address, "ls", "pets").stdout.decode().split() == ["readme", "train/"]
    assert dlfs(daemon.address, "ls", "pets/train/dog").stdout.decode().split() == ["2.jpg"]
    long = dlfs(daemon.address, "ls", "-l", "pets/train").stdout.decode().splitlines()
    assert long[0].startswith("dr-xr-xr-x") and long[0].endswith("cat/")
    stat = dlfs(daemon.address, "stat", "pets/readme").stdout.decode()
    assert "size: 3" in stat and "id: 0" in stat and "type: file" in stat
    assert dlfs(daemon.address, "cat", "pets/train/dog/2.jpg").stdout == b"woof!"
    failed = dlfs(daemon.address, "ingest", str(source), "pets", check=False)
    assert failed.returncode == 1
    assert b"AlreadyExists: dataset 'pets' exists; pass --replace" in failed.stderr
    dlfs(daemon.address, "ingest", "--replace", str(source), "pets")
    missing = dlfs(daemon.address, "cat", "pets/nope", check=False)
    assert missing.returncode == 1 and b"NotFound: dataset 'pets' has no sample 'nope'" in missing.stderr
    assert dlfs(daemon.address, "rm", "pets").stdout.decode().startswith("removed pets: 3 samples")
    assert dlfs(daemon.address, "datasets").stdout == b""


def test_cli_reports_a_down_daemon(tmp_path):
    result = dlfs("127.0.0.1:1", "datasets", check=False)
    assert result.returncode == 1
    assert b"Unavailable: DLFS daemon at 127.0.0.1:1 is unavailable" in result.stderr


def test_server_help_lists_every_limit():
    out = subprocess.run([sys.executable, "-m", "dlfs.server.server_cli", "--help"],
                         capture_output=True,
                         check=True).stdout.decode()
    for flag in ("--batch-ids-max", "--batch-bytes-max", "--message-bytes-max", "--reader-threads",
                 "--rpcs-concurrent-max", "--ingests-concurrent-max", "--extent-bytes-max",
                 "--open-extents-max", "--chunk-bytes"):
        assert flag in out


def test_server_refuses_a_data_dir_in_use(daemon):
    result = subprocess.run([sys.executable, "-m", "dlfs.server.server_cli",
                             "--data-dir", daemon.data_dir,
                             "--listen", "127.0.0.1:0"], capture_output=True, timeout=60)
    assert result.returncode == 2
    assert b"is in use by another dlfs-server" in result.stderr


def test_sigterm_stops_cleanly(daemon):
    assert daemon.stop() == 0
    assert "stopped; catalog flushed" in daemon.log()


def test_scrub_reports_damaged_samples_by_path(daemon, tmp_path):
    source = tmp_path / "src"
    write_tree(source, {f"d/{i:03d}.bin": bytes([i]) * 3000 for i in range(50)})
    dlfs(daemon.address, "ingest", str(source), "ds")
    clean = dlfs(daemon.address, "scrub", "ds").stdout.decode()
    assert clean.strip().endswith("scrubbed ds: 50 samples, 146.5 KiB, 0 damaged")
    [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
    extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
    with open(extent, "r+b") as f:
        data = f.read()
        for i in (7, 31):
            f.seek(data.index(bytes([i]) * 3000) + 100)
            f.write(b"\xff\xfe")
    result = dlfs(daemon.address, "scrub", "ds", check=False)
    out = result.stdout.decode()
    assert result.returncode == 1
    assert "DAMAGED ds/d/007.bin: checksum mismatch for sample 7" in out
    assert "DAMAGED ds/d/031.bin" in out and out.count("DAMAGED") == 2
    assert "50 samples" in out and "2 damaged" in out
    # Every other sample still reads.
    ok = [i for i in range(50) if i not in (7, 31)]
    from dlfs import Client
    with Client(daemon.address) as client:
        assert [bytes(s) for s in client.get_batch(ok, dataset="ds")] == \
               [bytes([i]) * 3000 for i in ok]


def test_status_and_metrics_endpoint(daemon_factory, tmp_path):
    import urllib.request

    daemon = daemon_factory(extra_args=["--metrics-listen", "127.0.0.1:0"])
    write_tree(tmp_path / "src", {f"{i}": b"x" * 100 for i in range(10)})
    dlfs(daemon.address, "ingest", str(tmp_path / "src"), "ds")
    from dlfs import Client, NotFound
    with Client(daemon.address) as client:
        client.get_batch([1, 2, 2], dataset="ds")
        try:
            client.get_batch([1], dataset="nope")
        except NotFound:
            pass
        status = client.status()
    assert (status.datasets, status.samples, status.bytes) == (1, 10, 1000)
    assert status.samples_served == 3 and status.batches_served == 1
    assert status.errors == {"NOT_FOUND": 1}
    out = dlfs(daemon.address, "status").stdout.decode()
    assert "datasets: 1, 10 samples" in out and "errors: NOT_FOUND 1" in out
    url = f"http://{status.metrics_address}/metrics"
    assert f"metrics: {url}" in out
    # 100-byte samples never go by sendfile; whether it could is said either way.
    assert f"sendfile from the page cache: {status.sendfile}\n" in out
    assert status.sendfile.startswith(("on", "off: this kernel"))
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert "dlfs_served_samples_total 3.0" in text
    assert 'dlfs_read_duration_seconds_count{method="DataBatch"} 1.0' in text  # the data path
    assert 'dlfs_errors_total{code="NOT_FOUND",method="DataBatch"} 1.0' in text
