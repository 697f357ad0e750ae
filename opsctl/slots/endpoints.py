"""Is an endpoint of a slot move still the master of its shard? Pure: views in, a verdict out.

A master that stalls longer than the node timeout is failed over by the cluster while opsctl moves slots to or
from it. Commands queued on its socket run when it wakes, before it learns it was demoted: a SETSLOT NODE then
gives slots to a node that is no longer its shard's master. So before every SETSLOT NODE (and after any failed
round) the engine asks both ends and the other side's view, and acts on the verdict:

ok: answers, is a master, nobody flags it, no other node of its shard is a master;
down: does not answer or is flagged fail/pfail, and nobody replaced it (yet): wait, bounded;
replaced: another node of its shard is a master with slots and an epoch at least its own (the cluster promoted
it), or it is a replica now.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from opsctl.observe.parse import ClusterNodeLine, myself

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
    """Another node of the shard is a healthy master with slots in this view, and a config epoch at least the
    judged node's there. A master that stalled past the node timeout can keep the slots it was given just
    before its replica took over (the replica claims only what it knew its master had): both then serve slots
    for good, and only the newer epoch is the shard's master (as shard_master picks it), so the older one does
    not make the newer one 'replaced' (a run that followed the failover stopped on that, and so did fix)."""
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
