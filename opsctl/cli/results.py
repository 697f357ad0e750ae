"""What each command prints when it is done, as a typed value (opsctl.cli.output.Result): its text for people and
the object --output json prints (inside opsctl.cli.output.envelope). A result's keys and text stay what scripts
and people read already: one value, so the two outputs cannot drift apart. More: docs/internals.md.

The slot subcommands' result text (their events print through opsctl.cli.output.Printer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opsctl.base.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK
from opsctl.base.events import human_bytes
from opsctl.base.frozen import Frozen, frozen
from opsctl.slots.session import SlotsOutcome

if TYPE_CHECKING:
    from opsctl.audit.bigdelete import DeleteResult
    from opsctl.audit.survey import AuditReport
    from opsctl.backup.manifest import Manifest
    from opsctl.backup.save import BackupDone
    from opsctl.backup.timeline import Listed
    from opsctl.cluster.check import ClusterReport
    from opsctl.failover.report import FailoverReport
    from opsctl.restore.copying import RestoreDone
    from opsctl.slots.session import SlotsOutcome
    from opsctl.spec.load import LoadedSpec

@frozen
class ClusterCheckResult(Frozen):
    """cluster check: coverage, open slots and agreement of the cluster's nodes."""

    report: ClusterReport

    def text(self) -> str:
        from opsctl.cluster.check import report_text

        return report_text(self.report)

    def to_dict(self) -> dict[str, Any]:
        return self.report.to_dict()


@frozen
class SlotsResult(Frozen):
    """cluster reshard, rebalance and fix: the moves made (or, in a dry run, that would be), their summary and
    notes."""

    outcome: SlotsOutcome

    def text(self) -> str:

        return outcome_text(self.outcome)

    def to_dict(self) -> dict[str, object]:
        outcome = self.outcome
        out: dict[str, object] = {"dry_run": outcome.dry_run, "moves": [m.to_json() for m in outcome.moves],
                                  "summary": outcome.summary.to_json() if outcome.summary else {},
                                  "notes": list(outcome.notes)}
        if outcome.plan:
            out["plan"] = outcome.plan
        return out


@frozen
class HotResult(Frozen):
    """audit --hot: per master, its hottest slots (share of the load, keys) and their hottest keys (LFU)."""

    report: dict[str, Any]

    def text(self) -> str:
        lines = [f"Hottest slots by {self.report['by']} ({self.report['measured']})"]
        for master in self.report["masters"]:
            lines.append(f"{master['master']}: {master['share']:.1%} of the load")
            for s in master["slots"]:
                keys = f"; hottest keys: {', '.join(s['top_keys'])}" if s["top_keys"] else ""
                lines.append(f"  slot {s['slot']}: {s['share']:.2%}, {s['keys']} keys{keys}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return dict(self.report)


@frozen
class FailoverResult(Frozen):
    """failover: the whole report as JSON; as text its last line (the outcome), the steps having printed as
    they ran."""

    report: FailoverReport

    def text(self) -> str:
        from opsctl.failover.report import report_text

        return report_text(self.report).splitlines()[-1]

    def to_dict(self) -> dict[str, Any]:
        return self.report.to_dict()


@frozen
class AuditResult(Frozen):
    """audit: the findings and tables of the checks that ran; as text a table, or an HTML page when html."""

    report: AuditReport
    html: bool = False

    def text(self) -> str:
        from opsctl.audit.formats import render_html, render_table

        render = render_html if self.html else render_table
        return render(self.report.as_dict(), self.report.findings)

    def to_dict(self) -> dict[str, Any]:
        return self.report.as_dict()


@frozen
class BigKeyDeleteResult(Frozen):
    """bigkey delete: how the key is (or, in a dry run, would be) deleted, and what it took."""

    result: DeleteResult
    dry_run: bool

    def text(self) -> str:
        result = self.result
        lines = [("would delete " if self.dry_run else "") + result.plan.describe()]
        if not self.dry_run and result.plan.method != "missing":
            lines.append(f"deleted: {result.removed} elements in {result.round_trips} round trips, "
                         f"{result.seconds:.2f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        plan, result = self.result.plan, self.result
        return {"key": plan.key.decode("utf-8", "backslashreplace"), "node": plan.node, "endpoint": plan.endpoint,
                "type": plan.type, "size": plan.size, "method": plan.method, "dry_run": self.dry_run,
                "removed": 0 if self.dry_run else result.removed,
                "round_trips": 0 if self.dry_run else result.round_trips,
                "seconds": 0.0 if self.dry_run else round(result.seconds, 3)}


@frozen
class ValidateResult(Frozen):
    """validate: the spec is valid; its derived nodes, one a line. secrets: whether they were checked too."""

    loaded: LoadedSpec
    secrets: bool = True

    def text(self) -> str:
        from opsctl.base.events import plural

        loaded, nodes = self.loaded, self.loaded.layout.nodes
        unchecked = "" if self.secrets else " (secrets not checked)"
        lines = [f"{loaded.file}: valid {loaded.spec.topology} spec '{loaded.spec.name}', "
                 f"{plural(len(nodes), 'node')}{unchecked}"]
        for node in nodes:
            shard = f" shard {node.shard}" if node.shard else ""
            lines.append(f"  {node.name:<24} {node.role:<9}{shard:<9} {node.host:<16} {node.endpoint}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        loaded = self.loaded
        return {"valid": True, "file": str(loaded.file), "name": loaded.spec.name,
                "topology": loaded.spec.topology, "secrets_checked": self.secrets,
                "nodes": [{"name": n.name, "role": n.role, "shard": n.shard, "host": n.host, "endpoint": n.endpoint}
                          for n in loaded.layout.nodes]}


@frozen
class LinesResult(Frozen):
    """destroy and tls rotate: what was done (or, in a dry run, would be), one line per node as the text printed them
    while they ran, and the facts a script reads."""

    lines: tuple[str, ...]
    facts: tuple[tuple[str, object], ...]

    def text(self) -> str:
        return "\n".join(self.lines)

    def to_dict(self) -> dict[str, Any]:
        return {**dict(self.facts), "lines": list(self.lines)}


@frozen
class TlsCaResult(Frozen):
    """tls ca: the CA certificates clients must trust, PEM (as text, exactly the PEM)."""

    pem: str

    def text(self) -> str:
        return self.pem.removesuffix("\n")

    def to_dict(self) -> dict[str, Any]:
        return {"pem": self.pem}


@frozen
class BackupResult(Frozen):
    """backup: the folder made and its manifest, one line per shard file (the JSON is the backup-done event)."""

    folder: str
    manifest: Manifest

    def text(self) -> str:
        from opsctl.backup.manifest import describe

        lines = [f"backup {self.folder}: {describe(self.manifest)}"]
        lines += [f"  {shard.file:<14} {shard.bytes:>12} bytes  {shard.total_keys:>10} keys  from {shard.node} "
                  f"({shard.role})  sha256 {shard.sha256[:16]}" for shard in self.manifest.shards]
        return "\n".join(lines)


@frozen
class CatalogResult(Frozen):
    """backup list / prune: every base of a location, oldest first, with what each shard's archive covers; after a
    prune, the bases it dropped."""

    where: str
    listed: tuple[Listed, ...]
    dropped: tuple[str, ...] | None

    def text(self) -> str:
        from opsctl.backup.timeline import iso

        lines = [f"dropped {len(self.dropped)} base(s) and their segments: {', '.join(self.dropped) or 'none'}"
                 ] if self.dropped is not None else []
        lines.append(f"{self.where}: {len(self.listed)} base(s)")
        for item in self.listed:
            b = item.base
            kind = ("archive base" if b.archived else "backup") if b.complete else "unfinished (never restored from)"
            lines.append(f"  {b.name}  {kind}, serves from {iso(b.taken)}")
            lines += [f"    shard {s.shard}: {s.segments} segments to offset {s.offset}"
                      + (f", complete until {iso(s.until)}" if s.until else "")
                      + (f"; {s.problem}" if s.problem else "") for s in item.spans]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.where, "dropped": list(self.dropped) if self.dropped is not None else None,
                "bases": [{"name": i.base.name, "spec": i.base.spec, "complete": i.base.complete,
                           "archive": i.base.archived, "serves_from": i.base.taken,
                           "shards": [{"shard": s.shard, "segments": s.segments, "offset": s.offset,
                                       "until": s.until, "problem": s.problem} for s in i.spans]}
                          for i in self.listed]}


@frozen
class VerifyResult(Frozen):
    """backup verify: every checksum and key count of the folder matches its manifest (the JSON is the
    verify-done event)."""

    folder: str
    manifest: Manifest

    def text(self) -> str:
        from opsctl.backup.manifest import describe

        return f"ok {self.folder}: {describe(self.manifest)}; every checksum and key count matches"


@frozen
class RestoreResult(Frozen):
    """restore: what was copied (or, in a dry run, would be) and how it checked (the JSON is the restore-done or
    restore-dry-run event)."""

    done: RestoreDone

    def text(self) -> str:
        done = self.done
        if done.dry_run and not done.rechecked:
            return (f"dry run: would restore {done.source} into {done.target} (mode {done.mode}); "
                    "every check passed, nothing was written")
        resumed = " (resumed)" if done.resumed else ""
        if done.rechecked:
            lines = [f"already restored: {done.source} into {done.target} by an earlier run (mode {done.mode}); "
                     "checked again, nothing copied"]
        else:
            lines = [f"restored {done.source} into {done.target}{resumed}: {done.keys} keys in "
                     f"{done.seconds:.1f}s ({done.keys_per_sec or 0} keys/s), mode {done.mode}"]
        for key, counts in sorted(done.sources.items()):
            lines.append(f"  {key:<28} {counts['keys']:>10} read  {counts['restored']:>10} restored  "
                         f"{counts['existing']:>8} already there  {counts['skipped']:>8} skipped")
        if done.problems:
            lines.append("problems:")
            lines += [f"  {p}" for p in done.problems]
        else:
            lines.append(f"verified: key counts match; {done.verified} keys compared with the source, all equal")
        return "\n".join(lines)


def load_plan_text(plan: Mapping[str, Any]) -> list[str]:
    """rebalance --by a load: each master's share now and after, the slots to move with their cost."""
    lines = [f"Load by {plan['by']} ({plan['measured']}): busiest master at {plan['spread_now']:.2f}x the mean now, "
             f"{plan['spread_after']:.2f}x after"]
    lines += [f"  {m['master']}: {m['share_now']:.1%} now -> {m['share_after']:.1%} after" for m in plan["masters"]]
    moves = plan["slot_moves"]
    if moves:
        lines.append(f"Slots to move: {len(moves)}, {plan['keys_moved']} keys")
        lines += [f"  slot {m['slot']}: {m['source']} -> {m['target']}, {m['share']:.2%} of the load, {m['keys']} keys"
                  for m in moves[:PLAN_LINES]]
        if len(moves) > PLAN_LINES:
            lines.append(f"  ... and {len(moves) - PLAN_LINES} more (--output json lists them all)")
    if not plan["reached"]:
        lines.append("  the spread cannot be reached by whole slots (see the notes)")
    return lines


PLAN_LINES = 20  # slot moves a text plan lists


def outcome_text(outcome: SlotsOutcome) -> str:
    lines = load_plan_text(outcome.plan) if outcome.plan else []
    lines.append(("Would move" if outcome.dry_run else "Moves") + f": {len(outcome.moves)}")
    for m in outcome.moves:
        lines.append(f"  {m.source} -> {m.target}: {m.slot_count} slots ({m.slots}), "
                     f"~{m.est_keys} keys, ~{human_bytes(m.est_bytes)}")
    lines += [f"  {note}" for note in outcome.notes]
    s = outcome.summary
    if s:
        lines.append(f"moved {s.slots_done} slots, {s.keys} keys in {s.seconds:.2f}s "
                     f"({s.keys_per_sec:.0f} keys/s, {s.mode})")
    return "\n".join(lines)


@frozen
class Audited(Frozen):
    """One topology's audit in a fleet: its findings counted by severity on its line; as JSON the single audit's
    report. unread: nodes the audit could not read (the single audit's exit 1)."""

    report: AuditReport
    fail_on: str

    @property
    def unread(self) -> list[str]:
        from opsctl.observe.findings import UNREAD_RULE

        return sorted({f.node for f in self.report.findings if f.rule == UNREAD_RULE})

    @property
    def code(self) -> int:
        from opsctl.observe.findings import at_or_above

        if self.unread:
            return EXIT_ERROR
        return EXIT_FINDINGS if at_or_above(self.report.findings, self.fail_on) else EXIT_OK

    def text(self) -> str:
        from collections import Counter

        from opsctl.base.events import plural
        from opsctl.observe.findings import ordered

        counts = Counter(f.severity for f in ordered(self.report.findings))
        line = plural(len(self.report.findings), "finding")
        line += f" ({', '.join(f'{n} {severity}' for severity, n in counts.items())})" if counts else ""
        return line + (f"; could not read {', '.join(self.unread)}: incomplete" if self.unread else "")

    def to_dict(self) -> dict[str, Any]:
        return self.report.as_dict()


@frozen
class Backed(Frozen):
    """One topology's backup in a fleet: where it went and what it holds; as JSON the single backup's result, its
    backup-done event."""

    where: str
    manifest: Manifest
    done: BackupDone | None = None

    def text(self) -> str:
        from opsctl.backup.manifest import describe

        return f"{self.where}: {describe(self.manifest)}"

    def to_dict(self) -> dict[str, object]:
        from opsctl.base.events import as_dict

        return as_dict(self.done) if self.done is not None else {"dir": self.where}


@frozen
class Inventoried(Frozen):
    """One topology's inventory in a fleet: what was written on its line; as JSON the inventory in Ansible's JSON
    form (the single command's -o json) when it was asked for, and what was written."""

    lines: tuple[str, ...]
    inventory: dict[str, Any] | None

    def text(self) -> str:
        return "; ".join(line for line in self.lines if not line.startswith("run: ")) or "inventory read"

    def to_dict(self) -> dict[str, Any]:
        return {**(self.inventory or {}), "wrote": list(self.lines)}
