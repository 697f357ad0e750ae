"""Close open slots (those a killed run journaled, exactly; then any other open slot), cover slots no master
serves (also apply's assign-slots), and, only with explicit consent, take over the slots of an unreachable
master."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from opsctl.base import stop
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connector import Connector
from opsctl.net.topolock import check_held
from opsctl.observe.cluster_state import no_master_hint, slot_map
from opsctl.observe.replies import SLOTS, ClusterNodeLine, NodeObservation, as_text, server_of
from opsctl.slots.atomic import wait_idle
from opsctl.slots.coverage import Cover, Owners, cover_owners, cover_plan, unreachable_owners, unserved_slots
from opsctl.slots.journal import Journal, OpenSlots, SlotState, decide
from opsctl.slots.keys import EndpointReplaced, KeyMover, Options, auth_args
from opsctl.slots.moveguard import flagged_ids
from opsctl.slots.progress import Closed, EndpointReplacedEvent, Progress
from opsctl.slots.ranges import expand, slot_command, text, to_ranges
from opsctl.slots.session import (
    MAX_FAILOVERS,
    Peer,
    ReplyError,
    Session,
    SlotsOutcome,
    checked,
    open_session,
    pipe,
    wait_one_slot_map,
    wait_stable,
)
from opsctl.spec.layout import Shard

STRAY_TIMEOUT_MS = 5000  # MIGRATE of one stray key to its slot's owner
STRAY_ROUNDS = 3


def close_open(connector: Connector, state_dir: Path, emit: Emit, seen: Mapping[str, NodeObservation]) -> list[str]:
    """Resume a killed run: close every journaled slot, then any other open slot (seen: a look at the spec's
    nodes, to tell whether any is open). Returns what was done."""
    journal = Journal(state_dir)
    if not journal.pending() and not _live_open(seen):
        journal.compact()
        return []
    with open_session(connector) as session:
        done = close_in_session(session, journal, emit)
    return done


def _live_open(seen: Mapping[str, NodeObservation]) -> bool:
    return any(line.migrating or line.importing for o in seen.values() for line in o.cluster_nodes or ()
               if line.is_myself)


def close_in_session(session: Session, journal: Journal, emit: Emit,
                     only: Callable[[OpenSlots], bool] | None = None) -> list[str]:
    """Close the journal's open entries (each resolved to its shards' current masters), then any slot a master
    shows open that nobody journaled. `only`: close just the entries it accepts, and no unjournaled slot
    (a run recovering one move while others are under way)."""
    with stop.finishing("closing open slots"):
        done = [] if only is not None else merge_split_shards(session, journal, emit)  # before: merge_split_shards
        for entry in journal.pending():
            if only is None or only(entry):
                done.append(_close_entry(session, journal, entry, emit, journaled=True))
        session.refresh()
        if only is None:
            check_held(session.connector)  # before each change: a run that lost its topology lock stops
            done += _release_owned_imports(session)
            for entry in live_open_slots(session):
                done.append(_close_entry(session, journal, entry, emit, journaled=False))
            journal.compact()
            session.refresh()
            done += _clear_replica_flags(session)
            done += hand_over_strays(session)
        session.refresh()
    return done


def _release_owned_imports(session: Session) -> list[str]:
    """SETSLOT STABLE for a slot a master imports while it serves it already, from a node that no longer migrates
    it to it (a source failed over mid-move: Redis 7.0 ignores every owner update for a slot it imports, so the flag
    never clears, and IMPORTING again is refused: "I'm already the owner"). The keys it holds are its own."""
    migrating = {(peer.id, slot) for peer in session.masters() if (me := session.me(peer.name)) is not None
                 for slot in me.migrating}
    notes = []
    for peer in session.masters():
        me = session.me(peer.name)
        stale = sorted(s for s, source in (me.importing.items() if me is not None else ())
                       if _owns(me, s) and (source, s) not in migrating)
        if stale:
            checked(peer, [("CLUSTER", "SETSLOT", s, "STABLE") for s in stale], "SETSLOT STABLE")
            notes.append(f"{peer.name} served {text(to_ranges(stale))} while still importing them from a node "
                         "that no longer moves them: cleared")
    return notes


def _clear_replica_flags(session: Session) -> list[str]:
    """A replica that shows a slot MIGRATING or IMPORTING its master does not (a run ended between the master's
    change and its replication): SETSLOT STABLE on the master, which replicates it (Valkey >= 8; a replica refuses
    SETSLOT from a client)."""
    notes = []
    for name in list(session.peers):
        me = session.me(name)
        if me is None or me.is_master or me.master_id is None:
            continue
        master = next((p for p in session.masters() if p.id == me.master_id), None)
        line = session.me(master.name) if master is not None else None
        if master is None or line is None:
            continue
        stale = sorted(s for s in {*me.migrating, *me.importing} if s not in line.migrating and s not in line.importing)
        if stale:
            checked(master, [("CLUSTER", "SETSLOT", s, "STABLE") for s in stale], "SETSLOT STABLE")
            notes.append(f"replica {name} showed {text(to_ranges(stale))} open, its master {master.name} did not: "
                         "cleared through the master")
    return notes


def live_open_slots(session: Session) -> list[OpenSlots]:
    """Open slots nobody journaled, as (owner -> target) groups from the MIGRATING/IMPORTING flags of masters
    only (Valkey 9 replicates the flags to replicas, whose copy is not the one to act on). An IMPORTING slot's
    source is the master that serves it now, whatever node id the flag names (it may have died)."""
    owner = {s: name for name, slots in session.owned().items() for s in slots}
    pairs: dict[tuple[str, str], set[int]] = {}
    for peer in session.masters():
        me = session.me(peer.name)
        if me is None:
            continue
        for slot, target in me.migrating.items():
            pairs.setdefault((peer.name, session.name_of(target) or target), set()).add(slot)
        for slot, source in me.importing.items():
            pairs.setdefault((owner.get(slot) or session.name_of(source) or source, peer.name), set()).add(slot)
    out = []
    for (source, target), slots in sorted(pairs.items()):
        if source in session.peers and target in session.peers:
            out.append(OpenSlots(source, session.peers[source].id, target, session.peers[target].id,
                                 to_ranges(slots)))
    return out


def shard_master_peer(session: Session, name: str) -> Peer:
    """The peer now serving name's shard; a clear error when the shard has no reachable master."""
    master = session.current_master(name)
    if master is None:
        raise OpsctlError(f"the shard of {name} has no reachable master", "the open slots stay journaled",
                          no_master_hint(session.views().values(), "run `opsctl cluster fix -f SPEC`"))
    return session.peers[master]


def slot_states(session: Session, source: Peer, target: Peer, slots: Sequence[int]) -> list[SlotState]:
    src, tgt = session.me(source.name), session.me(target.name)
    counts = [("CLUSTER", "COUNTKEYSINSLOT", s) for s in slots]
    src_keys = checked(source, counts, "counting the keys of open slots")  # an error is no count of 0: a slot
    tgt_keys = checked(target, counts, "counting the keys of open slots")  # closed on it would strand keys
    return [SlotState(_owns(src, s), _owns(tgt, s), bool(src and s in src.migrating),
                      bool(tgt and s in tgt.importing), a, b)
            for s, a, b in zip(slots, src_keys, tgt_keys, strict=True)]


def _owns(me: ClusterNodeLine | None, slot: int) -> bool:
    return me is not None and any(a <= slot <= b for a, b in me.slots)


def _close_entry(session: Session, journal: Journal, entry: OpenSlots, emit: Emit, journaled: bool) -> str:
    """Close one entry with its shards' current masters. A failover still settling (a stalled master that woke
    up claims its shard until gossip demotes it) is waited out and the masters resolved again, as a run's
    move follows one."""
    check_held(session.connector)
    for _ in range(MAX_FAILOVERS):
        try:
            return _close_entry_once(session, journal, entry, emit, journaled)
        except EndpointReplaced as exc:
            emit(EndpointReplacedEvent(exc.role, exc.name))
            wait_one_slot_map(session)
    return _close_entry_once(session, journal, entry, emit, journaled)


def _close_entry_once(session: Session, journal: Journal, entry: OpenSlots, emit: Emit, journaled: bool) -> str:
    slots = expand(entry.slots)
    if entry.mode == "atomic":
        if entry.source in session.peers:
            info = session.seen[entry.source].info
            version = server_of(dict(info))
            wait_idle(session.peers[entry.source], version[0] if version else "valkey")
        journal.closed(slots)
        return f"atomic move {entry.source} -> {entry.target} of {text(entry.slots)}: ended server-side"
    source, target = shard_master_peer(session, entry.source), shard_master_peer(session, entry.target)
    _clear_stale(session, {entry.source, entry.target} - {source.name, target.name}, slots)
    if source.name == target.name:  # both ends resolve to one master: nothing can be open between them
        journal.closed(slots)
        return f"{entry.source} -> {entry.target} of {text(entry.slots)}: both are now {source.name}; nothing open"
    states = slot_states(session, source, target, slots)
    groups: dict[str, list[int]] = {}
    for slot, state in zip(slots, states, strict=True):
        groups.setdefault(decide(state), []).append(slot)
    mover = KeyMover(session, source, target, journal, Progress(emit, len(slots)), emit, Options())
    if groups.get("finish"):
        _mend_import_view(session, source, target, groups["finish"])
        mover.move(groups["finish"])
    if groups.get("assign"):
        mover.close(groups["assign"])
    if groups.get("cancel"):
        checked(target, [("CLUSTER", "SETSLOT", s, "STABLE") for s in groups["cancel"]], "SETSLOT STABLE")
    journal.closed(slots)
    what = ", ".join(f"{k} {text(to_ranges(v))}" for k, v in sorted(groups.items()))
    origin = "journaled" if journaled else "not journaled (found open)"
    emit(Closed(source.name, target.name, journaled, {k: text(to_ranges(v)) for k, v in groups.items()}))
    moved = "" if (source.name, target.name) == (entry.source, entry.target) else \
        f" (now {source.name} -> {target.name}: the shard failed over)"
    return f"{origin} {entry.source} -> {entry.target}{moved}: {what}"


def _mend_import_view(session: Session, source: Peer, target: Peer, slots: Sequence[int]) -> list[int]:
    """SETSLOT NODE source on the target for the slots it imports whose owner, in its own view, is not the source
    that serves them: the old source demoted after a split took them along, and Redis 7.0 ignores every owner
    update for a slot it imports, so the target stayed cluster_state:fail and refused every MIGRATE
    (CLUSTERDOWN). The IMPORTING flag stays; the move then finishes as usual."""
    src, tgt, seen = session.me(source.name), session.me(target.name), session.seen.get(target.name)
    if src is None or tgt is None or seen is None:
        return []
    owner = {slot: line.id for line in seen.cluster_nodes or () if line.is_master
             for a, b in line.slots for slot in range(a, b + 1)}
    wrong = [s for s in slots if s in tgt.importing and _owns(src, s) and owner.get(s) != source.id]
    if wrong:
        checked(target, [("CLUSTER", "SETSLOT", s, "NODE", source.id) for s in wrong], "SETSLOT NODE")
    return wrong


def _clear_stale(session: Session, names: set[str], slots: Sequence[int]) -> None:
    """A node that was a move's end but is not its shard's master any more (it came back after a failover as
    an empty master, with the MIGRATING/IMPORTING flags its nodes.conf kept): SETSLOT STABLE for those slots,
    and only for slots it does not serve."""
    for name in sorted(names):
        me = session.me(name)
        if name not in session.peers or me is None or not me.is_master:
            continue
        stale = [s for s in slots if (s in me.migrating or s in me.importing) and not _owns(me, s)]
        if stale:
            # errors ignored: a node demoted meanwhile refuses SETSLOT, and its demotion cleared the flags
            pipe(session.peers[name], [("CLUSTER", "SETSLOT", s, "STABLE") for s in stale])


def fix(connector: Connector, state_dir: Path, emit: Emit, reassign_unreachable: bool = False) -> SlotsOutcome:
    """After close_open (done by the caller): cover uncovered slots; take over a lost master's only on consent."""
    with open_session(connector) as session:
        notes = [*close_in_session(session, Journal(state_dir), emit), *_cover(session),
                 *_unreachable(session, reassign_unreachable)]
        session.refresh()
        wait_stable(session)
    return SlotsOutcome(notes=tuple(notes) or ("nothing to fix: no open slots, every slot is served",))


def merge_split_shards(session: Session, journal: Journal, emit: Emit,
                       members: Collection[str] | None = None) -> list[str]:
    """A shard with two masters serving different slots: move the smaller one's slots to the other, key by key, then
    make it its replica: one master and its replica, no acknowledged write dropped. members: only the shards with
    one of these nodes. Done before the journal's entries close. Why: the promoted replica may hold copies of keys
    of a slot the other master serves, which read as a move to finish."""
    if not _split_shards(session, members):
        return []
    # a master that just woke up claims its old slots until gossip corrects it: merge only what all agree on
    wait_one_slot_map(session)
    notes = []
    for shard, serving in _split_shards(session, members):
        keep = max(serving, key=lambda m: (len(session.owned().get(m, ())), session.me(m).config_epoch))  # type: ignore[union-attr]
        for name in serving:
            if name == keep:
                continue
            slots = session.owned().get(name, [])
            source, target = session.peers[name], session.peers[keep]
            if slots:
                KeyMover(session, source, target, journal, Progress(emit, len(slots)), emit, Options()).move(slots)
            session.refresh()
            wait_for(lambda n=name: _empty(session, n), 30, f"{name} to show no slots")  # type: ignore[misc]
            _demote(session, source, target)
            notes.append(f"shard {shard.index} had two masters serving slots: moved {len(slots)} slots of {name} "
                         f"to {keep}, and {name} now replicates {keep}")
        session.refresh()
    return notes


def _demote(session: Session, node: Peer, master: Peer) -> None:
    """CLUSTER REPLICATE master on node, once the keys it holds are handed over. Masters that still migrate a
    slot to node stop first (they would send writes to it with ASK); a write they redirected just before lands
    on node all the same, and REPLICATE refuses a node with keys: handed over again, a few times."""
    check_held(session.connector)
    for peer in session.masters():
        line = session.me(peer.name)
        moving = [s for s, to in line.migrating.items() if to == node.id] if line is not None else []
        if moving:
            checked(peer, [("CLUSTER", "SETSLOT", s, "STABLE") for s in moving], "SETSLOT STABLE")
    for attempt in range(STRAY_ROUNDS):
        _hand_over_strays(session, node)
        reply = pipe(node, [("CLUSTER", "REPLICATE", master.id)])[0]
        if not isinstance(reply, ReplyError):
            return
        if "empty" not in str(reply) or attempt == STRAY_ROUNDS - 1:
            raise OpsctlError(f"CLUSTER REPLICATE failed on {node.name} ({node.node.endpoint})", str(reply),
                              "`opsctl cluster fix -f SPEC` merges the shard again")


def hand_over_strays(session: Session, members: Collection[str] | None = None) -> list[str]:
    """Keys a master holds in slots another master serves (a source's replica promoted mid-move still has the keys
    of waves its old master had handed over): each goes to its slot's owner, or is dropped there when the owner's
    copy is equal (_hand_over_strays). Unreachable until then, and they would shadow the owner's after a move back.
    members: only these masters."""
    notes = []
    # a slot no master serves is not a stray's: cover gives it to the master holding its keys
    served = {s for slots in session.owned().values() for s in slots}
    for peer in session.masters():
        if members is not None and peer.name not in members:
            continue
        mine = set(session.owned().get(peer.name, ()))
        stray = keys_in_slots(peer, sorted(served - mine))
        if stray:
            _hand_over_strays(session, peer, stray)
            notes.append(f"{peer.name} held {sum(stray.values())} keys of slots it does not serve "
                         f"({text(to_ranges(stray))}): handed to their owners")
    return notes


def _hand_over_strays(session: Session, node: Peer, stray: Mapping[int, int] | None = None) -> None:
    """Keys node still holds in slots it does not serve go to each slot's owner before node may replicate (CLUSTER
    REPLICATE refuses a master with keys, and a sync would drop them). Per slot: IMPORTING on node from the owner
    (so node answers ASKING), MIGRATE to the owner, a key the owner has already dropped here only when both copies
    are equal (else refused, nothing dropped); then STABLE."""
    owner = {s: name for name, slots in session.owned().items() for s in slots if name != node.name}
    auth = auth_args(session)
    for slot, count in (keys_in_slots(node, range(SLOTS)) if stray is None else stray).items():
        if slot not in owner:
            raise OpsctlError(f"{node.name} holds {count} keys of slot {slot}, which no master serves",
                              "it cannot become a replica without dropping them",
                              "`opsctl cluster fix -f SPEC` covers the slot first; then run it again")
        target = session.peers[owner[slot]]
        checked(node, [("CLUSTER", "SETSLOT", slot, "IMPORTING", target.id)], "SETSLOT IMPORTING")
        keys = checked(node, [("CLUSTER", "GETKEYSINSLOT", slot, count)], "GETKEYSINSLOT")[0]
        for key in keys:
            migrate = ("MIGRATE", target.node.address, target.node.port, "", 0, STRAY_TIMEOUT_MS, *auth, "KEYS", key)
            reply = pipe(node, [("ASKING",), migrate])[1]
            if isinstance(reply, ReplyError) and "BUSYKEY" in str(reply):
                mine = pipe(node, [("ASKING",), ("DUMP", key)])[1]
                if mine != pipe(target, [("DUMP", key)])[0]:
                    label = as_text(key)
                    raise RefusedError(f"key {label!r} of slot {slot} exists on {node.name} (which no longer "
                                       f"serves the slot) and on {target.name} with different values",
                                       "replacing either copy would lose data",
                                       "compare both copies, delete the wrong one, then run `opsctl cluster fix "
                                       "-f SPEC`")
                reply = pipe(node, [("ASKING",), ("DEL", key)])[1]
            if isinstance(reply, ReplyError):
                raise OpsctlError(f"handing a key of slot {slot} from {node.name} to {target.name} failed",
                                  str(reply), "`opsctl cluster fix -f SPEC` tries again")
        checked(node, [("CLUSTER", "SETSLOT", slot, "STABLE")], "SETSLOT STABLE")


def _split_shards(session: Session, members: Collection[str] | None) -> list[tuple[Shard, list[str]]]:
    """The shards (with one of members, if given) where two or more unflagged masters serve slots, or where one
    serves slots and another holds keys without serving any (a merge stopped before its CLUSTER REPLICATE: the
    keys may be the only copies, and REPLICATE refuses such a node)."""
    flagged = flagged_ids(session.views())
    split = []
    for shard in session.loaded.layout.shards:
        if members is not None and not set(shard.members) & set(members):
            continue
        masters = {m: me for m in shard.members if m in session.peers and (me := session.me(m)) is not None
                   and me.is_master and me.id not in flagged}
        serving = [m for m, me in masters.items() if me.slots]
        holding = [m for m, me in masters.items() if not me.slots and _holds_keys(session.peers[m])] if serving else []
        if len(serving) >= 2 or holding:
            split.append((shard, serving + holding))
    return split


def _holds_keys(peer: Peer) -> bool:
    (size,) = checked(peer, [("DBSIZE",)], "counting keys")
    return isinstance(size, int) and size > 0


def keys_in_slots(peer: Peer, slots: Sequence[int]) -> dict[int, int]:
    """peer's key count in each of slots it holds keys in (one DBSIZE for a node that holds none)."""
    if not _holds_keys(peer):
        return {}
    counts = checked(peer, [("CLUSTER", "COUNTKEYSINSLOT", s) for s in slots], "counting keys in slots")
    return {s: n for s, n in zip(slots, counts, strict=True) if isinstance(n, int) and n > 0}


def _empty(session: Session, name: str) -> bool | Pending:
    session.refresh()
    me = session.me(name)
    return True if me is not None and not me.slots else Pending(f"{name} still shows slots")


def cover(session: Session, slots: Iterable[int], owners: Owners, follow_keys: bool) -> dict[str, list[int]]:
    """Give each of slots that no view shows served (coverage.unserved_slots) to a master as coverage.cover_plan
    decides, and make each new owner's claim win (claim). Refused when a master holds keys in a slot that goes to
    another: those keys would stay on a node that does not serve their slot. Returns who got which slots."""
    unserved = sorted(set(slots) & unserved_slots(session.views().values()))
    if not unserved:
        return {}
    masters = _answering_masters(session, unserved)
    keys = dict(zip([p.name for p in masters], session.parallel(lambda p: keys_in_slots(p, unserved), masters),
                    strict=True))
    plan = cover_plan(unserved, keys, owners, follow_keys)
    if plan.stranded:
        raise _stranded(plan, follow_keys)
    for name, mine in plan.give.items():
        claim(session, session.peer(name), mine)
    session.refresh()
    return plan.give


def _answering_masters(session: Session, slots: Sequence[int]) -> list[Peer]:
    masters = session.masters()
    if not masters:
        raise OpsctlError(f"slots {text(to_ranges(slots))} need a new master, and no master answers",
                          "only a master can serve them", "start the masters, then run this again")
    return masters


def claim(session: Session, peer: Peer, slots: Sequence[int]) -> None:
    """ADDSLOTS of slots on peer, then BUMPEPOCH: a config epoch of its own, the greatest it knows, so that its
    claim wins over a view that still gives a slot to a former owner (a greater epoch there would take it back)."""
    check_held(session.connector)
    ranges = to_ranges(slots)
    checked(peer, [slot_command("ADDSLOTS", ranges, session.has_slot_ranges(peer.name)), ("CLUSTER", "BUMPEPOCH")],
            f"assigning slots {text(ranges)}")


def _stranded(plan: Cover, follow_keys: bool) -> RefusedError:
    owner = {s: name for name, mine in plan.give.items() for s in mine}
    names = sorted(plan.stranded)
    held = "; ".join(f"{name}: slots {text(to_ranges(plan.stranded[name]))} (they would go to "
                     f"{', '.join(sorted({owner[s] for s in plan.stranded[name]}))})" for name in names)
    hint = ("a slot has one master: leave each such slot's keys on one master (move or delete the others), then "
            "run `opsctl cluster fix -f SPEC` again" if follow_keys else
            "`opsctl cluster fix -f SPEC` gives each such slot to the node holding its keys; then apply again")
    return RefusedError(f"{', '.join(names)} hold{'s' * (len(names) == 1)} keys in slots that no master serves",
                        f"{held}: keys would stay on nodes that do not serve their slots", hint)


def _cover(session: Session) -> list[str]:
    """Every slot that no view shows served goes to the master holding keys in it, else as apply's assign-slots
    gives it: to its shard's master now by the spec's layout (coverage.cover_owners)."""
    given = cover(session, range(SLOTS), _layout_owners(session), follow_keys=True)
    return [f"covered {text(to_ranges(s))} with {n}" for n, s in given.items()]


def _layout_owners(session: Session) -> Owners:
    """coverage.cover_owners with each shard's master from the session's look, taken only when a slot needs one."""
    def owners(slots: Sequence[int]) -> Mapping[int, str]:
        masters, owned = session.shard_masters(), session.owned()
        counts = {m: len(owned.get(m, ())) for m in masters if m is not None}
        return cover_owners(session.loaded.layout, masters, counts)(slots)

    return owners


def _unreachable(session: Session, consent: bool) -> list[str]:
    owners = unreachable_owners(session.views().values())
    if not owners:
        return []
    lost = sorted(owners)
    slots = sorted({s for mine in owners.values() for s in mine})
    if not consent:
        raise RefusedError(f"{len(slots)} slots ({text(to_ranges(slots))}) belong to unreachable master(s) "
                           f"{', '.join(i[:8] for i in lost)}",
                           "giving them to another master loses the keys they held",
                           "bring the master back or fail over to its replica; or pass --reassign-unreachable")
    masters = _answering_masters(session, slots)
    given: dict[str, list[int]] = {}
    for slot, name in _layout_owners(session)(slots).items():
        given.setdefault(name, []).append(slot)
    session.parallel(lambda p: _unassign(session, p, slots), masters)
    for name, mine in given.items():
        claim(session, session.peer(name), mine)
    session.refresh()
    return [f"gave {len(mine)} slots of unreachable master(s) to {name} (their keys are lost)"
            for name, mine in given.items()]


def _unassign(session: Session, peer: Peer, slots: Sequence[int]) -> None:
    """DELSLOTS of those of slots that peer's view assigns (DELSLOTS refuses a slot it sees unassigned already)."""
    check_held(session.connector)
    view = session.views().get(peer.name, [])
    assigned = set(expand((start, end) for start, end, _ in slot_map(view)))
    mine = to_ranges(s for s in slots if s in assigned)
    if mine:
        checked(peer, [slot_command("DELSLOTS", mine, session.has_slot_ranges(peer.name))],
                f"unassigning slots {text(mine)} of unreachable masters")
