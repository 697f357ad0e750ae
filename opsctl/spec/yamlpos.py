"""Load YAML and remember the line of every field, so spec problems can name file:line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from opsctl.errors import SpecProblem

Path_ = tuple[str | int, ...]


@dataclass
class PositionedDocument:
    """A loaded YAML document and the 1-based line where each field path starts."""

    file: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, path: Path_) -> int | None:
        """The line of path, or of its nearest ancestor that has one."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None


def field_path(path: Path_) -> str:
    """('hosts', 0, 'name') -> 'hosts[0].name'."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def load_positioned(text: str, file: str) -> tuple[PositionedDocument | None, list[SpecProblem]]:
    """Parse text; on a syntax error return the problem with its line instead of raising."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        return None, [_syntax_problem(file, exc)]
    except yaml.YAMLError as exc:
        return None, [SpecProblem(file, None, "", f"not valid YAML: {exc}", "check the file's syntax")]
    doc = PositionedDocument(file, data)
    problems: list[SpecProblem] = []
    if root is not None:
        _walk(root, (), doc, problems)
    return doc, problems


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
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = (*path, key)
            if key in seen:
                problems.append(SpecProblem(doc.file, key_node.start_mark.line + 1, field_path(child),
                                            "appears twice", "remove one of the two entries"))
            seen.add(key)
            doc.lines[child] = key_node.start_mark.line + 1
            _walk(value_node, child, doc, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), doc, problems)
