"""monitoring/grafana/opsctl-redis.json: it parses, every panel query is valid PromQL (promtool, as recording
rules) and reads only metrics the exporter or opsctl exports, and it is templated by topology and node (issue 24)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring import DASHBOARD, known_metrics, metric_names, promtool

# What Grafana puts in place of its variables, so promtool can parse the query
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$topology": ".*", "$node": ".*"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"]
            for target in panel.get("targets", [])]


def expanded(expr: str) -> str:
    """Grafana's variables filled in; a label_replace group reference ($1) stays."""
    return re.sub(r"\$\w+", lambda m: GRAFANA_VARIABLES.get(m.group(0), m.group(0)), expr)


def test_the_dashboard_covers_what_the_issue_lists() -> None:
    read = {name for _, expr in queries() for name in metric_names(expr)}
    assert {"redis_commands_processed_total", "redis_memory_used_bytes", "redis_memory_max_bytes",
            "redis_connected_clients", "redis_connected_slave_lag_seconds", "redis_master_repl_offset",
            "redis_cluster_state", "redis_cluster_slots_ok", "redis_evicted_keys_total", "redis_keyspace_hits_total",
            "redis_keyspace_misses_total", "redis_rdb_last_bgsave_status", "redis_aof_last_bgrewrite_status",
            "opsctl_last_success_timestamp_seconds"} <= read


def test_every_query_reads_only_exported_metrics() -> None:
    known = known_metrics()
    assert len(queries()) > 30
    for title, expr in queries():
        read = metric_names(expr)
        assert read, f"{title}: no metric found in {expr!r}"
        assert read <= known, f"{title} reads metrics nothing exports: {sorted(read - known)}"


def test_templated_by_topology_and_node() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("topology", "node"):
        query = variables[name]["query"]["query"]
        metric = re.match(r"label_values\((\w+)", query)
        assert metric and metric.group(1) in known_metrics() and query.endswith(f", {name})"), query
    for title, expr in queries():
        assert 'topology=~"$topology"' in expr, f"{title}: not filtered by the topology variable"
    assert len({p["id"] for p in dashboard()["panels"]}) == len(dashboard()["panels"])


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:q{i}", "expr": expanded(expr)} for i, (_, expr) in enumerate(queries())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool("check", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr
