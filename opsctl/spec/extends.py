"""`extends: PATH`: a spec built on a base spec (docs/spec.md "Shared bases").

PATH is taken from the folder of the file that says it; a base may extend another (a chain). Maps merge key by key
and the extending file wins; lists and scalars replace whole. Every value of the merged document keeps the file and
line it was written at (PositionedDocument.files/lines), so every problem names where its value came from. A cycle,
a missing or unreadable base are problems located at the `extends:` line that names them. Reading the base files is
the only I/O: a spec's own files (the pure core may read those)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from opsctl.base.errors import SpecProblem, echo
from opsctl.spec.secretrefs import HIDDEN, secret_field, shown
from opsctl.spec.text import MAX_SPEC_CHARS
from opsctl.spec.yamlpos import Path_, PositionedDocument, field_path, load_positioned

EXTENDS = "extends"
MAX_CHAIN = 16  # bases under one spec: more is a mistake, not a layout
Reader = Callable[[str], "str | None"]  # a file's text; None when there is no such file; OSError when unreadable


def read_base(path: str) -> str | None:
    """A base spec's text (at most MAX_SPEC_CHARS + 1 characters: load_positioned refuses more)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(MAX_SPEC_CHARS + 1)
    except FileNotFoundError:
        return None


def merged_document(text: str, file: str, read: Reader = read_base) -> tuple[PositionedDocument | None,
                                                                               list[SpecProblem]]:
    """text (the spec in file) with its chain of bases merged under it; None when it cannot be built."""
    return _merged(text, file, read, ())


def chain_of(doc: PositionedDocument) -> tuple[str, ...]:
    """The files a merged document was built from: the spec, then its bases, nearest first."""
    return (doc.file, *doc.bases)


def _merged(text: str, file: str, read: Reader, chain: tuple[str, ...]) -> tuple[PositionedDocument | None,
                                                                                 list[SpecProblem]]:
    doc, problems = load_positioned(text, file)
    if doc is None or not isinstance(doc.data, dict) or EXTENDS not in doc.data:
        return doc, problems
    ref = doc.data.pop(EXTENDS)
    line = doc.lines.pop((EXTENDS,), None)
    here = (*chain, os.path.abspath(file))

    def problem(message: str, hint: str) -> tuple[None, list[SpecProblem]]:
        return None, [*problems, SpecProblem(file, line, EXTENDS, message, hint)]

    if not isinstance(ref, str) or not ref.strip():
        return problem(f"must be the path of a base spec, got {echo(ref)}", "e.g. extends: bases/prod.yaml")
    base_file = os.path.normpath(os.path.join(os.path.dirname(file), ref))
    if os.path.abspath(base_file) in here:
        cycle = " -> ".join([*(os.path.relpath(f) for f in here), os.path.relpath(base_file)])
        return problem(f"extends makes a cycle: {cycle}", "a base must not extend the spec that extends it")
    if len(here) > MAX_CHAIN:
        return problem(f"more than {MAX_CHAIN} bases in a chain", "merge some of the bases into one")
    try:
        base_text = read(base_file)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        return problem(f"the base spec {base_file} cannot be read: {reason}", "extends names a YAML file")
    if base_text is None:
        return problem(f"the base spec {base_file} does not exist", "the path is taken from this file's folder")
    base, base_problems = _merged(base_text, base_file, read, here)
    problems += base_problems
    if base is None:
        return None, problems
    if not isinstance(base.data, dict):
        return None, [*problems, SpecProblem(base_file, 1, "", "a base spec must be a mapping of fields",
                                             "write the shared fields as 'field: value' lines")]
    return merge(base, doc), problems


def merge(base: PositionedDocument, over: PositionedDocument) -> PositionedDocument:
    """over on top of base: maps key by key (over wins), lists and scalars replace; origins kept per value."""
    out = PositionedDocument(over.file, None, bases=(base.file, *base.bases))
    out.data = _merge_value(base.data, over.data, (), (base, over, out))
    return out


Docs = tuple[PositionedDocument, PositionedDocument, PositionedDocument]


def _merge_value(low: object, high: object, path: Path_, docs: Docs) -> object:
    base, over, out = docs
    if not (isinstance(low, dict) and isinstance(high, dict)):
        _copy(over, path, out)
        return high
    _copy_own(over if path in over.lines else base, path, out)
    merged: dict[object, object] = {}
    for key in [*low, *(k for k in high if k not in low)]:
        child = (*path, key)
        if key in low and key in high:
            merged[key] = _merge_value(low[key], high[key], child, docs)
        else:
            source = over if key in high else base
            merged[key] = high[key] if key in high else low[key]
            _copy(source, child, out)
    return merged


def _copy(source: PositionedDocument, prefix: Path_, out: PositionedDocument) -> None:
    """The origins of the value at prefix and of everything below it, from source."""
    size = len(prefix)
    for path, line in source.lines.items():
        if path[:size] == prefix:
            out.lines[path] = line
            out.files[path] = source.files.get(path, source.file)


def _copy_own(source: PositionedDocument, path: Path_, out: PositionedDocument) -> None:
    if path in source.lines:
        out.lines[path] = source.lines[path]
        out.files[path] = source.files.get(path, source.file)


def origins(doc: PositionedDocument) -> Iterator[str]:
    """The merged spec, one line per value: `field: value  # file:line` (a secret place's value is not shown)."""
    for path, value in _leaves(doc.data, ()):
        file, line = doc.origin_of(path)
        yield f"{field_path(path)}: {shown(value, path)}  # {file}:{line}"


def origin_entries(doc: PositionedDocument) -> list[dict[str, object]]:
    """The merged spec as JSON, one entry per value as origins has it: {"field", "value", "origin": "file:line"};
    a secret place's value is HIDDEN (as plan's JSON never carries a secret)."""
    entries: list[dict[str, object]] = []
    for path, value in _leaves(doc.data, ()):
        file, line = doc.origin_of(path)
        entries.append({"field": field_path(path), "value": HIDDEN if secret_field(path) is not None else value,
                        "origin": f"{file}:{line}"})
    return entries


def _leaves(value: object, path: Path_) -> Iterator[tuple[Path_, object]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value
