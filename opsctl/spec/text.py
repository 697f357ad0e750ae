"""Text from the spec that reaches server files: control characters."""

from __future__ import annotations

import re
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


def split_args(text: str) -> list[str]:
    """Split a config line value the way the server does (sdssplitargs): quotes and escapes."""
    if '"' not in text and "'" not in text:
        return text.split()  # the common case, the same words: str.split() splits on what isspace() says
    tokens: list[str] = []
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        if text[i] in "\"'":
            token, i = _read_quoted(text, i + 1, text[i])
        else:
            j = i
            while j < len(text) and not text[j].isspace():
                j += 1
            token, i = text[i:j], j
        tokens.append(token)
    return tokens


def _read_quoted(text: str, i: int, quote: str) -> tuple[str, int]:
    """The body of a quoted token starting after the opening quote at i; returns (body, index after close)."""
    out: list[str] = []
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if quote == '"' and nxt == "x" and re.match(r"[0-9a-fA-F]{2}", text[i + 2:i + 4]):
                out.append(chr(int(text[i + 2:i + 4], 16)))
                i += 4
                continue
            if quote == "'" and nxt != "'":
                out.append(ch)
                i += 1
                continue
            out.append(_ESCAPES.get(nxt, nxt) if quote == '"' else nxt)
            i += 2
            continue
        if ch == quote:
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    raise ValueError(f"unbalanced quotes in {text!r}")


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "a": "\a"}
