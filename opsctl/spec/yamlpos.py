"""Load YAML and remember the line of every field, so spec problems can name file:line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from opsctl.base.errors import SpecProblem, echo
from opsctl.spec.secretrefs import public_path
from opsctl.spec.text import MAX_SPEC_CHARS, control_chars

Path_ = tuple[str | int, ...]


@dataclass
class PositionedDocument:
    """A loaded YAML document and the 1-based line where each field path starts. files: the file a path's value
    came from where it is not this document's own (a value merged in from a base: opsctl.spec.extends)."""

    file: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    files: dict[Path_, str] = field(default_factory=dict)
    bases: tuple[str, ...] = ()  # the chain of bases merged under it, nearest first

    def line_of(self, path: Path_) -> int | None:
        """The line of path, or of its nearest ancestor that has one."""
        return self.origin_of(path)[1]

    def file_of(self, path: Path_) -> str:
        """The file path's value was written in (the line_of is a line of that file)."""
        return self.origin_of(path)[0]

    def origin_of(self, path: Path_) -> tuple[str, int | None]:
        """The file and line of path, or of its nearest ancestor that has a line."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return self.files.get(tuple(path[:cut]), self.file), line
        return self.file, None


def field_path(path: Path_) -> str:
    """('hosts', 0, 'name') -> 'hosts[0].name'; below a secret place, only as far as declared fields go (a key
    written there may be the secret: opsctl.spec.secretrefs)."""
    text = ""
    for part in public_path(path):
        shown = part if isinstance(part, int) or _PLAIN_KEY.match(part) else echo(part)
        text += f"[{shown}]" if isinstance(part, int) else (f".{shown}" if text else str(shown))
    return text


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.|@-]{1,60}$")


def load_positioned(text: str, file: str) -> tuple[PositionedDocument | None, list[SpecProblem]]:
    """Parse text; on a syntax error return the problem with its line instead of raising."""
    if len(text) > MAX_SPEC_CHARS:
        return None, [SpecProblem(file, 1, "", f"the spec is {len(text)} characters, more than {MAX_SPEC_CHARS}",
                                  "a topology spec is a few kilobytes: is this the right file?")]
    try:
        root, data, alias_problem = _parse(text, file)
        if alias_problem:
            return None, [alias_problem]
    except yaml.MarkedYAMLError as exc:
        return None, [_syntax_problem(file, exc)]
    except yaml.YAMLError as exc:
        return None, [SpecProblem(file, None, "", f"not valid YAML: {exc}", "check the file's syntax")]
    except RecursionError:
        return None, [SpecProblem(file, 1, "", "the YAML is nested too deeply",
                                  "a topology spec nests a few levels: is this the right file?")]
    doc = PositionedDocument(file, data)
    problems: list[SpecProblem] = []
    if root is not None:
        _walk(root, (), doc, problems)
    return doc, problems


Parsed = tuple[yaml.Node | None, Any, SpecProblem | None]


def _parse(text: str, file: str) -> Parsed:
    """What yaml.safe_load does, in one parse: the node tree (with lines), then the data built from it, or the
    alias problem that stopped the building. (PyYAML's parser, not libyaml's: libyaml's composer recurses in C
    and crashes the process on a document nested some 30000 deep; PyYAML's raises RecursionError.)"""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None, None
        alias_problem = _alias_problem(file, root)
        return (root, None, alias_problem) if alias_problem else (root, loader.construct_document(root), None)
    finally:
        loader.dispose()


# Values that aliases (*name) may add by repeating anchored parts; more is an alias bomb, not a topology.
ALIAS_EXPANSION_LIMIT = 10_000


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _alias_problem(file: str, root: yaml.Node) -> SpecProblem | None:
    """Count the nodes the document has once aliases are expanded, without expanding them (each distinct node
    once, iteratively): an alias inside its own anchor, or aliases that multiply the document, are refused."""
    cap = ALIAS_EXPANSION_LIMIT * 10
    sizes: dict[int, int] = {}
    expanding: set[int] = set()
    repeated: list[yaml.Node] = []
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            sizes[key] = min(cap, 1 + sum(sizes[id(child)] for child in _children(node)))
            expanding.discard(key)
            continue
        if key in sizes:
            repeated.append(node)
            continue
        expanding.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in expanding:
                return SpecProblem(file, child.start_mark.line + 1, "", "an alias refers to the anchor it is inside",
                                   "a recursive alias never ends: write the value out instead")
            stack.append((child, False))
    distinct = len(sizes)
    if sizes[id(root)] - distinct > ALIAS_EXPANSION_LIMIT:
        biggest = max(repeated, key=lambda node: sizes[id(node)])
        return SpecProblem(file, biggest.start_mark.line + 1, "",
                           f"aliases expand the spec to more than {distinct + ALIAS_EXPANSION_LIMIT} values",
                           f"aliases (*name) may add at most {ALIAS_EXPANSION_LIMIT} values: write them out")
    return None


# PyYAML names tokens the way its parser sees them; say what a person wrote instead.
_TOKENS = {"'?'": "a new key", "'-'": "a list item ('-')", "'<scalar>'": "a plain value",
           "'<stream end>'": "the end of the file", "<block end>": "the end of the indented block",
           "'<block mapping start>'": "an indented mapping", "':'": "':'"}

_CONSTRUCTS = {"a flow sequence": "[...] list", "a flow mapping": "{...} mapping",
               "a block collection": "indented list", "a block mapping": "indented mapping",
               "a quoted scalar": "quoted string", "a block scalar": "multi-line string"}


def _syntax_problem(file: str, exc: yaml.MarkedYAMLError) -> SpecProblem:
    """One problem for a YAML syntax error: the line of the problem, in words, and where the construct began."""
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark else None
    problem = exc.problem or "syntax error"
    for token, words in _TOKENS.items():
        problem = problem.replace(token, words)
    hint = "check indentation, colons and quoting near that line"
    if exc.context and exc.context_mark and exc.context_mark.line + 1 != line:
        construct = exc.context.removeprefix("while parsing ").removeprefix("while scanning ")
        construct = _CONSTRUCTS.get(construct, construct)
        hint = f"in the {construct} that starts on line {exc.context_mark.line + 1}: {hint}"
    if "\\t" in problem:
        hint = "YAML indents with spaces, not tabs"
    return SpecProblem(file, line, "", f"not valid YAML: {problem}", hint)


def _walk(node: yaml.Node, path: Path_, doc: PositionedDocument, problems: list[SpecProblem]) -> None:
    doc.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.ScalarNode):
        _check_control(str(node.value), node, path, doc, problems)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = (*path, key)
            if key in seen:
                problems.append(SpecProblem(doc.file, key_node.start_mark.line + 1, field_path(child),
                                            "appears twice", "remove one of the two entries"))
            seen.add(key)
            _check_control(key, key_node, child, doc, problems)
            doc.lines[child] = key_node.start_mark.line + 1
            _walk(value_node, child, doc, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), doc, problems)


def _check_control(text: str, node: yaml.Node, path: Path_, doc: PositionedDocument,
                   problems: list[SpecProblem]) -> None:
    """Every value and key of a spec is one line of plain text: a newline in a value would end a directive in
    the rendered file and start another."""
    bad = control_chars(text)
    if bad:
        problems.append(SpecProblem(doc.file, node.start_mark.line + 1, field_path(path),
                                    f"holds control character(s) {', '.join(bad)}",
                                    "write it on one line without newlines or tabs (a | or > block adds a newline)"))
