"""Secrets are a type: they print as *** everywhere and are revealed only where a file or an AUTH needs them."""

from __future__ import annotations

import re
from typing import TextIO

MASK = "***"


class Secret:
    """A secret value. str(), repr() and format() give ***; reveal() gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> str:
        raise TypeError("a Secret cannot be pickled")


_KNOWN: list[Secret] = []


def remember(secret: Secret) -> None:
    """Register a resolved secret so the CLI's output filter masks it wherever it would appear."""
    if secret.reveal() and secret not in _KNOWN:
        _KNOWN.append(secret)


class MaskingStream:
    """Wraps stdout/stderr: any registered secret written through it comes out as ***."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_text(text, _KNOWN))
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def mask_text(text: str, secrets: list[Secret]) -> str:
    """Replace every revealed secret value in text by ***, longest first."""
    for value in sorted((s.reveal() for s in secrets if s.reveal()), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def mask_url(text: str) -> str:
    """text with the secret parts of every URL in it masked: user:password@ and query strings (signatures)."""
    parts, done = [], 0
    for scheme in _SCHEME.finditer(text):
        if scheme.start() < done:
            continue  # inside a userinfo already masked
        end = userinfo_end(text, scheme.end())
        if end > scheme.end():
            parts.append(f"{text[done:scheme.end()]}{MASK}@")
            done = end
    text = "".join(parts) + text[done:]
    return _QUERY.sub(r"\1?***", text)


def mask_login(text: str, end: int | None = None) -> str:
    """text with all before its last @ (the last before end) shown as ***: a `user:password@host` typed where no URL
    is expected (an SSH target, an endpoint list) holds its secret there, and a password may hold `,` or `:`."""
    at = text.rfind("@", 0, len(text) if end is None else end)
    return text if at < 0 else f"{MASK}{text[at:]}"


def userinfo_end(text: str, start: int) -> int:
    """Where the host of the URL whose authority starts at start (just after `://`) begins: past the userinfo's @,
    or start when there is none. A password may hold `/`, `@`, quotes or blanks written raw, so the userinfo runs
    to the last @ before the first `/`, `?` or `#` after the first @ (never past the line); a URL with no
    userinfo followed on its line by an @ (not in another URL) is masked too far, never too little."""
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    first = text.find("@", start, line_end)
    if first < 0 or _SCHEME.search(text, start, first):  # that @ is another URL's
        return start
    stops = [i for i in (text.find(c, first, line_end) for c in "/?#") if i >= 0]
    return text.rfind("@", first, min(stops, default=line_end)) + 1


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'`?]*)\?[^\s\"'`]*")
