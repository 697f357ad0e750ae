"""Every field of the spec says what it means in the JSON Schema (`opsctl schema`), where editors show it (issue 25,
items 7 and 12): each property of every object the schema describes carries a description."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opsctl.spec.pydantic_model import spec_schema


def _properties(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, schema) of every property of every object schema under node, in the root and every definition."""
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            yield f"{where}.{name}", prop
        for key, value in node.items():
            yield from _properties(value, f"{where}/{key}")
    elif isinstance(node, list):
        for item in node:
            yield from _properties(item, where)


def test_the_schema_describes_many_properties() -> None:
    assert len(list(_properties(spec_schema()))) >= 80


def test_every_property_has_a_description() -> None:
    missing = sorted(path for path, prop in _properties(spec_schema()) if not str(prop.get("description", "")).strip())
    assert not missing, f"properties without a description: {missing}"


def test_descriptions_are_short_sentences_of_their_own() -> None:
    texts = [prop["description"] for _, prop in _properties(spec_schema()) if "description" in prop]
    too_long = [text for text in texts if len(text) > 400]
    assert not too_long, too_long
