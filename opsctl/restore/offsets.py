"""Replication offsets, the masters' own word on what their replicas hold. A live source's replica is read only
once it reached its master's offset at the start, and the master confirms it after the copy; a restore is durable
only once a replica of each target master acknowledged the master's offset. Why: a cut-off master still answers
OK to every RESTORE.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from opsctl.base.errors import OpsctlError
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connector import Connector
from opsctl.observe.replies import RoleInfo, parse_role
from opsctl.spec.layout import Node

CATCH_UP = 10.0  # a linked replica acknowledges once a second: ten beats behind is cut off, not slow
DURABLE = 10.0
POLL = 0.05


def role(connector: Connector, node: Node) -> RoleInfo:
    with connector.admin(node, timeout=5.0) as admin:
        return parse_role(admin.raw("ROLE"))


def acked(master: RoleInfo, replica: Node) -> int | None:
    """The offset the master says replica acknowledged (ROLE's replica list), None when it lists no such replica."""
    same_port = [r for r in master.replicas if r[1] == replica.port]
    mine = same_port if len(same_port) == 1 else [r for r in same_port if r[0] == replica.address]
    return mine[0][2] if mine else None


def caught_up(connector: Connector, replica: Node, master: Node) -> int | None:
    """The master's offset now, once replica's own offset reached it (within CATCH_UP); None if it did not."""
    target = role(connector, master).offset

    def offset() -> int | Pending:
        at = role(connector, replica).offset
        return target if at >= target else Pending(f"offset {at}, master at {target}")

    try:
        return wait_for(offset, CATCH_UP, f"{replica.name} to catch up", POLL)
    except (OpsctlError, redis.RedisError, OSError, ValueError):
        return None


def confirmed(connector: Connector, replica: Node, master: Node, start: int) -> str | None:
    """A problem unless the master itself reports replica at an offset >= start (the replica's own word on what
    it held is not enough: it was the copy's source)."""
    try:
        at = acked(role(connector, master), replica)
    except (redis.RedisError, OSError, ValueError) as exc:
        return f"{replica.name}: its master {master.name} could not confirm what it held: {exc}"
    if at is None or at < start:
        return (f"{replica.name}: its master {master.name} had offset {start} when the restore began but reports "
                f"this replica at {'no offset' if at is None else at}: it was behind, keys may be missing")
    return None


def durable(connector: Connector, masters: Sequence[Node], wanted: Sequence[bool]) -> list[str]:
    """Per target master (wanted: it has or should have a replica): a replica acknowledged the master's offset
    after the copy, within DURABLE seconds; one problem line per master that none did."""
    problems = []
    for master, want in zip(masters, wanted, strict=True):
        if (problem := _held(connector, master, want)) is not None:
            problems.append(problem)
    return problems


def _held(connector: Connector, master: Node, want: bool) -> str | None:
    try:
        now = role(connector, master)
    except (redis.RedisError, OSError, ValueError) as exc:
        return f"{master.name}: not durable: cannot read its replication offset ({exc})"
    if not want and not now.replicas:
        return None

    def best() -> int | Pending:
        seen = role(connector, master)
        top = max((r[2] for r in seen.replicas), default=-1)
        return top if top >= now.offset else Pending(f"best replica at {top if top >= 0 else 'none linked'}")

    try:
        wait_for(best, DURABLE, f"a replica of {master.name} to acknowledge", POLL)
    except (OpsctlError, redis.RedisError, OSError, ValueError) as exc:
        reason = exc.detail if isinstance(exc, OpsctlError) and exc.detail else str(exc)
        return (f"{master.name}: not durable: no replica acknowledged its offset {now.offset} within "
                f"{DURABLE:g}s ({reason})")
    return None
