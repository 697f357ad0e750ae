"""Text from the spec that reaches server files: control characters."""

from __future__ import annotations

import unicodedata

# Cc: C0/C1 controls (newline, carriage return, tab, NUL, ...); Zl/Zp: the Unicode line and paragraph
# separators, which Python's splitlines() treats as line ends.
_CONTROL_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})
MAX_SPEC_CHARS = 1024 * 1024  # a spec file longer than this is refused unread


def is_control(char: str) -> bool:
    return unicodedata.category(char) in _CONTROL_CATEGORIES


def control_chars(text: str) -> list[str]:
    """The distinct control characters in text, escaped for a message (e.g. ['\\n', '\\x00'])."""
    if text.isprintable():  # every control category is unprintable: the common case costs one C call
        return []
    found = sorted({c for c in text if is_control(c)})
    return [repr(c)[1:-1] for c in found]
