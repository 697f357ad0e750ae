"""The runtime a command opens: the provider, the connector and the placed spec, built in one place.

The connector a command uses: the spec's TLS files and, for hosts reached over SSH, the provider's tunnels.

The connector itself (opsctl.net.connector) is handed both and builds neither: TLS material and SSH routes belong
to layers above it.

The shell of placement (opsctl.spec.placement): the records read where the nodes are deployed, and, when a
replica count went down, who is each shard's master now, so the member retired is never the one serving."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from opsctl.base.errors import OpsctlError, clip
from opsctl.base.events import Emit, on_stderr
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connection import Connections
from opsctl.net.connector import Connector, Route
from opsctl.plan.spread import placement_moves, rebalancing
from opsctl.providers.base import Provider
from opsctl.server.versions import parse_version
from opsctl.spec.deployed import NodeRecord, deployed_from_records
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.spec.placement import surplus_members, with_placement
from opsctl.state.localdirs import state_dir_for
from opsctl.tls.material import client_tls


@frozen
class RuntimeOptions(Frozen):
    """How a runtime is opened. state_dir: None for the spec's default (beside it). locked: the state-dir lock and
    the topology lock for the whole run, planning included (apply). force_lock: take the topology lock over a
    marker of a run that is gone (--force-lock). keep_spec: what keeps the validated spec beside the state
    (state.specfile.read_spec_to_keep), called once the runtime is built where the state goes beside the spec."""

    state_dir: Path | None = None
    locked: bool = False
    force_lock: bool = False
    keep_spec: Callable[[], None] | None = None
    emit: Emit = on_stderr  # what the topology lock warns of (--force-lock, a lock taken over)


UNLOCKED = RuntimeOptions()


@dataclass
class Runtime:
    """What a command runs on, built once over the placed spec: every command sees one layout. force_lock: the
    topology lock may be taken over a gone run's marker (locked)."""

    loaded: LoadedSpec
    provider: Provider
    state_dir: Path
    connector: Connector
    force_lock: bool = False
    # one handle per node for the run (opsctl.net.connection), opened on first use, closed with the runtime (close)
    connections: Connections = field(init=False, repr=False)

    def __post_init__(self) -> None:
        layout = self.loaded.layout  # retired nodes too: a step may stop one (a layout node's name wins)
        self.connections = Connections(self.connector, (*layout.retired, *layout.nodes), fail_fast=False)

    def close(self) -> None:
        """The nodes' handles, then the provider (its SSH tunnels carry them)."""
        self.connections.close()
        self.provider.close()

    def node(self, name: str) -> Node:
        return self.loaded.layout.node(name)


@contextmanager
def open_runtime(loaded: LoadedSpec, options: RuntimeOptions = UNLOCKED) -> Iterator[Runtime]:
    """The runtime, under the state-dir lock and the topology lock if options.locked, for the whole run (planning
    included), so no other run changes the topology between the plan and its steps; its provider is closed inside
    the locks. More: docs/internals.md."""
    rt = make_runtime(loaded, options.state_dir, options.force_lock)
    if options.keep_spec is not None and options.state_dir is None:  # its state goes beside the spec: so does it
        options.keep_spec()
    with ExitStack() as locks:
        try:
            if options.locked:
                locks.enter_context(locked(rt, options.emit))
            yield rt
        finally:
            rt.close()


@contextmanager
def locked(rt: Runtime, emit: Emit = on_stderr) -> Iterator[None]:
    """The state-dir lock, then the topology lock (counting its majority among the servers that run somewhere:
    runs_nowhere), for the block; what the lock warns of goes to emit."""
    from opsctl.net.topolock import topology_lock  # redis: plan and status import no client library
    from opsctl.state.statelock import state_lock

    with state_lock(rt.state_dir), topology_lock(rt.connector, nowhere=lambda names: runs_nowhere(rt, names),
                                                 force=rt.force_lock, emit=emit):
        yield


def runs_nowhere(rt: Runtime, names: Sequence[str]) -> list[str]:
    """Of the named servers (silent to the topology lock), those the provider finds running nowhere: not deployed
    yet or stopped, their host reached and no process of theirs there (a first apply, a topology stopped by
    `destroy`, a scale-out's new servers). They grant no run anything, on either side of a split, so the lock counts
    its majority among the others. A host the provider cannot reach may run a server opsctl cannot see: not such a
    server."""
    from opsctl.net.fanout import fan_out

    def stopped(name: str) -> bool:
        try:
            return not rt.provider.process_state(rt.node(name)).running
        except OpsctlError:  # a host out of reach: a server may run there
            return False

    return [name for name, down in zip(names, fan_out(stopped, list(names)), strict=True) if down]


def make_runtime(loaded: LoadedSpec, state_dir: str | Path | None = None, force_lock: bool = False) -> Runtime:
    """The runtime over the spec placed where its nodes are deployed (placed): every command sees one layout. The
    records are read first (locally, or over SSH by a provider that only reads them), the spec placed with a
    short-lived connector, then the connector and the provider are built over the placed spec, once."""
    directory = state_dir_for(loaded, str(state_dir) if state_dir is not None else None)
    spec = loaded.spec
    if spec.provider == "ansible":
        from opsctl.providers.ansible import AnsibleProvider

        reader = AnsibleProvider(loaded, directory)
        try:
            route = reader.admin_route()
            at = placed(loaded, reader.deployed_records, make_connector(loaded, directory, route))
        except BaseException:
            reader.close()
            raise
        remote = AnsibleProvider(at, directory, hosts_of=reader)  # its SSH session, hosts and tombstones
        return Runtime(at, remote, directory, make_connector(at, directory, remote.admin_route()), force_lock)
    from opsctl.providers.binaries import find_server, require_tls
    from opsctl.providers.local import LocalProvider
    from opsctl.providers.localfiles import deployed_records_in

    binary = find_server(spec.server.flavor, parse_version(spec.server.version), loaded.server_binary)
    if spec.tls.enabled:
        require_tls(binary)
    at = placed(loaded, lambda: deployed_records_in(loaded, directory), make_connector(loaded, directory))
    return Runtime(at, LocalProvider(at, directory, binary), directory, make_connector(at, directory), force_lock)


def make_connector(loaded: LoadedSpec, state_dir: Path, route: Route | None = None) -> Connector:
    """The connector for loaded's nodes: through route (SSH tunnels) if given, with the spec's TLS."""
    return Connector(loaded, route, client_tls(loaded, state_dir))


@contextmanager
def open_connector(loaded: LoadedSpec, state_dir: Path) -> Iterator[Connector]:
    """The connector for commands that talk to nodes without a Runtime (failover, cluster check/reshard/...,
    audit), over the spec placed where its nodes are deployed (runtime.opening: the layout every command sees).
    An Ansible spec's records are read on the hosts; when hosts have admin_via_ssh, the provider also supplies the
    SSH-tunnel route for the block and closes its tunnels and connections afterwards."""

    if loaded.spec.provider != "ansible":
        from opsctl.providers.localfiles import deployed_records_in

        first = make_connector(loaded, state_dir)
        yield first.over(place_from(loaded, deployed_records_in(loaded, state_dir), first))
        return
    from opsctl.providers.ansible import AnsibleProvider

    provider = AnsibleProvider(loaded, state_dir)
    try:
        connector = make_connector(loaded, state_dir, provider.admin_route())
        if loaded.spec.topology != "standalone":
            connector = connector.over(place_from(loaded, provider.deployed_records(), connector))
        yield connector
    finally:
        provider.close()


def placed(loaded: LoadedSpec, records: Callable[[], Mapping[str, NodeRecord]],
           connector: Connector) -> LoadedSpec:
    """The spec's layout given the records of what is deployed: a deployed node keeps its name, host, port and
    shard; the records are read on the hosts, so a fresh state dir places the same. Every command places so."""
    if loaded.spec.topology == "standalone":
        return loaded
    return place_from(loaded, records(), connector)


def recorded_placement(loaded: LoadedSpec, state_dir: Path, known_hosts: str | None = None
                       ) -> tuple[LoadedSpec, Mapping[str, NodeRecord]]:
    """The spec placed from the records where its nodes are deployed (the state dir's node folders, or each host
    over SSH), and those records; no server is asked, so no secret is needed (a Prometheus host holds none). Who
    serves a shard now only decides which surplus member the next apply retires: such a node is no target."""
    if loaded.spec.provider != "ansible":
        from opsctl.providers.localfiles import deployed_records_in

        records: Mapping[str, NodeRecord] = deployed_records_in(loaded, state_dir)
    else:
        from opsctl.providers.ansible import AnsibleProvider

        provider = AnsibleProvider(loaded, state_dir, known_hosts)
        try:
            records = provider.deployed_records()
        finally:
            provider.close()
    # the moves of rebalance_placement as placed() makes them, from the recorded masters (no server is asked): render
    # and inventory write the nodes the next apply leaves running, a moved node's replacement among them
    moves = placement_moves(loaded.spec, deployed_from_records(records)) if rebalancing(loaded.spec) else ()
    return with_placement(loaded, records, (), moves), records


def nothing_deployed(loaded: LoadedSpec, state_dir: Path) -> str:
    """The words of the one note (or error) for a spec with no record where its nodes would be: a mistyped
    --state-dir, or nothing deployed yet."""
    where = "on its hosts" if loaded.spec.provider == "ansible" else f"in {state_dir}"
    return f"no node of '{loaded.spec.name}' is deployed {where}"


def placed_or_first(loaded: LoadedSpec, state_dir: Path, known_hosts: str | None = None
                    ) -> tuple[LoadedSpec, str | None]:
    """recorded_placement for the commands that write a deploy's files offline (render, inventory): the nodes the
    records keep (retired ones left out) and those the next apply adds. Where no record can be read (nothing
    deployed yet, or a host that does not answer over SSH, bounded by the SSH connect timeout) the positional layout
    of a first deploy, and a note that says so: never an error, CI jobs render specs whose hosts they cannot reach."""
    if loaded.spec.topology == "standalone":
        return loaded, None  # one node, placed by the spec alone
    try:
        placed, records = recorded_placement(loaded, state_dir, known_hosts)
    except OpsctlError as exc:
        from opsctl.providers.remote.ssh import HostUnreachable  # SSH's errors: only a remote read gets here

        if not isinstance(exc, HostUnreachable):
            raise  # a corrupt record, a refused login, a changed host key: an error, not a host out of reach
        why = clip(exc.summary, 200)
        return loaded, (f"note: the records of '{loaded.spec.name}' could not be read on its hosts ({why}): the "
                        "nodes are where a first deploy puts them (--offline skips the look)")
    if not records:
        return loaded, f"note: {nothing_deployed(loaded, state_dir)}: the nodes are where the first apply puts them"
    return placed, None


def place_from(loaded: LoadedSpec, records: Mapping[str, NodeRecord], connector: Connector) -> LoadedSpec:
    """with_placement, asking the cluster who serves first when the choice of a surplus member depends on it (a
    failover since the records were written makes a recorded replica the master)."""
    first = with_placement(loaded, records)
    if rebalancing(loaded.spec):
        return _rebalanced(loaded, records, first, connector)
    doubtful = surplus_members(first.layout)
    if not doubtful:
        return first
    shards = {n.shard for n in doubtful}
    members = [n for n in first.layout.servers if n.shard in shards] + doubtful
    serving = serving_masters(connector, members)
    return with_placement(loaded, records, serving) if serving else first


def _rebalanced(loaded: LoadedSpec, records: Mapping[str, NodeRecord], first: LoadedSpec,
                connector: Connector) -> LoadedSpec:
    """Placed with the moves that even out the hosts' load (plan.spread), from who serves now: a master moved
    earlier by a failover counts where it is, and a move a stopped run left half done is finished, not redone.
    While two members of a shard say they serve it (a run killed after asking a failover: the old master learns of
    the new one a moment later), placement waits, bounded: the moves and the plan are made from one master each."""
    deployed = deployed_from_records(records)
    nodes = [*first.layout.servers, *surplus_members(first.layout)]
    shard_of = {d.name: d.shard for d in deployed}
    timeout = 2 * loaded.spec.cluster_or_default().node_timeout_ms / 1000 + 10

    def one_each() -> set[str] | Pending:
        serving = serving_masters(connector, nodes)
        claims = sorted((shard_of.get(name) or 0, name) for name in serving)
        twice = [f"{a} and {b}" for (s, a), (t, b) in pairwise(claims) if s and s == t]
        return Pending(f"{twice[0]} both say they serve one shard's slots") if twice else serving

    serving = wait_for(one_each, timeout, "a failover under way to end (one master per shard)", interval=0.1)
    moves = placement_moves(loaded.spec, deployed, serving)
    return with_placement(loaded, records, serving, moves) if moves or serving else first


def serving_masters(connector: Connector, nodes: list[Node]) -> set[str]:
    """The nodes that say they are a master serving slots (each from its own CLUSTER NODES line); one that does not
    answer says nothing (placement then keeps the recorded master)."""
    from opsctl.net.observer import observe  # a client library only when a replica count went down

    found = set()
    for name, seen in observe(connector, nodes).items():
        me = next((line for line in seen.cluster_nodes or () if line.is_myself), None)
        if me is not None and me.is_master and me.slots:
            found.add(name)
    return found


def fleet_placer(path: str, state_dir: Path, connector: Connector
                 ) -> Callable[[], tuple[LoadedSpec, frozenset[str]]]:
    """For a command that runs for long (the continuous archive follows the fleet `apply` changes): the spec at
    path read again and placed from the records as they are now, as open_connector places it, with the names of the
    nodes deployed. Its name and topology must stay. Its secrets, where this process's environment cannot give them
    (a password rotation: the new password's variable is not in it), stay the connector's."""
    from dataclasses import replace

    from opsctl.state.specfile import read_spec

    def place() -> tuple[LoadedSpec, frozenset[str]]:
        current = connector.loaded
        try:
            loaded = read_spec(path)
        except OpsctlError:
            loaded = replace(read_spec(path, secrets=False), credentials=current.credentials)
        was, now = (current.spec.name, current.spec.topology), (loaded.spec.name, loaded.spec.topology)
        if now != was:
            raise OpsctlError(f"{path} now describes the {now[1]} '{now[0]}', not the {was[1]} '{was[0]}'",
                              hint="restart the archiver for another topology")
        if loaded.spec.topology == "standalone":
            return loaded, frozenset()
        _, records = recorded_placement(loaded, state_dir)  # the records as the hosts hold them now
        deployed = frozenset(d.name for d in deployed_from_records(records) if not d.retired)
        return place_from(loaded, records, connector), deployed

    return place
