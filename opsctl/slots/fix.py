"""Close open slots (those a killed run journaled, exactly; then any other open slot), cover uncovered slots,
and, only with explicit consent, take over the slots of an unreachable master."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from opsctl.errors import RefusedError
from opsctl.events import Closed, Emit
from opsctl.observe.cluster_state import slot_map, uncovered
from opsctl.observe.collect import observe
from opsctl.observe.parse import ClusterNodeLine, server_of
from opsctl.slots.atomic import wait_idle
from opsctl.slots.journal import Journal, OpenSlots, SlotState, decide
from opsctl.slots.keys import KeyMover, Options
from opsctl.slots.progress import Progress
from opsctl.slots.ranges import expand, text, to_ranges
from opsctl.slots.run import Outcome, open_session, wait_stable
from opsctl.slots.session import Peer, Session, checked, pipe
from opsctl.spec.load import LoadedSpec


def close_open(loaded: LoadedSpec, state_dir: Path, emit: Emit) -> list[str]:
    """Resume a killed run: close every journaled slot, then any other open slot. Returns what was done."""
    journal = Journal(state_dir)
    if not journal.pending() and not _live_open(loaded):
        journal.compact()
        return []
    with open_session(loaded) as session:
        done = close_in_session(session, journal, emit)
    return done


def _live_open(loaded: LoadedSpec) -> bool:
    seen = observe(loaded, loaded.layout.servers)
    return any(line.migrating or line.importing for o in seen.values() for line in o.cluster_nodes or ()
               if line.is_myself)


def close_in_session(session: Session, journal: Journal, emit: Emit) -> list[str]:
    done: list[str] = []
    for entry in journal.pending():
        done.append(_close_entry(session, journal, entry, emit, journaled=True))
    session.refresh()
    for entry in live_open_slots(session):
        done.append(_close_entry(session, journal, entry, emit, journaled=False))
    journal.compact()
    session.refresh()
    return done


def live_open_slots(session: Session) -> list[OpenSlots]:
    """Open slots nobody journaled, as (owner -> target) groups from the nodes' own MIGRATING/IMPORTING flags."""
    by_id = {p.id: p.name for p in session.peers.values()}
    pairs: dict[tuple[str, str], set[int]] = {}
    for name in session.peers:
        me = session.me(name)
        if me is None:
            continue
        for slot, target in me.migrating.items():
            pairs.setdefault((name, by_id.get(target, target)), set()).add(slot)
        for slot, source in me.importing.items():
            pairs.setdefault((by_id.get(source, source), name), set()).add(slot)
    out = []
    for (source, target), slots in sorted(pairs.items()):
        if source in session.peers and target in session.peers:
            out.append(OpenSlots(source, session.peers[source].id, target, session.peers[target].id,
                                 to_ranges(slots)))
    return out


def slot_states(session: Session, source: Peer, target: Peer, slots: Sequence[int]) -> list[SlotState]:
    src, tgt = session.me(source.name), session.me(target.name)
    counts = [("CLUSTER", "COUNTKEYSINSLOT", s) for s in slots]
    src_keys, tgt_keys = pipe(source, counts), pipe(target, counts)
    return [SlotState(_owns(src, s), _owns(tgt, s), bool(src and s in src.migrating),
                      bool(tgt and s in tgt.importing), _int(a), _int(b))
            for s, a, b in zip(slots, src_keys, tgt_keys, strict=True)]


def _owns(me: ClusterNodeLine | None, slot: int) -> bool:
    return me is not None and any(a <= slot <= b for a, b in me.slots)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _close_entry(session: Session, journal: Journal, entry: OpenSlots, emit: Emit, journaled: bool) -> str:
    slots = expand(entry.slots)
    if entry.mode == "atomic":
        if entry.source in session.peers:
            info = session.seen[entry.source].info
            version = server_of(dict(info))
            wait_idle(session.peers[entry.source], version[0] if version else "valkey")
        journal.closed(slots)
        return f"atomic move {entry.source} -> {entry.target} of {text(entry.slots)}: ended server-side"
    source, target = session.peer(entry.source), session.peer(entry.target)
    states = slot_states(session, source, target, slots)
    groups: dict[str, list[int]] = {}
    for slot, state in zip(slots, states, strict=True):
        groups.setdefault(decide(state), []).append(slot)
    mover = KeyMover(session, source, target, journal, Progress(emit, len(slots)), emit, Options())
    if groups.get("finish"):
        mover.move(groups["finish"])
    if groups.get("assign"):
        mover.close(groups["assign"])
    if groups.get("cancel"):
        checked(target, [("CLUSTER", "SETSLOT", s, "STABLE") for s in groups["cancel"]], "SETSLOT STABLE")
    journal.closed(slots)
    what = ", ".join(f"{k} {text(to_ranges(v))}" for k, v in sorted(groups.items()))
    origin = "journaled" if journaled else "not journaled (found open)"
    emit(Closed(entry.source, entry.target, journaled, {k: text(to_ranges(v)) for k, v in groups.items()}))
    return f"{origin} {entry.source} -> {entry.target}: {what}"


def fix(loaded: LoadedSpec, state_dir: Path, emit: Emit, reassign_unreachable: bool = False) -> Outcome:
    """After close_open (done by the caller): cover uncovered slots; take over a lost master's only on consent."""
    outcome = Outcome()
    with open_session(loaded) as session:
        outcome.notes += close_in_session(session, Journal(state_dir), emit)
        outcome.notes += _cover(session)
        outcome.notes += _unreachable(session, reassign_unreachable)
        if not outcome.notes:
            outcome.notes.append("nothing to fix: no open slots, every slot is served")
        wait_stable(session)
    return outcome


def _reference_map(session: Session) -> tuple[tuple[int, int, str], ...]:
    views = [o.cluster_nodes for o in session.seen.values() if o.cluster_nodes]
    maps = [slot_map(v) for v in views]
    return max(maps, key=maps.count) if maps else ()


def _cover(session: Session) -> list[str]:
    gaps = uncovered(_reference_map(session))
    if not gaps:
        return []
    masters = session.masters()
    slots = expand(gaps)
    counts = {p.name: pipe(p, [("CLUSTER", "COUNTKEYSINSLOT", s) for s in slots]) for p in masters}
    owned = {n: len(s) for n, s in session.owned().items()}
    give: dict[str, list[int]] = {}
    for i, slot in enumerate(slots):
        holders = [n for n in counts if _int(counts[n][i]) > 0]
        name = max(holders, key=lambda n: _int(counts[n][i])) if holders else min(owned, key=lambda n: owned[n])
        give.setdefault(name, []).append(slot)
        owned[name] += 1
    for name, mine in give.items():
        checked(session.peers[name], [("CLUSTER", "ADDSLOTSRANGE", *[x for r in to_ranges(mine) for x in r])],
                "ADDSLOTSRANGE")
    session.refresh()
    return [f"covered {text(to_ranges(s))} with {n}" for n, s in give.items()]


def _unreachable(session: Session, consent: bool) -> list[str]:
    smap = _reference_map(session)
    reachable = {p.id for p in session.peers.values()}
    lost = sorted({owner for _, _, owner in smap if owner not in reachable})
    if not lost:
        return []
    slots = [s for a, b, owner in smap if owner in lost for s in range(a, b + 1)]
    if not consent:
        raise RefusedError(f"{len(slots)} slots ({text(to_ranges(slots))}) belong to unreachable master(s) "
                           f"{', '.join(i[:8] for i in lost)}",
                           "giving them to another master loses the keys they held",
                           "bring the master back or fail over to its replica; or pass --reassign-unreachable")
    target = min(session.masters(), key=lambda p: len(session.owned().get(p.name, ())))
    args = [x for r in to_ranges(slots) for x in r]
    session.parallel(lambda p: pipe(p, [("CLUSTER", "DELSLOTSRANGE", *args)]), session.masters())
    checked(target, [("CLUSTER", "ADDSLOTSRANGE", *args), ("CLUSTER", "BUMPEPOCH")], "ADDSLOTSRANGE")
    session.refresh()
    return [f"gave {len(slots)} slots of unreachable master(s) to {target.name} (their keys are lost)"]
