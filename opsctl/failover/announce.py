"""Tell every sentinel about a promotion the moment it happened, in the words its leader will use.

The leading sentinel confirms a promotion only through INFO, which it sends the promoted replica once a second
during a failover (hard-coded in Redis 7.0 and Valkey 9.1): GET-MASTER-ADDR-BY-NAME names the new master up to
a second after the promotion, and the leader's SENTINEL MASTERS (what redis-py's `Sentinel` reads) only after
one more INFO of every other replica. Once confirmed, the leader announces the new master with a hello message
carrying the failover's epoch, and every sentinel adopts a configuration whose epoch is newer than its own.

opsctl sends that same hello (PUBLISH __sentinel__:hello to each sentinel, which takes hellos from its peers
this way) as soon as the replica answers ROLE master: the leader's failover epoch, read from its +new-epoch event
during SENTINEL FAILOVER, and, as the sender, a sentinel the receiver already knows (ip, port and run id from its
own SENTINEL SENTINELS), so no sentinel is added or moved. Nothing else changes: the epoch is the one the leader
won, the master is the replica the leader promoted (checked: its `promoted` flag in the leader's view, and no
other +new-epoch since). A sentinel that misses it (down, or opsctl killed half-way) learns the same
configuration from the others' hellos, as it would have anyway.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import PubSub

from opsctl.admin import Admin

HELLO_CHANNEL = "__sentinel__:hello"
EPOCH_WAIT = 0.5

__all__ = ["EpochWatch", "announce", "hello_message"]


@dataclass(frozen=True)
class Identity:
    ip: str
    port: int
    runid: str


def hello_message(sender: Identity, epoch: int, master_name: str, ip: str, port: int) -> str:
    """The hello format every sentinel sends: sender ip, port, run id, current epoch; master name, ip, port,
    config epoch."""
    return f"{sender.ip},{sender.port},{sender.runid},{epoch},{master_name},{ip},{port},{epoch}"


class EpochWatch:
    """The leader's +new-epoch events from just before SENTINEL FAILOVER on: the failover's epoch is the one
    published while the command ran; a second one later means the failover started again, and opsctl keeps out."""

    def __init__(self, admin: Admin) -> None:
        self.pubsub: PubSub = admin.client.pubsub()
        self.pubsub.subscribe("+new-epoch")
        self.epochs: list[int] = []
        deadline = time.monotonic() + EPOCH_WAIT
        while time.monotonic() < deadline:  # the subscription is live once its confirmation arrived
            message = self.pubsub.get_message(timeout=0.05)
            if message and message["type"] == "subscribe":
                return
        raise redis.TimeoutError("no subscription confirmation for +new-epoch")

    def drain(self, wait: float = 0.0) -> None:
        """Collect the epochs published so far, waiting up to `wait` s for the first one."""
        deadline = time.monotonic() + wait
        while (message := self.pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))) is not None \
                or time.monotonic() < deadline:
            if message and message["type"] == "message" and str(message["data"]).isdigit():
                self.epochs.append(int(message["data"]))
                deadline = 0.0

    def epoch(self) -> int | None:
        """The failover's epoch, once SENTINEL FAILOVER was accepted; None when there is none or more than one."""
        if not self.epochs:
            self.drain(EPOCH_WAIT)
        self.drain()
        return self.epochs[0] if len(self.epochs) == 1 else None

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            self.pubsub.close()


def _pairs(reply: Any) -> dict[str, str]:
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}


def _entries(admin: Admin, what: str, name: str) -> list[dict[str, str]]:
    return [_pairs(entry) for entry in admin.client.execute_command("SENTINEL", what, name)]


def promoted_address(leader: Admin, name: str, promoted: tuple[str, int]) -> tuple[str, int] | None:
    """The promoted replica as the leader knows it (its own address form), when the leader's failover of `name`
    is still running and has promoted exactly that replica; else None (nothing to say ahead of the leader)."""
    master = _pairs(leader.client.execute_command("SENTINEL", "MASTER", name))
    if "failover_in_progress" not in master.get("flags", "").split(","):
        return None
    for replica in _entries(leader, "REPLICAS", name):
        flags = replica.get("flags", "").split(",")
        if "promoted" in flags and (replica["ip"], int(replica["port"])) == promoted:
            return replica["ip"], int(replica["port"])
    return None


def _sender(receiver: Admin, name: str, leader_id: str) -> Identity | None:
    """A sentinel `receiver` already knows, exactly as it knows it: the leader when it is not the leader."""
    known = [Identity(e["ip"], int(e["port"]), e["runid"]) for e in _entries(receiver, "SENTINELS", name)]
    return next((k for k in known if k.runid == leader_id), known[0] if known else None)


def announce(leader: Admin, sentinels: list[Admin], watch: EpochWatch, name: str, promoted: tuple[str, int],
             pool: Executor) -> list[str]:
    """Send the leader's hello for the promotion to every sentinel at once; return the sentinels that took it.
    Best effort: a sentinel that does not answer (down, stopped) learns it from the others' hellos."""
    epoch = watch.epoch()
    if epoch is None:
        return []
    address = promoted_address(leader, name, promoted)
    watch.drain()
    if address is None or len(watch.epochs) != 1:
        return []
    leader_id = str(leader.client.execute_command("SENTINEL", "MYID"))

    def tell(admin: Admin) -> bool:
        with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
            sender = _sender(admin, name, leader_id)
            if sender is not None:
                admin.client.execute_command("PUBLISH", HELLO_CHANNEL, hello_message(sender, epoch, name, *address))
                return True
        return False

    told = dict(zip((s.name for s in sentinels), pool.map(tell, sentinels), strict=True))
    return [name for name, ok in told.items() if ok]
