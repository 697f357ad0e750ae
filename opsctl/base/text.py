"""Server replies as text: the one bytes -> str rule."""

from __future__ import annotations


def as_text(value: bytes | str | object) -> str:
    """value decoded as UTF-8 when it is bytes (a stray byte becomes U+FFFD: a reply's odd byte must not stop a
    look), else str(value)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
