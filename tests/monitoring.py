"""Helpers for the monitoring tests: promtool, the metric names a query reads, and the names that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from opsctl.metrics.signals import METRIC_HELP
from tests.support import missing

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
ALERTS = MONITORING / "prometheus" / "alerts.yml"
RULE_TESTS = sorted((MONITORING / "prometheus" / "tests").glob("*.yml"))
DASHBOARD = MONITORING / "grafana" / "opsctl-redis.json"
EXPORTER_NAMES = Path(__file__).resolve().parent / "fixtures" / "redis_exporter_metrics.txt"

_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                       "bool", "offset", "inf", "nan"})


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Debian's promtool (package prometheus): missing fails under CI=true, skips elsewhere."""
    path = shutil.which("promtool")
    if path is None:
        missing("promtool (apt-get install prometheus)")
    return subprocess.run([str(path), *map(str, args)], capture_output=True, text=True, timeout=600, check=False)


def known_metrics() -> frozenset[str]:
    """What a query may read: the exporter's names from a real scrape, opsctl's textfile names, Prometheus' up, and
    node_exporter's textfile collector's file times (a dead `opsctl follow` leaves its file unrefreshed)."""
    lines = EXPORTER_NAMES.read_text().splitlines()
    return frozenset({*(n for n in lines if n and not n.startswith("#")), *METRIC_HELP, "up",
                      "node_textfile_mtime_seconds"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label matchers, ranges,
    grouping label lists, function calls, keywords and numbers are set aside."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS:
            names.add(match.group(1))
    return names
