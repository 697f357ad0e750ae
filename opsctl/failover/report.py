"""The failover report: who, when, spec, every check with its value, phase timings, topology before and after.

Pure data; the runner writes it as JSON to <state_dir>/failover/ and to --report. No secrets: it holds only
roles, offsets, links and check values (observations are taken without CONFIG GET).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from opsctl.base.frozen import frozen
from opsctl.base.record import Versioned
from opsctl.failover.verdicts import Check, PastFailover, Target
from opsctl.plan.facts import NodeFacts
from opsctl.spec.layout import endpoint
from opsctl.state.readback import load_json, read_record
from opsctl.state.safefs import FileProblem

REPORT_DIR = "failover"
REPORT_LIMIT = 4 * 1024 * 1024
CLOCK_SKEW_S = 60.0
REPORT_HINT = ("a report opsctl wrote is never like this: move the file out of the state dir's failover/ folder "
               "(the cool-down check reads every *-succeeded.json and *-in-progress.json there)")
MAX_TIMEOUT_S = 3600.0


@dataclass
class Attempt:
    """One command sent (graceful, force, takeover, sentinel, failover-command, manual) and how it went."""

    mode: str
    reason: str
    outcome: str = "pending"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the mode did beside the promotion, e.g. who was told


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
    outcome: str = "pending"  # succeeded | refused | failed | dry-run | resumed | in-progress (until the end)
    error: str = ""
    warnings: list[str] = field(default_factory=list)
    spec_file: str = ""
    spec_digest: str = ""
    timeout: float = 0.0  # seconds each phase may take: an in-progress report's failover ends by then

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec, "spec_file": self.spec_file, "spec_digest": self.spec_digest,
            "topology": self.topology, "who": self.who, "started": self.started,
            "mode": self.mode, "dry_run": self.dry_run, "timeout": self.timeout,
            "target": self.target.as_dict() if self.target else None,
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
            "master": endpoint(*role.master) if role and role.master else None,
            "link": role.link if role else None,
            "offset": role.offset if role else None,
            "slots": me.slot_count if me else None,
        }
    return out


@frozen
class SavedPhases(Versioned):
    """A saved report's phases_ms, as the cool-down reads it: the whole run's."""

    READS_PART: ClassVar[bool] = True
    total: float = 0.0

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.total < 0:
            yield "total", "cannot be negative"


@frozen
class SavedTarget(Versioned):
    """A saved report's target, as the cool-down reads it: the master failed over and the replica promoted."""

    READS_PART: ClassVar[bool] = True
    master: str = ""
    replica: str = ""


@frozen
class SavedReport(Versioned):
    """A failover report (FailoverReport.to_dict) as the cool-down check reads it back: the fields it uses, each
    checked by its type; null or missing where the report may leave one out."""

    READS_PART: ClassVar[bool] = True
    outcome: str
    started: float
    phases_ms: SavedPhases = SavedPhases()
    target: SavedTarget = SavedTarget()
    new_master: str = ""
    timeout: float = 0.0  # ranged where it counts: an in-progress report's deadline


def read_past_failover(path: Path, now: float | None = None) -> PastFailover | None:
    """A saved report read back for the cool-down check, every field it uses checked. A report dated in the
    future is refused (it would block failovers until that date), naming the file and how to fix it."""
    report = read_record(SavedReport, load_json(path, REPORT_HINT, REPORT_LIMIT, follow=False), path, REPORT_HINT)
    started, master = report.started, report.target.master
    now = time.time() if now is None else now
    if started <= 0 or started > now + CLOCK_SKEW_S:
        raise FileProblem(path, f"started: {started:.0f} is {started - now:.0f} s in the future" if started > 0
                          else f"started: {started:g} is not a time", REPORT_HINT + "; check this machine's clock")
    replica = report.target.replica if report.outcome == "in-progress" else ""
    if replica and master:  # a run killed mid-way: its failover may have completed until its deadline
        if not 0 <= report.timeout <= MAX_TIMEOUT_S:
            raise FileProblem(path, f"timeout: must be 0..{MAX_TIMEOUT_S:g} seconds", REPORT_HINT)
        return PastFailover(started + report.timeout, master, replica, interrupted=True)
    if report.outcome != "succeeded" or not master or not report.new_master:
        return None
    return PastFailover(started + report.phases_ms.total / 1000, master, report.new_master)


def report_text(report: FailoverReport) -> str:
    t = report.target
    head = f"failover of '{report.spec}' ({report.topology}), mode {report.mode}"
    if t:
        head += f": shard {t.shard}, master {t.promotion()}"
    lines = [head, "pre-checks:", *(f"  {c.line()}" for c in report.prechecks)]
    lines += [f"  warning: {w}" for w in report.warnings]
    for a in report.attempts:
        lines.append(f"attempt {a.mode}: {a.outcome} in {a.seconds * 1000:.0f} ms ({a.reason})")
        lines += [f"  {note}" for note in a.notes]
    if report.postchecks:
        lines += ["post-checks:", *(f"  {c.line()}" for c in report.postchecks)]
    timings = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in report.phases.items())
    lines.append(f"outcome: {report.outcome}" + (f", new master {report.new_master}" if report.new_master else "")
                 + (f" ({timings})" if timings else ""))
    return "\n".join(lines)
