"""Slot operations end to end: look, choose moves (pure), move them (atomic or key by key), look again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from opsctl.base import stop
from opsctl.base.errors import AUTH_HINT, OpsctlError, RefusedError, auth_failed, is_auth_failure
from opsctl.base.events import Emit, Log
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connector import Connector
from opsctl.net.observer import observe
from opsctl.observe.cluster_state import node_groups
from opsctl.observe.replies import NodeObservation
from opsctl.slots.atomic import atomic_move
from opsctl.slots.balance import Move, balance_moves, estimate, pick_slots, split_for_parallel
from opsctl.slots.journal import Journal, OpenSlots
from opsctl.slots.keys import EndpointReplaced, KeyMover, Options
from opsctl.slots.members import find_node, shard_members
from opsctl.slots.moveguard import flagged_ids
from opsctl.slots.progress import EndpointReplacedEvent, Progress, SlotsStart
from opsctl.slots.ranges import expand, text
from opsctl.slots.session import (
    MAX_FAILOVERS,
    DescribedMove,
    Peer,
    Session,
    SlotsOutcome,
    SlotsSummary,
    open_session,
    pipe,
    wait_stable,
)


@dataclass(frozen=True)
class MoveOptions:
    max_keys_per_sec: float | None = None
    key_by_key: bool = False  # never use atomic migration (benchmarks, or to compare)


def one_cluster(connector: Connector) -> dict[str, NodeObservation]:
    """A look at the spec's nodes, refused (nothing changed) when they are not one cluster: a creation killed
    before its CLUSTER MEETs, a scale-out's node started and not joined. No slot moves between nodes that never met,
    nor do they converge; meeting them is apply's (join-cluster)."""
    seen = observe(connector, connector.loaded.layout.servers)
    groups = node_groups({name: o.cluster_nodes for name, o in seen.items() if o.cluster_nodes})
    if len(groups) > 1:
        raise RefusedError(f"the nodes are not one cluster: {len(groups)} groups know nothing of each other",
                           "\n".join(_group_line(g) for g in groups),
                           "a creation (or scale-out) stopped before its nodes met: `opsctl apply -f SPEC` meets "
                           "them and finishes it")
    return seen


def _group_line(names: Sequence[str]) -> str:
    return f"{names[0]} knows only itself" if len(names) == 1 else f"{', '.join(names)} know only each other"


def resolve(session: Session, ref: str, notes: list[str] | None = None) -> str:
    """A master named by node name or address:port; a node of a shard that failed over stands for its shard's
    master now (noted), so the same command still works after a failover."""
    node = find_node(session.loaded, ref)
    if node is None or node.name not in session.seen:
        raise OpsctlError(f"no cluster node {ref!r}", "name a node of the spec or its address:port",
                          "`opsctl status -f SPEC` lists the nodes")
    me = session.me(node.name)
    seen = session.seen.get(node.name)
    if me is None and seen is not None and is_auth_failure(seen.error):
        raise OpsctlError(auth_failed(node.name), seen.error, AUTH_HINT)
    master = session.current_master(node.name)
    if (me is None or not me.is_master) and master is not None and master != node.name:
        if notes is not None:
            notes.append(f"{node.name} is not its shard's master now: using {master}")
        return master
    if me is None or not me.is_master:
        raise RefusedError(f"{node.name} is not a reachable master", "only masters own slots",
                           "`opsctl cluster check -f SPEC` shows the roles")
    return node.name


def describe_move(session: Session, move: Move) -> DescribedMove:
    info = session.seen[move.source].info
    keys = int(dict(p.split("=", 1) for p in info.get("db0", "keys=0").split(",")).get("keys", 0))
    size = int(info.get("used_memory_dataset", 0))
    est_keys, est_bytes = estimate(keys, size, len(session.owned().get(move.source, ())), move.slot_count)
    return DescribedMove(move.source, move.target, text(move.slots), move.slot_count, est_keys, est_bytes)


def run_moves(session: Session, moves: Sequence[Move], journal: Journal, emit: Emit,
              options: MoveOptions) -> SlotsSummary:
    """Execute moves: disjoint (source, target) pairs at once; every slot journaled; look again after. A stop
    request (opsctl.base.stop) lets the slots open finish, then raises Stopped saying how much moved."""
    with stop.finishing("the slot move"):
        return _run_moves(session, moves, journal, emit, options)


def _run_moves(session: Session, moves: Sequence[Move], journal: Journal, emit: Emit,
               options: MoveOptions) -> SlotsSummary:
    wait_stable(session)
    atomic = session.atomic() and not options.key_by_key
    described = [describe_move(session, m) for m in moves]
    progress = Progress(emit, sum(m.slot_count for m in moves), sum(d.est_keys for d in described))
    emit(SlotsStart("atomic" if atomic else "key-by-key", sum(m.slot_count for m in moves),
                    tuple(d.fields() for d in described)))
    estimates = {(d.source, d.target): d.est_keys for d in described}
    failed_over: set[str] = set()  # the members of the shards whose failover a move followed
    for group in split_for_parallel(moves):
        signum = stop.requested()
        if signum is not None:  # the safe point between groups of moves
            raise _stopped(session, journal, progress, stop.Stopped(signum))
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_guarded, args=(errors, _move_one, session, m, journal, progress,
                                                           emit, options, atomic, estimates[(m.source, m.target)],
                                                           failed_over))
                   for m in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failures = [e for e in errors if not isinstance(e, stop.Stopped)]
        if failures:
            raise failures[0]
        if errors:
            raise _stopped(session, journal, progress, next(e for e in errors if isinstance(e, stop.Stopped)))
    session.refresh()
    if failed_over:  # a woken target may have split its shard after the failover was followed
        _merge_split(session, journal, emit, failed_over)
        _hand_over_strays(session, emit, failed_over)
    journal.compact()
    wait_stable(session)
    done = progress.finish()
    return SlotsSummary(done.kind, done.slots_done, done.slots_total, done.keys, done.bytes, done.keys_per_sec,
                        done.seconds, done.eta, "atomic" if atomic else "key-by-key")


def _stopped(session: Session, journal: Journal, progress: Progress, exc: stop.Stopped) -> stop.Stopped:
    """The whole operation's stop, once every mover stopped at its safe point: what moved, and how to go on."""
    session.refresh()
    journal.compact()
    left = progress.slots_total - progress.slots_done
    summary = f"in all: moved {progress.slots_done} of {progress.slots_total} slots, {left} not moved; no slot is open"
    return stop.Stopped(exc.signum, "\n".join(filter(None, (exc.detail, summary))),
                        f"to move the rest, run the same `cluster reshard` with --slots {left}; `cluster rebalance` "
                        "and `apply` plan again from what the nodes serve; `opsctl cluster check -f SPEC` shows "
                        "the slot map")


def _merge_split(session: Session, journal: Journal, emit: Emit, members: set[str]) -> bool:
    """Merge the shards of members that have two masters serving slots (a target stalled past the node timeout
    right after a wave's SETSLOT NODE keeps that wave when it wakes: its replica claimed only the slots it
    knew its master had). Whether one was merged."""
    from opsctl.slots.fix import merge_split_shards

    merged = merge_split_shards(session, journal, emit, members)
    for note in merged:
        emit(Log("slots", note))
    return bool(merged)


def _hand_over_strays(session: Session, emit: Emit, members: set[str]) -> None:
    """A promoted source still holds the keys of the waves its old master had handed over: to their owners."""
    from opsctl.slots.fix import hand_over_strays

    for note in hand_over_strays(session, members):
        emit(Log("slots", note))


def _guarded(errors: list[BaseException], fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # re-raised by the caller's thread
        errors.append(exc)


def _move_one(session: Session, move: Move, journal: Journal, progress: Progress, emit: Emit,
              options: MoveOptions, atomic: bool, est_keys: int, failed_over: set[str]) -> None:
    owned = set(session.owned().get(move.source, ()))
    slots = expand(move.slots)
    if not owned.issuperset(slots):
        raise RefusedError(f"{move.source} no longer serves all of slots {text(move.slots)}",
                           "the cluster changed since the moves were chosen", "plan again")
    source, target = session.peer(move.source), session.peer(move.target)
    if atomic:
        atomic_move(source, target, slots, journal, progress, session.seen[move.source].info, est_keys)
        return
    for failovers in range(MAX_FAILOVERS + 1):
        try:
            KeyMover(session, source, target, journal, progress, emit,
                     Options(max_keys_per_sec=options.max_keys_per_sec)).move(slots)
            return
        except EndpointReplaced as exc:
            if failovers == MAX_FAILOVERS:
                raise
            emit(EndpointReplacedEvent(exc.role, exc.name))
            failed_over.update(n for end in (source.name, target.name) for n in shard_members(session.loaded, end))
            source, target, slots = _follow_failover(session, journal, progress, emit, source, target, slots)


def _follow_failover(session: Session, journal: Journal, progress: Progress, emit: Emit, source: Peer,
                     target: Peer, slots: Sequence[int]) -> tuple[Peer, Peer, list[int]]:
    """After the cluster failed over the source's or target's shard: wait for both shards' masters, finish
    the journaled waves of this move with them, and return what is left to move, from and to whom."""
    from opsctl.slots.fix import close_in_session

    ends = (source.name, target.name)
    shards = {n for end in ends for n in shard_members(session.loaded, end)}

    def masters() -> tuple[str, str] | Pending:
        session.refresh()
        new_source, new_target = session.current_master(ends[0]), session.current_master(ends[1])
        if new_source is None or new_target is None:
            return Pending(f"no master yet for the shard of {ends[0] if new_source is None else ends[1]}")
        down = [n for n in (new_source, new_target) if session.seen[n].info.get("cluster_state") != "ok"]
        for name in down:
            _release_dead_imports(session, name, wanted)
        if down:  # a master answers CLUSTERDOWN until its cluster state is ok again
            return Pending(f"{', '.join(down)} not cluster_state:ok yet")
        return new_source, new_target

    wanted = {s for e in journal.pending() for s in expand(e.slots)} | set(slots)
    timeout = 3 * session.loaded.spec.cluster_or_default().node_timeout_ms / 1000 + 10
    new_source, new_target = wait_for(masters, timeout, "the failed-over shard to have a master", interval=0.1)

    def ours(entry: OpenSlots) -> bool:
        return entry.source in shards and entry.target in shards

    opened = [s for e in journal.pending() if ours(e) for s in expand(e.slots)]  # before a merge closes some
    if _merge_split(session, journal, emit, shards):
        new_source, new_target = wait_for(masters, timeout, "the merged shard to have a master", interval=0.1)
    close_in_session(session, journal, emit, only=ours)
    at_source = set(session.owned().get(new_source, ()))
    progress.add(slots=sum(1 for s in opened if s not in at_source))
    left = [s for s in slots if s in at_source]
    return session.peer(new_source), session.peer(new_target), left


def _release_dead_imports(session: Session, name: str, slots: set[int]) -> None:
    """SETSLOT STABLE for the slots name imports from a node the cluster flags failing (a killed source).
    A node ignores every claim on a slot it imports, so it would keep the dead node as the owner and answer
    CLUSTERDOWN for all its slots; the keys it already received stay, and the journal's close moves the rest
    from the promoted replica."""
    me = session.me(name)
    if me is None:
        return
    failing = flagged_ids(session.views())
    stale = [s for s, source in me.importing.items() if source in failing and s in slots]
    if stale:
        pipe(session.peers[name], [("CLUSTER", "SETSLOT", s, "STABLE") for s in stale])  # looked at again after


def execute_or_describe(session: Session, moves: list[Move], state_dir: Path, emit: Emit, options: MoveOptions,
                        dry_run: bool) -> SlotsOutcome:
    described = tuple(describe_move(session, m) for m in moves)
    if not moves:
        return SlotsOutcome(described, dry_run=dry_run, notes=("nothing to move: the slots are balanced within the "
                                                                "threshold",))
    summary = None if dry_run else run_moves(session, moves, Journal(state_dir), emit, options)
    return SlotsOutcome(described, summary, dry_run)


def reshard(connector: Connector, state_dir: Path, source_ref: str, target_ref: str, slots: int, emit: Emit,
            options: MoveOptions = MoveOptions(), dry_run: bool = False) -> SlotsOutcome:
    with open_session(connector) as session:
        notes: list[str] = []
        source, target = resolve(session, source_ref, notes), resolve(session, target_ref, notes)
        if source == target:
            raise RefusedError("source and target are the same node", hint="name two different masters")
        try:
            chosen = pick_slots(session.owned()[source], slots)
        except ValueError as exc:
            raise RefusedError(f"cannot move {slots} slots from {source}", str(exc)) from None
        outcome = execute_or_describe(session, [Move(source, target, chosen)], state_dir, emit, options, dry_run)
        return replace(outcome, notes=(*notes, *outcome.notes))


def rebalance(connector: Connector, state_dir: Path, weights: Mapping[str, float], threshold_pct: float,
              emit: Emit, options: MoveOptions = MoveOptions(), dry_run: bool = False) -> SlotsOutcome:
    with open_session(connector) as session:
        owned = session.owned()
        resolved = {resolve(session, ref): w for ref, w in weights.items()}
        takers = _takers(session)
        refused = sorted(n for n, w in resolved.items() if w > 0 and n not in takers)
        if refused:
            raise RefusedError(f"{', '.join(refused)}: not {'a shard master' if len(refused) == 1 else 'shard masters'}"
                               f" (the shards' masters: {', '.join(takers)})",
                               "given slots, a member of a shard whose master is another node (a replica that never "
                               "ran CLUSTER REPLICATE is a master without slots) leaves it two masters serving data, "
                               "and a node the spec no longer has is drained",
                               "weight its shard's master instead (`opsctl status -f SPEC` shows the roles)")
        want = {n: resolved.get(n, 1.0) for n in takers}
        moves = balance_moves(owned, want, threshold_pct)
        return execute_or_describe(session, moves, state_dir, emit, options, dry_run)


def _takers(session: Session) -> list[str]:
    """The masters a rebalance weighs: each shard's master now (Session.shard_masters, as apply decides it: an empty
    new shard's one too), and every node of the spec that serves slots (a shard whose master apply cannot tell
    keeps both). Not another master without slots: a replica that never ran CLUSTER REPLICATE, a drained node."""
    serving = [n for n, mine in session.owned().items() if mine and session.loaded.layout.find(n) is not None]
    return list(dict.fromkeys([*(m for m in session.shard_masters() if m is not None), *serving]))

