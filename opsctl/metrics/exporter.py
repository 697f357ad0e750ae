"""The redis_exporter beside each server and Sentinel (metrics.exporter): the command line it runs with, the
password file it reads, the digest of both, and the steps that bring a running exporter to them. Pure.

The digest is what drift compares: the provider keeps the digest an exporter was started with, so a changed port
offset, TLS setting or (rotated) password shows in `plan` as a start-exporter step."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import digest
from opsctl.base.secrets import Secret
from opsctl.plan.desired import DesiredNode, single_valued, unquote
from opsctl.plan.facts import NodeFacts
from opsctl.plan.steps import StartExporter, Step, StopExporter
from opsctl.render.exporteruser import EXPORTER_USER, exporter_rule_words, exporter_secret
from opsctl.spec.layout import Node, endpoint, exporter_port
from opsctl.spec.load import LoadedSpec

EXPORTER_BINARY = "/usr/bin/prometheus-redis-exporter"  # Debian's prometheus-redis-exporter
EXPORTER_PACKAGE = "prometheus-redis-exporter"
PASSWORD_FILE = "exporter-password.json"  # in the node's folder, 0600: the exporter's only copy of its password
CONNECTION_TIMEOUT = "5s"  # below Prometheus' default 10 s scrape timeout: a stalled node shows as redis_up 0
TLS_FLAGS = (("-tls-ca-cert-file", "tls-ca-cert-file"), ("-tls-client-cert-file", "tls-cert-file"),
             ("-tls-client-key-file", "tls-key-file"))


@frozen
class ExporterRun(Frozen):
    """How one node's exporter runs: its arguments (no secret among them), the text of its password file (a JSON
    map of the node's address to the password, the exporter's -redis.password-file format) and their digest."""

    node: str
    args: tuple[str, ...]
    password_file: str
    password: Secret
    digest: str


def exporter_nodes(loaded: LoadedSpec) -> list[Node]:
    """The nodes that get an exporter: every server and every Sentinel."""
    return list(loaded.layout.nodes) if loaded.spec.metrics.exporter else []


def exporter_home(loaded: LoadedSpec, node: Node, node_dir: str) -> str:
    """The folder of a node's exporter (its password file, and with TLS its copies of the node's TLS files): the
    node's own folder where the exporter runs as the server's user (provider local), else, where it runs as a user
    of its own that cannot enter the node's folder (provider ansible), `<spec folder>.exporters/<node>` beside the
    spec's folder (a spec name holds no dot, so no spec's folder is named so)."""
    if loaded.spec.provider != "ansible":
        return node_dir
    return f"{node_dir.rsplit('/', 1)[0]}.exporters/{node.name}"


def exporter_run(loaded: LoadedSpec, want: DesiredNode) -> ExporterRun:
    """The exporter of want's node: it talks to the node as EXPORTER_USER (TLS with the node's CA and certificate
    when tls.enabled) and listens on the node's address at the node's port + metrics.port_offset; its password file
    (and TLS files) lie in its folder (exporter_home)."""
    node = want.node
    tls = loaded.spec.tls.enabled
    address = f"{'rediss' if tls else 'redis'}://{endpoint(node.address, node.port)}"
    directives = single_valued(want.directives)
    node_dir = unquote(directives["dir"])
    folder = exporter_home(loaded, node, node_dir)
    args = ["-redis.addr", address, "-redis.user", EXPORTER_USER,
            "-redis.password-file", f"{folder}/{PASSWORD_FILE}",
            "-web.listen-address", endpoint(node.address, exporter_port(node, loaded.spec.metrics.port_offset)),
            "-config-command", "-", "-connection-timeout", CONNECTION_TIMEOUT]
    if tls:
        for flag, directive in TLS_FLAGS:
            path = unquote(directives[directive])
            args += [flag, path if folder == node_dir else f"{folder}/{path.rsplit('/', 1)[-1]}"]
    password = exporter_secret(loaded.spec.name, loaded.credentials.password)
    settings = {"args": args, "password": hashlib.sha256(password.reveal().encode()).hexdigest()}
    return ExporterRun(node.name, tuple(args), json.dumps({address: password.reveal()}) + "\n", password,
                       digest(settings))


def exporter_steps(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Mapping[str, NodeFacts]) \
        -> list[Step]:
    """A start-exporter step for each node whose exporter does not run with the settings it should, a stop-exporter
    step for each exporter that should not run."""
    wanted = {n.name for n in exporter_nodes(loaded)}
    steps: list[Step] = []
    for node in loaded.layout.nodes:
        f = facts.get(node.name)
        running = f.exporter if f is not None else None
        if node.name not in wanted:
            if running is not None:
                steps.append(StopExporter(node.name, "metrics.exporter is off: stop its redis_exporter"))
            continue
        run = exporter_run(loaded, desired[node.name])
        if running != run.digest:
            why = "no redis_exporter runs beside it" if running is None else "its redis_exporter's settings changed"
            steps.append(StartExporter(node.name, why, run.digest))
        elif f is not None and _user_missing(f):
            steps.append(StartExporter(node.name, f"its redis_exporter runs, but the node has no {EXPORTER_USER} user",
                                       run.digest))
        elif f is not None and (changed := _rules_changed(f, node.is_sentinel)):
            steps.append(StartExporter(node.name, f"its {EXPORTER_USER} user's rules changed live ({changed}): set "
                                                  "them again", run.digest))
    return steps


def _rules_changed(f: NodeFacts, sentinel: bool) -> str:
    """What the exporter user may do live beyond or short of its rules, as words; "" when it matches or was not
    read. A denial beyond them is no drift: users.acl adds the disabled commands after -@all (ACL mode), which
    only repeats what -@all denies. Passwords are not rules: they are compared as verdicts (accepts)."""
    if f.exporter_rules is None:
        return ""
    live, wanted = set(f.exporter_rules), set(exporter_rule_words(sentinel))
    extra, lacking = sorted(w for w in live - wanted if not w.startswith("-")), sorted(wanted - live)
    return ", ".join([*(f"has {w}" for w in extra), *(f"lacks {w}" for w in lacking)])


def _user_missing(f: NodeFacts) -> bool:
    """The node answered ACL GETUSER for the exporter's user with no password at all: the user is gone (deleted
    behind opsctl's back), and the exporter cannot log in; its step sets the user again."""
    return f.accepts is not None and EXPORTER_USER in f.accepts and not f.accepts[EXPORTER_USER]
