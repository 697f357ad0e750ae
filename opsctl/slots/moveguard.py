"""Is an endpoint of a slot move still its shard's master? Pure: views in, verdict out.

ok: answers, is a master, unflagged, no other master in its shard.
down: silent or flagged fail/pfail, not replaced yet: wait, bounded.
replaced: a replica now, or a node of its shard is a master with slots and an epoch at least its own.
Why: a stalled master runs a queued SETSLOT NODE even once replaced."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from opsctl.observe.replies import ClusterNodeLine, myself

OK, DOWN, REPLACED = "ok", "down", "replaced"


def verdict(endpoint: str, own: Sequence[ClusterNodeLine] | None, other: Sequence[ClusterNodeLine] | None,
            shard: Collection[str]) -> str:
    """endpoint: address:port of the node judged; own: its CLUSTER NODES (None: no answer in time); other:
    the CLUSTER NODES of the other end of the move (None: no answer); shard: the endpoints of its shard."""
    me = myself(own) if own is not None else None
    if me is not None and not me.is_master:
        return REPLACED
    seen = next((line for line in other or () if line.endpoint == endpoint), None)
    if seen is not None and not seen.is_master:
        return REPLACED
    if _promoted(other or (), endpoint, shard) or _promoted(own or (), endpoint, shard):
        return REPLACED
    if me is None or (seen is not None and seen.is_failing):
        return DOWN
    return OK


def _promoted(view: Sequence[ClusterNodeLine], endpoint: str, shard: Collection[str]) -> bool:
    """Another node of the shard is a healthy master with slots in this view, with a config epoch at least the judged
    node's. Of two masters serving slots of one shard only the newer epoch is the master (as shard_master picks it),
    so the older one never makes the newer one 'replaced'."""
    judged = next((line for line in view if line.endpoint == endpoint), None)
    least = judged.config_epoch if judged is not None else -1
    return any(line.endpoint != endpoint and line.endpoint in shard and line.is_master and line.slots
               and not line.is_failing and line.config_epoch >= least for line in view)


def shard_master(members: Sequence[str], mine: Mapping[str, ClusterNodeLine | None],
                 flagged: Collection[str]) -> str | None:
    """The shard's master now: a member that says it is a master and that no other node flags as failing;
    the one with slots and the highest config epoch if several do (the cluster's own tie-break)."""
    candidates = [m for m in members if (me := mine.get(m)) is not None and me.is_master and me.id not in flagged]
    if not candidates:
        return None
    return max(candidates, key=lambda m: (bool(mine[m].slots), mine[m].config_epoch))  # type: ignore[union-attr]


def flagged_ids(views: Mapping[str, Sequence[ClusterNodeLine]]) -> set[str]:
    """Ids some node's view flags fail or pfail (not counting a node's view of itself)."""
    return {line.id for view in views.values() for line in view if line.is_failing and not line.is_myself}
