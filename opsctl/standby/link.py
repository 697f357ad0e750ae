"""`opsctl follow -f STANDBY`: the migrate engine (opsctl.migrate.migration) with the source from `follows:`,
writing as the standby's follower user, never cutting over by itself. Its cutover is the switchover's: asked by
`opsctl switchover` through the migration's request file, it fences the primary, waits for its final offsets and
verifies, then (after_cutover) lifts the standby's own fence, records the switch and reports the write pause from
the fence to the standby taking writes. A journaled position the primary no longer holds (backlog overrun, history
changed): the standby is emptied and copied again from scratch, which its spec allows (docs/standby.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

from opsctl.base import stop
from opsctl.base.errors import NodeUnreachable, OpsctlError, RefusedError
from opsctl.base.events import Emit, Event, Note, Redrawn
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.secrets import remember
from opsctl.base.stop import Stopped
from opsctl.failover.actions import checkpoint
from opsctl.failover.fence import unfence
from opsctl.migrate.cutover import CutoverDone
from opsctl.migrate.migration import MigrateLag, MigrateOptions, run_migrate
from opsctl.migrate.phases import JOURNAL, RESULT, read_journal
from opsctl.migrate.shard import MustStartOver
from opsctl.net.connection import connection_to, said
from opsctl.net.connector import Connector
from opsctl.net.rawpipe import RawPipe
from opsctl.observe.replies import ROLE
from opsctl.plan.facts import fenced as replicas_fence
from opsctl.plan.facts import spec_values
from opsctl.render.exporteruser import FENCE_RULE, FOLLOWER_RULES, FOLLOWER_USER, follower_secret, lifts
from opsctl.restore.target import inspect_target
from opsctl.spec.load import LoadedSpec
from opsctl.standby.primary import Primary, primary_connector, primary_of, primary_silent
from opsctl.state.safefs import write_private
from opsctl.state.standbyfiles import LAG, LAG_EVERY, Switched, lag_json, read_switched, record_switched

# a server that does not answer (down, not deployed yet); a server that answers with an error is an error
UNANSWERED = (NodeUnreachable, OSError)
PRIMARY_RETRY = 2.0  # seconds between looks at a primary that does not answer
START_OVERS = 3  # copies from scratch in one run: a primary whose backlog never holds a copy's writes stops there


@frozen
class PrimaryAwaited(Frozen, Event):
    """The link stopped and waits for its primary, which does not answer (a cut between the sites, its site down):
    said at each look, so that what reads the link's events (its textfile) knows no shard streams now."""

    kind: ClassVar[str] = "primary-awaited"
    redrawn: ClassVar[Redrawn] = "bar"
    primary: str
    why: str
    waited: float

    def line(self) -> str:
        return f"waiting for the primary {self.primary} ({self.waited:.0f}s): {self.why}"


def refuse_switched(loaded: LoadedSpec, state_dir: Path) -> None:
    switched = read_switched(state_dir)
    if switched is not None:
        raise RefusedError(f"'{loaded.spec.name}' was switched over ({switched.mode}) and takes writes now: it "
                           "follows nothing", hint=f"remove follows: from its spec and apply it (`opsctl switchover -f "
                           f"{loaded.file}` lifts its fence again after an interrupted switchover)")


def finish_switch(loaded: LoadedSpec, state_dir: Path) -> list[str]:
    """A switchover recorded but maybe killed before its lift: the fence lifted again (idempotent) on every server;
    returns the servers that did not answer."""
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.statelock import state_lock

    with state_lock(state_dir), open_connector(loaded, state_dir) as admin, topology_lock(admin):
        missed = lift_fence(admin).missed
    (state_dir / LAG).unlink(missing_ok=True)
    return list(missed)


def run_follow(loaded: LoadedSpec, state_dir: Path, emit: Emit, sample: int = 200, force_lock: bool = False,
               approve: Callable[[str], None] = lambda question: None) -> CutoverDone:
    """Follow until a switchover; its report (the cutover's, with the pause until the standby took writes).
    approve(question): raises unless a standby that holds keys before its first copy may be emptied (the way back
    makes a site that took writes a standby: it is copied again from the new primary, never merged)."""
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.statelock import state_lock

    refuse_switched(loaded, state_dir)
    primary = primary_of(loaded)
    with ExitStack() as stack:
        stack.enter_context(state_lock(state_dir))
        admin = stack.enter_context(open_connector(loaded, state_dir))
        stack.enter_context(topology_lock(admin, force=force_lock))
        follower = follower_of(loaded, admin)
        _empty_before_the_first_copy(loaded, follower, state_dir, emit, approve)
        emit = _lag_recorder(state_dir, primary.shown, emit)
        options = MigrateOptions("manual", sample=sample, after_cutover=partial(_switched, admin, state_dir, primary,
                                                                                 emit))
        start_overs = 0
        while True:
            try:
                with ExitStack() as link:  # the primary's lock too: a split from the primary loses it
                    source = primary_connector(primary, link, force_lock)
                    report = run_migrate(source, follower, state_dir, options, emit, primary.ref())
            except Stopped:
                raise
            except MustStartOver as exc:
                start_overs += 1
                if start_overs > START_OVERS:
                    raise
                emit(Note(f"{exc.summary}: emptying the standby and copying it again from scratch (its spec "
                          "declares it a standby)"))
                start_afresh(follower, state_dir)
                continue
            except OpsctlError as exc:
                if not wait_for_primary(primary, exc, emit):
                    raise
                continue
            if report.ok:
                return report
            # everything as it was: the primary's fence lifted (the cutover did), the standby fenced: follow on
            emit(Note("the switchover failed its verification (the report says why): the primary takes writes "
                      "again and the standby keeps following"))
            _report_taken(state_dir)


def wait_for_primary(primary: Primary, exc: OpsctlError, emit: Emit) -> bool:
    """exc stopped the link: when no server of the primary answers (a split, its site down), wait until one does,
    saying so once a minute, and return True (the link then resumes from its journal); else False (exc is the
    link's own error). A standby outlives its primary's outages: dying would leave a service that systemd restarts
    into a refused topology lock (exit 3: not restarted)."""
    why = primary_silent(primary)
    if why is None:
        return False
    emit(Note(f"the primary {primary.shown} does not answer ({why}); the link stopped ({exc.summary}): waiting for "
              f"it, looking every {PRIMARY_RETRY:.0f}s (then it resumes from its journal)"))
    waited, said_at = time.monotonic(), time.monotonic()
    while (why := primary_silent(primary)) is not None:
        emit(PrimaryAwaited(primary.shown, why, time.monotonic() - waited))
        stop.check("the link waited for its primary", "run the same command again: it resumes from its journal")
        if time.monotonic() - said_at >= 60:
            said_at = time.monotonic()
            emit(Note(f"still waiting for the primary {primary.shown} ({time.monotonic() - waited:.0f}s): {why}"))
        time.sleep(PRIMARY_RETRY)
    emit(Note(f"the primary {primary.shown} answers again after {time.monotonic() - waited:.0f}s: resuming the link"))
    return True


def _lag_recorder(state_dir: Path, primary: str, emit: Emit) -> Emit:
    """emit, and every LAG_EVERY seconds the last lag report into the state dir (status shows it)."""
    written = [0.0]

    def record(event: Event) -> None:
        emit(event)
        if isinstance(event, MigrateLag) and time.monotonic() - written[0] >= LAG_EVERY:
            written[0] = time.monotonic()
            write_private(state_dir / LAG, lag_json(time.time(), primary, event.shards))
    return record


def _report_taken(state_dir: Path, timeout: float = 10.0) -> None:
    """Until the waiting `opsctl switchover` took the failed report (the next run's start clears the file), or
    timeout: nobody waits for it."""
    deadline = time.monotonic() + timeout
    while (state_dir / RESULT).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _empty_before_the_first_copy(loaded: LoadedSpec, follower: Connector, state_dir: Path, emit: Emit,
                                 approve: Callable[[str], None]) -> None:
    journal = read_journal(state_dir)
    if journal is not None and not journal.finished and journal.shards:
        return  # a copy or a stream under way: resumed, its keys are the primary's
    held = inspect_target(follower).keys
    if not held:
        return
    approve(f"'{loaded.spec.name}' holds {held} keys: delete them and copy its primary's in (a standby holds only "
            "its primary's data, it never merges)?")
    emit(Note(f"'{loaded.spec.name}' held {held} keys before its first copy: emptied (a standby holds only its "
              "primary's data)"))
    start_afresh(follower, state_dir)


def start_afresh(follower: Connector, state_dir: Path) -> None:
    """Every key of the standby's masters gone (as the follower: FLUSHALL is disabled), the journal and the shards'
    spools and snapshots removed: the next run copies from scratch."""
    for master in inspect_target(follower).masters:
        with connection_to(follower, master, 120.0) as handle, handle.dedicated(120.0) as pipe:
            for keys in _scanned(pipe):
                pipe.ask("UNLINK", *keys)
    for path in [state_dir / JOURNAL, *state_dir.glob("migrate-shard-*.spool"), *state_dir.glob("migrate-shard-*.rdb")]:
        path.unlink(missing_ok=True)


def _scanned(pipe: RawPipe) -> Iterator[list[bytes]]:
    cursor = b"0"
    while True:
        reply = pipe.call("SCAN", cursor, "COUNT", 1000)
        if not isinstance(reply, list) or not isinstance(reply[0], bytes) or not isinstance(reply[1], list):
            raise OpsctlError(f"unexpected SCAN reply from {pipe.label}")
        cursor, keys = reply[0], [k for k in reply[1] if isinstance(k, bytes)]
        if keys:
            yield keys
        if cursor == b"0":
            return


@dataclass(frozen=True)
class Lifted:
    """lift_fence's outcome. writable: when (time.monotonic()) the last server took writes, before the saving;
    masters: the servers lifted first, masters by their own ROLE; missed: the servers that did not answer (they
    come back fenced until the spec without follows: is applied)."""

    writable: float
    masters: tuple[str, ...]
    missed: tuple[str, ...]


def lift_fence(admin: Connector) -> Lifted:
    """The standby's clients write again: each fenced user's rules without the fence on every server, the masters
    first (where clients write; by their live role: a standby failover promoted a replica of the spec), then the
    follower user gone and the users saved into the server's files (ACL SAVE, CONFIG REWRITE) so a restart keeps
    it."""
    loaded = admin.loaded
    missed: list[str] = []
    with ExitStack() as stack:
        opened = []
        for node in loaded.layout.servers:
            try:
                conn = stack.enter_context(connection_to(admin, node))
                opened.append((conn.read(ROLE).kind == "master", node, conn))  # one round trip, inside the pause
            except UNANSWERED as exc:
                missed.append(f"{node.name} ({said(exc)})")
        lifted = []
        for _, node, conn in sorted(opened, key=lambda each: not each[0]):  # stable: the spec's order within each
            try:
                for user, words in lifts(loaded):
                    conn.call("ACL", "SETUSER", user, *words)
                lifted.append((node, conn))
            except UNANSWERED as exc:
                missed.append(f"{node.name} ({said(exc)})")
        writable = time.monotonic()
        for node, conn in lifted:
            try:
                conn.call("ACL", "DELUSER", FOLLOWER_USER)
                conn.call(*(("ACL", "SAVE") if loaded.spec.auth.mode == "acl" else ("CONFIG", "REWRITE")))
            except UNANSWERED as exc:
                missed.append(f"{node.name}, not saved ({said(exc)})")
    masters = tuple(node.name for master, node, _ in opened if master)
    return Lifted(writable, masters, tuple(missed))


def fence_live(admin: Connector) -> tuple[list[str], list[str]]:
    """The fence set on every server that runs (a standby's apply, before any step: the way back makes a site that
    took writes a standby, and its servers must refuse clients before opsctl does anything else there): the
    clients' users lose @write, the follower user is set. A cutover's or failover's fence (min-replicas-to-write,
    NOREPLICAS: the old primary after a switchover) is lifted once this one holds: it would refuse the follower's
    writes too. Returns (fenced, not answering); a server that does not answer starts fenced from the files apply
    writes."""
    loaded = admin.loaded
    secret = follower_secret(loaded)
    remember(secret)
    denied = [f"-{c.lower()}" for c in loaded.spec.hardening.disabled_commands]
    follower = ["reset", "on", f">{secret.reveal()}", *FOLLOWER_RULES, *denied]
    fenced, missed = [], []
    for node in loaded.layout.servers:
        try:
            with connection_to(admin, node) as conn:
                for user, _ in lifts(loaded):
                    conn.call("ACL", "SETUSER", user, FENCE_RULE)
                conn.call("ACL", "SETUSER", FOLLOWER_USER, *follower)
                if replicas_fence(conn.config_get("min-replicas-*")):
                    unfence(conn, spec_values(loaded, node))
                    fenced.append(f"{node.name} (its NOREPLICAS fence replaced)")
                else:
                    fenced.append(node.name)
        except UNANSWERED:
            missed.append(node.name)
    return fenced, missed


def _switched(admin: Connector, state_dir: Path, primary: Primary, emit: Emit, report: CutoverDone) -> CutoverDone:
    """after_cutover: the primary is fenced and the standby verified; the standby's fence lifted and the switch
    recorded; the pause counted until then."""
    started = time.monotonic()
    # recorded first: killed before the lift, `switchover` again lifts it (the record says the switch was decided)
    record_switched(state_dir, Switched(time.time(), primary.shown, "planned"))
    checkpoint("standby-recorded")
    lifted = lift_fence(admin)
    (state_dir / LAG).unlink(missing_ok=True)
    emit(Note(f"switchover: the primary fenced, the standby caught up after {report.caught_up_s:.3f}s, verified after "
              f"{report.pause_s:.3f}s, taking writes {lifted.writable - started:.3f}s later (its masters first: "
              f"{', '.join(lifted.masters) or 'none answered'})"))
    if lifted.missed:
        emit(Note(f"the fence could not be lifted on {', '.join(lifted.missed)}: lift it there once it answers (apply "
                  "the spec without follows:)"))
    return CutoverDone(True, round(report.pause_s + lifted.writable - started, 3), report.caught_up_s,
                       report.source_keys, report.target_keys, report.verified, report.final_offsets, report.point_to,
                       ())


def follower_of(loaded: LoadedSpec, admin: Connector) -> Connector:
    """admin's connector logged in as the follower user (its password registered for masking)."""
    secret = follower_secret(loaded)
    remember(secret)
    return admin.as_user(FOLLOWER_USER, secret)
