"""Test hosts as network namespaces, each with its own sshd and a private view of the deploy directories.

A bridge in the root namespace, one `ip netns` per host joined to it by a veth pair, addresses from the
benchmarking range 198.18.0.0/15 only (bridge .1, hosts .11, .12, ...), no default route: traffic goes only
to these hosts and to loopback. Each host runs
`unshare -m --propagation private sh -c 'mount overlay on /etc; mount tmpfs on the deploy dirs; exec sshd -D'`,
so users and units it creates and the files opsctl deploys stay private to it. Each host has an unprivileged login
`ops` (LOGIN_USER, home on a private tmpfs) with passwordless sudo, as a real host gives its deploy account.

As a module fixture: `yield from tests.support.netns_lab(3)` (torn down afterwards, even on failure).
By hand: `python -m tests.netns up [N]` prints the lab as JSON; `python -m tests.netns down [ID]` removes one
lab or every lab recorded under STATE_ROOT.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_ROOT = Path(os.environ.get("OPSCTL_NETNS_STATE", "/tmp/opsctl-netns"))
DEPLOY_DIRS = ("/var/lib/opsctl", "/home")
# Kernel settings of the whole machine, not of a network namespace (vm.overcommit_memory, transparent huge pages):
# read-only in every host, so a deploy's host tuning reports them refused instead of changing this machine.
READ_ONLY = ("/proc/sys/vm", "/sys/kernel/mm")
LOGIN_USER = "ops"  # the unprivileged login of every lab host: it escalates through sudo (Ansible's become)
SSHD = "/usr/sbin/sshd"
READY_TIMEOUT = 15.0
# Outgoing connections in a host (sshd forwarding an admin tunnel to a node there) take their source port from
# here, above every node port the tests choose (support.free_base_port: below 32768, cluster bus ports
# included): such a connection can neither hold a node's port when the node binds it ("Address already in use")
# nor connect to itself on a port nothing listens on yet.
EPHEMERAL_PORTS = "56000 60999"


@dataclass(frozen=True)
class TestHost:
    name: str
    netns: str
    address: str
    veth: str
    host_key: str  # the public host key line, as it goes into known_hosts


@dataclass(frozen=True)
class Lab:
    id: str
    bridge: str
    gateway: str
    hosts: tuple[TestHost, ...]
    root: str
    key: str
    known_hosts: str

    def spec_hosts(self, user: str = "root") -> list[dict[str, Any]]:
        """Host entries for a spec with provider: ansible."""
        return [{"name": h.name, "address": h.address, "ssh_user": user, "ssh_key": self.key} for h in self.hosts]

    def ssh(self, host: TestHost, command: str, timeout: float = 30,
            user: str = "root") -> subprocess.CompletedProcess[str]:
        """Run a command on a host through the real ssh client (for checks from tests)."""
        argv = ["ssh", "-i", self.key, "-o", f"UserKnownHostsFile={self.known_hosts}", "-o",
                "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{user}@{host.address}", command]
        # the harness's own ssh gets no secret of the test's environment: a secret-watching test on another worker
        # scans every process's environ and must find only what opsctl started
        env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)

    def processes(self, host: TestHost) -> list[str]:
        """Names of the processes running in the host's namespace (sshd, and the servers deployed there)."""
        names = []
        for pid in _netns_pids(host.netns):
            with contextlib.suppress(OSError):
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        return sorted(set(names))


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def _used_subnets() -> set[int]:
    text = _run("ip", "-o", "-4", "addr", "show", check=False).stdout
    return {int(part.split(".")[2]) for part in text.split() if part.startswith("198.18.")}


def _new_id() -> tuple[str, int]:
    used = _used_subnets()
    free = [n for n in range(1, 255) if n not in used]
    if not free:
        raise RuntimeError("no free /24 left in 198.18.0.0/16")
    return f"{random.randrange(16**4):04x}", random.choice(free)


def sshd_config(host_dir: Path, address: str, authorized: Path) -> str:
    return "\n".join([
        "Port 22", f"ListenAddress {address}", f"HostKey {host_dir / 'ssh_host_ed25519_key'}", "PidFile none",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", f"AuthorizedKeysFile {authorized} .ssh/authorized_keys", "StrictModes no",
        "UsePAM no",
        "AllowTcpForwarding yes", "PermitTunnel no", "X11Forwarding no", "MaxStartups 100:30:200",
        "MaxSessions 50", "Subsystem sftp internal-sftp", "LogLevel ERROR", "",
    ])


def login_user_steps(authorized: Path, user: str = LOGIN_USER) -> list[str]:
    """Commands (run in the host's private /etc and /home) that add an unprivileged login with passwordless sudo
    and the lab's client key in its own authorized_keys (sshd reads that file as the user, and the lab's copy is
    root's). Its password field is `*`, not useradd's locked `!`: sshd without PAM refuses keys for a locked account."""
    sudoers, ssh_dir = f"/etc/sudoers.d/opsctl-lab-{user}", f"/home/{user}/.ssh"
    return [f"useradd --create-home --home-dir /home/{user} --shell /bin/sh --password '*' {user}",
            f"mkdir -m 0700 {ssh_dir}", f"cp {authorized} {ssh_dir}/authorized_keys", f"chown -R {user}: {ssh_dir}",
            "mkdir -p /etc/sudoers.d", f"printf '%s\\n' '{user} ALL=(ALL) NOPASSWD: ALL' > {sudoers}",
            f"chmod 0440 {sudoers}"]


def host_script(host_dir: Path, config: Path, authorized: Path) -> str:
    """What runs inside the host's mount namespace: private /etc (overlay), tmpfs deploy dirs and /home, the
    machine-wide kernel settings read-only, the login user, then sshd."""
    upper, work = host_dir / "etc-upper", host_dir / "etc-work"
    mounts = [f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"]
    mounts += [f"mkdir -p {d} && mount -t tmpfs -o mode=0755 tmpfs {d}" for d in DEPLOY_DIRS]
    mounts += [f"mount --bind {d} {d} && mount -o remount,bind,ro {d}" for d in READ_ONLY]
    steps = ["set -e", f"hostname {host_dir.name}", f"mkdir -p {upper} {work} /run/sshd", *mounts,
             f"printf '127.0.1.1 %s\\n' {host_dir.name} >> /etc/hosts", *login_user_steps(authorized)]
    return " && ".join([*steps, f"exec {SSHD} -D -e -f {config}"])


def _keygen(path: Path, comment: str) -> str:
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return (path.with_suffix(".pub") if path.suffix else Path(f"{path}.pub")).read_text().strip()


def _add_host(lab_id: str, subnet: int, index: int, bridge: str, root: Path, authorized: Path) -> TestHost:
    name, netns, veth = f"h{index}", f"ops{lab_id}h{index}", f"ov{lab_id}h{index}"
    address = f"198.18.{subnet}.{10 + index}"
    _run("ip", "netns", "add", netns)
    _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    _run("ip", "link", "set", veth, "master", bridge, "up")
    for argv in (("addr", "add", f"{address}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                 ("link", "set", "lo", "up")):
        _run("ip", "-n", netns, *argv)
    _run("ip", "netns", "exec", netns, "sysctl", "-qw", f"net.ipv4.ip_local_port_range={EPHEMERAL_PORTS}")
    host_dir = root / name
    host_dir.mkdir(mode=0o700)
    public = _keygen(host_dir / "ssh_host_ed25519_key", f"{name}@opsctl-lab")
    config = host_dir / "sshd_config"
    config.write_text(sshd_config(host_dir, address, authorized))
    log = (host_dir / "sshd.log").open("w")
    subprocess.Popen(["ip", "netns", "exec", netns, "unshare", "-m", "-u", "--propagation", "private", "sh", "-c",
                      host_script(host_dir, config, authorized)], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                     start_new_session=True)
    log.close()
    key_type, key_data = public.split()[:2]
    return TestHost(name, netns, address, veth, f"{address} {key_type} {key_data}")


def _wait_ready(lab: Lab) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    pending = list(lab.hosts)
    while pending:
        pending = [h for h in pending if not _accepts(h.address, 22)]
        if pending and time.monotonic() > deadline:
            logs = {h.name: (Path(lab.root) / h.name / "sshd.log").read_text()[-500:] for h in pending}
            raise RuntimeError(f"sshd did not come up on {[h.name for h in pending]}: {logs}")
        time.sleep(0.01)


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.2) as sock:
            sock.settimeout(0.5)
            return sock.recv(4).startswith(b"SSH")
    except OSError:
        return False


def up(count: int = 3) -> Lab:
    """Create count hosts; on any failure, remove what was made and re-raise."""
    lab_id, subnet = _new_id()
    root = STATE_ROOT / lab_id
    root.mkdir(parents=True, mode=0o700)
    bridge, gateway = f"opsbr{lab_id}", f"198.18.{subnet}.1"
    partial = Lab(lab_id, bridge, gateway, (), str(root), str(root / "id_ed25519"), str(root / "known_hosts"))
    _save(partial, count, subnet)
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{gateway}/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        client_public = _keygen(root / "id_ed25519", f"opsctl-lab-{lab_id}")
        authorized = root / "authorized_keys"
        authorized.write_text(client_public + "\n")
        hosts = tuple(_add_host(lab_id, subnet, i, bridge, root, authorized) for i in range(1, count + 1))
        lab = Lab(lab_id, bridge, gateway, hosts, str(root), partial.key, partial.known_hosts)
        Path(lab.known_hosts).write_text("".join(h.host_key + "\n" for h in hosts))
        _save(lab, count, subnet)
        _wait_ready(lab)
        return lab
    except BaseException:
        down(lab_id)
        raise


def _save(lab: Lab, count: int, subnet: int) -> None:
    (Path(lab.root) / "lab.json").write_text(json.dumps({**asdict(lab), "count": count, "subnet": subnet}))


def _load(lab_id: str) -> dict[str, Any]:
    path = STATE_ROOT / lab_id / "lab.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _netns_pids(netns: str) -> list[int]:
    text = _run("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in text.split() if p.isdigit()]


def _kill_all(netns: str) -> None:
    """Every process in the host's namespace (its sshd and the servers deployed there): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        pids = _netns_pids(netns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.01)
            pids = _netns_pids(netns)
        if not pids:
            return


def down(lab_id: str) -> None:
    """Remove a lab: processes, namespaces, veths, the bridge, its addresses and its state dir. Best effort."""
    state = _load(lab_id)
    count = int(state.get("count", 0))
    for index in range(1, count + 1):
        netns = f"ops{lab_id}h{index}"
        if Path(f"/run/netns/{netns}").exists():
            _kill_all(netns)
            _run("ip", "netns", "del", netns, check=False)
        _run("ip", "link", "del", f"ov{lab_id}h{index}", check=False)
    _run("ip", "link", "del", f"opsbr{lab_id}", check=False)
    shutil.rmtree(STATE_ROOT / lab_id, ignore_errors=True)


def recorded() -> list[str]:
    return sorted(p.parent.name for p in STATE_ROOT.glob("*/lab.json")) if STATE_ROOT.is_dir() else []


def unavailable() -> str | None:
    """Why this machine cannot host a lab, or None."""
    if os.geteuid() != 0:
        return "root (for ip netns)"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen", "useradd", "sudo"):
        if not shutil.which(tool):
            return tool
    return None if Path(SSHD).exists() else "openssh-server (/usr/sbin/sshd)"


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "up":
        lab = up(int(argv[1]) if len(argv) > 1 else 3)
        print(json.dumps(asdict(lab), indent=2))
        return 0
    if len(argv) >= 1 and argv[0] == "down":
        for lab_id in argv[1:] or recorded():
            down(lab_id)
            print(f"removed lab {lab_id}")
        return 0
    print("usage: python -m tests.netns up [N] | down [ID...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
