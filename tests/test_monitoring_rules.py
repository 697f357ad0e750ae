"""monitoring/prometheus/alerts.yml: promtool accepts it, its unit tests pass (each alert fires when it should and
stays silent when it should not), and it reads only metrics the exporter or opsctl exports (issue 24)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.monitoring import ALERTS, RULE_TESTS, known_metrics, metric_names, promtool


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def rule_cases() -> list[dict[str, Any]]:
    return [case for path in RULE_TESTS for test in yaml.safe_load(path.read_text())["tests"]
            for case in test.get("alert_rule_test", [])]


def test_promtool_check_rules_accepts_the_alerts() -> None:
    done = promtool("check", "rules", ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    done = promtool("test", "rules", *RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS), done.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    cases = rule_cases()
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']}: no case where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']}: no case where it stays silent"


def test_the_issue_asks_for_these_alerts() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert {"RedisNodeDown", "RedisReplicationLinkDown", "RedisReplicaLagging", "RedisShardWithoutReplica",
            "RedisClusterStateFail", "RedisClusterSlotsNotCovered", "RedisMemoryNearMax",
            "RedisEvictionsOnNoevictionStore", "RedisRejectedConnections", "RedisRdbSaveFailed",
            "RedisAofRewriteFailed", "RedisTooManyClients", "OpsctlBackupMissing"} <= names


def test_alerts_read_only_exported_metrics_and_name_the_node() -> None:
    known = known_metrics()
    for rule in alert_rules():
        read = metric_names(rule["expr"])
        assert read, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        assert read <= known, f"{rule['alert']} reads metrics nothing exports: {sorted(read - known)}"
        assert "{{ $labels.topology }}" in rule["annotations"]["summary"], rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]


def test_metric_names_sees_through_promql() -> None:
    expr = ('(redis_a - ignoring(slave_ip) group_right redis_b{x="y}z"}) > on (i) group_left 0.5 * redis_c '
            'and time() - opsctl_d[5m] offset 1h > 26 * 3600 unless sum by (node) (rate(e:f_total{a=~"$t"}[1m]))')
    assert metric_names(expr) == {"redis_a", "redis_b", "redis_c", "opsctl_d", "e:f_total"}
