"""The topologies of a folder (a stand-in for opsctl.spec.fleet.read_fleet, engineer A's loader with bases and
fleet-level checks: same name, same signature; this one reads each *.yaml / *.yml directly in the folder with
read_spec and keeps those that have a `topology`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec


@frozen
class Fleet(Frozen):
    """specs: in name order, or --only's order. files: the spec file of each, in the same order."""

    folder: Path
    specs: tuple[LoadedSpec, ...]
    files: tuple[Path, ...]

    def file_of(self, name: str) -> Path:
        return next(f for s, f in zip(self.specs, self.files, strict=True) if s.spec.name == name)


def read_fleet(path: str, only: Sequence[str] | None = None) -> Fleet:
    folder = Path(path)
    found = [(read_spec(f), f) for f in _topology_files(folder)]
    names = [loaded.spec.name for loaded, _ in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        files = [str(f) for loaded, f in found if loaded.spec.name in twice]
        raise OpsctlError(f"{folder}: topology name {', '.join(twice)} used twice", "\n".join(files),
                          "give each topology of the folder its own name")
    found.sort(key=lambda pair: pair[0].spec.name)
    if only is not None:
        by_name = {loaded.spec.name: (loaded, f) for loaded, f in found}
        unknown = [n for n in only if n not in by_name]
        if unknown:
            raise OpsctlError(f"--only: no topology {', '.join(unknown)} in {folder}",
                              hint=f"the folder has: {', '.join(sorted(by_name)) or 'none'}")
        found = [by_name[n] for n in dict.fromkeys(only)]
    if not found:
        raise OpsctlError(f"{folder}: no topology in this folder",
                          hint="a topology is a *.yaml or *.yml file directly in it with a `topology` key")
    return Fleet(folder, tuple(loaded for loaded, _ in found), tuple(f for _, f in found))


def _topology_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [f for f in files if _has_topology(f)]


def _has_topology(path: Path) -> bool:
    from opsctl.state.safefs import read_bounded

    try:
        data = yaml.safe_load(read_bounded(path, "pass the topology spec (a YAML file) with -f") or "")
    except (OpsctlError, OSError, yaml.YAMLError):
        return True  # read_spec names the problem, located
    return isinstance(data, dict) and "topology" in data
