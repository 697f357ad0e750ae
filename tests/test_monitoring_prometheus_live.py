"""The rules and the dashboard against a real Prometheus (issue 24, "must show"): a 3+3 cluster and a Sentinel fleet,
both with metrics.exporter, scraped by Debian's Prometheus through `opsctl metrics targets`, and opsctl's own signals
(a real `opsctl backup --metrics-textfile`, a standby link's textfile) through Debian's node_exporter. Every query
of the dashboard returns a series; killing a cluster master makes RedisNodeDown fire for it, killing its shard's
last node makes RedisClusterStateFail and RedisClusterSlotsNotCovered fire, and a stalled (SIGSTOPped) Sentinel is a
node down too.
The rules are monitoring/prometheus/alerts.yml with every `for:` cut to FOR so the test stays short. Fails (not
skips) under CI=true without the Debian packages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from opsctl.cli.runsignals import LinkTextfile
from opsctl.metrics.exporter import EXPORTER_BINARY
from opsctl.migrate.migration import MigrateLag
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, run
from tests.monitoring import ALERTS
from tests.support import PASSWORD
from tests.test_metrics_exporter_live import _free_port, _needs, _prometheus, _targets_up
from tests.test_monitoring_dashboard import GRAFANA_VARIABLES, queries
from tests.writer import cluster_client

pytestmark = pytest.mark.integration
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
FOR = "2s"
WAIT_S = 60.0


def _rules_copy(tmp_path: Path) -> Path:
    """alerts.yml with every `for:` cut to FOR (the expressions untouched)."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump(rules))
    return path


@contextmanager
def _node_exporter(textfiles: Path) -> Iterator[str]:
    """Debian's node_exporter with the textfile collector alone, on loopback; yields its address."""
    address = f"127.0.0.1:{_free_port()}"
    process = subprocess.Popen(
        [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
         f"--collector.textfile.directory={textfiles}", f"--web.listen-address={address}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        yield address
    finally:
        process.terminate()
        process.wait(30)


def _api(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=10) as reply:
        return json.loads(reply.read())["data"]


def _expanded(expr: str) -> str:
    """A panel's query as Grafana sends it: every topology and node, a rate window that 1 s scrapes fill fast."""
    values = {**GRAFANA_VARIABLES, "$__rate_interval": "15s"}
    for name, value in values.items():
        expr = expr.replace(name, value)
    return expr


def _empty_queries(url: str) -> list[str]:
    return [f"{title}: {expr}" for title, expr in queries()
            if not _api(url, "query", query=_expanded(expr))["result"]]


def _wait_for_alert(url: str, name: str, labels: dict[str, str], since: float) -> float:
    """Seconds from since until the alert fires with these labels (pending does not count)."""
    deadline = time.monotonic() + WAIT_S
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = [a for a in _api(url, "alerts")["alerts"] if a["labels"].get("alertname") == name]
        if any(a["state"] == "firing" and labels.items() <= a["labels"].items() for a in seen):
            return time.monotonic() - since
        time.sleep(0.2)
    raise AssertionError(f"{name} {labels} did not fire within {WAIT_S:g} s: {seen}")


def _pid(spec: Path, loaded: LoadedSpec, node: Node) -> int:
    return int((spec.parent / ".opsctl" / loaded.spec.name / node.name / "server.pid").read_text())


def _oom_once(loaded: LoadedSpec) -> None:
    """One write refused with OOM on the Sentinel fleet's master (maxmemory 1 byte, noeviction for a moment, then the
    spec's values back): the dashboard's OOM query then has a series, as it has on a store that ever filled up."""
    master = loaded.layout.node(loaded.layout.shards[0].master)
    client = redis.Redis(master.address, master.port, password=PASSWORD, socket_timeout=5)
    config = loaded.spec.hardening.renamed_commands.get("CONFIG", "CONFIG")
    before = client.execute_command(config, "GET", "maxmemory*")
    values = before if isinstance(before, dict) else dict(zip(before[::2], before[1::2], strict=True))
    client.execute_command(config, "SET", "maxmemory-policy", "noeviction", "maxmemory", "1")
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("oom-probe", "x")
    finally:
        client.execute_command(config, "SET", "maxmemory-policy", values[b"maxmemory-policy"],
                               "maxmemory", values[b"maxmemory"])
        client.close()


@contextmanager
def _standby_link(textfiles: Path, standby: str) -> Iterator[Callable[[], None]]:
    """A standby link's textfile kept current as `opsctl follow --metrics-textfile` keeps it (its LinkTextfile, fed
    the lag reports a streaming link makes twice a second): the standby panels have series and
    RedisStandbyNotFollowing stays silent while it is refreshed; yields what stops the link (its file then says
    following 0, as a stopped `follow` leaves it). A real standby here would add two topologies to a test about the
    dashboard; tests/test_standby_live.py runs the link itself."""
    link = LinkTextfile(str(textfiles), standby, lambda event: None, json_mode=False)
    stop = threading.Event()

    def stopped() -> None:
        stop.set()
        thread.join()
        link.stopped(switched=False)

    def refresh() -> None:
        while not stop.is_set():
            link(MigrateLag({"shard-1": {"phase": "stream", "lag_bytes": 0, "lag_seconds": 0.0,
                                         "applied_at": time.time()}}))
            stop.wait(0.5)
    thread = threading.Thread(target=refresh, name="standby-textfile", daemon=True)
    thread.start()
    try:
        yield stopped
    finally:
        stop.set()
        thread.join()
        link.stopped(switched=True)


def _hot_slots_once(loaded: LoadedSpec, spec: Path, textfiles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Keys on every master, then a real `audit --hot --metrics-textfile`: the heat map's query has a series (Redis
    7.0 counts no cpu per slot, so the slots rank by keys, and an empty cluster ranks none)."""
    client = cluster_client(loaded)
    try:
        for i in range(60):
            client.set(f"heat:{i}", "x")
    finally:
        client.close()
    code, out, err = run(capsys, "audit", "-f", str(spec), "--hot", "--hot-window", "0.5",
                         "--metrics-textfile", str(textfiles))
    assert code == 0, err + out
    assert "opsctl_slot_load_share{" in (textfiles / f"opsctl_{loaded.spec.name}_audit_hot.prom").read_text()


def test_dashboard_queries_return_series_and_a_killed_master_fires_the_alerts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path, package in ((EXPORTER_BINARY, "prometheus-redis-exporter"), ("/usr/bin/prometheus", "prometheus"),
                          (NODE_EXPORTER, "prometheus-node-exporter")):
        _needs(path, package)
    (tmp_path / "cluster").mkdir()
    (tmp_path / "sentinel").mkdir()
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    with ExitStack() as stack:
        cluster_spec, cluster = stack.enter_context(
            deployed(tmp_path / "cluster", capsys, "cluster", "redis", metrics={"exporter": True}))
        sentinel_spec, fleet = stack.enter_context(
            deployed(tmp_path / "sentinel", capsys, "sentinel", "valkey", metrics={"exporter": True}))
        targets = tmp_path / "targets"
        targets.mkdir()
        for spec, loaded in ((cluster_spec, cluster), (sentinel_spec, fleet)):
            code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--out",
                                 str(targets / f"{loaded.spec.name}.json"))
            assert code == 0, err
        code, out, err = run(capsys, "backup", "-f", str(sentinel_spec), "--to", str(tmp_path / "backups"),
                             "--metrics-textfile", str(textfiles))
        assert code == 0, err + out
        _hot_slots_once(cluster, cluster_spec, textfiles, capsys)
        _oom_once(fleet)
        stop_link = stack.enter_context(_standby_link(textfiles, "dr"))
        node_exporter = stack.enter_context(_node_exporter(textfiles))
        url = stack.enter_context(_prometheus(tmp_path, targets / "*.json", _rules_copy(tmp_path), [node_exporter]))
        _targets_up(url, len(cluster.layout.nodes) + len(fleet.layout.nodes) + 1)

        deadline = time.monotonic() + WAIT_S
        while (empty := _empty_queries(url)) and time.monotonic() < deadline:
            time.sleep(1)
        assert empty == [], f"{len(empty)} of {len(queries())} dashboard queries return no series"
        assert _api(url, "alerts")["alerts"] == []  # a healthy fleet fires nothing, pending nothing

        master = cluster.layout.node(cluster.layout.shards[0].master)
        killed = time.monotonic()
        os.kill(_pid(cluster_spec, cluster, master), signal.SIGKILL)
        down = _wait_for_alert(url, "RedisNodeDown", {"node": master.name}, killed)
        replica = next(n for n in cluster.layout.servers if n.shard == master.shard and n.name != master.name)
        killed = time.monotonic()
        os.kill(_pid(cluster_spec, cluster, replica), signal.SIGKILL)  # the shard's last node: its slots are gone
        state = _wait_for_alert(url, "RedisClusterStateFail", {"topology": cluster.spec.name}, killed)
        slots = _wait_for_alert(url, "RedisClusterSlotsNotCovered", {"topology": cluster.spec.name}, killed)
        sentinel = fleet.layout.sentinels[0]
        pid = _pid(sentinel_spec, fleet, sentinel)
        stalled = time.monotonic()
        os.kill(pid, signal.SIGSTOP)  # a stalled node: its exporter's scrape outlasts the scrape timeout
        try:
            stall = _wait_for_alert(url, "RedisNodeDown", {"node": sentinel.name}, stalled)
        finally:
            os.kill(pid, signal.SIGCONT)
        link_stopped = time.monotonic()
        stop_link()
        link = _wait_for_alert(url, "RedisStandbyNotFollowing", {"topology": "dr"}, link_stopped)
        with capsys.disabled():
            print(f"RedisStandbyNotFollowing fired {link:.1f} s after the link's textfile said following 0")
            print(f"RedisNodeDown fired {down:.1f} s after the master's SIGKILL; RedisClusterStateFail {state:.1f} s "
                  f"and RedisClusterSlotsNotCovered {slots:.1f} s after its shard's last node's (for: {FOR}, "
                  f"node_timeout {cluster.spec.cluster_or_default().node_timeout_ms} ms, 1 s scrapes); "
                  f"RedisNodeDown {stall:.1f} s after a Sentinel's SIGSTOP")
