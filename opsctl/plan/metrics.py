"""What Prometheus reads about a fleet: file_sd target groups for the redis_exporter beside each node, and the
node_exporter textfile that opsctl's own runs leave behind (docs/monitoring.md). Pure: state.textfile writes it.
Target labels never include `role`: the exporter reports the live role under that name (docs/monitoring.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Literal, TypedDict

from opsctl.base.endpoints import endpoint
from opsctl.base.frozen import Frozen, frozen
from opsctl.render.directives import maxclients
from opsctl.server.defaults import SERVER_DEFAULTS
from opsctl.spec.exporters import EXPORTER_PORT_OFFSET, exporter_port, exporter_port_problems
from opsctl.spec.layout import Layout, Node
from opsctl.spec.model import Spec

__all__ = ["EXPORTER_PORT_OFFSET", "exporter_port", "exporter_port_problems"]  # the rule lives in spec.exporters

RECORDED_COMMANDS = ("apply", "backup", "restore", "failover", "cluster reshard", "cluster rebalance", "cluster fix")
# the commands that take --metrics-textfile (cli.runsignals.recorded): one textfile each per topology

Outcome = Literal["ok", "error", "refused"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "refused")

METRIC_HELP = {
    "opsctl_last_run_timestamp_seconds": "When the last run of this opsctl command on this topology ended (unix time).",
    "opsctl_last_run_duration_seconds": "How long the last run of this opsctl command took.",
    "opsctl_last_run_outcome": "1 for the outcome of the last run (ok, error, refused), 0 for the others.",
    "opsctl_last_success_timestamp_seconds": "When the last successful run ended (unix time); 0: none yet.",
    "opsctl_last_run_keys_moved": "Keys the last run moved, backed up or restored.",
}
_SUCCESS_LINE = re.compile(r"^opsctl_last_success_timestamp_seconds(?:\{[^}]*\})?\s+(\S+)\s*$", re.MULTILINE)


class TargetGroup(TypedDict):
    """One entry of a Prometheus file_sd file: the targets share these labels."""

    targets: list[str]
    labels: dict[str, str]


@frozen
class RunSignal(Frozen):
    """One finished opsctl run as its textfile reports it: finished and duration in seconds (unix time, elapsed);
    keys_moved None when the command moves no keys."""

    command: str
    topology: str
    finished: float
    duration: float
    outcome: Outcome
    keys_moved: int | None = None


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


def target_groups(spec: Spec, layout: Layout, records: Mapping[str, Mapping[str, object]] | None = None) \
        -> list[TargetGroup]:
    """One group per node of the layout (servers and Sentinels) that is deployed (deployed_nodes), in layout
    order: each has its own labels."""
    offset = spec.metrics.port_offset
    return [TargetGroup(targets=[endpoint(n.address, exporter_port(n, offset))], labels=target_labels(spec, n))
            for n in deployed_nodes(layout, records or {})]


def deployed_nodes(layout: Layout, records: Mapping[str, Mapping[str, object]]) -> list[Node]:
    """The nodes that run, where they run (spec.deployed.running_nodes): a node the next apply adds is left out
    until it is deployed, a drained one kept at its recorded address until it is removed, tombstones left out;
    with nothing deployed at all every node, where the first apply puts it. Why: Prometheus calls every target
    that does not answer down, and a node that runs must not lose its monitoring before it stops."""
    from opsctl.spec.deployed import running_nodes

    return running_nodes(layout, records)


def file_sd_json(groups: list[TargetGroup]) -> str:
    return json.dumps(groups, indent=2) + "\n"


def outcome_of(exit_code: int) -> Outcome:
    """0 ok and 2 (it did its steps; more are left to plan) are ok, 3 a safety refusal, anything else an error."""
    return "ok" if exit_code in (0, 2) else "refused" if exit_code == 3 else "error"


def textfile_name(topology: str, command: str) -> str:
    """One file per topology and command (node_exporter reads *.prom only), so runs never overwrite each other."""
    return f"opsctl_{_slug(topology)}_{_slug(command)}.prom"


def last_success_in(previous: str | None) -> float | None:
    """The last success time a previous textfile recorded (None: no file, no success line, or not a number)."""
    match = _SUCCESS_LINE.search(previous or "")
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if value == value and value >= 0 else None  # value == value: not NaN


def render_textfile(run: RunSignal, previous: str | None = None) -> str:
    """The run's textfile; the last success time is the run's own when it succeeded, else the previous file's
    (0 when there was none), so a failed run never hides how old the last good one is."""
    labels = {"command": run.command, "topology": run.topology}
    success = run.finished if run.outcome == "ok" else (last_success_in(previous) or 0.0)
    samples: list[tuple[str, dict[str, str], str]] = [
        ("opsctl_last_run_timestamp_seconds", labels, _number(run.finished)),
        ("opsctl_last_run_duration_seconds", labels, _number(run.duration)),
        *[("opsctl_last_run_outcome", {**labels, "outcome": o}, "1" if o == run.outcome else "0") for o in OUTCOMES],
        ("opsctl_last_success_timestamp_seconds", labels, _number(success)),
    ]
    if run.keys_moved is not None:
        samples.append(("opsctl_last_run_keys_moved", labels, str(run.keys_moved)))
    return _exposition(samples)


def _exposition(samples: list[tuple[str, dict[str, str], str]]) -> str:
    lines: list[str] = []
    for name, labels, value in samples:
        if not lines or not lines[-1].startswith(f"{name}{{"):
            lines += [f"# HELP {name} {METRIC_HELP[name]}", f"# TYPE {name} gauge"]
        pairs = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
        lines.append(f"{name}{{{pairs}}} {value}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    """A label value in the text exposition format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return f"{value:.3f}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "_", text.lower()).strip("_") or "_"
