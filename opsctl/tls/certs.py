"""Certificates with the `cryptography` library: a private CA, node and client certificates, and reading them.

Pure (bytes in, PEM text out); where the files live is opsctl.tls.material's business. Keys are ECDSA P-256:
small, and the cheapest handshake for the many short admin connections opsctl makes.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 397
Pem = str


@dataclass(frozen=True)
class Issued:
    cert: Pem
    key: Pem


@dataclass(frozen=True)
class CertFacts:
    """What a certificate says about itself."""

    subject: str
    not_after: datetime.datetime
    dns: tuple[str, ...]
    ips: tuple[str, ...]
    fingerprint: str

    def days_left(self, now: datetime.datetime) -> float:
        return (self.not_after - now).total_seconds() / 86400


def _key_pem(key: ec.EllipticCurvePrivateKey) -> Pem:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert: x509.Certificate) -> Pem:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "opsctl"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(common: str, now: datetime.datetime, days: int = CA_DAYS) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(_cert_pem(cert), _key_pem(key))


def issue(ca: Issued, common: str, names: tuple[str, ...], now: datetime.datetime, days: int = CERT_DAYS) -> Issued:
    """A certificate for a node (names: its address and host name as SANs) or for a client (no names).
    Both server and client use: servers present it when they connect to each other (replication, bus)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.encode())
    ca_key = serialization.load_pem_private_key(ca.key.encode(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key opsctl made")
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                                        critical=False)
    return Issued(_cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def facts(pem: Pem) -> list[CertFacts]:
    """Every certificate in a PEM text (a bundle holds several). ValueError when it holds none."""
    out = []
    for cert in x509.load_pem_x509_certificates(pem.encode()):
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            dns = tuple(san.get_values_for_type(x509.DNSName))
            ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
        except x509.ExtensionNotFound:
            dns, ips = (), ()
        out.append(CertFacts(cert.subject.rfc4514_string(), cert.not_valid_after_utc, dns, ips,
                             cert.fingerprint(hashes.SHA256()).hex()[:16]))
    return out


def key_fits(issued: Issued) -> bool:
    """Whether the key is the certificate's own: a run killed between writing the two files leaves a new key
    beside the old certificate, a pair no TLS library loads."""
    try:
        key = serialization.load_pem_private_key(issued.key.encode(), None)
        cert = x509.load_pem_x509_certificate(issued.cert.encode())
    except ValueError:
        return False
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def issuer_of(pem: Pem) -> str:
    return x509.load_pem_x509_certificate(pem.encode()).issuer.rfc4514_string()


def covers(fact: CertFacts, names: tuple[str, ...]) -> bool:
    return set(names) <= set(fact.dns) | set(fact.ips)


def der_facts(der: bytes) -> CertFacts:
    """A peer certificate as a TLS handshake hands it over (DER)."""
    return facts(x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).decode())[0]
