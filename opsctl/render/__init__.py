"""Render per-node files (redis.conf, sentinel.conf, users.acl) from a loaded spec. Pure: text in, text out."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from string import Template

from opsctl import data_dir
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.secrets import MASK, Secret
from opsctl.render.directives import NodePaths, Section, sentinel_sections, server_sections
from opsctl.render.exporteruser import (
    EXPORTER_USER,
    FENCE_RULE,
    FOLLOWER_USER,
    default_fence_line,
    exporter_acl_words,
    follower_words,
    following,
)
from opsctl.render.tokens import checked, checked_arguments, word
from opsctl.spec.aclrules import rule_tokens
from opsctl.spec.layout import Node, sentinel_master_name
from opsctl.spec.load import LoadedSpec

__all__ = ["NodePaths", "RenderedNode", "render_node", "render_sections"]

ADMIN_ACL_RULES = "~* &* +@all"


@frozen
class RenderedNode(Frozen):
    """The files one node needs: file name -> text. Secrets are real only when rendered with reveal."""

    node: Node
    files: dict[str, str]
    sections: tuple[Section, ...]


def _printed(value: object) -> str:
    """A value as a file prints it: refused when it holds a control character (render.tokens.checked)."""
    return str(checked(value))


@functools.cache
def _template(name: str) -> Template:
    """templates/<name>: the frame of a rendered file, read once per process."""
    return Template((data_dir("templates") / name).read_text(encoding="utf-8"))


def _filled(name: str, body: dict[str, str], **values: object) -> str:
    """templates/<name> with its body placeholder (lines already built from checked values) and every other
    placeholder filled by a checked value. A placeholder left unfilled raises."""
    return _template(name).substitute({**{key: _printed(value) for key, value in values.items()}, **body})


def _sections_text(sections: Sequence[Section]) -> str:
    """Each section's title and its directives, one a line, a blank line before each title."""
    return "\n".join(
        "\n".join(["", f"# --- {_printed(section.title)}",
                   *(f"{_printed(name)} {_printed(value)}" for name, value in section.directives)])
        for section in sections)


def _server_conf(loaded: LoadedSpec, node: Node, sections: Sequence[Section]) -> str:
    spec = loaded.spec
    return _filled("redis.conf.tmpl", flavor=spec.server.flavor, version=spec.server.version, node=node.name,
                   role=node.role, shard=f", shard {node.shard}" if node.shard else "",
                   spec_name=spec.name, body={"sections": _sections_text(sections)})


def _sentinel_conf(loaded: LoadedSpec, node: Node, sections: Sequence[Section]) -> str:
    return _filled("sentinel.conf.tmpl", node=node.name, master_name=sentinel_master_name(loaded.spec),
                   spec_name=loaded.spec.name, body={"sections": _sections_text(sections)})


def _shown(secret: Secret, reveal: bool) -> str:
    return secret.reveal() if reveal else MASK


def render_sections(loaded: LoadedSpec, node: Node, paths: NodePaths, reveal: bool, daemonize: bool = True,
                    master: tuple[str, int] | None = None) -> tuple[Section, ...]:
    password = _shown(loaded.credentials.password, reveal)
    if node.is_sentinel:
        if master is None:
            first = loaded.layout.node(loaded.layout.shards[0].master)
            master = (first.address, first.port)
        return sentinel_sections(loaded, node, paths, master, password, daemonize)
    sections = server_sections(loaded, node, paths, password, daemonize)
    users = [line for line in (_default_user_line(loaded, reveal), _exporter_user_line(loaded, reveal),
                               _follower_user_line(loaded, reveal)) if line]
    if not users:
        return sections
    return tuple(Section(s.title, (*s.directives, *(("user", line) for line in users)))
                 if s.title == "security" else s for s in sections)


def _exporter_user_line(loaded: LoadedSpec, reveal: bool) -> str | None:
    """Password mode: the exporter's ACL user as a `user` line beside requirepass (ACL mode: in users.acl)."""
    words = exporter_acl_words(loaded, reveal) if loaded.spec.auth.mode == "password" else None
    return " ".join([EXPORTER_USER, *words]) if words else None


def _follower_user_line(loaded: LoadedSpec, reveal: bool) -> str | None:
    """Password mode, a standby while it follows: opsctl's follower user beside the fenced default user."""
    if loaded.spec.auth.mode != "password" or not following(loaded):
        return None
    return " ".join([FOLLOWER_USER, *follower_words(loaded, reveal)])


def _default_user_line(loaded: LoadedSpec, reveal: bool) -> str | None:
    """Password mode: the default user's line when requirepass alone does not say it all: a rotation's overlap,
    or a standby's fence (docs/standby.md)."""
    if loaded.spec.auth.mode != "password":
        return None
    overlap = rotation_overlap(loaded, reveal)
    if not following(loaded):
        return overlap
    secrets = [loaded.credentials.password] + ([loaded.credentials.previous] if overlap else [])
    return default_fence_line(" ".join(f"#{_password_hash(s) if reveal else MASK}" for s in secrets if s))


def rotation_overlap(loaded: LoadedSpec, reveal: bool) -> str | None:
    """Password mode during a rotation (auth.previous_password): the default user also accepts the previous
    password, so the overlap survives a restart (the user line wins over requirepass at startup)."""
    credentials = loaded.credentials
    previous = credentials.previous
    if loaded.spec.auth.mode != "password" or previous is None or not previous.reveal() or \
            previous == credentials.password:
        return None
    hashes = " ".join(f"#{_password_hash(s) if reveal else MASK}" for s in (credentials.password, previous))
    return f"default on {hashes} ~* &* +@all"


def render_node(loaded: LoadedSpec, node: Node, paths: NodePaths, reveal: bool = False, daemonize: bool = True,
                master: tuple[str, int] | None = None) -> RenderedNode:
    """All files of one node. master: the address sentinels monitor (default: the spec's first master)."""
    spec = loaded.spec
    sections = render_sections(loaded, node, paths, reveal, daemonize, master)
    for section in sections:
        for name, value in section.directives:
            checked_arguments(name, value)
    if node.is_sentinel:
        return RenderedNode(node, {"sentinel.conf": _sentinel_conf(loaded, node, sections)}, sections)
    files = {"redis.conf": _server_conf(loaded, node, sections)}
    if spec.auth.mode == "acl":
        files["users.acl"] = render_acl(loaded, reveal)
    return RenderedNode(node, files, sections)


def render_acl(loaded: LoadedSpec, reveal: bool) -> str:
    spec = loaded.spec
    denied = [f"-{c.lower()}" for c in spec.hardening.disabled_commands]
    users: list[tuple[str, Secret, list[str]]] = [
        (spec.auth.admin_user, loaded.credentials.password, ADMIN_ACL_RULES.split())]
    users += [(name, secret, rule_tokens(user.rules))
              for (name, secret), user in zip(loaded.credentials.users, spec.auth.users, strict=True)]
    previous = {spec.auth.admin_user: loaded.credentials.previous, **dict(loaded.credentials.users_previous)}
    lines = []
    exporter = exporter_acl_words(loaded, reveal)
    for name, secret, rules in users:
        accepted = [secret, *[p for p in [previous.get(name)] if p is not None and p.reveal() and p != secret]]
        line = {"name": word(name), "rules": " ".join(word(rule) for rule in [*rules, *denied]),
                "hash": " #".join(_password_hash(s) if reveal else MASK for s in accepted)}
        checked_arguments("user", f"{line['name']} {line['rules']}")
        lines.append(line)
    fence = f" {FENCE_RULE}" if following(loaded) else ""  # the applications' users, not opsctl's admin
    texts = [f"user {_printed(u['name'])} on #{_printed(u['hash'])} {_printed(u['rules'])}"
             f"{fence if u['name'] != spec.auth.admin_user else ''}" for u in lines]
    if exporter is not None:
        texts.append(" ".join(["user", EXPORTER_USER, *(_printed(w) for w in [*exporter, *denied])]))
    if following(loaded):
        texts.append(" ".join(["user", FOLLOWER_USER, *(_printed(w) for w in [*follower_words(loaded, reveal),
                                                                                 *denied])]))
    return _filled("users.acl.tmpl", body={"users": "\n".join(texts)})


def _password_hash(secret: Secret) -> str:
    return hashlib.sha256(secret.reveal().encode()).hexdigest()


def default_paths(root: str, node: Node) -> NodePaths:
    base = f"{root}/{node.name}"
    conf = "sentinel.conf" if node.is_sentinel else "redis.conf"
    return NodePaths(dir=base, conf=f"{base}/{conf}", acl=f"{base}/users.acl", log=f"{base}/server.log",
                     pid=f"{base}/server.pid")
