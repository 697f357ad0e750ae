"""Certificate files on the machine running opsctl: given ones read from the spec's paths, generated ones kept 0600 in
`<state_dir>/tls/`; the node files shipped with each node's config, and opsctl's own client TLS.

Generated: ca.crt + ca.key (the signing CA), ca-bundle.crt (every CA the nodes trust, the signing one first),
nodes/<node>.crt|key, opsctl.crt|key (client)."""

from __future__ import annotations

import datetime
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.base.errors import OpsctlError
from opsctl.net.connector import ClientTLS
from opsctl.render.directives import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from opsctl.spec.layout import Node, node_names, node_refs
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import FileRef
from opsctl.state.safefs import write_private

if TYPE_CHECKING:
    from opsctl.tls.certs import Issued

RENEW_DAYS = 30  # a generated certificate closer than this to its end is issued again by `apply`


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OpsctlError(f"cannot read {what} {path}", str(exc),
                          "check the tls files in the spec (paths are relative to the spec file)") from None


class Generated:
    """The private CA and the certificates opsctl made (tls.generate: true). opsctl.tls.certs (cryptography) is
    imported by the methods that make or read certificates: a spec without TLS never loads it."""

    def __init__(self, loaded: LoadedSpec, state_dir: Path) -> None:
        self.loaded = loaded
        self.dir = Path(state_dir) / "tls"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _path(self, name: str) -> Path:
        return self.dir / name

    def _issued(self, stem: str) -> Issued | None:
        cert, key = self._path(f"{stem}.crt"), self._path(f"{stem}.key")
        if not (cert.is_file() and key.is_file()):
            return None
        from opsctl.tls.certs import Issued

        return Issued(_read(cert, "certificate"), _read(key, "key"))

    def _save(self, stem: str, issued: Issued) -> None:
        write_private(self._path(f"{stem}.key"), issued.key)
        write_private(self._path(f"{stem}.crt"), issued.cert)

    def ensure(self) -> None:
        """Make whatever is missing: the CA, its bundle, opsctl's client certificate, each node's certificate
        (again when it no longer names the node's address and host, or ends within RENEW_DAYS)."""
        from opsctl.tls.certs import issue, make_ca

        with self._locked():
            ca = self._issued("ca")
            if ca is None:
                ca = make_ca(f"opsctl CA for {self.loaded.spec.name}", now())
                self._save("ca", ca)
                write_private(self._path("ca-bundle.crt"), ca.cert)
            if self._stale("opsctl", ()):
                self._save("opsctl", issue(self._signing(ca), "opsctl", (), now()))
            for node in self.loaded.layout.nodes:
                if self._stale(f"nodes/{node.name}", node_names(node)):
                    self._save(f"nodes/{node.name}", issue(self._signing(ca), node.name, node_names(node), now()))

    def _stale(self, stem: str, names: tuple[str, ...]) -> bool:
        from opsctl.tls.certs import covers, facts, key_fits

        issued = self._issued(stem)
        if issued is None:
            return True
        fact = facts(issued.cert)[0]
        return not covers(fact, names) or fact.days_left(now()) < RENEW_DAYS or not key_fits(issued)

    def _signing(self, ca: Issued) -> Issued:
        """The CA, refused when its key is not its certificate's (it would sign certificates nobody trusts)."""
        from opsctl.tls.certs import key_fits

        if not key_fits(ca):
            raise OpsctlError(f"{self._path('ca.key')} is not the key of {self._path('ca.crt')}",
                              "a CA rotation was stopped between writing the two files",
                              "make a new CA the nodes trust beside the old one: `opsctl tls rotate -f SPEC --new-ca`")
        return ca

    def reissue(self) -> None:
        """New certificates for every node and for opsctl, from the signing CA."""
        from opsctl.tls.certs import issue

        with self._locked():
            ca = self._issued("ca")
            if ca is None:
                raise OpsctlError("no generated CA yet", hint="run `opsctl apply -f SPEC` first")
            ca = self._signing(ca)
            self._save("opsctl", issue(ca, "opsctl", (), now()))
            for node in self.loaded.layout.nodes:
                self._save(f"nodes/{node.name}", issue(ca, node.name, node_names(node), now()))

    def add_ca(self) -> None:
        """A new signing CA; the bundle trusts it and every older one, so nothing breaks until reissue()."""
        from opsctl.tls.certs import make_ca

        with self._locked():
            old = _read(self._path("ca-bundle.crt"), "CA bundle")
            ca = make_ca(f"opsctl CA for {self.loaded.spec.name} ({now():%Y-%m-%d %H:%M})", now())
            self._save("ca", ca)
            write_private(self._path("ca-bundle.crt"), ca.cert + old)

    def drop_old_cas(self) -> None:
        with self._locked():
            write_private(self._path("ca-bundle.crt"), _read(self._path("ca.crt"), "CA certificate"))

    def bundle(self) -> str:
        return _read(self._path("ca-bundle.crt"), "CA bundle")

    def ca_cert(self) -> str:
        return _read(self._path("ca.crt"), "CA certificate")

    def issuer(self, node: Node) -> str:
        """The subject of the CA that signed node's certificate ("" when it has none)."""
        from opsctl.tls.certs import issuer_of

        issued = self._issued(f"nodes/{node.name}")
        return issuer_of(issued.cert) if issued else ""

    def node_files(self, node: Node) -> dict[str, str]:
        issued = self._issued(f"nodes/{node.name}")
        if issued is None:
            raise OpsctlError(f"no generated certificate for {node.name}", hint="run `opsctl apply -f SPEC`")
        return {TLS_CA_FILE: self.bundle(), TLS_CERT_FILE: issued.cert, TLS_KEY_FILE: issued.key}

    def client(self) -> ClientTLS:
        return ClientTLS(str(self._path("ca-bundle.crt")), str(self._path("opsctl.crt")),
                         str(self._path("opsctl.key")), tuple(self.loaded.spec.tls.protocols))


def _given_path(loaded: LoadedSpec, ref: FileRef | None) -> Path:
    assert ref is not None  # spec checks refuse a TLS spec that leaves a node without a file
    path = Path(ref.file)
    return path if path.is_absolute() else Path(loaded.file).resolve().parent / path


def node_files(loaded: LoadedSpec, state_dir: Path, node: Node) -> dict[str, str]:
    """The TLS files a node's folder holds ({} without TLS): CA bundle, certificate, key."""
    tls = loaded.spec.tls
    if not tls.enabled:
        return {}
    if tls.generate:
        store = Generated(loaded, state_dir)
        store.ensure()
        return store.node_files(node)
    refs = node_refs(loaded.spec, node)
    return {TLS_CA_FILE: _read(_given_path(loaded, refs.ca), f"tls CA file of {node.name}"),
            TLS_CERT_FILE: _read(_given_path(loaded, refs.cert), f"tls certificate of {node.name}"),
            TLS_KEY_FILE: _read(_given_path(loaded, refs.key), f"tls key of {node.name}")}


def client_tls(loaded: LoadedSpec, state_dir: Path) -> ClientTLS | None:
    """How opsctl speaks TLS to the nodes (None without TLS). With given files it trusts the first server's CA
    file and presents its certificate (the servers accept it: the same CA signed it)."""
    tls = loaded.spec.tls
    if not tls.enabled:
        return None
    if tls.generate:
        store = Generated(loaded, state_dir)
        store.ensure()
        return store.client()
    refs = node_refs(loaded.spec, loaded.layout.servers[0])
    return ClientTLS(str(_given_path(loaded, refs.ca)), str(_given_path(loaded, refs.cert)),
                     str(_given_path(loaded, refs.key)), tuple(tls.protocols))


def ca_text(loaded: LoadedSpec, state_dir: Path) -> str:
    """The CA certificate(s) clients should trust, PEM."""
    tls = loaded.spec.tls
    if tls.generate:
        store = Generated(loaded, state_dir)
        store.ensure()
        return store.bundle()
    return _read(_given_path(loaded, node_refs(loaded.spec, loaded.layout.servers[0]).ca), "tls CA file")
