"""Validated specs kept beside the state: a run whose spec file has not changed since a run validated it reads
the validated spec back instead of parsing YAML and validating with pydantic again (most of a plan's or a
status's start).

Where: <spec folder>/.opsctl/spec-cache/<digest of the spec's path>.json, only when .opsctl is there: a run that
keeps its state next to the spec makes it (plan and apply with their default state dir, once the spec passed
and their runtime is set up); nothing is created beside a spec for any other run (validate, --state-dir). What: the
validated spec's JSON form (secret references, never a secret's value), the key it is valid for and a digest of
itself. The key is a digest of the spec file's bytes, opsctl's version and sources, and the versions of pydantic
and PyYAML: a spec that changes in any byte, or an opsctl or a library that could judge it otherwise, misses.
Read back, every field is checked (opsctl.spec.model's from_json); anything unexpected (a link, another format or
version, another key, a digest or a field that does not match) is a miss, and a miss validates the spec in full,
which writes the entry anew. The secrets a spec names are read from the environment and files on every run, and
checked as validation checks them; a problem with them validates in full too, so the error reads as always.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

from opsctl import __version__
from opsctl.base.digest import digest
from opsctl.spec.model import DataMismatch, Spec
from opsctl.state.safefs import FileProblem, check_state_path, make_dir, read_bounded, write_private

FORMAT = 2
FOLDER = "spec-cache"
ENTRY_LIMIT = 4 * 1024 * 1024
FIELDS = {"format", "opsctl", "key", "digest", "spec"}
LIBRARIES = ("pydantic", "pydantic_core", "yaml")  # what validation runs on besides opsctl


def entry_path(spec_path: Path, make_root: bool = False) -> Path | None:
    """Where spec_path's entry lives; None when its folder has no .opsctl folder (or one that is a link).
    make_root: a run that keeps its state there (its default state dir) makes the folder, once its spec
    validated, so that its validation is kept: a first `plan` beside a new spec left none, and the `apply` after
    it validated again. Only in a folder of the user's own: root's plan in another user's checkout would leave a
    folder that user's apply cannot use."""
    spec_file = spec_path.resolve()
    root = spec_file.parent / ".opsctl"
    if make_root:
        with contextlib.suppress(OSError):
            if os.stat(root.parent).st_uid == os.geteuid():
                root.mkdir()  # never through a link: an existing one is refused below
    try:
        if not os.path.isdir(root) or os.path.islink(root):
            return None
    except OSError:
        return None
    return root / FOLDER / f"{hashlib.sha256(os.fsencode(spec_file)).hexdigest()[:32]}.json"


def entry_key(text: str) -> str:
    """What an entry is valid for: these spec bytes, judged by this opsctl and these libraries."""
    key = hashlib.sha256(f"opsctl spec cache {FORMAT} {__version__}\n{_code_stamps()}\n".encode())
    key.update(text.encode("utf-8", "surrogatepass"))
    return key.hexdigest()


def read_entry(path: Path, key: str) -> Spec | None:
    """The validated spec stored for key, or None (missing, unreadable, foreign, stale or damaged: a miss)."""
    try:
        check_state_path(path.parent, below=path.parent.parent.parent)
        text = read_bounded(path, "", limit=ENTRY_LIMIT)
    except FileProblem:
        return None
    if text is None:
        return None
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(entry, dict) and set(entry) == FIELDS and entry["format"] == FORMAT
            and entry["opsctl"] == __version__ and entry["key"] == key and entry["digest"] == digest(entry["spec"])):
        return None
    try:
        return Spec.from_json(entry["spec"])
    except DataMismatch:
        return None


def write_entry(path: Path, key: str, spec: Spec) -> None:
    """Store spec as valid for key; a cache that cannot be written is no error (the next run validates again)."""
    data = spec.model_dump()
    entry = {"format": FORMAT, "opsctl": __version__, "key": key, "digest": digest(data), "spec": data}
    try:
        check_state_path(path.parent, below=path.parent.parent.parent)
        make_dir(path.parent)
        write_private(path, json.dumps(entry, separators=(",", ":")))
    except (FileProblem, OSError):
        return


@functools.cache
def _code_stamps() -> str:
    """Each opsctl source file's and each library's path, mtime and size: an upgrade or an edit changes them."""
    package = Path(__file__).resolve().parents[1]  # opsctl/
    sources = sorted(os.path.join(folder, name) for folder, _, files in os.walk(package)
                     for name in files if name.endswith(".py"))
    return "\n".join(_stamp(path) for path in [*sources, *(_origin(name) for name in LIBRARIES)])


def _origin(module: str) -> str:
    from importlib.util import find_spec

    found = find_spec(module)
    return str(found.origin) if found is not None else module


def _stamp(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} -"
    return f"{path} {st.st_mtime_ns} {st.st_size}"
