"""Validated specs kept beside the state: a run whose spec file is unchanged skips parsing and validating it.

An entry (.opsctl/spec-cache/ beside the spec) holds the spec's JSON form (secret references, never values), its key
and its digest. The key covers the spec's bytes, opsctl's version and sources, pydantic's and PyYAML's versions.
Anything unexpected is a miss: full validation. A spec that extends a base (`extends:`, opsctl.spec.extends) is never
cached: its meaning is in other files too (cacheable)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

from opsctl import __version__
from opsctl.base.record import DataMismatch, digest
from opsctl.spec.model import Spec
from opsctl.state.safefs import FileProblem, check_state_path, make_dir, read_bounded, write_private

FORMAT = 2
FOLDER = "spec-cache"
ENTRY_LIMIT = 4 * 1024 * 1024
FIELDS = {"format", "opsctl", "key", "digest", "spec"}
LIBRARIES = ("pydantic", "pydantic_core", "yaml")  # what validation runs on besides opsctl


def entry_path(spec_path: Path, make_root: bool = False) -> Path | None:
    """Where spec_path's entry lives; None when its folder has no .opsctl folder (or one that is a link).
    make_root: make that .opsctl folder (a run keeping its state there, once its spec validated), only in a folder of
    the user's own, so that no run leaves a folder another user's run cannot use."""
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


def cacheable(text: str) -> bool:
    """Whether the spec's bytes alone decide its validation: not when it may extend a base. Judged on the text
    without parsing it (parsing is what the cache saves): any `extends` in it, even in a comment, skips the cache."""
    return "extends" not in text


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
