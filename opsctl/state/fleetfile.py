"""The I/O edge of a fleet: the topologies of a folder, read and validated (opsctl.spec.fleet holds the checks).

Every `*.yaml` / `*.yml` directly in the folder is read; one that has `topology` once merged with its bases
(`extends:`) is a topology, one that has not is only a base and is skipped."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.spec.extends import merged_document
from opsctl.spec.fleet import Fleet, fleet_findings, select
from opsctl.spec.load import LoadedSpec
from opsctl.spec.yamlpos import Path_, PositionedDocument
from opsctl.state.safefs import read_bounded
from opsctl.state.specfile import SPEC_LIMIT, read_spec

SUFFIXES = (".yaml", ".yml")


def read_fleet(path: str, only: Sequence[str] | None, env: Mapping[str, str] | None = None,
               secrets: bool = True) -> Fleet:
    """The topologies of the folder at path, each validated (a spec problem raises, naming its file:line), those
    --only names in its order (an unknown name refused), with the fleet-level findings over all of them."""
    folder = Path(path)
    if not folder.is_dir():
        raise OpsctlError(f"{path}: not a folder", hint="pass -f a folder of topology specs (or one spec file)")
    files = tuple(sorted(str(folder / name) for name in os.listdir(folder)
                         if name.endswith(SUFFIXES) and (folder / name).is_file()))
    docs = {file: _merged(file) for file in files}
    specs = [read_spec(file, env, secrets) for file, doc in docs.items() if _is_topology(doc)]
    if not specs:
        raise OpsctlError(f"{path}: no topology here", hint="a topology spec has `topology:` (itself or by a base)")

    def locate(loaded: LoadedSpec, field: Path_) -> tuple[str, int | None]:
        doc = docs.get(loaded.file)
        return doc.origin_of(field) if doc is not None else (loaded.file, None)

    return Fleet(str(folder), select(specs, only, str(folder)), files, tuple(fleet_findings(specs, locate)))


def _merged(file: str) -> PositionedDocument | None:
    """The file merged with its bases; None when that fails (reading it as a spec then reports why)."""
    doc, problems = merged_document(read_bounded(Path(file), "", limit=SPEC_LIMIT, follow=True) or "", file)
    return None if problems else doc


def _is_topology(doc: PositionedDocument | None) -> bool:
    """Whether a file has `topology` once merged with its bases; one that does not merge counts as one, so that
    reading it reports its problem."""
    return doc is None or not isinstance(doc.data, dict) or "topology" in doc.data
