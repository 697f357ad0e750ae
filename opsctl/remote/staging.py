"""Stage what deploy.yml ships from the control machine: the node files (sentinel.conf is copied from there)
and the archives of opsctl/remote/bundle.py. I/O: reads the control script and a given server binary."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from opsctl.errors import OpsctlError
from opsctl.remote.bundle import host_archives, plain_name
from opsctl.resources import data_dir
from opsctl.safefs import write_private
from opsctl.spec.load import LoadedSpec

FileMap = Mapping[str, Mapping[str, str]]


def stage(loaded: LoadedSpec, files_dir: Path, files: FileMap) -> None:
    """Write files (node name -> file name -> text) and the archives for those nodes under files_dir."""
    spec = loaded.spec
    nodes = [n for n in loaded.layout.nodes if n.name in files]
    for node in nodes:
        for name, text in files[node.name].items():
            write_private(files_dir / node.name / plain_name(name), text)
    script = (data_dir("playbooks") / "files" / "opsctl-node.sh").read_bytes()
    try:
        binary = Path(spec.server.binary).read_bytes() if spec.server.binary else None
    except OSError as exc:
        raise OpsctlError(f"cannot read the server binary {spec.server.binary}", str(exc),
                          "set server.binary to a readable file on this machine") from None
    for name, data in host_archives(spec, nodes, files, script, binary).items():
        write_private(files_dir / name, data)
