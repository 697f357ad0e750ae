"""`cluster rebalance --by cpu|network|memory|keys`: measure what each slot costs on every master, plan with
slots.loadplan, move through the slot engines (slots.reshard.run_moves). I/O shell.

Measured: Valkey 8.0+ keeps per-slot counters (CLUSTER SLOT-STATS: key-count always; cpu-usec and
network-bytes-in/out with cluster-slot-stats-enabled); cpu and network are their deltas over --window. Where a
server keeps none (Redis 7.0), keys are counted (CLUSTER COUNTKEYSINSLOT) and memory is estimated by sampling
(MEMORY USAGE of a few keys per slot, times its key count); cpu and network are refused by name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from opsctl.base import stop
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Log
from opsctl.net.connector import Connector
from opsctl.observe.replies import RespError, server_of
from opsctl.server.versions import has_capability, version_text
from opsctl.slots.balance import Move
from opsctl.slots.loadplan import LoadPlan, plan_by_load, spread
from opsctl.slots.ranges import expand
from opsctl.slots.reshard import MoveOptions, execute_or_describe
from opsctl.slots.session import DescribedMove, Peer, Session, SlotsOutcome, keyed, open_session, pipe

COUNTERS = {"cpu": ("cpu-usec",), "network": ("network-bytes-in", "network-bytes-out")}  # summed per slot
UNITS = {"cpu": "µs CPU", "network": "bytes", "memory": "bytes", "keys": "keys"}
SAMPLE = 5  # keys sampled per slot for --by memory without per-slot memory
TOP_KEYS = 5  # keys named per hot slot
HOT_SAMPLE = 100  # keys sampled in a hot slot to name its top ones


@dataclass
class Measured:
    cost: dict[int, float]
    keys: dict[int, int]
    how: str  # one line: what was measured, how


def has_slot_stats(session: Session, name: str) -> bool:
    version = server_of(session.seen[name].info)
    return version is not None and has_capability(version[0], version[1], "slot_stats")


def measure(session: Session, by: str, window: float, emit: Emit) -> Measured:
    """Each slot's cost by `by`, and its keys, from every master that serves slots."""
    masters = [session.peer(m) for m, slots in session.owned().items() if slots]
    with_stats = all(has_slot_stats(session, p.name) for p in masters)
    if by in COUNTERS:
        _refuse_without_counters(session, by, masters)
        first = _slot_stats(session, masters)
        _counters_on(by, first)
        emit(Log("slots", f"measuring {by} per slot for {window:g}s on {len(masters)} masters"))
        _wait_window(window)
        second = _slot_stats(session, masters)
        cost = {s: float(sum(max(0, second[s].get(c, 0) - first.get(s, {}).get(c, 0)) for c in COUNTERS[by]))
                for s in second}
        return Measured(cost, {s: v.get("key-count", 0) for s, v in second.items()},
                        f"{by}: CLUSTER SLOT-STATS deltas over {window:g}s")
    if with_stats:
        keys = {s: v.get("key-count", 0) for s, v in _slot_stats(session, masters).items()}
        how = "CLUSTER SLOT-STATS key-count"
    else:
        keys = _count_keys(session, masters)
        how = "CLUSTER COUNTKEYSINSLOT"
    if by == "keys":
        return Measured({s: float(n) for s, n in keys.items()}, keys, f"keys: {how}")
    return Measured(_sampled_memory(session, masters, keys), keys,
                    f"memory: estimated, MEMORY USAGE of up to {SAMPLE} keys per slot x its keys ({how})")


def _refuse_without_counters(session: Session, by: str, masters: Sequence[Peer]) -> None:
    lacking = [p for p in masters if not has_slot_stats(session, p.name)]
    if lacking:
        names = ", ".join(f"{p.name} ({_server_text(session, p.name)})" for p in lacking)
        raise OpsctlError(f"--by {by} needs per-slot statistics, and {names} keeps none",
                          "CLUSTER SLOT-STATS (Valkey 8.0 and later) measures CPU time and network bytes per slot; "
                          "other servers cannot say what a slot costs",
                          "balance by --by keys or --by memory (estimated by sampling), or --by slots")


def _server_text(session: Session, name: str) -> str:
    version = server_of(session.seen[name].info)
    return f"{version[0]} {version_text(version[1])}" if version else "unknown server"


def _counters_on(by: str, stats: Mapping[int, Mapping[str, int]]) -> None:
    """CLUSTER SLOT-STATS names cpu-usec and the network counters only where cluster-slot-stats-enabled is on."""
    if stats and not any(COUNTERS[by][0] in v for v in stats.values()):
        raise OpsctlError(f"--by {by}: cluster-slot-stats-enabled is off, the servers count no {by} per slot",
                          "CLUSTER SLOT-STATS answers only key-count without it",
                          "set `cluster: {slot_stats: true}` in the spec (or `config: {cluster-slot-stats-enabled: "
                          "\"yes\"}`) and run `opsctl apply -f SPEC`, then measure again")


def _wait_window(window: float) -> None:
    """The measurement window (a measured span, not a wait for a premise); a stop request ends it early."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        signum = stop.requested()
        if signum is not None:
            raise stop.Stopped(signum, "stopped while measuring: nothing moved")
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _slot_stats(session: Session, masters: Sequence[Peer]) -> dict[int, dict[str, int]]:
    replies = session.parallel(lambda p: pipe(p, [("CLUSTER", "SLOT-STATS", "SLOTSRANGE", 0, 16383)])[0], masters)
    out: dict[int, dict[str, int]] = {}
    for peer, reply in zip(masters, replies, strict=True):
        if isinstance(reply, RespError):
            raise OpsctlError(f"CLUSTER SLOT-STATS failed on {peer.name}", str(reply))
        out.update(parse_slot_stats(reply))
    return out


def parse_slot_stats(reply: object) -> dict[int, dict[str, int]]:
    """CLUSTER SLOT-STATS: [[slot, [name, value, name, value...]], ...] -> {slot: {name: value}} (the node's own
    slots only). Another shape is an error naming it, not a crash."""
    try:
        if not isinstance(reply, list):
            raise TypeError("not a list")
        out: dict[int, dict[str, int]] = {}
        for entry in reply:
            slot, fields = int(entry[0]), entry[1]
            out[slot] = {_str(fields[i]): int(fields[i + 1]) for i in range(0, len(fields) - 1, 2)}
        return out
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise OpsctlError("CLUSTER SLOT-STATS answered in a shape opsctl does not know", f"{exc}: {reply!r:.200}",
                          "balance by --by keys or --by memory (sampled) on this server") from None


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _count_keys(session: Session, masters: Sequence[Peer]) -> dict[int, int]:
    owned = session.owned()

    def count(peer: Peer) -> dict[int, int]:
        slots = owned[peer.name]
        replies = pipe(peer, [("CLUSTER", "COUNTKEYSINSLOT", s) for s in slots])
        return {s: int(n) for s, n in zip(slots, replies, strict=True) if not isinstance(n, RespError)}

    out: dict[int, int] = {}
    for counted in session.parallel(count, masters):
        out.update(counted)
    return out


def _sampled_memory(session: Session, masters: Sequence[Peer], keys: Mapping[int, int]) -> dict[int, float]:
    """Each slot's bytes: the mean MEMORY USAGE of up to SAMPLE of its keys, times its key count."""
    owned = session.owned()

    def sample(peer: Peer) -> dict[int, float]:
        slots = [s for s in owned[peer.name] if keys.get(s, 0) > 0]
        listed = pipe(peer, [("CLUSTER", "GETKEYSINSLOT", s, SAMPLE) for s in slots])
        names = [(s, k) for s, ks in zip(slots, listed, strict=True) if isinstance(ks, list) for k in ks]
        sizes = keyed(peer, "MEMORY", "USAGE", [k for _, k in names])
        per_slot: dict[int, list[int]] = {}
        for (s, _), size in zip(names, sizes, strict=True):
            if isinstance(size, int):
                per_slot.setdefault(s, []).append(size)
        return {s: keys[s] * sum(v) / len(v) for s, v in per_slot.items() if v}

    out: dict[int, float] = {}
    for sampled in session.parallel(sample, masters):
        out.update(sampled)
    return out


def top_keys(peer: Peer, slot: int, by_size: bool = True) -> list[str]:
    """A hot slot's top keys on its master (sampled): by access frequency where the maxmemory-policy is LFU
    (OBJECT FREQ answers), else by size (by_size), else none."""
    listed = pipe(peer, [("CLUSTER", "GETKEYSINSLOT", slot, HOT_SAMPLE)])[0]
    names = [k for k in listed if isinstance(k, bytes)] if isinstance(listed, list) else []
    freq = keyed(peer, "OBJECT", "FREQ", names)
    lfu = bool(names) and all(isinstance(f, int) for f in freq)
    if not lfu and not by_size:
        return []
    scores = freq if lfu else keyed(peer, "MEMORY", "USAGE", names)
    ranked = sorted(zip(names, scores, strict=True), key=lambda p: -(p[1] if isinstance(p[1], int) else 0))
    return [k.decode(errors="backslashreplace") for k, _ in ranked[:TOP_KEYS]]


def plan_dict(by: str, measured: Measured, plan: LoadPlan, named: Mapping[int, list[str]],
              loads_now: Mapping[str, float]) -> dict[str, Any]:
    """The plan as people read it (and --output json carries): shares now and after, moves with cost, hot slots."""
    total = plan.total or 1.0
    after = {m: share * total for m, share in plan.share_after.items()}
    return {
        "by": by, "measured": measured.how, "unit": UNITS[by], "total": plan.total,
        "masters": [{"master": m, "share_now": plan.share_now[m], "share_after": plan.share_after[m]}
                    for m in plan.share_now],
        "spread_now": spread(loads_now), "spread_after": spread(after),
        "slot_moves": [{"slot": m.slot, "source": m.source, "target": m.target, "cost": m.cost,
                        "share": m.cost / total, "keys": m.keys} for m in plan.slot_moves],
        "keys_moved": plan.keys_moved, "reached": plan.reached,
        "hot": [{"slot": h.slot, "master": h.master, "cost": h.cost, "share": h.share,
                 "top_keys": named.get(h.slot, [])} for h in plan.hot],
    }


def rebalance_by_load(connector: Connector, state_dir: Path, by: str, window: float, threshold_pct: float,
                      emit: Emit, options: MoveOptions, dry_run: bool = False) -> SlotsOutcome:
    with open_session(connector) as session:
        owned = session.owned()
        measured = measure(session, by, window, emit)
        plan = plan_by_load(owned, measured.cost, measured.keys, 1.0 + threshold_pct / 100.0)
        named = {h.slot: top_keys(session.peer(h.master), h.slot) for h in plan.hot}
        loads_now = {m: sum(measured.cost.get(s, 0.0) for s in slots) for m, slots in owned.items()}
        moves = plan.moves()
        outcome = execute_or_describe(session, moves, state_dir, emit, options, dry_run) if moves \
            else SlotsOutcome(dry_run=dry_run)
        notes = list(outcome.notes)
        if not moves:
            notes.append(f"nothing to move: every master is within {threshold_pct:g}% of the mean "
                         f"{by}" + (" (hot slots allowing)" if plan.hot else ""))
        for h in plan.hot:
            notes.append(f"slot {h.slot} on {h.master} alone costs {h.share:.0%} of all {by}, more than a "
                         f"master's fair share: left where it is (only the key design can split it; "
                         f"top keys sampled: {', '.join(named[h.slot]) or 'none'})")
        return replace(outcome, moves=tuple(_by_load(described, move, plan)
                                            for described, move in zip(outcome.moves, moves, strict=True)),
                       plan=plan_dict(by, measured, plan, named, loads_now), notes=tuple(notes))


def _by_load(described: DescribedMove, move: Move, plan: LoadPlan) -> DescribedMove:
    """The move with the keys the load plan counted in its slots (the engine's estimate spreads a node's keys
    evenly over its slots)."""
    mine = set(expand(move.slots))
    return replace(described, est_keys=sum(m.keys for m in plan.slot_moves if m.slot in mine))
