"""The connector a command uses: the spec's TLS files and, for hosts reached over SSH, the provider's tunnels.

The connector itself (opsctl.net.connector) is handed both and builds neither: TLS material and SSH routes belong
to layers above it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from opsctl.net.connector import Connector, Route
from opsctl.spec.load import LoadedSpec
from opsctl.tls.material import client_tls


def make_connector(loaded: LoadedSpec, state_dir: Path, route: Route | None = None) -> Connector:
    """The connector for loaded's nodes: through route (SSH tunnels) if given, with the spec's TLS."""
    return Connector(loaded, route, client_tls(loaded, state_dir))


@contextmanager
def open_connector(loaded: LoadedSpec, state_dir: Path) -> Iterator[Connector]:
    """The connector for commands that talk to nodes without a Runtime (failover, cluster check/reshard/...,
    audit), over the spec placed where its nodes are deployed (apply.placing: the layout every command sees).
    An Ansible spec's records are read on the hosts; when hosts have admin_via_ssh, the provider also supplies the
    SSH-tunnel route for the block and closes its tunnels and connections afterwards."""
    from opsctl.apply.placing import place_from

    if loaded.spec.provider != "ansible":
        from opsctl.providers.localfiles import deployed_records_in

        connector = make_connector(loaded, state_dir)
        connector.loaded = place_from(loaded, deployed_records_in(loaded, state_dir), connector)
        yield connector
        return
    from opsctl.providers.ansible import AnsibleProvider

    provider = AnsibleProvider(loaded, state_dir)
    try:
        connector = make_connector(loaded, state_dir, provider.admin_route())
        if loaded.spec.topology != "standalone":
            connector.loaded = provider.loaded = place_from(loaded, provider.deployed_records(), connector)
        yield connector
    finally:
        provider.close()


def fleet_placer(path: str, state_dir: Path, connector: Connector
                 ) -> Callable[[], tuple[LoadedSpec, frozenset[str]]]:
    """For a command that runs for long (the continuous archive follows the fleet `apply` changes): the spec at
    path read again and placed from the records as they are now, as open_connector places it, with the names of the
    nodes deployed. Its name and topology must stay. Its secrets, where this process's environment cannot give them
    (a password rotation: the new password's variable is not in it), stay the connector's."""
    from dataclasses import replace

    from opsctl.apply.placing import place_from, recorded_placement
    from opsctl.base.errors import OpsctlError
    from opsctl.spec.deployed import deployed_from_records
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

