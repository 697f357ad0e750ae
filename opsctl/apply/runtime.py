"""The I/O shell around the planner: pick the provider, gather facts, compute desired state and the plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opsctl.apply.connect import make_connector
from opsctl.apply.placing import placed
from opsctl.net.admin import Admin
from opsctl.net.connector import Connector
from opsctl.providers.base import Provider
from opsctl.server.versions import parse_version
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.statedir import state_dir_for


@dataclass
class Runtime:
    loaded: LoadedSpec
    provider: Provider
    state_dir: Path
    connector: Connector

    def admin(self, node: Node, timeout: float = 5.0) -> Admin:
        return self.connector.admin(node, timeout)

    def node(self, name: str) -> Node:
        return self.loaded.layout.node(name)


def make_runtime(loaded: LoadedSpec, state_dir: str | None = None) -> Runtime:
    """The runtime over the spec placed where its nodes are deployed (placed): every command sees one layout."""
    directory = state_dir_for(loaded, state_dir)
    spec = loaded.spec
    if spec.provider == "ansible":
        from opsctl.providers.ansible import AnsibleProvider

        remote = AnsibleProvider(loaded, directory)
        connector = make_connector(loaded, directory, remote.admin_route())
        loaded = remote.loaded = connector.loaded = placed(loaded, remote, connector)
        return Runtime(loaded, remote, directory, connector)
    from opsctl.providers.binaries import find_server, require_tls
    from opsctl.providers.local import LocalProvider

    binary = find_server(spec.server.flavor, parse_version(spec.server.version), loaded.server_binary)
    if spec.tls.enabled:
        require_tls(binary)
    local = LocalProvider(loaded, directory, binary)
    connector = make_connector(loaded, directory)
    loaded = local.loaded = connector.loaded = placed(loaded, local, connector)
    return Runtime(loaded, local, directory, connector)

