"""Hints that sent the operator to wait for the cluster's own election, where none can come (issue 33, item 3: the
class of the dead host that held half the masters): with the slot-owning masters that answer no majority, `cluster
fix` (a shard without a reachable master) and the failover pre-checks (masters-reachable; target-linked with the
master down) name what works instead; with a majority they say what they said before. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from opsctl.base.errors import OpsctlError
from opsctl.failover.checks import cluster_prechecks, failed
from opsctl.failover.verdicts import Check, Target, Thresholds
from opsctl.observe.cluster_state import even_slot_ranges
from opsctl.observe.replies import ClusterNodeLine
from opsctl.slots.fix import shard_master_peer
from tests.test_failover_checks import facts_for, spec


def _views(masters: int, answering: int) -> dict[str, list[ClusterNodeLine]]:
    """The views of the first `answering` of `masters` slot-owning masters (the others down)."""
    ranges = even_slot_ranges(masters)
    lines = [ClusterNodeLine(f"m{i}", "127.0.0.1", 7000 + i, 17000 + i, frozenset({"master"}), None, i + 1,
                             "connected" if i < answering else "disconnected", (ranges[i],)) for i in range(masters)]
    return {f"n{i}": [ClusterNodeLine(**{**line.__dict__, "flags": line.flags | {"myself"}}) if line.id == f"m{i}"
                      else line for line in lines] for i in range(answering)}


class _Session:
    """What shard_master_peer reads of a slots session: the shard's master now (none), the nodes' views."""

    def __init__(self, views: dict[str, Sequence[ClusterNodeLine]]) -> None:
        self._views = views

    def current_master(self, name: str) -> None:
        return None

    def views(self) -> dict[str, Sequence[ClusterNodeLine]]:
        return self._views


def _fix_hint(masters: int, answering: int) -> str:
    try:
        shard_master_peer(_Session(_views(masters, answering)), "t-1")  # type: ignore[arg-type]
    except OpsctlError as exc:
        return exc.hint
    raise AssertionError("a shard without a master was not refused")


def test_cluster_fix_says_wait_only_while_a_majority_can_elect() -> None:
    assert _fix_hint(3, 2).startswith("wait for the cluster to promote a replica")
    hint = _fix_hint(4, 2)
    assert "wait for the cluster" not in hint and "cannot promote a replica: 2 of 4" in hint, hint
    assert "an election needs 3" in hint and "`opsctl apply`" in hint and "opsctl cluster fix" in hint


def test_failover_prechecks_name_takeover_once_no_majority_is_left(tmp_path) -> None:
    loaded = spec(tmp_path, "cluster")
    s1, s2, _ = loaded.layout.shards
    target = Target(1, s1.master, s1.replicas[0])

    def prechecks(down: list[str]) -> list[Check]:
        facts = facts_for(loaded, down=down, link_down=[s1.replicas[0]])
        return cluster_prechecks(loaded, facts, target, Thresholds(), [], 0.0)

    kept = prechecks([s1.master])
    hints = {c.name: c.hint for c in failed(kept)}
    assert "masters-reachable" not in hints and "`--mode force --yes`" in hints["target-linked"]
    lost = prechecks([s1.master, s2.master])
    hints = {c.name: c.hint for c in failed(lost)}
    assert "--mode force" not in hints["target-linked"] and "1/3 masters answer" in hints["target-linked"]
    for name in ("target-linked", "masters-reachable"):
        assert "`--mode takeover --yes --force-checks`" in hints[name] and "`opsctl apply`" in hints[name], hints
