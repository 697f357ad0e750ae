"""What Prometheus reads about a fleet: file_sd target groups for the redis_exporter beside each node (the
node_exporter textfile that opsctl's own runs leave behind is opsctl.metrics.signals; docs/monitoring.md). Pure.
Target labels never include `role`: the exporter reports the live role under that name (docs/monitoring.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict

from opsctl.render.directives import maxclients
from opsctl.server.defaults import SERVER_DEFAULTS
from opsctl.spec.layout import EXPORTER_PORT_OFFSET, Layout, Node, endpoint, exporter_port, exporter_port_problems
from opsctl.spec.model import Spec

if TYPE_CHECKING:  # the records' type alone: spec.deployed is imported where a run reads them
    from opsctl.spec.deployed import NodeRecord

__all__ = ["EXPORTER_PORT_OFFSET", "exporter_port", "exporter_port_problems"]  # the rule lives in spec.layout

# the commands that take --metrics-textfile (cli.runsignals.recorded): one textfile each per topology


class TargetGroup(TypedDict):
    """One entry of a Prometheus file_sd file: the targets share these labels."""

    targets: list[str]
    labels: dict[str, str]


def target_labels(spec: Spec, node: Node) -> dict[str, str]:
    """Every target carries the maxclients its node runs with: its exporter cannot read it (no CONFIG GET for a
    least-privilege user; a Sentinel has no CONFIG) and RedisTooManyClients needs it. A server's is the rendered
    one; a Sentinel renders none, so it runs with its flavor's built-in value."""
    labels = {"topology": spec.name, "node": node.name, "host": node.host,
              "kind": "sentinel" if node.is_sentinel else "server"}
    if node.shard is not None:
        labels["shard"] = str(node.shard)
    limit = int(SERVER_DEFAULTS[spec.server.flavor]["maxclients"]) if node.is_sentinel else maxclients(spec, node)
    if limit is not None:
        labels["maxclients"] = str(limit)
    return labels


def target_groups(spec: Spec, layout: Layout, records: Mapping[str, NodeRecord] | None = None) \
        -> list[TargetGroup]:
    """One group per node of the layout (servers and Sentinels) that is deployed (deployed_nodes), in layout
    order: each has its own labels."""
    offset = spec.metrics.port_offset
    return [TargetGroup(targets=[endpoint(n.address, exporter_port(n, offset))], labels=target_labels(spec, n))
            for n in deployed_nodes(layout, records or {})]


def deployed_nodes(layout: Layout, records: Mapping[str, NodeRecord]) -> list[Node]:
    """The nodes that run, where they run (spec.deployed.running_nodes): a node the next apply adds is left out
    until it is deployed, a drained one kept at its recorded address until it is removed, tombstones left out;
    with nothing deployed at all every node, where the first apply puts it. Why: Prometheus calls every target
    that does not answer down, and a node that runs must not lose its monitoring before it stops."""
    from opsctl.spec.deployed import running_nodes

    return running_nodes(layout, records)


def file_sd_json(groups: list[TargetGroup]) -> str:
    return json.dumps(groups, indent=2) + "\n"


