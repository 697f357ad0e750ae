"""`opsctl init [--topology T] [--out FILE]`: a new spec file from the example of that topology shipped in the package
(opsctl/_data/examples installed, examples/ in a checkout). It writes a new file only, never over one: an existing
spec holds a fleet's name and ports, and replacing it would point the next apply at another fleet."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import NamedTuple

from opsctl.base.errors import EXIT_OK, OpsctlError
from opsctl.cli.options import Moved, add_output

TOPOLOGIES = ("cluster", "sentinel", "replication", "standalone")
DEFAULT_FILE = "topology.yaml"


class InitResult(NamedTuple):
    """What init wrote (file "-": printed) and which environment variables the example reads its secrets from.
    A NamedTuple: this module is imported to build every parser, and dataclasses costs `opsctl --help` its import."""

    topology: str
    file: str
    spec: str
    env: tuple[str, ...]

    def text(self) -> str:
        if self.file == "-":
            return self.spec.rstrip("\n")
        where = self.file if "/" in self.file else f"./{self.file}"
        lines = [f"wrote {where}: the {self.topology} example (edit name, hosts and ports to your fleet), then:"]
        lines += [f"  export {name}=$(openssl rand -hex 24)   # or your own secret" for name in self.env]
        lines += [f"  opsctl validate -f {self.file}", f"  opsctl plan -f {self.file}"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"topology": self.topology, "file": self.file, "env": list(self.env),
                **({"spec": self.spec} if self.file == "-" else {})}


def example_text(topology: str) -> str:
    from opsctl import data_dir

    return (data_dir("examples") / f"{topology}.yaml").read_text()


def cmd_init(args: argparse.Namespace) -> int:
    from opsctl.cli.output import print_result

    text = example_text(args.topology)
    if args.out != "-":
        _write_new(Path(args.out), text)
    env = tuple(dict.fromkeys(re.findall(r"\{env: *([A-Za-z_][A-Za-z0-9_]*) *\}", text)))
    print_result(InitResult(args.topology, args.out, text, env), args.output)
    return EXIT_OK


def _write_new(path: Path, text: str) -> None:
    """Create path with text; refuse when anything is there (the check and the creation are one call), and a
    folder that is a link: opsctl never writes through one."""
    from opsctl.state.safefs import LINK_HINT, FileProblem

    if any(folder.is_symlink() for folder in path.absolute().parents):
        raise FileProblem(path, "its folder is a symbolic link", LINK_HINT)
    try:
        with path.open("x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise OpsctlError(f"{path} exists: init writes a new file only, never over one", "",
                          "give another file with --out FILE, or move the existing one away first") from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("init", help="write an example spec to start from (never over an existing file)")
    p.add_argument("--topology", choices=TOPOLOGIES, default="cluster",
                   help="which example: a cluster (default), master/replicas with Sentinel, master/replicas, or one "
                        "server")
    p.add_argument("--out", metavar="FILE", default=DEFAULT_FILE,
                   help=f"the new spec file (default: {DEFAULT_FILE}; '-' prints it)")
    add_output(p, moved=Moved("init", "file", "--out"))  # -o is the format here too (-o FILE was --out's)
    p.set_defaults(handler=cmd_init)
