"""A fleet: the topologies of one folder (docs/fleet.md "Bases and validation"), and the checks across them.

Pure: the specs come in validated (opsctl.state.fleetfile reads the folder). The fleet-level checks: a name used
twice (it names the state and data folders too: /var/lib/opsctl/<name>, .opsctl/<name>), two topologies on one
address:port (a server's port, a cluster bus port, a Sentinel's, an exporter's), and a host name given two
addresses. Each finding names both topologies and both files."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from opsctl.base.errors import OpsctlError, SpecError, SpecProblem
from opsctl.base.frozen import Frozen, frozen
from opsctl.spec.layout import endpoint, exporter_port
from opsctl.spec.load import LoadedSpec
from opsctl.spec.portchecks import own_ports, port_path
from opsctl.spec.yamlpos import Path_, field_path

# Where a field of a spec was written: (file, line) (a base's, for a value it gave); see opsctl.state.fleetfile.
Locate = Callable[[LoadedSpec, Path_], tuple[str, "int | None"]]


def unlocated(loaded: LoadedSpec, path: Path_) -> tuple[str, int | None]:
    return loaded.file, None


@frozen
class Fleet(Frozen):
    """specs: the topologies selected, in name order or --only's; files: every YAML file of the folder (bases
    too); findings: the fleet-level problems (empty: the fleet is consistent)."""

    folder: str
    specs: tuple[LoadedSpec, ...]
    files: tuple[str, ...]
    findings: tuple[SpecProblem, ...] = ()


def select(specs: Sequence[LoadedSpec], only: Sequence[str] | None, folder: str) -> tuple[LoadedSpec, ...]:
    """The specs --only names, in its order; every spec in name order without it. An unknown name is refused."""
    by_name = {loaded.spec.name: loaded for loaded in specs}
    if only is None:
        return tuple(by_name[name] for name in sorted(by_name))
    unknown = [name for name in only if name not in by_name]
    if unknown:
        raise OpsctlError(f"{folder}: no topology named {', '.join(unknown)}",
                          hint=f"the topologies here: {', '.join(sorted(by_name)) or 'none'}")
    return tuple(by_name[name] for name in dict.fromkeys(only))


def refuse(fleet: Fleet) -> None:
    """Raise the fleet's findings as one SpecError (exit 1), when it has any."""
    if fleet.findings:
        raise SpecError(list(fleet.findings))


def fleet_findings(specs: Sequence[LoadedSpec], locate: Locate = unlocated) -> list[SpecProblem]:
    """The problems across the fleet's specs (each spec valid on its own), each located where the second of the two
    topologies wrote the value and naming the first's file:line."""
    return [*_names(specs, locate), *_endpoints(specs, locate), *_hosts(specs, locate)]


def _where(locate: Locate, loaded: LoadedSpec, path: Path_) -> str:
    file, line = locate(loaded, path)
    return f"{file}:{line}" if line else file


def _problem(locate: Locate, loaded: LoadedSpec, path: Path_, message: str, hint: str) -> SpecProblem:
    return SpecProblem(*locate(loaded, path), field_path(path), message, hint)


def _names(specs: Sequence[LoadedSpec], locate: Locate) -> Iterator[SpecProblem]:
    first: dict[str, LoadedSpec] = {}
    for loaded in specs:
        other = first.setdefault(loaded.spec.name, loaded)
        if other is not loaded:
            yield _problem(locate, loaded, ("name",), (
                f"topology {loaded.spec.name} is named in {_where(locate, other, ('name',))} too"),
                "names are unique across the fleet: they name the nodes, the state and the data folders "
                "(.opsctl/<name>, /var/lib/opsctl/<name>)")


def _claims(loaded: LoadedSpec) -> Iterator[tuple[str, int, str, Path_]]:
    """(address, port, what, where it is set) for every port the topology's nodes and exporters listen on."""
    spec = loaded.spec
    for node in loaded.layout.nodes:
        path = port_path(spec, node.name, node.is_sentinel)
        for address in node.listens_on:
            for port, what in own_ports(node):
                yield address, port, what, path
            if spec.metrics.exporter:
                port = exporter_port(node, spec.metrics.port_offset)
                yield address, port, f"{node.name}'s exporter", ("metrics", "port_offset")


def _endpoints(specs: Sequence[LoadedSpec], locate: Locate) -> Iterator[SpecProblem]:
    """One problem per pair of topologies (the first port they share)."""
    taken: dict[tuple[str, int], tuple[LoadedSpec, str, Path_]] = {}
    told: set[tuple[str, str]] = set()
    for loaded in specs:
        for address, port, what, path in _claims(loaded):
            first, its, at = taken.setdefault((address, port), (loaded, what, path))
            pair = (first.file, loaded.file)
            if first is not loaded and pair not in told:
                told.add(pair)
                yield _problem(locate, loaded, path, (
                    f"topologies {loaded.spec.name} and {first.spec.name} both use {endpoint(address, port)}: {what} "
                    f"and {its} ({_where(locate, first, at)})"), "give one of the two topologies other ports or hosts")


def _hosts(specs: Sequence[LoadedSpec], locate: Locate) -> Iterator[SpecProblem]:
    seen: dict[str, tuple[str, LoadedSpec, Path_]] = {}
    for loaded in specs:
        for index, host in enumerate(loaded.spec.hosts):
            path: Path_ = ("hosts", index, "address")
            address, other, at = seen.setdefault(host.name, (host.address, loaded, path))
            if address != host.address:
                yield _problem(locate, loaded, path, (
                    f"host {host.name} is {host.address} in {loaded.spec.name} and {address} in {other.spec.name} "
                    f"({_where(locate, other, at)})"),
                    "a host name means one machine across the fleet: give it one address (a shared base)")
