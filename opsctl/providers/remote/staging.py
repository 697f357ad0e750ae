"""Stage what deploy.yml ships from the control machine: one installer per host (opsctl/providers/remote/bundle.py).
I/O: reads the install and control scripts and a given server binary."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from opsctl import data_dir
from opsctl.base.errors import OpsctlError
from opsctl.providers.remote.bundle import host_installers, hosts_table
from opsctl.spec.layout import deployed_record
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Host
from opsctl.state.safefs import write_private

FileMap = Mapping[str, Mapping[str, str]]


BINARY_LIMIT = 512 << 20  # a server binary is tens of MB; /dev/zero or a FIFO must not be read forever


def read_binary(path: str) -> bytes:
    """The server binary to ship: a regular file (a link to one is fine) of at most BINARY_LIMIT bytes."""
    fix = "set server.binary to the server's executable file on this machine"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    except OSError as exc:
        raise OpsctlError(f"cannot read the server binary {path}", str(exc.strerror), fix) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OpsctlError(f"the server binary {path} is not a regular file", hint=fix)
        if info.st_size > BINARY_LIMIT:
            raise OpsctlError(f"the server binary {path} is too big ({info.st_size} bytes, at most {BINARY_LIMIT})",
                              hint=fix)
        return handle.read(BINARY_LIMIT + 1)[:BINARY_LIMIT]


def stage(loaded: LoadedSpec, files_dir: Path, files: FileMap, hosts: Sequence[Host] = (),
          tombstones: Mapping[str, Mapping[str, object]] | None = None) -> None:
    """Write the installers for these nodes (node name -> file name -> text; retired nodes' tombstones too) under
    files_dir, 0600; hosts: the hosts table their base archives carry (none without), with the tombstones known
    (name -> placement) and those of the nodes this run retires."""
    spec = loaded.spec
    nodes = [n for n in [*loaded.layout.nodes, *loaded.layout.retired] if n.name in files]
    scripts = data_dir("playbooks") / "files"
    body = (scripts / "opsctl-install.sh").read_text()
    control = (scripts / "opsctl-node.sh").read_bytes()
    binary = read_binary(loaded.server_binary) if loaded.server_binary else None
    retiring = {n.name: deployed_record(n) for n in loaded.layout.retired}
    table = hosts_table(hosts, {**(tombstones or {}), **retiring}) if hosts else None
    retired = frozenset(n.name for n in loaded.layout.retired)
    for name, data in host_installers(spec, nodes, files, body, control, binary, table, retired).items():
        write_private(files_dir / name, data)
