"""The topology lock's rule, pure: what a lock marker says, which nodes grant a run the lock, and whether its
grants are enough. The I/O around it is opsctl.net.topolock.

A marker is a client name, `opsctl-lock:<topology>:<epoch>:<owner>:<lease seconds>`, on a connection its run keeps
open. A node grants a run the lock when the run's marker is set there and no other run's live marker is (live: its
connection idled at most its lease, by the server's own clock). A run holds the lock with the grants of a strict
majority of the topology's servers, and keeps it while its markers stay renewed on enough of them that the rest are
no majority (keeping). Invariant: two runs never both hold it, because two majorities share a node, and there the
run whose marker came second lists the first one's (it lists after it sets) and is not granted; nor can one take it
from a holder, whose renewed markers leave it no majority to be granted.
The epoch is one more than the highest a run saw when it took the lock: a run whose markers went stale on the
other side of a split learns, when it meets a higher epoch, that another run took over since.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.frozen import Frozen, frozen

LEASE_SECONDS = 30.0
LEASE_ENV = "OPSCTL_LOCK_LEASE"
LEASE_RANGE = (6.0, 3600.0)  # 6: a renewal waits lease/6 for a reply, and a TLS handshake needs ~1 s
PREFIX = "opsctl-lock"
FORCE_FLAG = "--force-lock"
_IDLE = re.compile(r"-?[0-9]+")


@frozen
class Marker(Frozen):
    """A lock marker seen on a node: whose, its lease, seconds since its holder last renewed it (the
    server's idle of that connection), the client id that holds it there, and its epoch (0: not yet granted, or
    a marker of an opsctl before epochs)."""

    owner: str
    lease: int
    idle: int
    client_id: str
    node: str
    epoch: int = 0

    @property
    def live(self) -> bool:
        return self.idle <= self.lease


def marker_name(topology: str, epoch: int, owner: str, lease: float) -> str:
    """The client name that marks the lock; the lease rounded up (never shorter than promised). topology and owner
    hold no colon or space (CLIENT SETNAME refuses spaces; the fields are split on colons)."""
    return f"{PREFIX}:{topology}:{epoch}:{owner}:{math.ceil(lease)}"


def _idle(text: str) -> int | None:
    """CLIENT LIST's idle, in seconds, or None when it is no number. The server counts it on its wall clock, so a
    step back makes it negative: such a marker was renewed just now (0), not unreadable (it was ignored, and a
    live marker read as none)."""
    if not _IDLE.fullmatch(text):
        return None
    return max(0, int(text))


def _marker(name: str, idle_text: str, client_id: str, node: str) -> Marker | None:
    """The marker a client name holds, or None: the current form, or the one before epochs (owner:lease)."""
    idle = _idle(idle_text)
    if not name.startswith(f"{PREFIX}:") or idle is None:
        return None
    fields = name.removeprefix(f"{PREFIX}:").split(":")
    if len(fields) == 4 and fields[1].isdigit():
        owner, lease, epoch = fields[2], fields[3], int(fields[1])
    elif len(fields) == 2:
        owner, lease, epoch = fields[0], fields[1], 0
    else:
        return None
    if not owner or not lease.isdigit():
        return None
    return Marker(owner, int(lease), idle, client_id, node, epoch)


def parse_markers(client_list: str, node: str) -> list[Marker]:
    """The lock markers in a CLIENT LIST reply."""
    out = []
    for line in client_list.splitlines():
        fields = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
        marker = _marker(fields.get("name", ""), fields.get("idle", ""), fields.get("id", ""), node)
        if marker is not None:
            out.append(marker)
    return out


def live_others(markers: Iterable[Marker], mine: dict[str, str]) -> tuple[list[Marker], list[Marker]]:
    """(live markers of other runs, expired ones): mine maps node -> my client id there."""
    others = [m for m in markers if mine.get(m.node) != m.client_id]
    return [m for m in others if m.live], [m for m in others if not m.live]


def majority(total: int) -> int:
    """The grants a run needs of total servers: more than half."""
    return total // 2 + 1


def keeping(total: int) -> int:
    """The renewed markers a run that holds the lock needs to keep it: enough that the servers without one are no
    majority (half of them, rounded up), so no other run can take it meanwhile. A run's own restart of a node
    keeps the lock of a two-server topology; a split that leaves it fewer loses it."""
    return total - majority(total) + 1


def next_epoch(seen: Iterable[Marker]) -> int:
    return max((m.epoch for m in seen), default=0) + 1


@frozen
class Tally(Frozen):
    """One attempt to take the lock: the servers that granted it, those that answered, and all of them."""

    granted: tuple[str, ...]
    answered: tuple[str, ...]
    servers: tuple[str, ...]

    @property
    def enough(self) -> bool:
        return len(self.granted) >= majority(len(self.servers))

    @property
    def silent(self) -> tuple[str, ...]:
        return tuple(n for n in self.servers if n not in self.answered)

    def counted(self) -> str:
        return (f"{len(self.granted)} of {len(self.servers)} servers granted it (a majority is "
                f"{majority(len(self.servers))}); {len(self.answered)} answered")


def counted_without(tally: Tally, nowhere: Collection[str]) -> tuple[str, ...]:
    """The servers a majority is counted over once those that run nowhere are left out: a server not deployed
    yet, or stopped (the provider reached its host and found no process), grants no run anything, on either side
    of a split. Only silent servers can be such."""
    return tuple(n for n in tally.servers if n not in nowhere or n in tally.answered)


def enough_without(tally: Tally, nowhere: Collection[str]) -> bool:
    """Whether the grants are a majority of counted_without; with every server running nowhere, nothing runs to
    be split (two such runs are arbitrated by the state-dir lock and the marking of each server as it starts:
    docs/slots.md)."""
    left = counted_without(tally, nowhere)
    return len(tally.granted) >= majority(len(left)) if left else True


def held_elsewhere(live: Sequence[Marker], tally: Tally, lease: float) -> RefusedError:
    """Another run's live marker was found: refused (exit 3) naming it."""
    first = live[0]
    return RefusedError(f"another opsctl run holds this topology: {first.owner}",
                        f"its lock marker is a client named {PREFIX}:... on "
                        f"{', '.join(sorted({m.node for m in live}))}, renewed {first.idle}s ago "
                        f"(lease {first.lease}s, epoch {first.epoch}); {tally.counted()}",
                        "wait until that run finishes (or stop it); a run that died releases the lock at "
                        f"once, one that hangs within {lease:.0f}s")


def too_few(tally: Tally) -> RefusedError:
    """Fewer grants than a majority, and no other run seen: the rest do not answer from here (down, or on the
    other side of a split, where a run may hold them). Refused (exit 3) naming --force-lock."""
    return RefusedError("cannot take the topology lock: a majority of its servers does not answer from here",
                        f"{tally.counted()}; no answer from {', '.join(tally.silent)}: they are down, or on the other "
                        "side of a network split, where another opsctl run may hold them",
                        "`opsctl status -f SPEC` shows which servers are down; run again once a majority "
                        f"answers, or, when you know they are down and no other run acts, pass {FORCE_FLAG}")


def forced_warning(tally: Tally) -> str:
    """What --force-lock risks, said on stderr when it is used."""
    return (f"warning: {FORCE_FLAG}: going on without the topology lock of a majority ({tally.counted()}). "
            "If the silent servers are on the other side of a network split rather than down, another opsctl "
            "run may act there at the same time; this run stops once it finds that run's marker")


def client_refused(name: str, words: str) -> OpsctlError:
    """CLIENT refused on a node while taking the lock (unknown, or NOPERM): the markers set so far are withdrawn."""
    return OpsctlError(f"cannot take the topology lock on {name}: CLIENT was refused", words,
                       "opsctl needs CLIENT ID, SETNAME, LIST and KILL on its admin connection: do not "
                       "disable CLIENT in hardening (renaming it is fine)")


def lost_error(reason: str, finished: bool = False) -> OpsctlError:
    """finished: the loss was found once the run's last change was made (it may have overlapped another run)."""
    when = ("its last change overlapped the loss, and nothing was left to stop" if finished
            else "this run stopped before its next change")
    return OpsctlError(f"this run lost the topology lock: {reason}",
                       f"another opsctl run may have changed the topology meanwhile; {when}",
                       "look at `opsctl status -f SPEC` (and `opsctl cluster check` for a cluster), then run the "
                       "same command again: it goes on from the live state")


def lease_seconds(environ: Mapping[str, str]) -> float:
    """The lease: $OPSCTL_LOCK_LEASE seconds (6 to 3600), else 30. A shorter lease lets a hung run's lock
    expire sooner; every run of one topology should use the same."""
    text = environ.get(LEASE_ENV)
    if text is None:
        return LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = LEASE_RANGE
    if not low <= value <= high:
        raise OpsctlError(f"{LEASE_ENV}={text[:40]!r} is not a lease opsctl accepts",
                          hint=f"give seconds from {low:.0f} to {high:.0f} (default {LEASE_SECONDS:.0f}), or unset it")
    return value
