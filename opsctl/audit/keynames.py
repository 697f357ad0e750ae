"""Key-name lint: namespace separator, special characters, case styles within a namespace, length. Pure."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from opsctl.observe.findings import Finding, finding

SEPARATOR = b":"
SPECIAL = frozenset(b" \t\r\n\"'\\`") | frozenset(range(0, 32)) | {127}
EXAMPLES = 3
_SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")
_KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")
_CAMEL = re.compile(r"^[a-z][a-z0-9]*([A-Z][a-z0-9]*)+$")
_PASCAL = re.compile(r"^([A-Z][a-z0-9]+){2,}$")
_UPPER = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z][A-Z0-9_]*$")
_ID = re.compile(r"^[0-9a-fA-F-]+$|^[0-9]+$")


def shown(key: bytes) -> str:
    """A key for people: printable, with control characters escaped."""
    return repr(key.decode("utf-8", "backslashreplace"))[1:-1]


def prefix_of(key: bytes) -> str:
    """The namespace: the first colon-separated segment, or '(none)' when there is no separator."""
    head, sep, _ = key.partition(SEPARATOR)
    return shown(head) if sep else "(none)"


def case_style(segment: str) -> str | None:
    """snake, kebab, camel, pascal or upper; None for plain lower-case words, ids and hash tags."""
    if not segment or _ID.match(segment) or segment.startswith("{"):
        return None
    for name, pattern in (("snake", _SNAKE), ("kebab", _KEBAB), ("camel", _CAMEL), ("pascal", _PASCAL),
                          ("upper", _UPPER)):
        if pattern.match(segment):
            return name
    return None


def styles_of(key: bytes) -> set[str]:
    text = key.decode("utf-8", "replace")
    return {s for s in (case_style(seg) for seg in text.split(":")) if s}


@dataclass
class _Group:
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, key: bytes) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(shown(key))


@dataclass
class NameLint:
    """Accumulates lint results over scanned keys, grouped by (rule, prefix)."""

    max_length: int = 128
    groups: dict[tuple[str, str], _Group] = field(default_factory=dict)
    styles: dict[str, dict[str, _Group]] = field(default_factory=dict)

    def _hit(self, rule: str, prefix: str, key: bytes) -> None:
        self.groups.setdefault((rule, prefix), _Group()).add(key)

    def add(self, key: bytes) -> None:
        prefix = prefix_of(key)
        if SEPARATOR not in key:
            self._hit("key-namespace", prefix, key)
        if not SPECIAL.isdisjoint(key):
            self._hit("key-special-chars", prefix, key)
        if len(key) > self.max_length:
            self._hit("key-length", prefix, key)
        for style in styles_of(key):
            self.styles.setdefault(prefix, {}).setdefault(style, _Group()).add(key)

    def findings(self, node: str, styles: bool = True) -> list[Finding]:
        out = [_lint_finding(rule, prefix, group, node, self.max_length)
               for (rule, prefix), group in sorted(self.groups.items())]
        return out + (style_findings({node: self}) if styles else [])


def style_findings(lints: dict[str, NameLint]) -> list[Finding]:
    """Case styles are a namespace-wide property: merge what every shard saw before judging."""
    merged: dict[str, dict[str, _Group]] = {}
    seen: dict[str, set[str]] = {}
    for node, lint in sorted(lints.items()):
        for prefix, by_style in lint.styles.items():
            seen.setdefault(prefix, set()).add(node)
            for style, group in by_style.items():
                into = merged.setdefault(prefix, {}).setdefault(style, _Group())
                into.count += group.count
                into.examples = (into.examples + group.examples)[:EXAMPLES]
    return [_style_finding(prefix, by_style, ",".join(sorted(seen[prefix])))
            for prefix, by_style in sorted(merged.items()) if len(by_style) > 1]


_LINT_TEXT = {
    "key-namespace": ("low", "{n} key(s) without a ':' namespace separator",
                      "name keys business:table:id (e.g. trade:order:1); rename in the application"),
    "key-special-chars": ("medium", "{n} key(s) with spaces, newlines, quotes or control characters",
                          "use only letters, digits and : _ - . in key names"),
    "key-length": ("low", "{n} key(s) longer than {max} bytes",
                   "shorten the names (abbreviate segments), long names cost memory on every key"),
}


def _lint_finding(rule: str, prefix: str, group: _Group, node: str, max_length: int) -> Finding:
    severity, text, fix = _LINT_TEXT[rule]
    message = f"prefix {prefix}: " + text.format(n=group.count, max=max_length)
    return finding(rule, severity, node, message, fix, prefix=prefix, count=group.count, examples=group.examples)


def _style_finding(prefix: str, by_style: dict[str, _Group], node: str) -> Finding:
    counts = Counter({style: g.count for style, g in by_style.items()})
    main = counts.most_common(1)[0][0]
    message = f"prefix {prefix}: mixed case styles " + ", ".join(f"{s} ({n})" for s, n in sorted(counts.items()))
    examples = {style: g.examples for style, g in sorted(by_style.items())}
    return finding("key-case-style", "low", node, message, f"use one style per namespace (most keys use {main})",
                   prefix=prefix, count=sum(counts.values()) - counts[main], styles=dict(counts), examples=examples)
