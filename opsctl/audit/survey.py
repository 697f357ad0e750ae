"""Run an audit: discover nodes, check each node, scan one node per shard, gather findings and tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opsctl.audit.keynames import style_findings
from opsctl.audit.keyspace import Thresholds, missing_ttl_findings, shard_skew
from opsctl.audit.scan import NodeScan, ScanWants, scan_all
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.discover import LiveNode, discover, scan_targets, unreachable
from opsctl.net.rawpipe import link_error
from opsctl.observe.findings import Finding, finding, ordered
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

CHECKS = ("config", "bigkeys", "hotkeys", "keys", "ttl", "slowlog", "memory", "tls")
SCANNING = {"bigkeys", "hotkeys", "keys", "ttl"}
PER_NODE = {"config", "memory", "slowlog", "hotkeys"}  # hotkeys: the node's maxmemory-policy says whether LFU


@dataclass(frozen=True)
class AuditOptions:
    checks: tuple[str, ...] = CHECKS
    thresholds: Thresholds = field(default_factory=Thresholds)
    allow_masters: bool = False
    max_ops_per_sec: float | None = None
    count: int = 1000
    batch: int = 250
    window: int = 3


@dataclass
class AuditReport:
    spec: str
    checks: tuple[str, ...]
    findings: list[Finding] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "checks": list(self.checks), "stats": self.stats,
                "findings": [f.as_dict() for f in ordered(self.findings)], "tables": self.tables}


def wants_for(options: AuditOptions, lfu: bool) -> ScanWants:
    checks = options.checks
    return ScanWants(sizes="bigkeys" in checks, expiry="ttl" in checks, freq="hotkeys" in checks and lfu,
                     names="keys" in checks, count=options.count, batch=options.batch, window=options.window)


def _node_checks(connector: Connector, ln: LiveNode, checks: Sequence[str], report: AuditReport) -> bool:
    """Per-node checks; returns whether the node runs an LFU policy."""
    from opsctl.audit import nodechecks as nc
    from opsctl.audit import probe  # renders the expected config: loaded only by audits that check nodes

    name = ln.node.name
    with connection_to(connector, ln.node) as handle, handle.dedicated(timeout=5.0) as pipe:
        if "config" in checks:
            report.findings += probe.config_findings(connector, ln.node, pipe)
        if "memory" in checks:
            row = probe.memory_facts(ln.node, pipe)
            report.tables.setdefault("memory", []).append(row)
            report.findings += nc.memory_findings(row)
        if "slowlog" in checks:
            rows = probe.slowlog(ln.node, pipe)
            report.tables.setdefault("slowlog", []).extend(rows)
            report.findings += nc.slowlog_findings(name, rows)
        policy = probe.policy(pipe)
    lfu = "lfu" in policy
    if "hotkeys" in checks and not lfu and ln.role == "master":
        report.findings.append(nc.hotkey_setup_finding(name, policy))
    return lfu


def _scan_tables(scans: Sequence[NodeScan], report: AuditReport, loaded: LoadedSpec) -> None:
    for s in scans:
        if s.keys or s.dbsize:
            report.tables.setdefault("shards", []).append(_shard_row(s))
        report.findings += s.bigkeys.findings(s.node) + s.names.findings(s.node, styles=False)
        if s.errors:
            first = masked(s.first_error[:200], loaded)
            report.findings.append(finding("reachable", "high", s.node, f"{s.errors} commands failed during the scan, "
                                           f"first: {first}", "the results of this node are incomplete; check the "
                                           "node and run the audit again"))
        report.findings += s.expiries.findings(s.node, prefixes=False) + s.hot.findings(s.node)
        report.tables.setdefault("bigkeys", []).extend(b.row(s.node) for b in s.bigkeys.top_described)
        report.tables.setdefault("ttl", []).extend({"node": s.node, **r} for r in s.expiries.rows())
        report.tables.setdefault("hotkeys", []).extend(s.hot.rows(s.node))
    report.findings += missing_ttl_findings({s.node: s.expiries for s in scans})
    report.findings += style_findings({s.node: s.names for s in scans})


def _shard_row(s: NodeScan) -> dict[str, Any]:
    big_memory = sum(b.memory or 0 for b in s.bigkeys.big)
    return {"node": s.node, "shard": s.shard, "keys": s.keys, "used_memory": s.used_memory,
            "big_keys": len(s.bigkeys.big), "big_keys_memory": big_memory, "seconds": round(s.seconds, 3),
            **{f"{t}_keys": n for t, n in sorted(s.bigkeys.counts.items())}}


def masked(text: str, loaded: LoadedSpec) -> str:
    """Server errors echo command names; renamed commands are secrets."""
    for name in loaded.renames.values():
        text = text.replace(name, "***")
    return text


def run_audit(connector: Connector, options: AuditOptions, progress: Emit | None = None,
              nodes: Sequence[Node] | None = None) -> AuditReport:
    """nodes: the nodes that run (by their records: the CLI passes them), by default the spec's as placed; a node
    the next apply adds is not audited, a drained one still running is."""
    loaded = connector.loaded
    report = AuditReport(loaded.spec.name, options.checks)
    started = time.monotonic()
    nodes = list(loaded.layout.nodes if nodes is None else nodes)
    live = discover(connector, [n for n in nodes if not n.is_sentinel])
    report.findings += unreachable(live)
    lfu = True
    for ln in live:
        if ln.role != "down" and PER_NODE & set(options.checks):
            try:
                lfu = _node_checks(connector, ln, options.checks, report) and lfu
            except OpsctlError as exc:  # a node that stopped answering: NodeUnreachable
                report.findings.append(finding("reachable", "high", ln.node.name,
                                               f"checks failed: {masked(link_error(exc), loaded)}",
                                               "check the node's log and the spec's renamed commands"))
    if "tls" in options.checks and loaded.spec.tls.enabled:
        _tls(connector, nodes, report)
    if SCANNING & set(options.checks):
        _scan(connector, live, options, lfu, report, progress)
    report.stats["seconds"] = round(time.monotonic() - started, 3)
    report.findings = ordered(report.findings)
    return report


def _tls(connector: Connector, nodes: Sequence[Node], report: AuditReport) -> None:
    """Every node that runs, sentinels too: certificate days left, protocol, a plaintext port that answers."""
    from opsctl.tls import judge
    from opsctl.tls.handshake import seen
    from opsctl.tls.material import now

    at = now()
    allowed = connector.loaded.spec.tls.plaintext_port
    for node in nodes:
        answer = seen(connector, node)
        report.tables.setdefault("tls", []).append(judge.row(answer, at))
        report.findings += judge.findings(answer, at, allowed)


def _scan(connector: Connector, live: Sequence[LiveNode], options: AuditOptions, lfu: bool, report: AuditReport,
          progress: Emit | None) -> None:
    targets, problems = scan_targets(live, options.allow_masters)
    report.findings += problems
    wants = wants_for(options, lfu)
    t0 = time.monotonic()
    scans = scan_all(connector, targets, wants, options.thresholds, options.max_ops_per_sec, progress)
    elapsed = time.monotonic() - t0
    _scan_tables(scans, report, connector.loaded)
    if "bigkeys" in options.checks and len(scans) > 1:
        report.findings += shard_skew({s.node: s.used_memory for s in scans})
    keys = sum(s.keys for s in scans)
    report.stats.update(scanned_nodes=[t.node.name for t in targets], keys_scanned=keys,
                        scan_seconds=round(elapsed, 3), keys_per_second=int(keys / elapsed) if elapsed else 0)
