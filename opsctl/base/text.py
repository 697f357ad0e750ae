"""Server replies as text: the one bytes -> str rule."""

from __future__ import annotations


def as_text(value: bytes | str | object) -> str:
    """value decoded as UTF-8 when it is bytes (a stray byte becomes U+FFFD: a reply's odd byte must not stop a
    look), else str(value)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def ascii_decimal(text: object, low: int, high: int) -> int | None:
    """text's number when it is written in ASCII digits alone and low <= it <= high, else None. The one check of a
    number read from a file, a key or a variable: str.isdigit() takes '²' (int() then raises) and '٣' (int() reads
    3), int() takes ' 3' and '+3'."""
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= len(str(high))):
        return None
    value = int(text)
    return value if low <= value <= high else None
