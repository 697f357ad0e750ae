"""`opsctl help spec`: the spec reference as a tree people read (path, type, default, description), made from the
spec's JSON Schema (opsctl.spec.pydantic_model), whose descriptions are the fields' own in opsctl.spec.model: one
source, so the reference, the schema editors read and docs/spec.md cannot disagree. Pure: a schema in, text out."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any

Schema = Mapping[str, Any]
WIDTH = 100
ABSENT = object()


# Not a field of the model: the spec's bases are merged before the model sees it (opsctl.spec.extends).
EXTENDS = ["extends  (string)",
           "    a base spec this one is built on (its path from this file's folder; a base may extend another):",
           "    maps merge key by key and this file wins, lists and scalars replace whole (docs/spec.md)"]


def spec_reference(schema: Schema) -> str:
    """Every field of the spec, depth first in the model's order: `path  (type, default D, required)` and its
    description indented below. A list's fields read `hosts[].name`, a map's `nodes.<name>.port`."""
    lines = ["The topology spec: every field, its type, its default and what it means.",
             "(`opsctl schema` prints the same as JSON Schema; examples/ has one spec of each topology.)", ""]
    lines += EXTENDS
    lines += _fields(schema, schema, "", 0)
    return "\n".join(lines)


def _fields(root: Schema, node: Schema, prefix: str, depth: int) -> Iterator[str]:
    required = set(node.get("required", ()))
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        yield from _field(root, prop, path, name in required, depth)


def _field(root: Schema, prop: Schema, path: str, required: bool, depth: int) -> Iterator[str]:
    target = _resolve(root, _without_null(prop))
    facts = [_type(root, target)]
    default = prop.get("default", ABSENT)
    if default is not ABSENT and default is not None:
        facts.append(f"default {json.dumps(default)}")
    if required:
        facts.append("required")
    indent = "  " * depth
    yield f"{indent}{path}  ({', '.join(facts)})"
    description = prop.get("description") or target.get("description") or ""
    yield from textwrap.wrap(description, WIDTH, initial_indent=indent + "    ", subsequent_indent=indent + "    ")
    for inner, suffix in _children(root, target):
        yield from _fields(root, inner, f"{path}{suffix}.", depth + 1)


def _children(root: Schema, target: Schema) -> Iterator[tuple[Schema, str]]:
    """The object whose fields live below target: itself, its list's items ([]) or its map's values (.<name>)."""
    if "properties" in target:
        yield target, ""
    items = _resolve(root, _without_null(target.get("items", {})))
    if "properties" in items:
        yield items, "[]"
    values = target.get("additionalProperties")
    if isinstance(values, Mapping) and "properties" in _resolve(root, values):
        yield _resolve(root, values), ".<name>"


def _without_null(prop: Schema) -> Schema:
    """An optional field's schema without its null alternative (anyOf [X, null] -> X)."""
    options = [o for o in prop.get("anyOf", ()) if o.get("type") != "null"]
    return options[0] if len(options) == 1 else prop


def _resolve(root: Schema, prop: Schema) -> Schema:
    ref = prop.get("$ref")
    if not isinstance(ref, str):
        return prop
    resolved: Schema = root["$defs"][ref.rsplit("/", 1)[1]]
    return resolved


def _type(root: Schema, target: Schema) -> str:
    if "enum" in target:
        return " | ".join(str(v) for v in target["enum"])
    if "anyOf" in target:
        return " or ".join(_type(root, _resolve(root, o)) for o in target["anyOf"] if o.get("type") != "null")
    kind = target.get("type", "any")
    if kind == "array":
        return f"list of {_plural(_type(root, _resolve(root, _without_null(target.get('items', {})))))}"
    if kind == "object":
        values = target.get("additionalProperties")
        if "properties" in target:
            return "object"
        return f"map of {_type(root, _resolve(root, values))}" if isinstance(values, Mapping) else "map"
    if kind in ("integer", "number") and ("minimum" in target or "maximum" in target):
        return f"{kind} {target.get('minimum', '')}..{target.get('maximum', '')}"
    return str(kind)


def _plural(kind: str) -> str:
    return {"object": "objects", "string": "strings", "integer": "integers", "boolean": "booleans"}.get(kind, kind)
