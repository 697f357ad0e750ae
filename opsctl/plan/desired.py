"""What every node should run with: rendered (masked) files and directives, and their digest. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import digest
from opsctl.render import NodePaths, render_node, render_sections
from opsctl.render.directives import Directive, derived_causes, sentinel_causes
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.spec.text import split_args

# Lines that are not CONFIG SET-able directives: changing them needs a restart.
NOT_CONFIG_DIRECTIVES = frozenset({"rename-command", "daemonize", "pidfile", "logfile", "dir", "cluster-enabled",
                                   "cluster-config-file", "aclfile", "appendfilename", "dbfilename"})


@frozen
class DesiredNode(Frozen):
    """causes: the spec field a derived directive comes from (render.directives.derived_causes), as plan text."""

    node: Node
    directives: tuple[Directive, ...]
    digest: str
    causes: tuple[tuple[str, str], ...] = ()


def desired_node(loaded: LoadedSpec, node: Node, paths: NodePaths, daemonize: bool,
                 master: tuple[str, int] | None = None) -> DesiredNode:
    rendered = render_node(loaded, node, paths, reveal=False, daemonize=daemonize, master=master)
    directives = tuple(d for section in rendered.sections for d in section.directives)
    causes = sentinel_causes(loaded.spec) if node.role == "sentinel" else derived_causes(loaded.spec, node)
    return DesiredNode(node, directives, digest(rendered.files), tuple(causes.items()))


def desired_nodes(loaded: LoadedSpec, paths_of: Callable[[Node], NodePaths], daemonize: bool,
                  master: tuple[str, int] | None = None) -> dict[str, DesiredNode]:
    return {n.name: desired_node(loaded, n, paths_of(n), daemonize, master) for n in loaded.layout.nodes}


def single_valued(directives: tuple[Directive, ...] | list[Directive]) -> dict[str, str]:
    """Directives that appear once, by name (rename-command and sentinel lines repeat)."""
    counts: dict[str, int] = {}
    for name, _ in directives:
        counts[name] = counts.get(name, 0) + 1
    return {name: value for name, value in directives if counts[name] == 1}


def rendered_values(loaded: LoadedSpec, node: Node, defaults: Mapping[str, str]) -> dict[str, str]:
    """These directives as the spec renders them for node; defaults: the server's own where it renders none."""
    paths = NodePaths("-", "-", "-", "-", "-")
    rendered = single_valued([d for s in render_sections(loaded, node, paths, reveal=False) for d in s.directives])
    return {name: rendered.get(name, default) for name, default in defaults.items()}


def unquote(value: str) -> str:
    """Inverse of opsctl.render.tokens.quoted for CONFIG SET, which takes the raw value: one double-quoted
    argument read back the way the server's parser reads it (escapes and all); anything else as it is."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            tokens = split_args(value)
        except ValueError:
            return value
        if len(tokens) == 1:
            return tokens[0]
    return value
