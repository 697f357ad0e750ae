"""A source opsctl did not deploy: given as endpoints and a reference to its password (`--from-endpoints`), its
members found on the servers themselves (a cluster's CLUSTER NODES; a master's replicas from INFO replication,
a replica's master followed once) and described as a spec of its own for the connector, the stream reader and
the cutover. The password is read from its file or variable here and never leaves as text (opsctl.base.secrets).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.base.secrets import Secret, remember
from opsctl.net.connection import connection_to
from opsctl.net.connector import ClientTLS, Connector
from opsctl.observe.replies import CLUSTER_NODES, ClusterNodeLine, info
from opsctl.spec.follows import endpoint_problem
from opsctl.spec.layout import Layout, Node, Role, Shard, split_endpoint
from opsctl.spec.load import Credentials, LoadedSpec
from opsctl.spec.model import Auth, Hardening, Host, SecretRef, Spec
from opsctl.spec.secretrefs import SecretUnusable
from opsctl.state.specfile import read_secret_file

NAME = "source"
HINT = "--from-endpoints HOST:PORT[,HOST:PORT...] with --from-password-file PATH or --from-password-env VAR"
TLS_HINT = "a TLS source: --from-tls-ca PATH, and --from-tls-cert PATH --from-tls-key PATH when it asks clients " \
    "for a certificate"


@dataclass(frozen=True)
class ForeignSource:
    """What the command line says about the source: endpoints, where its password lives, an ACL user."""

    endpoints: tuple[tuple[str, int], ...]
    password_file: str | None = None
    password_env: str | None = None
    user: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def ref(self) -> dict[str, str]:
        """The options that reach this source again (a re-run's, from the journal): references, no secret."""
        ref = {"from_endpoints": ",".join(f"{a}:{p}" if ":" not in a else f"[{a}]:{p}" for a, p in self.endpoints)}
        if self.password_file:
            ref["from_password_file"] = os.path.abspath(self.password_file)
        if self.password_env:
            ref["from_password_env"] = self.password_env
        if self.user:
            ref["from_user"] = self.user
        for option, path in (("from_tls_ca", self.tls_ca), ("from_tls_cert", self.tls_cert),
                             ("from_tls_key", self.tls_key)):
            if path:
                ref[option] = os.path.abspath(path)
        return ref


def parse_endpoints(text: str) -> tuple[tuple[str, int], ...]:
    if "@" in text:  # before it is split: a password may hold a `,`; nothing before the last @ is echoed
        raise OpsctlError(f"--from-endpoints: {endpoint_problem(text)}",
                          hint="the password goes through --from-password-file or --from-password-env, the user "
                               "through --from-user")
    found = []
    for part in (p.strip() for p in text.split(",")):
        problem = endpoint_problem(part)
        if problem:
            raise OpsctlError(f"--from-endpoints: {problem}", hint=HINT)
        parsed = split_endpoint(part)
        assert parsed is not None
        found.append(parsed)
    if not found:
        raise OpsctlError("--from-endpoints names no endpoint", hint=HINT)
    return tuple(found)


def read_password(source: ForeignSource) -> Secret:
    """The password from its file or variable, registered for masking."""
    if bool(source.password_file) == bool(source.password_env):
        raise OpsctlError("--from-endpoints needs exactly one of --from-password-file and --from-password-env",
                          hint=HINT)
    if source.password_file:
        try:
            value = (read_secret_file(Path(source.password_file)) or "").strip()
        except SecretUnusable as exc:
            raise OpsctlError(f"--from-password-file {source.password_file}: {exc.what}", hint=exc.hint) from None
        if not value:
            raise OpsctlError(f"--from-password-file {source.password_file}: missing or empty",
                              hint="a file holding only the password, mode 0600")
    else:
        value = os.environ.get(source.password_env or "", "")
        if not value:
            raise OpsctlError(f"--from-password-env {source.password_env}: the variable is not set or empty",
                              hint=f"export {source.password_env}=... before running opsctl")
    secret = Secret(value)
    remember(secret)
    return secret


def source_tls(source: ForeignSource) -> ClientTLS | None:
    """How to speak TLS to the source (None: plaintext): its CA, and a client certificate when it asks for one
    (tls-auth-clients yes, the servers' default)."""
    if (source.tls_cert is None) != (source.tls_key is None):
        raise OpsctlError("--from-tls-cert and --from-tls-key go together", hint=TLS_HINT)
    if source.tls_ca is None:
        if source.tls_cert is not None:
            raise OpsctlError("--from-tls-cert needs --from-tls-ca (the CA the source's certificates chain to)",
                              hint=TLS_HINT)
        return None
    for option, path in (("--from-tls-ca", source.tls_ca), ("--from-tls-cert", source.tls_cert),
                         ("--from-tls-key", source.tls_key)):
        if path is not None and not os.path.isfile(path):
            raise OpsctlError(f"{option} {path}: no such file", hint=TLS_HINT)
    return ClientTLS(os.path.abspath(source.tls_ca), source.tls_cert and os.path.abspath(source.tls_cert),
                     source.tls_key and os.path.abspath(source.tls_key))


def check_source(source: ForeignSource) -> None:
    """What the command line says about the source, checked before anything connects: the password is there, the
    TLS files go together and exist (the endpoints were parsed into source)."""
    read_password(source)
    source_tls(source)


def foreign_connector(source: ForeignSource) -> Connector:
    """The source described as a spec whose layout is what its servers say now, and the connector to it."""
    password, tls = read_password(source), source_tls(source)
    given = Connector(_loaded(_given_layout(source.endpoints), password, source), None, tls)
    return Connector(_loaded(_discover(given, given.loaded.layout.servers), password, source), None, tls)


def _spec(source: ForeignSource, addresses: Sequence[str]) -> Spec:
    """A spec with no renamed or disabled command (a foreign store runs its commands under their own names)."""
    hosts = [Host(name=f"h{i + 1}", address=a) for i, a in enumerate(dict.fromkeys(addresses))]
    ref = SecretRef(file=source.password_file) if source.password_file else SecretRef(env=source.password_env)
    auth = Auth(mode="acl" if source.user else "password", password=ref, admin_user=source.user or "opsctl")
    return Spec(name=NAME, topology="standalone", hosts=hosts, auth=auth,
                hardening=Hardening(disabled_commands=[], rename_takeover_commands=False))


def _loaded(layout: Layout, password: Secret, source: ForeignSource) -> LoadedSpec:
    spec = _spec(source, [n.address for n in layout.nodes])
    return LoadedSpec("--from-endpoints", spec, layout, Credentials(password))


def _given_layout(endpoints: Sequence[tuple[str, int]]) -> Layout:
    nodes = tuple(Node(f"{NAME}-given-{i + 1}", "h", a, p, "master", None) for i, (a, p) in enumerate(endpoints))
    return Layout(nodes)


def _info(connector: Connector, node: Node, section: str) -> dict[str, str]:
    with connection_to(connector, node, 10.0) as handle:
        return handle.read(info(section))


def _discover(connector: Connector, given: Sequence[Node]) -> Layout:
    """The layout from the first given endpoint that answers."""
    errors = []
    for node in given:
        try:
            if _info(connector, node, "cluster").get("cluster_enabled") == "1":
                with connection_to(connector, node, 10.0) as handle:
                    view = handle.read(CLUSTER_NODES)
                return cluster_layout_of(view)
            info = _info(connector, node, "replication")
            if info.get("role") == "slave":
                master = Node(f"{NAME}-master", "h", info.get("master_host", ""), int(info.get("master_port", "0")),
                              "master", None)
                info = _info(connector, master, "replication")
                return replication_layout_of((master.address, master.port), replicas_of(info))
            return replication_layout_of((node.address, node.port), replicas_of(info))
        except OpsctlError as exc:  # NodeError too: a node that does not answer or refuses
            errors.append(f"{node.endpoint}: {getattr(exc, 'summary', None) or exc}")
    raise OpsctlError("no endpoint of the source answers", "; ".join(errors),
                      "check --from-endpoints and the password reference (and that the source runs)")


# --- pure: the layout from what the servers said -----------------------------------------------------------------


def replicas_of(info: dict[str, str]) -> list[tuple[str, int]]:
    """A master's replicas that are online and listen on a port (a stream reader such as opsctl's says 0)."""
    out = []
    for key, value in sorted(info.items()):
        if key.startswith("slave") and key[5:].isdigit():
            fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
            if fields.get("state") == "online" and fields.get("port", "0") not in ("", "0"):
                out.append((fields.get("ip", ""), int(fields["port"])))
    return out


def replication_layout_of(master: tuple[str, int], replicas: Sequence[tuple[str, int]]) -> Layout:
    nodes = [_node(1, master, "master", 1)] + [_node(i + 2, r, "replica", 1) for i, r in enumerate(replicas)]
    return Layout(tuple(nodes), (Shard(1, nodes[0].name, tuple(n.name for n in nodes[1:])),))


def cluster_layout_of(lines: Sequence[ClusterNodeLine]) -> Layout:
    """One shard per master serving slots, in slot order, with its replicas that are not failing."""
    masters = sorted((line for line in lines if line.is_master and line.slots and not line.is_failing),
                     key=lambda line: line.slots[0])
    if not masters:
        raise OpsctlError("the source cluster has no master serving slots")
    nodes: list[Node] = []
    shards = []
    for index, master in enumerate(masters, start=1):
        replicas = [line for line in lines if line.master_id == master.id and not line.is_failing]
        members = [master, *sorted(replicas, key=lambda line: (line.address, line.port))]
        named = [_node(len(nodes) + k + 1, (m.address, m.port), "master" if k == 0 else "replica", index)
                 for k, m in enumerate(members)]
        nodes += named
        shards.append(Shard(index, named[0].name, tuple(n.name for n in named[1:])))
    return Layout(tuple(nodes), tuple(shards))


def _node(number: int, where: tuple[str, int], role: Role, shard: int) -> Node:
    return Node(f"{NAME}-{number}", f"h-{where[0]}", where[0], where[1], role, shard)
