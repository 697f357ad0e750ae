"""The failover runbook, I/O shell: observe once in parallel, pre-check, fail over, poll, post-check, report.

The judging is pure (opsctl.failover.checks); the topology-specific commands live in opsctl.failover.actions.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opsctl.base import stop
from opsctl.base.errors import ConvergenceError, NodeError, OpsctlError, RefusedError
from opsctl.base.events import Emit, Note
from opsctl.base.poll import Pending, wait_for
from opsctl.base.record import digest
from opsctl.failover import actions, fence
from opsctl.failover.actions import Session
from opsctl.failover.checks import (
    cluster_prechecks,
    failed,
    postchecks,
    probe_key,
    replication_prechecks,
    resolve_target,
    sentinel_prechecks,
    thresholds_for,
)
from opsctl.failover.promotion import PING_PERIOD, promotion_prechecks
from opsctl.failover.report import REPORT_DIR, Attempt, FailoverReport, read_past_failover, report_text, topology
from opsctl.failover.verdicts import Check, PastFailover, Target
from opsctl.net.connection import said
from opsctl.net.connector import Connector
from opsctl.net.topolock import check_held
from opsctl.plan.desired import rendered_values
from opsctl.plan.facts import NodeFacts
from opsctl.providers.base import Provider
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import check_state_path, write_private

ESCALATION = ("graceful", "force", "takeover")
POLL = 0.003


@dataclass(frozen=True)
class Options:
    shard: int | None = None
    master: str | None = None
    to: str | None = None
    mode: str = "graceful"
    escalate: bool = False
    dry_run: bool = False
    force_checks: bool = False
    yes: bool = False
    max_lag_bytes: int = 1024 * 1024
    max_lag_seconds: int = 3
    timeout: float = 10.0
    report: str | None = None
    failover_command: bool = True  # replication: use FAILOVER where the server has it


def load_history(state_dir: Path) -> list[PastFailover]:
    out: list[PastFailover] = []
    directory = state_dir / REPORT_DIR
    check_state_path(directory, below=state_dir.parent)
    for path in sorted([*directory.glob("*-succeeded.json"), *directory.glob("*-in-progress.json")])[-50:]:
        past = read_past_failover(path)
        if past:
            out.append(past)
    return out


def write_report(report: FailoverReport, state_dir: Path, extra: str | None) -> list[Path]:
    paths = [Path(extra)] if extra else []
    if not report.dry_run:
        directory = state_dir / REPORT_DIR
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths.insert(0, directory / report.file_name())
    for path in paths:
        write_private(path, report.json())
    return paths


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def run_failover(connector: Connector, state_dir: Path, opts: Options, emit: Emit,
                 provider: Provider | None = None) -> FailoverReport:
    """The whole runbook; always writes the report (except a dry run's to the state dir), then raises on failure.
    Before acting it leaves an in-progress report, so a run killed mid-way still counts for the cool-down.
    provider: a replication topology's forced promotion stops the silent old master's process through it."""
    loaded = connector.loaded
    report = FailoverReport(loaded.spec.name, loaded.spec.topology, _who(), time.time(), opts.mode, opts.dry_run,
                            spec_file=str(loaded.file), spec_digest=digest(loaded.spec.model_dump(mode="json")),
                            timeout=opts.timeout)
    started = time.monotonic()
    session = Session(connector, provider)
    marker: list[Path] = []
    try:
        _run(session, state_dir, opts, report, emit, lambda: marker.extend(write_report(report, state_dir, None)))
    except OpsctlError as exc:
        if report.outcome == "pending":
            report.outcome = "refused" if isinstance(exc, RefusedError) else "failed"
        report.error = exc.summary
        raise
    finally:
        session.close()
        report.phases["total"] = time.monotonic() - started
        for path in write_report(report, state_dir, opts.report):
            emit(Note(f"report: {path}"))
        for path in marker:
            path.unlink(missing_ok=True)
    return report


def _phase(report: FailoverReport, name: str, started: float) -> float:
    now = time.monotonic()
    report.phases[name] = now - started
    return now


def _run(session: Session, state_dir: Path, opts: Options, report: FailoverReport, emit: Emit,
         mark: Callable[[], None]) -> None:
    loaded = session.loaded
    t = time.monotonic()
    if _finish_interrupted(session, opts, report, emit):
        return
    facts = session.facts()
    report.before = topology(facts)
    modes = _modes(loaded, opts)
    forced = modes[0] in ("force", "takeover", "promote")
    target = resolve_target(loaded, facts, opts.shard, opts.master, opts.to, promote=forced)
    report.target = target
    checks = _prechecks(session, facts, target, opts, state_dir, forced)
    report.prechecks = checks
    t = _phase(report, "prechecks", t)
    emit(Note(f"pre-checks for shard {target.shard}: {target.promotion()}"))
    for check in checks:
        emit(Note(f"  {check.line()}" + (f"\n      hint: {check.hint}" if not check.passed and check.hint else "")))
    _gate(report, checks, opts, emit)
    if target.replica is None and modes != ("sentinel",):  # --force-checks cannot make one
        gone = not forced and not facts[target.master].reachable
        raise RefusedError(f"shard {target.shard} has no replica to promote: {target.no_replica}",
                           "nothing was changed", "the master is gone: `--mode force --yes` promotes the replica "
                           "holding the most data (docs/runbooks/failover.md)" if gone else
                           "start or repair a replica (opsctl status shows them), then re-run")
    if opts.dry_run:
        report.outcome = "dry-run"
        for step in actions.describe(loaded, target, modes):
            emit(Note(f"  would: {step}"))
        return
    check_held(session.connector)  # paused past the lock's lease after the checks: another run may have acted
    report.outcome = "in-progress"
    mark()
    report.outcome = "pending"
    try:
        with stop.finishing("the failover"):  # a stop request: the promotion finishes or its fence is lifted
            _act(session, target, modes, report, emit, opts.timeout, t)
    except stop.Stopped as exc:
        if report.outcome != "succeeded":
            raise
        raise stop.Stopped(exc.signum, f"the failover finished first: {report.new_master} is the master, "
                           "post-checks passed", "nothing is left to do (`opsctl status -f SPEC` shows it)") from None


def _act(session: Session, target: Target, modes: tuple[str, ...], report: FailoverReport, emit: Emit,
         timeout: float, t: float) -> None:
    """Fail over, then wait for the post-checks; the report's outcome says how it ended."""
    new_master = _failover(session, target, modes, report, emit, timeout)
    t = _phase(report, "failover", t)
    forced = report.attempts[-1].mode in ("force", "takeover", "promote")
    report.postchecks, after = _wait_postchecks(session, target.master, new_master, timeout, forced)
    report.after = topology(after)
    _phase(report, "postchecks", t)
    report.new_master = new_master
    for check in report.postchecks:
        emit(Note(f"  {check.line()}"))
    if failed(report.postchecks):
        report.outcome = "failed"
        raise OpsctlError(f"the failover to {new_master} happened but post-checks failed",
                          "\n".join(c.line() for c in failed(report.postchecks)),
                          "read the report; `opsctl status -f SPEC` shows the roles now")
    report.outcome = "succeeded"


def _finish_interrupted(session: Session, opts: Options, report: FailoverReport, emit: Emit) -> bool:
    """A fence left by a killed run: finish that failover first. True when it had promoted a replica (then this
    run stops there: the failover asked for has happened; run again to fail over once more)."""
    handle_of = lambda node: session.connections[node.name]  # noqa: E731
    if opts.dry_run:
        for node in fence.fenced_nodes(session.loaded, handle_of):
            emit(Note(f"{node.name} is fenced by an interrupted failover: a real run finishes that failover first"))
        return False
    done = fence.finish(session.loaded, handle_of, emit)
    switched = [f for f in done if f.master]
    if not switched:
        return False
    report.outcome, report.new_master = "resumed", switched[0].master
    report.warnings += [f"interrupted failover finished: {f.line()}" for f in done]
    report.after = topology(session.facts())
    emit(Note(f"not failing over again: {switched[0].master} is the master now; "
              "run the command again for another failover"))
    return True


def _prechecks(session: Session, facts: dict[str, NodeFacts], target: Target, opts: Options,
               state_dir: Path, forced: bool) -> list[Check]:
    loaded = session.loaded
    limits = thresholds_for(loaded, opts.max_lag_bytes, opts.max_lag_seconds)
    topo = loaded.spec.topology
    if topo == "cluster":
        return cluster_prechecks(loaded, facts, target, limits, load_history(state_dir), time.time(), forced)
    if topo == "sentinel":
        return sentinel_prechecks(loaded, facts, target, limits, session.quorum())
    if topo == "replication" and opts.mode == "force":
        period = rendered_values(loaded, loaded.layout.node(target.master), {PING_PERIOD: "10"})[PING_PERIOD]
        return promotion_prechecks(loaded.layout, facts, target, float(period))
    if topo == "replication":
        return replication_prechecks(loaded, facts, target, limits)
    raise OpsctlError("a standalone topology has no replica to fail over to",
                      hint="use a replication, sentinel or cluster topology")


def _gate(report: FailoverReport, checks: list[Check], opts: Options, emit: Emit) -> None:
    bad = failed(checks)
    binding = [c for c in bad if c.binding]
    if bad and (binding or not opts.force_checks):
        raise RefusedError(f"{len(bad)} pre-check(s) failed; nothing was changed",
                           "\n".join(f"{c.line()}\n  hint: {c.hint}" for c in bad),
                           f"{', '.join(c.name for c in binding)}: --force-checks cannot override it (two masters "
                           "would take writes); fix what it names" if binding else
                           "fix what the checks name, or pass --force-checks if you accept the risk")
    if bad:
        report.warnings.append(f"--force-checks: went on despite {', '.join(c.name for c in bad)}")
        emit(Note(f"warning: {report.warnings[-1]}"))


def _modes(loaded: LoadedSpec, opts: Options) -> tuple[str, ...]:
    """The modes to try in order. replication: one handover (FAILOVER, else the manual one) or, with --mode force,
    "promote" (the master is gone); sentinel: one; cluster: the mode asked, or the escalation from it."""
    topo = loaded.spec.topology
    offered = {"cluster": ESCALATION, "replication": ("graceful", "force")}.get(topo, ("graceful",))
    if opts.mode not in offered or (opts.escalate and topo != "cluster"):
        raise OpsctlError(f"{'--escalate' if opts.escalate else f'--mode {opts.mode}'} is not for a {topo} topology",
                          "Sentinel promotes a replica by itself once the master is down for down_after_ms; "
                          "opsctl's sentinel failover is the graceful one" if topo == "sentinel" else
                          "a replication topology has the graceful handover and, with the master gone, "
                          "`--mode force` (no vote to escalate through)",
                          "drop the option" if topo == "sentinel" else "use --mode force --yes once the master is "
                          "gone for good, or the default mode while it answers")
    if topo == "sentinel":
        return ("sentinel",)
    if topo == "replication" and opts.mode != "force":
        return ("failover-command" if opts.failover_command and actions.has_failover_command(loaded) else "manual",)
    modes = ("promote",) if topo == "replication" else \
        ESCALATION[ESCALATION.index(opts.mode):] if opts.escalate else (opts.mode,)
    if set(modes) - {"graceful"} and not opts.yes and not opts.dry_run:
        raise RefusedError(f"mode {' -> '.join(modes)} can lose acknowledged writes",
                           "the master is gone: what it acknowledged and no replica received is lost"
                           if modes == ("promote",) else
                           "force does not wait for the replica to catch up; takeover skips the vote as well",
                           "pass --yes to accept that, or use the default graceful mode")
    return modes


def _failover(session: Session, target: Target, modes: tuple[str, ...], report: FailoverReport, emit: Emit,
              timeout: float) -> str:
    last = ""
    for mode in modes:
        if last:  # a safe point: the previous mode promoted nothing and left no fence
            stop.check(f"nothing was promoted: {last}", "run the same failover again")
        reason = "requested" if not last else f"previous mode did not complete: {last}"
        attempt = Attempt(mode, reason)
        report.attempts.append(attempt)
        if mode in ("force", "takeover", "promote"):
            warning = f"{'forced promotion' if mode == 'promote' else mode + ' failover'} can lose acknowledged " \
                "writes"
            report.warnings.append(warning)
            emit(Note(f"warning: {warning}"))
        check_held(session.connector)
        started = time.monotonic()
        try:
            new_master = actions.perform(session, target, mode, timeout, attempt.notes)
        except ConvergenceError as exc:
            attempt.outcome, attempt.seconds = f"timed out: {exc.detail}", time.monotonic() - started
            last = f"{mode} {exc.summary} ({exc.detail})"
            emit(Note(f"{mode}: {attempt.outcome}"))
            continue
        attempt.outcome, attempt.seconds = "promoted", time.monotonic() - started
        emit(Note(f"{mode}: {new_master} promoted in {attempt.seconds * 1000:.0f} ms"))
        for note in attempt.notes:
            emit(Note(f"  {note}"))
        return new_master
    raise OpsctlError(f"the failover of shard {target.shard} did not complete", last,
                      "read the report; the nodes' logs say why the election failed")


def _wait_postchecks(session: Session, old: str, new: str, timeout: float,
                     forced: bool) -> tuple[list[Check], dict[str, NodeFacts]]:
    loaded = session.loaded
    wrote = ["not tried"]
    last: list[tuple[list[Check], dict[str, NodeFacts]]] = []

    def done() -> bool | Pending:
        facts = session.facts()
        if wrote[0] != "OK":
            wrote[0] = _probe_write(session, new, facts)
        checks = postchecks(loaded, facts, old, new, wrote[0], forced)
        last[:] = [(checks, facts)]
        bad = failed(checks)
        return Pending("; ".join(c.line() for c in bad)) if bad else True

    with contextlib.suppress(ConvergenceError):
        wait_for(done, timeout, "post-checks to pass", interval=POLL)
    return last[0] if last else ([], {})


def _probe_write(session: Session, name: str, facts: dict[str, NodeFacts]) -> str:
    me = facts[name].myself
    key = probe_key(me.slots if me else ())
    node = session.connections[name]
    try:
        node.call("SET", key, str(time.time()), "PX", 10_000)
        node.call("DEL", key)
    except NodeError as exc:
        return f"{type(exc).__name__}: {said(exc)}"
    return "OK"


__all__ = ["Options", "Session", "report_text", "run_failover"]
