"""Slot operations end to end: look, choose moves (pure), move them (atomic or key by key), look again."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.connerr import AUTH_HINT, auth_failed, is_auth_failure
from opsctl.errors import OpsctlError, RefusedError
from opsctl.events import Emit, SlotsStart, as_dict
from opsctl.observe.collect import observe, wait_converged
from opsctl.slots.atomic import atomic_move
from opsctl.slots.balance import Move, balance_moves, estimate, pick_slots, split_for_parallel
from opsctl.slots.journal import Journal
from opsctl.slots.keys import KeyMover, Options
from opsctl.slots.progress import Progress
from opsctl.slots.ranges import expand, text
from opsctl.slots.scale import find_node, retired_nodes
from opsctl.slots.session import Session
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

CONVERGE_TIMEOUT = 60.0


@dataclass(frozen=True)
class MoveOptions:
    max_keys_per_sec: float | None = None
    key_by_key: bool = False  # never use atomic migration (benchmarks, or to compare)


@dataclass
class Outcome:
    moves: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)


def cluster_members(loaded: LoadedSpec) -> list[Node]:
    """The spec's servers plus the nodes a larger spec had that the cluster still knows."""
    seen = observe(loaded, loaded.layout.servers)
    views = [o.cluster_nodes for o in seen.values() if o.cluster_nodes]
    return [*loaded.layout.servers, *retired_nodes(loaded, views)]


def open_session(loaded: LoadedSpec) -> Session:
    return Session(loaded, cluster_members(loaded))


def resolve(session: Session, ref: str) -> str:
    node = find_node(session.loaded, ref)
    if node is None or node.name not in session.seen:
        raise OpsctlError(f"no cluster node {ref!r}", "name a node of the spec or its address:port",
                          "`opsctl status -f SPEC` lists the nodes")
    me = session.me(node.name)
    seen = session.seen.get(node.name)
    if me is None and seen is not None and is_auth_failure(seen.error):
        raise OpsctlError(auth_failed(node.name), seen.error, AUTH_HINT)
    if me is None or not me.is_master:
        raise RefusedError(f"{node.name} is not a reachable master", "only masters own slots",
                           "`opsctl cluster check -f SPEC` shows the roles")
    return node.name


def describe_move(session: Session, move: Move) -> dict[str, Any]:
    info = session.seen[move.source].info
    keys = int(dict(p.split("=", 1) for p in info.get("db0", "keys=0").split(",")).get("keys", 0))
    size = int(info.get("used_memory_dataset", 0))
    est_keys, est_bytes = estimate(keys, size, len(session.owned().get(move.source, ())), move.slot_count)
    return {"source": move.source, "target": move.target, "slots": text(move.slots),
            "slot_count": move.slot_count, "est_keys": est_keys, "est_bytes": est_bytes}


def wait_stable(session: Session, timeout: float = CONVERGE_TIMEOUT) -> None:
    wait_converged(session.observer, timeout)


def run_moves(session: Session, moves: Sequence[Move], journal: Journal, emit: Emit,
              options: MoveOptions) -> dict[str, Any]:
    """Execute moves: disjoint (source, target) pairs at once; every slot journaled; look again after."""
    wait_stable(session)
    atomic = session.atomic() and not options.key_by_key
    described = [describe_move(session, m) for m in moves]
    progress = Progress(emit, sum(m.slot_count for m in moves), sum(d["est_keys"] for d in described))
    emit(SlotsStart("atomic" if atomic else "key-by-key", sum(m.slot_count for m in moves), tuple(described)))
    estimates = {(d["source"], d["target"]): d["est_keys"] for d in described}
    for group in split_for_parallel(moves):
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_guarded, args=(errors, _move_one, session, m, journal, progress,
                                                           emit, options, atomic, estimates[(m.source, m.target)]))
                   for m in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    journal.compact()
    session.refresh()
    wait_stable(session)
    return {**as_dict(progress.finish()), "mode": "atomic" if atomic else "key-by-key"}


def _guarded(errors: list[BaseException], fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # re-raised by the caller's thread
        errors.append(exc)


def _move_one(session: Session, move: Move, journal: Journal, progress: Progress, emit: Emit,
              options: MoveOptions, atomic: bool, est_keys: int) -> None:
    owned = set(session.owned().get(move.source, ()))
    slots = expand(move.slots)
    if not owned.issuperset(slots):
        raise RefusedError(f"{move.source} no longer serves all of slots {text(move.slots)}",
                           "the cluster changed since the moves were chosen", "plan again")
    source, target = session.peer(move.source), session.peer(move.target)
    if atomic:
        atomic_move(source, target, slots, journal, progress, session.seen[move.source].info, est_keys)
    else:
        KeyMover(session, source, target, journal, progress, emit,
                 Options(max_keys_per_sec=options.max_keys_per_sec)).move(slots)


def execute_or_describe(session: Session, moves: list[Move], state_dir: Path, emit: Emit, options: MoveOptions,
                        dry_run: bool) -> Outcome:
    outcome = Outcome([describe_move(session, m) for m in moves], dry_run=dry_run)
    if not moves:
        outcome.notes.append("nothing to move: the slots are balanced within the threshold")
    elif not dry_run:
        outcome.summary = run_moves(session, moves, Journal(state_dir), emit, options)
    return outcome


def reshard(loaded: LoadedSpec, state_dir: Path, source_ref: str, target_ref: str, slots: int, emit: Emit,
            options: MoveOptions = MoveOptions(), dry_run: bool = False) -> Outcome:
    with open_session(loaded) as session:
        source, target = resolve(session, source_ref), resolve(session, target_ref)
        if source == target:
            raise RefusedError("source and target are the same node", hint="name two different masters")
        try:
            chosen = pick_slots(session.owned()[source], slots)
        except ValueError as exc:
            raise RefusedError(f"cannot move {slots} slots from {source}", str(exc)) from None
        return execute_or_describe(session, [Move(source, target, chosen)], state_dir, emit, options, dry_run)


def rebalance(loaded: LoadedSpec, state_dir: Path, weights: Mapping[str, float], threshold_pct: float,
              emit: Emit, options: MoveOptions = MoveOptions(), dry_run: bool = False) -> Outcome:
    with open_session(loaded) as session:
        owned = session.owned()
        resolved = {resolve(session, ref): w for ref, w in weights.items()}
        layout_masters = [n for n in owned if loaded.layout.find(n) is not None]
        want = {n: resolved.get(n, 1.0) for n in layout_masters}
        moves = balance_moves(owned, want, threshold_pct)
        return execute_or_describe(session, moves, state_dir, emit, options, dry_run)

