"""The provider contract shared by the local (processes) and Ansible (SSH hosts) providers."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.render import NodePaths
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.layout import Node
from opsctl.state.readback import parse_json, read_record


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

    def load_record(self, node: Node) -> NodeRecord: ...

    def deployed_records(self) -> dict[str, NodeRecord]:
        """Every record of the spec's server folders where they are deployed (each host), by node name: what
        placement keeps (opsctl.spec.placement), read from the hosts, not from the state dir alone."""

    def save_record(self, node: Node, record: NodeRecord) -> None: ...

    def flush(self) -> object:
        """Land files written so far on their hosts now (a staging provider ships them in one go)."""

    def close(self) -> None: ...


RECORD_HINT = "delete the file; the next `opsctl apply` writes it again"


def parse_record(text: str | None, where: str) -> NodeRecord:
    """A node's record (what opsctl last applied) from its JSON text; NodeRecord() when there is none yet. Every
    field is checked by its type (a FileProblem naming the file and the field); keys it does not know are kept."""
    if text is None:
        return NodeRecord()
    return _parsed_record(text, where)


@lru_cache(maxsize=512)
def _parsed_record(text: str, where: str) -> NodeRecord:
    """parse_record of one text, once a process: a run reads each record where it places the spec and again where
    it gathers, and a fleet command runs many (a refused text is not kept: its error is raised each time).
    The record is frozen, so sharing it is safe."""
    return read_record(NodeRecord, parse_json(text, where, RECORD_HINT), where, RECORD_HINT)


def record_text(record: NodeRecord, indent: int | None = None) -> str:
    """The record's file: its JSON with sorted keys (json's C encoder on one line; indent= takes the pure-Python
    one), as every opsctl wrote it."""
    return json.dumps(record.to_json(), sort_keys=True, indent=indent) + "\n"
