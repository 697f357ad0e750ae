"""`opsctl audit --hot`: each master's hottest slots over a window and, where the maxmemory-policy is LFU, their
hottest keys. I/O shell over slots.byload's measurement (CLUSTER SLOT-STATS deltas; key counts where a server
keeps no load counters)."""

from __future__ import annotations

from typing import Any

from opsctl.base.events import Emit
from opsctl.net.connector import Connector
from opsctl.slots.byload import COUNTERS, has_slot_stats, measure, top_keys
from opsctl.slots.session import Session, open_session, pipe


def hot_report(connector: Connector, top: int, window: float, emit: Emit) -> dict[str, Any]:
    """{"by": what ranks the slots, "masters": [{"master", "slots": [{"slot", "cost", "share", "keys",
    "top_keys"}]}]}: per master its top slots by cpu where the counters are on, else by keys."""
    with open_session(connector) as session:
        owned = {m: slots for m, slots in session.owned().items() if slots}
        by = "cpu" if _counting(session, list(owned)) else "keys"
        measured = measure(session, by, window, emit)
        total = sum(measured.cost.values()) or 1.0
        masters = []
        for master, slots in sorted(owned.items()):
            ranked = sorted((s for s in slots if measured.cost.get(s, 0.0) > 0),
                            key=lambda s: (-measured.cost[s], s))[:top]
            peer = session.peer(master)
            masters.append({"master": master, "share": sum(measured.cost.get(s, 0.0) for s in slots) / total,
                            "slots": [{"slot": s, "cost": measured.cost[s], "share": measured.cost[s] / total,
                                       "keys": measured.keys.get(s, 0),
                                       "top_keys": top_keys(peer, s, by_size=False)} for s in ranked]})
        return {"by": by, "measured": measured.how, "masters": masters}


def _counting(session: Session, masters: list[str]) -> bool:
    """Whether every master counts cpu per slot (Valkey 8.0+ with cluster-slot-stats-enabled on)."""
    if not masters or not all(has_slot_stats(session, m) for m in masters):
        return False
    for name in masters:
        reply = pipe(session.peer(name), [("CLUSTER", "SLOT-STATS", "ORDERBY", "key-count", "LIMIT", 1)])[0]
        fields = reply[0][1] if isinstance(reply, list) and reply else []
        if COUNTERS["cpu"][0].encode() not in fields and COUNTERS["cpu"][0] not in fields:
            return False
    return True
