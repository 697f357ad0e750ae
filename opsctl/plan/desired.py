"""What every node should run with: rendered (masked) files and directives, and their digest. Pure.

What a node's files say, in the shape the planner compares with the spec. Pure: text in, values out.

Secrets never leave this module as values: a secret directive becomes a verdict (MASK when it is the spec's
secret, PREVIOUS when it is the secret being rotated away from, DIFFERS otherwise)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import digest
from opsctl.base.secrets import MASK, Secret
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


DIFFERS = "(differs from the spec)"
PREVIOUS = "(the previous password)"
# Lines that repeat by design; their values are compared as a whole elsewhere (renames) or not at all.
REPEATED = frozenset({"rename-command", "user", "include", "loadmodule", "sentinel known-replica",
                      "sentinel known-sentinel", "sentinel rename-command"})
# Names a server writes back under another name on CONFIG REWRITE (Valkey's primary*/commandlog-*).
ALIASES = {"primaryauth": "masterauth", "primaryuser": "masteruser", "slaveof": "replicaof",
           "commandlog-execution-slower-than": "slowlog-log-slower-than",
           "commandlog-slow-execution-max-len": "slowlog-max-len"}


def canonical(name: str) -> str:
    """One name per directive, whatever alias a file uses (slave-* is replica-*, ziplist is listpack)."""
    name = ALIASES.get(name, name)
    return name.replace("slave", "replica").replace("ziplist", "listpack")


def conf_lines(text: str) -> Iterator[Directive]:
    """(name, value) per directive line of a redis.conf or sentinel.conf; sentinel lines keep two words."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        name, value = name.lower(), value.strip()
        if name == "sentinel":
            sub, _, value = value.partition(" ")
            name, value = f"sentinel {sub.lower()}", value.strip()
        yield name, value


def secret_verdict(value: str, secret: Secret, previous: Secret | None = None) -> str:
    """A secret's value as something safe to show: whether it is the spec's secret, the previous one, or other."""
    if value == secret.reveal():
        return MASK
    if previous is not None and previous.reveal() and value == previous.reveal():
        return PREVIOUS
    return DIFFERS


def password_verdicts(hashes: Iterable[str], secret: Secret, previous: Secret | None = None) -> tuple[str, ...]:
    """The passwords a user accepts (ACL GETUSER's SHA-256 hashes) as sorted verdicts."""
    def verdict(value: str) -> str:
        if value == _sha256(secret):
            return MASK
        if previous is not None and previous.reveal() and value == _sha256(previous):
            return PREVIOUS
        return DIFFERS

    return tuple(sorted({verdict(h) for h in hashes}))


def _sha256(secret: Secret) -> str:
    return hashlib.sha256(secret.reveal().encode()).hexdigest()


def server_file_values(text: str, secret_names: frozenset[str], secret: Secret,
                       previous: Secret | None = None) -> dict[str, str]:
    """A server config file's values as CONFIG GET would print them (quotes resolved, save lines joined),
    with secrets as verdicts, by canonical name. The last line of a directive wins, as in the server."""
    values: dict[str, str] = {}
    saves: list[str] = []
    for alias, value in conf_lines(text):
        name = canonical(alias)
        words = _words(value)
        if name == "user" and words[:1] == ["default"]:
            # CONFIG REWRITE persists the default user: a password it holds would come back at a restart
            hashes = [w[1:] for w in words if w.startswith("#")]
            plain = [w for w in words if w.startswith(">") or w == "nopass"]
            verdicts = set(password_verdicts(hashes, secret, previous)) | ({DIFFERS} if plain else set())
            values["user default"] = ", ".join(sorted(verdicts))
            continue
        if name in REPEATED or name.startswith("sentinel "):
            continue
        if name == "save":
            saves = [] if words in ([], [""]) else [*saves, *words]
            values[name] = " ".join(saves)
        elif name in secret_names:
            values[name] = secret_verdict(" ".join(words), secret, previous)
        else:
            values[name] = " ".join(words)
    return values


def sentinel_file_values(text: str, secret: Secret, previous: Secret | None = None) -> dict[str, str]:
    """What a sentinel's own file says about its monitored master: auth-pass as a verdict, renames as keys
    "rename-command X" (the shape of planner.sentinel_settings)."""
    values: dict[str, str] = {}
    for name, value in conf_lines(text):
        words = _words(value)
        if name == "sentinel auth-pass" and len(words) == 2:
            values["auth-pass"] = secret_verdict(words[1], secret, previous)
        elif name == "sentinel auth-user" and len(words) == 2:
            values["auth-user"] = words[1]
        elif name == "sentinel sentinel-pass" and len(words) == 1:
            values["sentinel-pass"] = secret_verdict(words[0], secret, previous)
        elif name == "sentinel rename-command" and len(words) == 3:
            values[f"rename-command {words[1]}"] = words[2]
    return values


def _words(value: str) -> list[str]:
    try:
        return split_args(value)
    except ValueError:
        return [value]
