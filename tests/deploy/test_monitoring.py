"""deploy/monitoring/: the Grafana dashboard and the Prometheus alert rules name only
metrics that a real daemon and a real mount export."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dlfs import Client
from dlfs.tools.launch import MountProcess
from helpers.trees import write_tree

MONITORING = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "monitoring")
METRIC = re.compile(r"\b((?:dlfs|process|python)_[a-z0-9_]+)\b")


def _rules() -> list[dict]:
    with open(os.path.join(MONITORING, "dlfs-alerts.yaml")) as f:
        groups = yaml.safe_load(f)["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard() -> dict:
    with open(os.path.join(MONITORING, "dlfs-dashboard.json")) as f:
        return json.load(f)


def _expressions() -> list[str]:
    panels = [p for p in _dashboard()["panels"] if p["type"] != "row"]
    return [rule["expr"] for rule in _rules()] + \
        [target["expr"] for panel in panels for target in panel["targets"]]


def _named(prefix: str) -> set[str]:
    return {name for expr in _expressions() for name in METRIC.findall(expr)
            if name.startswith(prefix)}


def _exported(address: str) -> set[str]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=30).read().decode()
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


def test_rules_and_dashboard_are_well_formed():
    rules = _rules()
    assert len({rule["alert"] for rule in rules}) == len(rules)
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    dashboard = _dashboard()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"


def test_every_daemon_metric_they_name_is_exported(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=["--metrics-listen", "127.0.0.1:0"])
    write_tree(tmp_path / "src", {f"{i}": b"x" * 100 for i in range(4)})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        client.get_batch([0, 1], dataset="ds")
        client.warm("ds", wait=True)
        try:
            client.stat("ds", "missing")
        except Exception:  # noqa: BLE001 - only to have an error counted
            pass
        exported = _exported(client.status().metrics_address)
    wanted = _named("dlfs_") - _named("dlfs_mount_") | _named("process_")
    assert wanted and wanted - exported == set()


@pytest.mark.mount
def test_every_mount_metric_they_name_is_exported(daemon, tmp_path):
    with MountProcess(daemon.address, str(tmp_path / "mnt"), str(tmp_path / "mount.log"),
                      ["--metrics-listen", "127.0.0.1:0"]) as mount:
        os.listdir(mount.mountpoint)
        [where] = re.findall(r"metrics at http://(\S+)/metrics", mount.log())
        exported = _exported(where)
    wanted = _named("dlfs_mount_") | _named("process_")
    assert wanted and wanted - exported == set()
