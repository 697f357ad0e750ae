"""What /proc says about a process and this machine's sockets: the pure parsers (shared with the Ansible provider,
which reads a host's /proc over SFTP) and the local reads they parse.

A pid is trusted only after /proc says it is a Redis/Valkey server working in the node's folder and listening on
its port (is_node_process, holds_port): pids get reused."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from opsctl.base.frozen import Frozen, frozen
from opsctl.providers import sockdiag

SERVER_NAMES = ("redis-server", "valkey-server")
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@frozen
class ProcFacts(Frozen):
    """What /proc says about a process: its executable, working directory and (retitled) command line."""

    pid: int
    exe: str
    cwd: str
    cmdline: tuple[str, ...]


# --- pure partners -----------------------------------------------------------------------------------------

def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """/proc/<pid>/cmdline as words; servers retitle themselves to 'binary addr:port [mode]' in one arg."""
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace")
    return tuple(text.split())


def is_node_process(facts: ProcFacts, binary: str, node_dir: str, conf: str, port: int,
                    plain_port: int | None = None) -> bool:
    """True when the process is a server (our binary or one by name) in node_dir, run with conf or on port (a
    TLS node with a plaintext port as well titles itself with that one)."""
    exe = facts.exe.removesuffix(" (deleted)")
    argv0 = facts.cmdline[0] if facts.cmdline else ""
    server = exe == os.path.realpath(binary) or os.path.basename(argv0) in (*SERVER_NAMES, os.path.basename(binary))
    ports = {f":{port}", f":{plain_port}"} if plain_port else {f":{port}"}
    ours = conf in facts.cmdline or any(word.endswith(tuple(ports)) for word in facts.cmdline[1:])
    return server and ours and facts.cwd == node_dir


def listening_inodes(table: str, address: str, port: int) -> set[str]:
    """Socket inodes listening on address:port (or on the wildcard) in a /proc/net/tcp or tcp6 table. Pure."""
    ip = ipaddress.ip_address(address.strip("[]"))
    words = [ip.packed[i:i + 4][::-1] for i in range(0, len(ip.packed), 4)]  # the kernel prints each word LE
    wanted = {f"{b''.join(words).hex().upper()}:{port:04X}", f"{'0' * len(ip.packed) * 2}:{port:04X}"}
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[3] == "0A" and fields[1] in wanted:  # 0A: LISTEN
            found.add(fields[9])
    return found


# --- this machine's /proc ----------------------------------------------------------------------------------

def read_proc(pid: int) -> ProcFacts | None:
    """None when the pid is gone, a zombie, or not ours to inspect."""
    base = Path(f"/proc/{pid}")
    try:
        if base.joinpath("stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X"):
            return None
        return ProcFacts(pid, os.readlink(base / "exe"), os.readlink(base / "cwd"),
                         parse_cmdline(base.joinpath("cmdline").read_bytes()))
    except (OSError, IndexError):
        return None


def holds_port(pid: int, address: str, port: int) -> bool:
    """Whether pid listens on address:port itself (a port that answers may be another process's). The listening
    sockets come from sock_diag, else /proc/net. True when neither can tell (or another user's fds): the port
    check alone decides then. False when pid is gone: a server that failed to bind the port another process holds
    exits right after it wrote its pidfile, and the other process's port accepts."""
    table = "tcp6" if ":" in address else "tcp"
    try:
        inodes = sockdiag.listening_inodes(address, port)
        if inodes is None:
            inodes = listening_inodes(Path(f"/proc/net/{table}").read_text(), address, port)
        fds = os.listdir(f"/proc/{pid}/fd")
        links = _fd_links(pid, fds)
    except FileNotFoundError:  # pid is gone
        return False
    except (OSError, ValueError):
        return True
    return not inodes or any(f"socket:[{inode}]" in links for inode in inodes)


def _fd_links(pid: int, fds: list[str]) -> set[str]:
    """What pid's fds point to; an fd closed since it was listed is left out (the listing's own, for opsctl)."""
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return links


def proc_cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def working_below(folder: str) -> dict[str, list[int]]:
    """Working directory -> pids, for every process whose working directory lies below folder (one scan)."""
    found: dict[str, list[int]] = {}
    below = folder + os.sep
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (cwd := proc_cwd(int(entry.name))) and cwd.startswith(below):
            found.setdefault(cwd, []).append(int(entry.name))
    return found


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """This machine's range of source ports for outgoing connections; None when it cannot be read as one."""
    try:
        words = path.read_text(encoding="ascii").split()
        first, last = (int(w) for w in words)
    except (OSError, UnicodeError, ValueError):
        return None
    return (first, last) if 1 <= first <= last <= 65535 else None
