"""The destroy operation: stop (and with purge delete) exactly the nodes that run, have an exporter running or have
files, node by node, in an order that leaves the masters last; with purge the state files that name the purged
nodes and, given a textfile folder, the topology's signals go too. Library code: it never prints, asks or exits;
approval is options.approve, each line said goes to emit as a Note."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath

from opsctl.base.events import Emit, Note, ignore
from opsctl.base.frozen import Frozen, frozen
from opsctl.runtime.opening import Runtime, locked
from opsctl.spec.layout import Node


@frozen
class NodeTeardown(Frozen):
    """What destroy did (or, in a dry run, would do) to a node: it ran (it is stopped), its data was purged, an
    exporter ran beside it."""

    node: str
    was_running: bool
    purged: bool
    exporter: bool
    dry_run: bool = False

    def line(self) -> str:
        """'stopped N', 'stopped N and purged its data', 'purged the data of N' (a node that was down), 'stopped the
        redis_exporter of N' (beside a node that was down), or that it was down already (it stopped since destroy
        looked); in a dry run, what would be done."""
        name, purged = self.node, self.purged
        if self.dry_run:
            if not self.was_running:
                return f"would purge the data of {name}" if purged else f"would stop the redis_exporter of {name}"
            return f"would stop {name}{' and purge its data' if purged else ''}"
        if not self.was_running:
            if purged:
                return f"purged the data of {name}"
            return f"stopped the redis_exporter of {name}" if self.exporter else f"{name} was down already"
        return f"stopped {name}{' and purged its data' if purged else ''}"


def approve_all(todo: Sequence[NodeTeardown]) -> None:
    """An approval that lets every teardown go on (a library caller that decided before)."""


@frozen
class DestroyOptions(Frozen):
    """purge: delete the nodes' data, configs and logs too, and the state files naming them. dry_run: say what
    would be done, change nothing. textfile_dir: with purge, the topology's signals in node_exporter's textfile
    folder go too. approve: called with what is about to be done when there is something to do (not in a dry
    run); raises RefusedError to say no."""

    purge: bool = False
    dry_run: bool = False
    textfile_dir: Path | None = None
    approve: Callable[[Sequence[NodeTeardown]], None] = approve_all


@frozen
class DestroyResult(Frozen):
    """What destroy did (or would do): each node, then each file it removed (state files, textfiles)."""

    spec: str
    dry_run: bool
    purge: bool
    nodes: tuple[NodeTeardown, ...]
    removed: tuple[Path, ...]

    @property
    def nothing_to_do(self) -> bool:
        return not self.nodes

    def lines(self) -> tuple[str, ...]:
        """As people read them, in the order they were said."""
        nothing = () if self.nodes else (nothing_to_do(self.spec, self.purge),)
        verb = "would remove" if self.dry_run else "removed"
        return (*(n.line() for n in self.nodes), *nothing, *(f"{verb} {path}" for path in self.removed))

    def text(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, object]:
        return {"name": self.spec, "dry_run": self.dry_run, "purge": self.purge, "nothing_to_do": self.nothing_to_do,
                "lines": list(self.lines())}


def nothing_to_do(spec: str, purge: bool) -> str:
    return (f"nothing to {'stop or purge' if purge else 'stop'}: no node of '{spec}' runs"
            f"{' or has files' if purge else ''}")


@frozen
class _Presence(Frozen):
    """A node as destroy finds it: its server runs, its exporter runs, it has files (a config or a record)."""

    node: Node
    running: bool
    exporter: bool
    files: bool


DEFAULTS = DestroyOptions()


def destroy(rt: Runtime, options: DestroyOptions = DEFAULTS, emit: Emit = ignore) -> DestroyResult:
    """Every node the state knows (_destroy_order), so a purge leaves nothing of the topology and the next apply
    deploys as the first did. A topology with nothing to do is left alone: no question, no lock, nothing written (a
    lock file would be a lie of 'deployed'); a dry run says what would be done and changes nothing either. The
    changes run under the state-dir and topology locks (runtime.opening.locked)."""
    waves = _destroy_order(rt)
    todo = [p for p in _presence(rt, [n for wave in waves for n in wave])
            if p.running or p.exporter or (options.purge and p.files)]
    said = _Said(emit)
    if not todo or options.dry_run:
        nodes = [said.node(NodeTeardown(p.node.name, p.running, options.purge and p.files, p.exporter, True))
                 for p in todo]
        if not todo:
            said.note(nothing_to_do(rt.loaded.spec.name, options.purge))
        if options.purge:  # a purge killed after its last node left the journals: they go on this path too
            _purge_state(rt.state_dir, options.dry_run, said)
        _drop_textfiles(options, rt.loaded.spec.name, said)
        return DestroyResult(rt.loaded.spec.name, options.dry_run, options.purge, tuple(nodes), tuple(said.removed))
    options.approve([NodeTeardown(p.node.name, p.running, options.purge, p.exporter, True) for p in todo])
    with locked(rt, emit):
        nodes = [said.node(done) for wave in waves for done in _tear_down_wave(rt, wave, todo, options.purge)]
        if options.purge:
            _drop_state(rt.state_dir, said)  # under the lock, the lock file last
    _drop_textfiles(options, rt.loaded.spec.name, said)
    return DestroyResult(rt.loaded.spec.name, False, options.purge, tuple(nodes), tuple(said.removed))


class _Said:
    """What destroy says as it goes (emit, a Note a line) and the files it removed (or would)."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.removed: list[Path] = []

    def note(self, line: str) -> None:
        self.emit(Note(line))

    def node(self, done: NodeTeardown) -> NodeTeardown:
        self.note(done.line())
        return done

    def file(self, path: Path, dry_run: bool) -> None:
        self.removed.append(path)
        self.note(f"{'would remove' if dry_run else 'removed'} {path}")


def _tear_down_wave(rt: Runtime, wave: Sequence[Node], todo: Sequence[_Presence], purge: bool) -> list[NodeTeardown]:
    """The nodes of one wave of _destroy_order that have something to tear down, their servers stopped all at once
    (fan_out: each stop waits for its server's shutdown, its last save; one after another, 240 nodes took longer
    than their creation), then each one's exporter and files, one after another (the last purge drops the shared
    binary copy)."""
    from opsctl.net.fanout import fan_out

    names = {n.name for n in wave}
    mine = [p for p in todo if p.node.name in names]
    stopped = fan_out(lambda p: _stop(rt, p), mine)
    return [_tear_down(rt, p, running, purge) for p, running in zip(mine, stopped, strict=True)]


def _stop(rt: Runtime, p: _Presence) -> bool:
    """One node's server stopped if it runs (looked at again, under the locks): whether it ran."""
    from opsctl.net.topolock import check_held, stopping

    check_held(rt.connector)
    running = rt.provider.process_state(p.node).running  # again, under the locks
    if running:
        stopping(rt.connector, [p.node.name])  # its own stops do not count against its lock
        rt.provider.stop(p.node)
    return running


def _tear_down(rt: Runtime, p: _Presence, running: bool, purge: bool) -> NodeTeardown:
    """One node, under the locks, its server stopped (_stop): its exporter removed, purged if asked."""
    from opsctl.metrics.exporter_steps import remove_exporter

    remove_exporter(rt, p.node)
    if purge:
        rt.provider.purge(p.node)
    return NodeTeardown(p.node.name, running, purge, p.exporter)


def _state_files(state_dir: Path) -> list[Path]:
    """What a purged topology's state dir may still hold beside its nodes' folders, each naming the purged nodes
    (ids, addresses) and read by a fresh deploy as its own: the slot, restore and migration journals, the failover
    reports (the cool-down reads them), and the lock file. The TLS material (tls/) stays: clients trust its CA."""
    from opsctl.failover.report import REPORT_DIR
    from opsctl.migrate.phases import JOURNAL as MIGRATE_JOURNAL
    from opsctl.restore.route import JOURNAL as RESTORE_JOURNAL
    from opsctl.slots.journal import JOURNAL as SLOTS_JOURNAL
    from opsctl.state.statelock import LOCK_NAME

    names = (SLOTS_JOURNAL, RESTORE_JOURNAL, MIGRATE_JOURNAL, REPORT_DIR, LOCK_NAME)
    return [path for path in (state_dir / name for name in names) if path.is_symlink() or path.exists()]


def _purge_state(state_dir: Path, dry_run: bool, said: _Said) -> None:
    """destroy --purge with no node left to purge: the state files a killed purge left go (under the lock: a run
    that starts meanwhile reads none half-removed); a dry run names them."""
    from opsctl.state.statelock import state_lock

    found = _state_files(state_dir)
    if dry_run or not found:
        for path in found:
            said.file(path, dry_run=True)
        return
    with state_lock(state_dir):
        _drop_state(state_dir, said)


def _drop_state(state_dir: Path, said: _Said) -> None:
    """Remove _state_files (a link goes itself, never what it points to), the lock file last: this run holds it."""
    from opsctl.state.statelock import LOCK_NAME, remove_lock_file

    for path in _state_files(state_dir):
        if path.name == LOCK_NAME:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        said.file(path, dry_run=False)
    remove_lock_file(state_dir)


def _drop_textfiles(options: DestroyOptions, name: str, said: _Said) -> None:
    """With purge and a textfile folder: the topology's own signals go too (named in a dry run), nodes or not: they
    lie outside the state dir, where node_exporter reads them."""
    if options.textfile_dir is None:
        return
    from opsctl.metrics.signals import remove_textfiles, topology_textfiles

    if options.dry_run:
        for path in topology_textfiles(options.textfile_dir, name):
            said.file(Path(path), dry_run=True)
        return
    for path in remove_textfiles(options.textfile_dir, name):
        said.file(Path(path), dry_run=False)


def _destroy_order(rt: Runtime) -> list[list[Node]]:
    """Every node the state knows, in waves torn down one after another (the nodes of a wave at once): first the
    ones the spec no longer keeps (retiring, parked, tombstones: their records, at the place they were deployed),
    then the sentinels, the replicas, the masters. Over SSH a tombstone
    on a host the spec lost is out of reach (no host entry names its SSH settings): the copy of it the hosts table
    carries goes with the spec's folder on the last purge of each host."""
    from opsctl.spec.deployed import deployed_from_records
    from opsctl.spec.placement import recorded_nodes

    spec, layout = rt.loaded.spec, rt.loaded.layout
    recorded = recorded_nodes(spec, layout, deployed_from_records(rt.provider.deployed_records()))
    if spec.provider == "ansible":
        recorded = tuple(n for n in recorded if n.host in {h.name for h in spec.hosts})
    waves = [[*layout.retired, *recorded], list(layout.sentinels),
             [n for n in layout.servers if n.role == "replica"], [n for n in layout.servers if n.role == "master"]]
    return [wave for wave in waves if wave]


def _presence(rt: Runtime, nodes: list[Node]) -> list[_Presence]:
    """Each node, whether its server runs, whether an exporter runs beside it, and whether it has files where the
    provider keeps them (its config is the first file a deployment writes; a tombstone holds its record alone), all
    nodes at once."""
    from opsctl.metrics.exporter_steps import exporter_runs
    from opsctl.net.fanout import fan_out

    def look(node: Node) -> _Presence:
        conf = PurePath(rt.provider.paths(node).conf).name
        files = rt.provider.read_file(node, conf) is not None or bool(rt.provider.load_record(node))
        return _Presence(node, rt.provider.process_state(node).running, exporter_runs(rt, node), files)

    return fan_out(look, nodes)
