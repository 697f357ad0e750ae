"""Render an audit report as a text table, JSON or a self-contained HTML page. Pure.

The JSON is the report's own keys: the command line prints them inside its versioned envelope
(opsctl.cli.output.envelope), so this module decides the text, not the envelope."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from opsctl.base.events import plural
from opsctl.observe.findings import Finding, ordered

FINDING_COLUMNS = ("severity", "rule", "node", "message")
TABLE_ORDER = ("shards", "bigkeys", "ttl", "hotkeys", "slowlog", "memory", "tls")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def text_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "  (none)"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [min(60, max(len(c), *(len(row[i]) for row in cells))) for i, c in enumerate(cols)]
    lines = ["  " + "  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  " + "  ".join(v[:60].ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _finding_lines(f: Finding) -> list[str]:
    return [f"[{f.severity.upper():8}] {f.rule}  {f.node}: {f.message}", f"           fix: {f.fix}",
            f"           rule: {f.source}"]


def render_table(report: Mapping[str, Any], findings: Sequence[Finding]) -> str:
    """The report as text: its checks, scan counts, tables and every finding with its fix (no final newline)."""
    lines = [f"opsctl audit of '{report['spec']}': {', '.join(report['checks'])}"]
    stats = report.get("stats", {})
    if stats.get("keys_scanned") is not None:
        lines.append(f"scanned {stats['keys_scanned']} keys on {', '.join(stats.get('scanned_nodes', []))} in "
                     f"{stats.get('scan_seconds')} s ({stats.get('keys_per_second')} keys/s)")
    for name in TABLE_ORDER:
        rows = report.get("tables", {}).get(name)
        if rows:
            lines += ["", f"{name}:", text_table(rows)]
    lines += ["", plural(len(findings), "finding")]
    for f in ordered(findings):
        lines += _finding_lines(f)
    return "\n".join(lines)


def render_json(report: Mapping[str, Any]) -> str:
    """The report's keys as indented JSON; a value JSON has no form for prints as its str."""
    return json.dumps(report, indent=2, sort_keys=False, default=str)


def _html_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    cols = list(rows[0].keys())
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: Mapping[str, Any], findings: Sequence[Finding]) -> str:
    """The report as one self-contained HTML page (no final newline)."""
    title = html.escape(f"opsctl audit of {report['spec']}")
    rows = [{"severity": f.severity, "rule": f.rule, "node": f.node, "message": f.message, "fix": f.fix,
             "source": f.source} for f in ordered(findings)]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
             "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:2px 6px;font-size:13px}</style></head><body>", f"<h1>{title}</h1>",
             f"<h2>{plural(len(findings), 'finding')}</h2>", _html_table(rows)]
    for name in TABLE_ORDER:
        table = report.get("tables", {}).get(name)
        if table:
            parts += [f"<h2>{html.escape(name)}</h2>", _html_table(table)]
    return "".join(parts) + "</body></html>"


def render(report: Mapping[str, Any], findings: Sequence[Finding], output: str) -> str:
    """The report as a file of the output format (json, html or table), ending in a newline."""
    if output == "json":
        return render_json(report) + "\n"
    if output == "html":
        return render_html(report, findings) + "\n"
    return render_table(report, findings) + "\n"
