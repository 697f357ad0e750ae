"""The connector a command uses: the spec's TLS files and, for hosts reached over SSH, the provider's tunnels.

The connector itself (opsctl.net.connector) is handed both and builds neither: TLS material and SSH routes belong
to layers above it.
"""

from __future__ import annotations

from collections.abc import Iterator
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
    audit). When hosts have admin_via_ssh, an AnsibleProvider supplies the SSH-tunnel route for the block
    and closes its tunnels and connections afterwards."""
    if loaded.spec.provider != "ansible" or not any(h.admin_via_ssh for h in loaded.spec.hosts):
        yield make_connector(loaded, state_dir)
        return
    from opsctl.providers.ansible import AnsibleProvider

    provider = AnsibleProvider(loaded, state_dir)
    try:
        yield make_connector(loaded, state_dir, provider.admin_route())
    finally:
        provider.close()
