"""What a restore copies: every RDB of a backup, each loaded into a scratch server, or a running topology read
from a linked replica per shard; each source with the databases it holds and how often its keys are sampled."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from opsctl.backup.manifest import ShardFile, describe
from opsctl.backup.plan import parse_keyspace, pick_scratch, rdb_written_by
from opsctl.backup.scratch import scratch_binaries, scratch_servers
from opsctl.backup.verify import check_files, read_manifest
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.net.connector import Connector, unix_socket
from opsctl.net.discover import LiveNode, discover, scan_targets
from opsctl.net.rawpipe import RawPipe
from opsctl.observe.replies import parse_info
from opsctl.restore.engine import Source
from opsctl.restore.offsets import caught_up, confirmed
from opsctl.restore.target import Target, one_server
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
            sources.append(Source(key, shard.file, _scratch_opener(scratch.socket, shard.file), dbs,
                                  _sample_every(shard.total_keys, options.sample)))
            expected[key] = shard
        text = f"backup {origin or folder} ({describe(manifest)})"
        yield Prepared(f"backup:{origin or folder.resolve()}:{manifest.created_at}", text, sources, dataset, expected)


def _scratch_opener(socket_path: str, label: str) -> Callable[[], RawPipe]:
    return lambda: RawPipe.on_socket(unix_socket(socket_path, 120.0), label)


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
        with source.admin(node) as admin:
            info = parse_info(admin.info())
        infos.append(info)
        if target.cluster and set(parse_keyspace(info)) - {0}:
            raise RefusedError(f"{node.name} holds keys in databases other than 0; a cluster has only "
                               "database 0 (nothing was written)", hint="restore into a standalone topology")
        keys = sum(k for k, _ in parse_keyspace(info).values())
        dataset += int(info.get("used_memory_dataset", "0"))
        sources.append(Source(ln.node.name, f"{node.name} ({node.endpoint}){note}", _live_opener(source, node),
                              sorted(parse_keyspace(info)), _sample_every(keys, options.sample), confirm=confirm))
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


def _live_opener(connector: Connector, node: Node) -> Callable[[], RawPipe]:
    return lambda: RawPipe(connector, node, 120.0)
