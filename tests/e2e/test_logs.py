"""Structured logs: every line of a real daemon's JSON log names the request it served."""

from __future__ import annotations

import io
import json
import logging
import re
import time

import grpc
import pytest

import dlfs
from dlfs import logs
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc


def json_lines(text: str) -> list[dict]:
    """Every line of a daemon log, parsed; fails on a line that is not JSON."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_request_ids_from_callers_are_kept_only_when_well_formed():
    assert logs.request_id_from([("x-request-id", "job42.step7:rank-3")]) == "job42.step7:rank-3"
    for hostile in ("two\nlines", "quote\"d", "", "x" * 65, "ünïcode", "a b"):
        fresh = logs.request_id_from([("x-request-id", hostile)])
        assert re.fullmatch(r"[0-9a-f]{16}", fresh), hostile
    assert logs.request_id_from([("x-request-id", b"bytes")]) != b"bytes"
    assert logs.request_id_from(None) != logs.request_id_from(None)


def test_json_lines_carry_the_bound_request_id_and_extra_fields():
    stream = io.StringIO()
    handler = logs.configure(logging.INFO, "json", program="test", stream=stream)
    try:
        log = logging.getLogger("dlfs.test")
        log.info("outside")
        binding = logs.bind_request_id("abc123")
        try:
            log.warning("inside %d", 7, extra={"dataset": "imagenet"})
        finally:
            logs.unbind_request_id(binding)
    finally:
        logging.getLogger().removeHandler(handler)
    outside, inside = json_lines(stream.getvalue())
    assert outside["request_id"] == logs.NO_REQUEST and outside["message"] == "outside"
    assert inside["request_id"] == "abc123"
    assert inside["message"] == "inside 7" and inside["level"] == "WARNING"
    assert inside["dataset"] == "imagenet" and inside["program"] == "test"
    assert inside["logger"] == "dlfs.test" and inside["timestamp"]


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match="text, json"):
        logs.configure(logging.INFO, "xml")


def test_a_failed_call_returns_the_request_id_the_daemon_logged_it_under(daemon_factory):
    daemon = daemon_factory(extra_args=["--log-format", "json", "--log-level", "DEBUG",
                                        "--demo"])
    with dlfs.Client(daemon.address) as client:
        with pytest.raises(dlfs.NotFound) as caught:
            client.stat("no-such-dataset", "a.jpg")
        assert len(client.dataset("demo").get_batch([0, 1])) == 2
    request_id = caught.value.request_id
    assert request_id and re.fullmatch(r"[0-9a-f]{16}", request_id)

    def finished_batches(lines):
        return [line for line in lines if line.get("method") == "DataBatch"  # the data path
                and "duration_ms" in line]

    def served_lines():
        return json_lines(daemon.log())  # every line, start-up included, is JSON

    # The data path logs a request once its reply is sent, so the line may trail the reply.
    deadline = time.monotonic() + 10
    while not finished_batches(served_lines()) and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = served_lines()
    mine = [line for line in lines if line["request_id"] == request_id]
    assert any(line.get("code") == "NOT_FOUND" and line.get("method", "").endswith("/Stat")
               and "no-such-dataset" in line["message"] for line in mine), mine
    finished = finished_batches(lines)
    assert finished and finished[0]["code"] == "OK" and finished[0]["request_id"] != request_id
    assert all(line["program"] == "dlfs-server" for line in lines)


def test_a_caller_chosen_request_id_is_echoed_and_logged(daemon_factory):
    daemon = daemon_factory(extra_args=["--log-format", "json", "--log-level", "DEBUG"])
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Stat(pb.StatRequest(dataset="missing", path="x"), timeout=10,
                      metadata=[("x-request-id", "epoch3-batch17")])
    trailing = dict(caught.value.trailing_metadata())
    assert trailing["x-request-id"] == "epoch3-batch17"
    assert trailing["dlfs-error"] == "NotFound"
    logged = [json.loads(line) for line in daemon.log().splitlines() if "epoch3-batch17" in line]
    assert logged and all(line["request_id"] == "epoch3-batch17" for line in logged)


def test_cli_errors_quote_the_request_id(daemon, capsys):
    from dlfs.cli import main

    assert main(["--server", daemon.address, "stat", "missing/x"]) != 0
    err = capsys.readouterr().err
    assert re.search(r"NotFound: .*missing.* \[request id [0-9a-f]{16}\]", err), err


def test_a_client_chosen_request_id_reaches_every_daemon_of_a_striped_batch(cluster, tmp_path):
    from helpers.trees import write_tree

    daemons = cluster.start(2, ["--log-format", "json", "--log-level", "DEBUG"])
    write_tree(tmp_path / "src", {f"f{i:03d}": bytes([i]) * 100 for i in range(64)})
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "ds")
        with dlfs.request_id("epoch3-step17"):
            assert len(client.get_batch(range(64), dataset="ds")) == 64
        client.get_batch([0], dataset="ds")  # outside the block: the daemon's own ids
        with pytest.raises(dlfs.InvalidArgument, match="request id"):
            with dlfs.request_id("two words"):
                pass
    def batches(daemon) -> list[dict]:
        lines = json_lines(daemon.log())
        return [line for line in lines
                if "Batch" in line.get("method", "") and "duration_ms" in line]

    def tagged_and_untagged() -> tuple[list[bool], int]:
        per_daemon = [batches(d) for d in daemons]
        tagged = [any(line["request_id"] == "epoch3-step17" for line in lines)
                  for lines in per_daemon]
        untagged = sum(line["request_id"] != "epoch3-step17"
                       for lines in per_daemon for line in lines)
        return tagged, untagged

    # The data path logs a request once its reply is sent: the lines may trail the calls.
    # 64 samples over 2 daemons: each serves a part (p = 1 - 2**-63).
    deadline = time.monotonic() + 10
    tagged, untagged = tagged_and_untagged()
    while not (all(tagged) and untagged >= 1) and time.monotonic() < deadline:
        time.sleep(0.02)
        tagged, untagged = tagged_and_untagged()
    assert all(tagged), [batches(d) for d in daemons]
    assert untagged == 1  # the call outside the block


RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_a_json_log_is_json_from_the_first_line_with_rfc3339_times(daemon_factory):
    daemon = daemon_factory(extra_args=["--log-format", "json"])
    lines = json_lines(daemon.log())  # fails on any plain-text line
    assert all(RFC3339_UTC.fullmatch(line["timestamp"]) for line in lines), lines
    [serving] = [line for line in lines if "serving on" in line["message"]]
    assert serving["address"] == daemon.address
    assert serving["message"].startswith(f"dlfs-server {dlfs.__version__} serving on "
                                         f"{daemon.address} (data dir ")


def test_text_log_lines_start_with_an_rfc3339_time(daemon):
    first = daemon.log().splitlines()[0]
    assert RFC3339_UTC.fullmatch(first.split(" ", 1)[0]), first
    assert f"dlfs-server {dlfs.__version__} serving on {daemon.address}" in daemon.log()


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_port_in_use_is_said_once_in_the_log_format(daemon, tmp_path, log_format):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "dlfs.server.server_cli", "--data-dir", str(tmp_path / "other"),
         "--listen", daemon.address, "--log-format", log_format],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "add_port" not in result.stderr, result.stderr  # gRPC's own line, held back
    assert not any(logs.GRPC_NATIVE_LINE.match(line) for line in result.stderr.splitlines())
    why = (f"cannot listen on {daemon.address}: the address is in use (another dlfs-server?); "
           "stop that process or choose another --listen port")
    if log_format == "json":
        lines = json_lines(result.stdout + result.stderr)
        assert [line["message"] for line in lines if line["level"] == "CRITICAL"] == \
            [f"cannot start: {why}"]
    else:
        assert result.stderr.splitlines()[-1] == f"dlfs-server: {why}"
