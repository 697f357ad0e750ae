"""The failover report: who, when, spec, every check with its value, phase timings, topology before and after.

Pure data; the runner writes it as JSON to <state_dir>/failover/ and to --report. No secrets: it holds only
roles, offsets, links and check values (observations are taken without CONFIG GET).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opsctl.failover.checks import Check, PastFailover, Target
from opsctl.plan.facts import NodeFacts

REPORT_DIR = "failover"


@dataclass
class Attempt:
    """One command sent (graceful, force, takeover, sentinel, failover-command, manual) and how it went."""

    mode: str
    reason: str
    outcome: str = "pending"
    seconds: float = 0.0


@dataclass
class FailoverReport:
    spec: str
    topology: str
    who: str
    started: float  # epoch seconds
    mode: str
    dry_run: bool
    target: Target | None = None
    prechecks: list[Check] = field(default_factory=list)
    postchecks: list[Check] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    new_master: str | None = None
    outcome: str = "pending"  # succeeded | refused | failed | dry-run
    error: str = ""
    warnings: list[str] = field(default_factory=list)
    spec_file: str = ""
    spec_digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec, "spec_file": self.spec_file, "spec_digest": self.spec_digest,
            "topology": self.topology, "who": self.who, "started": self.started,
            "mode": self.mode, "dry_run": self.dry_run, "target": self.target.as_dict() if self.target else None,
            "new_master": self.new_master, "outcome": self.outcome, "error": self.error, "warnings": self.warnings,
            "prechecks": [c.as_dict() for c in self.prechecks], "postchecks": [c.as_dict() for c in self.postchecks],
            "attempts": [a.__dict__ for a in self.attempts],
            "phases_ms": {k: round(v * 1000, 1) for k, v in self.phases.items()},
            "before": self.before, "after": self.after,
        }

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def file_name(self) -> str:
        shard = self.target.shard if self.target else 0
        return f"{self.started:.3f}-shard{shard}-{self.outcome}.json"


def topology(facts: Mapping[str, NodeFacts]) -> dict[str, dict[str, Any]]:
    """Per node: role, master, link, offset, slots. What an engineer compares before and after."""
    out: dict[str, dict[str, Any]] = {}
    for name, f in sorted(facts.items()):
        role = f.role
        me = f.myself
        out[name] = {
            "reachable": f.reachable,
            "role": role.kind if role else None,
            "master": f"{role.master[0]}:{role.master[1]}" if role and role.master else None,
            "link": role.link if role else None,
            "offset": role.offset if role else None,
            "slots": me.slot_count if me else None,
        }
    return out


def past_failover(data: Mapping[str, Any]) -> PastFailover | None:
    """A succeeded failover from a saved report, for the cool-down check."""
    target = data.get("target") or {}
    if data.get("outcome") != "succeeded" or not target.get("master") or not data.get("new_master"):
        return None
    finished = float(data.get("started", 0)) + float(data.get("phases_ms", {}).get("total", 0)) / 1000
    return PastFailover(finished, str(target["master"]), str(data["new_master"]))


def report_text(report: FailoverReport) -> str:
    t = report.target
    head = f"failover of '{report.spec}' ({report.topology}), mode {report.mode}"
    if t:
        head += f": shard {t.shard}, master {t.promotion()}"
    lines = [head, "pre-checks:", *(f"  {c.line()}" for c in report.prechecks)]
    lines += [f"  warning: {w}" for w in report.warnings]
    for a in report.attempts:
        lines.append(f"attempt {a.mode}: {a.outcome} in {a.seconds * 1000:.0f} ms ({a.reason})")
    if report.postchecks:
        lines += ["post-checks:", *(f"  {c.line()}" for c in report.postchecks)]
    timings = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in report.phases.items())
    lines.append(f"outcome: {report.outcome}" + (f", new master {report.new_master}" if report.new_master else "")
                 + (f" ({timings})" if timings else ""))
    return "\n".join(lines)
