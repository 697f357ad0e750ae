"""Write a file to a host over SSH (SFTP), atomically: `opsctl metrics targets --write-to HOST:PATH` puts the
file_sd targets where Prometheus runs. HOST is a host of the spec (its SSH settings) or `[user@]address`."""

from __future__ import annotations

from opsctl.base.errors import OpsctlError, echo
from opsctl.base.secrets import mask_login
from opsctl.providers.remote import ssh
from opsctl.providers.remote.inventory import parse_bastion
from opsctl.spec.model import Spec

WRITE_TO_HINT = ("give --write-to HOST:/ABSOLUTE/PATH, HOST a host of the spec (its ssh_user, ssh_key, bastion) or "
                 "[user@]address")


def parse_write_to(text: str) -> tuple[str, str]:
    """HOST:PATH as (host, path); the path must be absolute (the first `:/` ends the host, an address may hold
    colons)."""
    host, sep, rest = text.partition(":/")
    user = host.rpartition("@")[0]
    shown = echo(mask_login(text, len(host)))  # what is before an @ may be a password
    if "://" in text:  # a URL's scheme would be taken for the host, its user:password for the path
        raise OpsctlError(f"--write-to {shown}: a URL is not HOST:/PATH", hint=WRITE_TO_HINT)
    if ":" in user:
        raise OpsctlError(f"--write-to {shown}: a login holds no password (SSH logs in with a key or the agent)",
                          hint=WRITE_TO_HINT)
    if not sep or not host or not rest or rest.endswith("/") or any(ord(c) < 32 for c in rest) \
            or any(part in (".", "..") for part in rest.split("/")):
        raise OpsctlError(f"--write-to {shown} is not HOST:/PATH", hint=WRITE_TO_HINT)
    parse_bastion(host, "root")  # a port out of range or a malformed address: said before the spec is read
    return host, "/" + rest


def target_of(spec: Spec, host: str) -> ssh.SshTarget:
    """A host of the spec by name (its SSH settings), else [user@]address logged in as that user (default root)
    with the SSH agent or the default keys."""
    named = next((h for h in spec.hosts if h.name == host), None)
    if named is not None:
        return ssh.target_for(spec, named)
    user, address, port = parse_bastion(host, "root")
    return ssh.SshTarget(host, address, port, user)


def write_over_ssh(spec: Spec, where: str, data: bytes, mode: int = 0o644,
                   known_hosts: str | None = None) -> str:
    """Replace the file where (HOST:PATH) with data, atomically; returns `host:path` as written. The host key is
    checked against known_hosts (OPSCTL_SSH_KNOWN_HOSTS, else ~/.ssh/known_hosts), as for every SSH connection."""
    host, path = parse_write_to(where)
    target = target_of(spec, host)
    client = ssh.connect(target, ssh.known_hosts_path(known_hosts))
    try:
        with ssh.open_sftp(client, target) as sftp:
            ssh.replace_file(sftp, path, data, mode)
    except ssh.GONE as exc:
        raise ssh.ssh_error(target, exc, f"write {path} on") from None
    finally:
        ssh.close(client)
    return f"{target.describe()}:{path}"
