"""What a restore copies: every RDB of a backup, each loaded into a scratch server, or a running topology read
from a linked replica per shard; each source with the databases it holds and how often its keys are sampled.

Replication offsets, the masters' own word on what their replicas hold. A live source's replica is read only
once it reached its master's offset at the start, and the master confirms it after the copy; a restore is durable
only once a replica of each target master acknowledged the master's offset. Why: a cut-off master still answers
OK to every RESTORE."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from opsctl.backup.integrity import check_files, read_manifest
from opsctl.backup.manifest import ShardFile, describe
from opsctl.backup.savers import parse_keyspace, pick_scratch, rdb_written_by
from opsctl.backup.scratch import scratch_binaries, scratch_servers
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.poll import Pending, wait_for
from opsctl.base.stop import Stopped
from opsctl.net.connection import Connection, connection_to, said
from opsctl.net.connector import Connector
from opsctl.net.discover import LiveNode, discover, scan_targets
from opsctl.observe.replies import ROLE, RoleInfo, info
from opsctl.restore.engine import Source
from opsctl.restore.target import PIPE_TIMEOUT, Target, one_server
from opsctl.server.versions import reads_rdb, server_text
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec


@dataclass(frozen=True)
class RestoreOptions:
    mode: str = "fail-if-exists"
    dry_run: bool = False
    verify: str = "sample"
    sample: int = 1000


@dataclass
class Prepared:
    id: str
    text: str
    sources: list[Source]
    dataset: int
    expected: dict[str, ShardFile] = field(default_factory=dict)


def _sample_every(keys: int, sample: int) -> int:
    return max(1, keys // max(1, sample))


@contextmanager
def backup_sources(folder: Path, target: Target, options: RestoreOptions, origin: str = "",
                   replay: Callable[[ShardFile, str], None] | None = None) -> Iterator[Prepared]:
    """Every RDB of the backup checked and loaded into a scratch server the target can take payloads from. origin:
    where the folder was copied from (an s3:// URL), named in the report and the journal instead of the copy.
    replay(shard, scratch socket): commands run on a shard's scratch server before the copy (a restore to a time);
    its keys are counted from the scratch server then."""
    manifest = read_manifest(folder)
    check_files(folder, manifest)
    if target.cluster and manifest.dbs() - {0}:
        raise RefusedError(f"{folder} holds keys in databases {sorted(manifest.dbs() - {0})}; a cluster has only "
                           "database 0 (nothing was written)",
                           hint="restore into a standalone or replication topology, or move the keys to db 0 first")
    binaries = scratch_binaries()
    server = pick_scratch(list(binaries), manifest.rdb_version, target.server, f"the backup {folder}")
    with ExitStack() as stack:
        sources, dataset, expected = [], 0, {}
        databases = max(manifest.dbs() | {0}) + 1
        servers = stack.enter_context(scratch_servers(binaries[server], [folder / s.file for s in manifest.shards],
                                                      databases))
        for shard, scratch in zip(manifest.shards, servers, strict=True):
            if replay is not None:
                replay(shard, scratch.socket)
                space = scratch.keyspace()
                shard = replace(shard, keys={db: k for db, (k, _) in space.items()},
                                expires={db: e for db, (_, e) in space.items()})
            dbs = sorted(db for db, (keys, _) in scratch.keyspace().items() if keys)
            dataset += scratch.dataset_bytes()
            key = f"shard-{shard.shard}"
            sources.append(Source(key, shard.file, Connection.on_unix(scratch.socket, shard.file, PIPE_TIMEOUT), dbs,
                                  _sample_every(shard.total_keys, options.sample)))
            expected[key] = shard
        text = f"backup {origin or folder} ({describe(manifest)})"
        yield Prepared(f"backup:{origin or folder.resolve()}:{manifest.created_at}", text, sources, dataset, expected)


def refuse_same_servers(target: LoadedSpec, source: LoadedSpec) -> None:
    """RefusedError when the source spec names a server of the target's: a topology copied into itself."""
    shared = {n.endpoint for n in source.layout.servers} & {n.endpoint for n in target.layout.servers}
    if shared:
        raise RefusedError("source and target are the same nodes",
                           f"both specs name {', '.join(sorted(shared))}",
                           "--from-live names another topology's spec")


@contextmanager
def live_sources(source: Connector, target: Target, options: RestoreOptions) -> Iterator[Prepared]:
    """A running topology: per shard a linked replica caught up with its master (else the master), read with DUMP
    as its server writes."""
    chosen, problems = scan_targets(discover(source), allow_masters=True)
    if problems or not chosen:
        raise OpsctlError("the source topology has a shard without a reachable node",
                          "\n".join(f.message for f in problems), "`opsctl status -f SOURCE_SPEC`")
    if {ln.node.endpoint for ln in chosen} & {m.endpoint for m in target.masters}:
        raise RefusedError("source and target are the same nodes", hint="--from-live names another topology's spec")
    sources, dataset, infos = [], 0, []
    for ln in chosen:
        node, confirm, note = fresh_node(source, ln)
        with connection_to(source, node) as handle:
            server_info = handle.read(info("all"))
        infos.append(server_info)
        if target.cluster and set(parse_keyspace(server_info)) - {0}:
            raise RefusedError(f"{node.name} holds keys in databases other than 0; a cluster has only "
                               "database 0 (nothing was written)", hint="restore into a standalone topology")
        keys = sum(k for k, _ in parse_keyspace(server_info).values())
        dataset += int(server_info.get("used_memory_dataset", "0"))
        sources.append(Source(ln.node.name, f"{node.name} ({node.endpoint}){note}",
                              connection_to(source, node, PIPE_TIMEOUT),
                              sorted(parse_keyspace(server_info)), _sample_every(keys, options.sample),
                              confirm=confirm))
    server = one_server(infos, "source")
    written = rdb_written_by(server)
    if written is None or not reads_rdb(*target.server, written):
        raise RefusedError(f"{server_text(*target.server)} cannot RESTORE what {server_text(*server)} DUMPs "
                           f"(RDB format {written}); nothing was written",
                           hint="restore into servers of the same or a newer version of the source's flavor")
    spec = source.loaded.spec
    yield Prepared(f"live:{source.loaded.file}", f"running topology {spec.name} ({spec.topology}, "
                   f"{len(sources)} shards)", sources, dataset)


def fresh_node(source: Connector, ln: LiveNode) -> tuple[Node, Callable[[], str | None] | None, str]:
    """The node to read a shard from, the check its master confirms after the copy, and a note for its label:
    the replica once it reached its master's offset now (every write acknowledged before the restore began),
    else the master itself (a replica cut off from its master still says its link is up until repl-timeout)."""
    master = source.loaded.layout.find(ln.master) if ln.role == "replica" and ln.master else None
    if master is None:
        return ln.node, None, ""
    start = caught_up(source, ln.node, master)
    if start is None:
        return master, None, f", its replica {ln.node.name} lagged behind"
    return ln.node, partial(confirmed, source, ln.node, master, start), ""


CATCH_UP = 10.0  # a linked replica acknowledges once a second: ten beats behind is cut off, not slow
DURABLE = 10.0
POLL = 0.05


def role(connector: Connector, node: Node) -> RoleInfo:
    with connection_to(connector, node, timeout=5.0) as handle:
        return handle.read(ROLE)


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
    except Stopped:
        raise  # a stop request, not a replica that fell behind
    except (OpsctlError, ValueError):
        return None


def confirmed(connector: Connector, replica: Node, master: Node, start: int) -> str | None:
    """A problem unless the master itself reports replica at an offset >= start (the replica's own word on what
    it held is not enough: it was the copy's source)."""
    try:
        at = acked(role(connector, master), replica)
    except Stopped:
        raise
    except (OpsctlError, ValueError) as exc:
        return f"{replica.name}: its master {master.name} could not confirm what it held: {said(exc)}"
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
    except Stopped:
        raise
    except (OpsctlError, ValueError) as exc:
        return f"{master.name}: not durable: cannot read its replication offset ({said(exc)})"
    if not want and not now.replicas:
        return None

    def best() -> int | Pending:
        seen = role(connector, master)
        top = max((r[2] for r in seen.replicas), default=-1)
        return top if top >= now.offset else Pending(f"best replica at {top if top >= 0 else 'none linked'}")

    try:
        wait_for(best, DURABLE, f"a replica of {master.name} to acknowledge", POLL)
    except Stopped:
        raise
    except (OpsctlError, ValueError) as exc:
        reason = exc.detail if isinstance(exc, OpsctlError) and exc.detail else str(exc)
        return (f"{master.name}: not durable: no replica acknowledged its offset {now.offset} within "
                f"{DURABLE:g}s ({reason})")
    return None
