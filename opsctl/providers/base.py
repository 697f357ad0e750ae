"""The provider contract shared by the local (processes) and Ansible (SSH hosts) providers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.render import NodePaths
from opsctl.spec.layout import MAX_PORT, PORTS, Node, valid_host
from opsctl.state.readback import Fields, parse_json


@frozen
class ProcessState(Frozen):
    """What the provider knows about a node's process, without talking Redis to it."""

    node: str
    running: bool
    pid: int | None = None
    detail: str = ""


class Provider(Protocol):
    """Everything the executor needs from where servers run.

    Files are written with mode 0600. start() returns once the process is alive and its port accepts
    TCP connections, and raises OpsctlError (naming node, host and the log's last lines) otherwise.
    """

    daemonize: bool
    stages_files: bool  # written files wait and ship together at the next start or flush (one playbook run)

    def paths(self, node: Node) -> NodePaths: ...

    def write_files(self, node: Node, files: dict[str, str]) -> None: ...

    def read_file(self, node: Node, name: str) -> str | None: ...

    def start(self, node: Node) -> None: ...

    def start_many(self, nodes: Sequence[Node], launched: Callable[[], None] | None = None) -> dict[str, OpsctlError]:
        """Start several nodes, returning those that did not come up (with why); the others are up. launched is
        called once every node was launched (at the latest before returning): the caller's next work may overlap
        the nodes' start-up."""


    def stop(self, node: Node, timeout: float = 30.0) -> None: ...

    def process_state(self, node: Node) -> ProcessState: ...

    def purge(self, node: Node, keep_record: bool = False) -> None:
        """Delete a stopped node's folder (keep_record: all but its record, which a retired node's tombstone is)."""

    def load_record(self, node: Node) -> dict[str, Any]: ...

    def deployed_records(self) -> dict[str, dict[str, Any]]:
        """Every record of the spec's server folders where they are deployed (each host), by node name: what
        placement keeps (opsctl.spec.placement), read from the hosts, not from the state dir alone."""

    def save_record(self, node: Node, record: dict[str, Any]) -> None: ...

    def flush(self) -> object:
        """Land files written so far on their hosts now (a staging provider ships them in one go)."""

    def close(self) -> None: ...


MAX_SHARD = 16384  # a cluster has no more shards than slots
RECORD_HINT = "delete the file; the next `opsctl apply` writes it again"


def parse_record(text: str | None, node: str, where: str) -> dict[str, Any]:
    """A node's record (what opsctl last applied) from its JSON text; {} when there is none yet.
    Every field opsctl reads is checked (FileProblem naming the file and field); others are kept as they are."""
    if text is None:
        return {}
    record = Fields(parse_json(text, where, RECORD_HINT), where, RECORD_HINT)
    record.get("digest", str, None)
    record.get("pending_restart", bool, None)
    if record.data.get("deployed") is not None:
        # ranged too: each value reaches a config file, a plan and a scrape target as it is
        deployed = record.child("deployed")
        deployed.get("host", str), deployed.get("role", str)
        if deployed.get("port", int) not in PORTS:
            raise deployed.problem(f"is not a port from 1 to {MAX_PORT}", "port")
        shard = deployed.get("shard", int, None)
        if shard is not None and not 1 <= shard <= MAX_SHARD:
            raise deployed.problem(f"is not a shard number from 1 to {MAX_SHARD}", "shard")
        address = deployed.get("address", str, None)
        if address is not None and not valid_host(address):
            raise deployed.problem("is not an IP address or host name", "address")
    applied = record.get("applied", float, None)
    if applied is not None and applied < 0:
        raise record.problem("is not a time (seconds since 1970)", "applied")
    directives = record.get("directives", list, [])
    for index, pair in enumerate(directives):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(v, str) for v in pair):
            raise record.problem("expected [directive, value] pairs of strings", f"directives[{index}]")
    if "directives" not in record.data:
        return record.data
    return {**record.data, "directives": directives}  # "directives": null reads as none recorded
