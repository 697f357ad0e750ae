"""Tell every sentinel about a promotion the moment it happened, in the words its leader will use.

Once the replica answers ROLE master, each sentinel gets the leader's hello (PUBLISH __sentinel__:hello: the
failover's epoch, a sender it knows) and is then asked what it names. Why: the leader confirms a promotion only
through a once-a-second INFO. See docs/runbooks/failover.md, "What it costs".
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Executor
from dataclasses import dataclass

from opsctl.base.errors import ConvergenceError, NodeError
from opsctl.base.poll import wait_for
from opsctl.net.connection import Connection, Subscription
from opsctl.net.resp import text
from opsctl.observe.replies import Reply, TextReply, as_text, parse_pairs
from opsctl.spec.layout import canonical_address

HELLO_CHANNEL = "__sentinel__:hello"
EPOCH_WAIT = 0.5

__all__ = ["EpochWatch", "announce", "entries", "hello_message", "names_promoted"]


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

    def __init__(self, sentinel: Connection) -> None:
        self.subscription: Subscription = sentinel.subscribe("+new-epoch")
        self.epochs: list[int] = []
        # the subscription is live once its confirmation arrived (subscribe() waits for it)

    def _read(self, timeout: float) -> str | None:
        """The next message's data, read within timeout s (an epoch is collected); None when none came."""
        message = self.subscription.get(timeout)
        if message is None:
            return None
        _, data = message
        if data.isdigit():
            self.epochs.append(int(data))
        return data

    def drain(self, wait: float = 0.0) -> None:
        """Collect the epochs published so far, waiting up to `wait` s for the first one."""
        before = len(self.epochs)
        if wait > 0:
            with contextlib.suppress(ConvergenceError):  # none in time: epoch() says so
                wait_for(lambda: True if self._read(0.01) and len(self.epochs) > before else None, wait,
                         "the leader's +new-epoch", 0)
        while self._read(0.0) is not None:
            pass

    def epoch(self) -> int | None:
        """The failover's epoch, once SENTINEL FAILOVER was accepted; None when there is none or more than one."""
        if not self.epochs:
            self.drain(EPOCH_WAIT)
        self.drain()
        return self.epochs[0] if len(self.epochs) == 1 else None

    def close(self) -> None:
        with contextlib.suppress(NodeError, OSError):
            self.subscription.close()


def listed(reply: Reply) -> list[TextReply]:
    """A list reply's entries as text (SENTINEL MASTERS, REPLICAS, SENTINELS, MASTER); any other reply as none."""
    entries = text(reply)
    return entries if isinstance(entries, list) else []


def entries(sentinel: Connection, *words: str) -> list[dict[str, str]]:
    """SENTINEL words (MASTERS, REPLICAS name, SENTINELS name): one dict per entry."""
    return [parse_pairs(entry) for entry in listed(sentinel.call("SENTINEL", *words)) if isinstance(entry, list)]


def names_promoted(address_reply: object, master_reply: object, promoted: tuple[str, int], epoch: int) -> bool:
    """Does a sentinel hold the failover's configuration, by its GET-MASTER-ADDR-BY-NAME and SENTINEL MASTER
    replies: the promoted replica at the leader's epoch? GET-MASTER-ADDR-BY-NAME, not SENTINEL MASTER's address:
    a leader that confirmed the promotion itself names the promoted replica there at once, the old master in
    SENTINEL MASTER until its failover ends. A reply that is an error is no."""
    if not isinstance(address_reply, list | tuple) or len(address_reply) != 2 or \
            not isinstance(master_reply, list | tuple | dict):
        return False
    named = (canonical_address(str(address_reply[0])), int(address_reply[1]))
    config_epoch = parse_pairs(master_reply).get("config-epoch", "")
    return named == (canonical_address(promoted[0]), promoted[1]) and config_epoch == str(epoch)


def promoted_address(leader: Connection, name: str, promoted: tuple[str, int]) -> tuple[str, int] | None:
    """The promoted replica as the leader knows it (its own address form), when the leader's failover of `name`
    is still running and has promoted exactly that replica; else None (nothing to say ahead of the leader)."""
    master = parse_pairs(listed(leader.call("SENTINEL", "MASTER", name)))
    if "failover_in_progress" not in master.get("flags", "").split(","):
        return None
    for replica in entries(leader, "REPLICAS", name):
        flags = replica.get("flags", "").split(",")
        if "promoted" in flags and (replica["ip"], int(replica["port"])) == promoted:
            return replica["ip"], int(replica["port"])
    return None


def _sender(receiver: Connection, name: str, leader_id: str) -> Identity | None:
    """A sentinel `receiver` already knows, exactly as it knows it: the leader when it is not the leader."""
    known = [Identity(e["ip"], int(e["port"]), e["runid"]) for e in entries(receiver, "SENTINELS", name)]
    return next((k for k in known if k.runid == leader_id), known[0] if known else None)


def announce(leader: Connection, sentinels: list[Connection], watch: EpochWatch, name: str, promoted: tuple[str, int],
             pool: Executor) -> list[str]:
    """Send the leader's hello for the promotion to every sentinel at once; return the sentinels that, asked
    right after it, name the promoted replica at the leader's epoch (names_promoted). Best effort: a sentinel
    that does not answer (down, stopped) learns it from the others' hellos."""
    epoch = watch.epoch()
    if epoch is None:
        return []
    address = promoted_address(leader, name, promoted)
    watch.drain()
    if address is None or len(watch.epochs) != 1:
        return []
    leader_id = as_text(leader.call("SENTINEL", "MYID"))

    def tell(sentinel: Connection) -> bool:
        with contextlib.suppress(NodeError, KeyError, ValueError):
            sender = _sender(sentinel, name, leader_id)
            if sender is not None:
                _, named, master = sentinel.texts([
                    ("PUBLISH", HELLO_CHANNEL, hello_message(sender, epoch, name, *address)),
                    ("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name), ("SENTINEL", "MASTER", name)])
                return names_promoted(named, master, address, epoch)
        return False

    told = dict(zip((s.name for s in sentinels), pool.map(tell, sentinels), strict=True))
    return [name for name, ok in told.items() if ok]
