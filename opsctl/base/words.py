"""Words for people: counts with their nouns."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 node`, `3 nodes`, `0 replicas`; many for irregular nouns."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"
