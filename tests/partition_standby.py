"""A standby's link cut from its primary by iptables while `opsctl follow` runs (issue 36), inside a fresh network
namespace like tests/partition.py:

    python -m tests.partition_standby link-cut --flavor valkey

The primary (standalone, `repl-backlog-size 16kb`, `repl-timeout 5`: it drops a silent replica after 5 s) takes
writes from a client beside it (its connections leave from the primary's own address, so the cut spares it) while
the link, which connects from 127.0.0.1, is cut off from it until the primary dropped the link, the writes overran
its backlog and the link, its lock on the primary lost (a lease of 6 s), said it waits for the primary. Then the
cut heals and the link must say it starts over, copy again and be current: every
acknowledged write on the standby. Prints one JSON line (RESULT + LinkCut) and stops every server it started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.partition import RESULT, Partition, run_module_in_namespace
from tests.support import CONDITION_BOUND

BACKLOG = 16 * 1024
HOLD = 6.0  # the cut lasts this long after the link said it waits for the primary: its behaviour while it waits
LEASE = 6  # the topology locks' lease (OPSCTL_LOCK_LEASE, seconds): the link loses the primary's lock within seconds
LINK_SOURCE = "127.0.0.1"  # where opsctl's own connections leave from (no bind: the loopback route's source)


@dataclass(frozen=True)
class LinkCut:
    """cut: how long the cut lasted; dropped_after: when the primary dropped the link (from the cut); overrun:
    bytes the primary's stream moved during the cut; alive: the link ran through the cut; cpu_while_cut: its CPU
    seconds during the cut; said_while_cut: its notes during the cut; lag_while_cut: its last lag report under the
    cut; start_over: its notes from the cut on; acked, lost: the writer's acknowledged writes, of those missing on
    the standby once it caught up; current_after: seconds from the heal until the standby held every write;
    last_lag: the link's last lag report; link_up_while_cut, link_up_after: the link_up samples of its textfile
    under the cut (once the link said it waits) and once it streams again."""

    flavor: str
    cut: float
    dropped_after: float
    overrun: int
    alive: bool
    cpu_while_cut: float
    said_while_cut: list[str]
    lag_while_cut: dict[str, Any]
    start_over: list[str]
    acked: int
    lost: int
    current_after: float
    last_lag: dict[str, Any]
    link_sources: list[str]
    link_up_while_cut: list[str]
    link_up_after: list[str]


def run_in_namespace(flavor: str) -> dict[str, Any]:
    return run_module_in_namespace("tests.partition_standby", ["link-cut", f"--flavor={flavor}"])


# --- inside the namespace ---

@contextmanager
def topology(tmp: Path, name: str, spec: dict[str, Any]) -> Iterator[tuple[Path, Any]]:
    from tests.partition_restore import applied

    with applied(tmp, name, spec) as made:
        yield made


def beside(node: Any) -> Any:
    """A client of node whose connections leave from node's own address: on its side of any cut."""
    import redis

    from tests.support import PASSWORD

    class Bound(redis.Connection):
        def _connect(self) -> socket.socket:
            sock = socket.create_connection((self.host, self.port), self.socket_connect_timeout,
                                            source_address=(node.address, 0))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.socket_timeout)
            return sock

    pool = redis.ConnectionPool(connection_class=Bound, host=node.address, port=node.port, password=PASSWORD,
                                socket_timeout=5, socket_connect_timeout=2, decode_responses=True)
    return redis.Redis(connection_pool=pool)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def link_cut(tmp: Path, flavor: str) -> LinkCut:
    from opsctl.base.poll import wait_for
    from opsctl.metrics.signals import FOLLOW_COMMAND, textfile_name
    from tests.support import make_spec
    from tests.test_migrate_live import source_client
    from tests.test_standby_live import Follow
    from tests.writer import Writer

    with ExitStack() as stack:
        p, p_loaded = stack.enter_context(topology(tmp, "primary", make_spec(
            "standalone", flavor, hosts=1, config={"repl-backlog-size": BACKLOG, "repl-timeout": 5})))
        s, s_loaded = stack.enter_context(topology(tmp, "standby", make_spec(
            "standalone", "valkey", hosts=1, follows={"spec": str(p)})))
        node = p_loaded.layout.servers[0]
        primary, standby = beside(node), source_client(s_loaded)
        writer = stack.enter_context(Writer(lambda: beside(node)))
        writer.wait_for_writes(200)
        textfiles = tmp / "textfiles"
        textfiles.mkdir()
        prom = textfiles / textfile_name(s_loaded.spec.name, FOLLOW_COMMAND)
        follow = Follow(s, "--metrics-textfile", str(textfiles), env={"OPSCTL_LOCK_LEASE": str(LEASE)})
        stack.callback(lambda: follow.proc.poll() is None and follow.proc.kill())
        follow.streaming()
        sources = sorted({c["addr"].rsplit(":", 1)[0] for c in primary.client_list() if "S" in c.get("flags", "")})

        def replication() -> dict[str, Any]:
            return dict(primary.info("replication"))
        partition = Partition()
        stack.callback(partition.close)
        at_cut = replication()["master_repl_offset"]
        seen, cpu_before = len(follow.events), cpu_seconds(follow.proc.pid)
        partition.cut([node.address], [LINK_SOURCE, s_loaded.layout.servers[0].address])
        cut_at = time.monotonic()
        wait_for(lambda: replication()["connected_slaves"] == 0 or None, CONDITION_BOUND,
                 "the primary to drop the cut link")
        dropped = time.monotonic() - cut_at
        wait_for(lambda: replication()["master_repl_offset"] - at_cut > 4 * BACKLOG or None, CONDITION_BOUND,
                 "the writes to overrun the primary's backlog")
        wait_for(lambda: any("does not answer" in e.get("text", "") for e in follow.events[seen:])
                 or follow.proc.poll() is not None or None, CONDITION_BOUND, "the link to say it waits for the primary")
        waiting = time.monotonic()
        up_while_cut = link_up_once(prom, " 0", wait_for)  # refreshed each second: the cut's 0 once it is written
        wait_for(lambda: time.monotonic() - waiting >= HOLD or None, HOLD + 30, "the hold")
        alive = follow.proc.poll() is None
        cpu = cpu_seconds(follow.proc.pid) - cpu_before if alive else -1.0
        under_cut = follow.events[seen:]
        overrun = replication()["master_repl_offset"] - at_cut
        partition.heal()
        healed = time.monotonic()
        cut = healed - cut_at
        after = len(follow.events)
        if alive:
            follow.streaming(after=after)
        writer.wait_for_more(200)
        writer.stop()
        if alive:
            wait_for(lambda: writer.verify(standby) == [] or None, CONDITION_BOUND,
                     "every acknowledged write on the standby")
        current_after = time.monotonic() - healed
        up_after = link_up_once(prom, " 1", wait_for) if alive else []
        lost = len(writer.verify(standby))
        lags = [e for e in follow.events if e.get("event") == "migrate-lag"]
        notes = [e.get("text", "") for e in follow.events[seen:] if e.get("event") == "note"]
        if alive:
            follow.proc.send_signal(signal.SIGTERM)
            follow.wait()
        lag_under = [e for e in under_cut if e.get("event") == "migrate-lag"]
        return LinkCut(flavor, round(cut, 3), round(dropped, 3), overrun, alive, round(cpu, 3),
                       [e.get("text", json.dumps(e)) for e in under_cut if e.get("event") != "migrate-lag"],
                       lag_under[-1] if lag_under else {}, notes, len(writer.acked), lost, round(current_after, 3),
                       lags[-1] if lags else {}, sources, up_while_cut, up_after)


def link_up_once(prom: Path, value: str, wait_for: Any) -> list[str]:
    """The textfile's link_up lines once they all end in value (or, after CONDITION_BOUND, as they are)."""
    def lines() -> list[str]:
        text = prom.read_text() if prom.exists() else ""
        return [line for line in text.splitlines() if line.startswith("opsctl_standby_link_up{")]

    from opsctl.base.errors import OpsctlError

    def said() -> list[str] | None:
        now = lines()
        return now if now and all(line.endswith(value) for line in now) else None

    try:
        found: list[str] = wait_for(said, CONDITION_BOUND, f"the textfile's link_up to say{value}")
    except OpsctlError:  # the test names what it found instead
        return lines()
    return found


def main(argv: list[str]) -> int:
    from tests.support import PASSWORD, PASSWORD_ENV, server_tmpdir

    parser = argparse.ArgumentParser(prog="python -m tests.partition_standby")
    parser.add_argument("scenario", choices=["link-cut"])
    parser.add_argument("--flavor", default="valkey", choices=["valkey", "redis"])
    args = parser.parse_args(argv)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with server_tmpdir("opsctl-partition-") as tmp:
        run = link_cut(Path(tmp), args.flavor)
    print(RESULT + json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
