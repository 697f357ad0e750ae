"""The Ansible provider: nodes on SSH hosts, deployed by playbooks/deploy.yml (ansible-runner).

Writes are staged and land in one deploy.yml run before the next start/read/stop/close; reads see them first.
start/stop/purge: one SSH command each; process_state and read_file use the kept SFTP session. Node files travel only
in 0600 installers (never vars, env, command lines). See docs/remote.md."""

from __future__ import annotations

import shlex
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

try:
    import paramiko
except ImportError as exc:  # provider: ansible without its extra: say which to install, not a traceback
    from opsctl.providers.binaries import ansible_extra_error, missing_ansible_libraries

    raise ansible_extra_error(missing_ansible_libraries()) from exc

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit
from opsctl.net.connector import Route
from opsctl.net.fanout import fan_out
from opsctl.providers.base import ProcessState, parse_record, record_text
from opsctl.providers.binaries import require_ansible
from opsctl.providers.proc import ProcFacts, is_node_process, listening_inodes, parse_cmdline
from opsctl.providers.remote import ssh
from opsctl.providers.remote.bundle import (
    HOSTS_FILE,
    host_setting_paths,
    parse_hosts_table,
    parse_tombstones,
    plain_name,
    stage,
)
from opsctl.providers.remote.inventory import (
    binary_path,
    build_inventory,
    remote_paths,
    remote_root,
    settings_path,
    unit_name,
)
from opsctl.providers.remote.runner import PlaybookResult, private_dir, run_playbook
from opsctl.render import NodePaths, render_node
from opsctl.render.directives import plaintext_port
from opsctl.spec.deployed import NodeRecord, is_node_name
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Host
from opsctl.tls.material import node_files

RECORD = "opsctl-node.json"
PIDFILE_LIMIT = 64
PROC_LIMIT = 64 << 10
T = TypeVar("T")
WRITTEN_ONCE = ("sentinel.conf",)  # deploy.yml never overwrites these: Sentinel rewrites its own file
FileMap = dict[str, dict[str, str]]


def parse_control(stdout: str) -> tuple[str, int | None]:
    """`opsctl-node` output: its first word (started|running|stopped|absent|failed) and the pid if any."""
    words = stdout.split()
    word = words[0].rstrip(":") if words else ""
    pid = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    return word, pid


class AnsibleProvider:
    """Servers on SSH hosts. Paths: /var/lib/opsctl/<spec>/<node>."""

    daemonize = True
    stages_files = True

    def __init__(self, loaded: LoadedSpec, state_dir: Path, known_hosts: str | None = None,
                 on_event: Emit | None = None, hosts_of: AnsibleProvider | None = None) -> None:
        """hosts_of: the provider that read the records this spec was placed from (runtime.opening); this one
        takes over its SSH connections and tunnels and the hosts and tombstones it found, and closes them."""
        require_ansible()  # paramiko imported, ansible-runner or ansible-core may still be missing
        self.loaded = loaded
        self.state_dir = Path(state_dir).resolve()
        self.known_hosts = ssh.known_hosts_path(known_hosts)
        self.on_event = on_event
        self._pending: FileMap = {}
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._sftps: dict[str, paramiko.SFTPClient] = {}
        self._host_locks: dict[tuple[str, str], threading.Lock] = {}
        self._host_locks_guard = threading.Lock()  # not self._lock: admin_endpoint connects while holding that
        self._node_dirs: dict[str, str] = {}
        self._removed: dict[str, Host] = {}  # hosts the spec no longer has that hold live nodes (deployed_records)
        self._tombstones: dict[str, dict[str, object]] = {}  # retired names -> placement, carried in every hosts table
        self._tunnels: dict[str, ssh.Tunnel] = {}
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self.last_result: PlaybookResult | None = None
        if hosts_of is not None:
            self.known_hosts = hosts_of.known_hosts
            self._clients, self._sftps, self._tunnels = hosts_of._clients, hosts_of._sftps, hosts_of._tunnels
            self._host_locks, self._removed, self._tombstones = (hosts_of._host_locks, hosts_of._removed,
                                                                 hosts_of._tombstones)

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "ansible"

    def paths(self, node: Node) -> NodePaths:
        return remote_paths(self.loaded.spec, node)

    # --- playbooks -----------------------------------------------------------------------------------------

    def rendered(self, nodes: list[Node] | None = None) -> FileMap:
        """Every node's files with real secrets, for deploy()."""
        chosen = list(self.loaded.layout.nodes) if nodes is None else nodes
        return {n.name: {**render_node(self.loaded, n, self.paths(n), reveal=True, daemonize=True).files,
                         **node_files(self.loaded, self.state_dir, n)} for n in chosen}

    def deploy(self, files: FileMap | None = None, start: bool = True) -> PlaybookResult:
        """One deploy.yml run for these nodes' files (default: all nodes, freshly rendered)."""
        chosen = self.rendered() if files is None else files
        staging = private_dir(self.data_dir) / "files"
        try:
            stage(self.loaded, staging, chosen, [*self.loaded.spec.hosts, *self._removed.values()], self._tombstones)
            inventory = build_inventory(self.loaded, str(staging), self.known_hosts,
                                        only={node: sorted(named) for node, named in chosen.items()},
                                        removed=list(self._removed.values()))
            self.last_result = run_playbook("deploy.yml", self.data_dir, inventory, {"opsctl_start": start},
                                            self.on_event)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self.last_result

    def playbook(self, name: str, extravars: dict[str, Any] | None = None) -> PlaybookResult:
        """restart.yml or destroy.yml over every node of the spec."""
        inventory = build_inventory(self.loaded, str(self.data_dir / "files"), self.known_hosts,
                                    removed=list(self._removed.values()))
        self.last_result = run_playbook(name, self.data_dir, inventory, extravars, self.on_event)
        return self.last_result

    def flush(self) -> PlaybookResult | None:
        """Ship what is staged (one deploy.yml run). Threads that call it at once (reads of nodes side by side)
        wait for the one running the playbook and find nothing left to ship."""
        with self._flushing:
            if not self._pending:
                return None
            pending, self._pending = self._pending, {}
            return self.deploy(pending, start=False)

    # --- the Provider contract -----------------------------------------------------------------------------

    def write_files(self, node: Node, files: dict[str, str]) -> None:
        staged = self._pending.setdefault(node.name, {})
        staged.update({plain_name(name): text for name, text in files.items()})

    def save_record(self, node: Node, record: NodeRecord) -> None:
        self.write_files(node, {RECORD: record_text(record, indent=2)})

    def read_file(self, node: Node, name: str) -> str | None:
        """The file as the host will have it: a staged copy answers without a playbook run."""
        staged = self._pending.get(node.name, {}).get(plain_name(name))
        if staged is not None and name not in WRITTEN_ONCE:
            return staged
        if staged is not None:
            self.flush()
        path = f"{self.paths(node).dir}/{name}"
        return self._over_sftp(node, lambda sftp: ssh.read_file(sftp, path), f"read {path} on")

    def load_record(self, node: Node) -> NodeRecord:
        return parse_record(self.read_file(node, RECORD), f"{RECORD} on host {node.host}")

    def deployed_records(self) -> dict[str, NodeRecord]:
        """The records of the spec's server folders on every host (one SFTP listing of the spec's root each, then
        each record): a fresh state dir finds what is deployed where it runs. A host the spec no longer has is
        found in the hosts table its base archive left on the others (hosts.json): its records are read too, and
        while it holds a live node it stays reachable (drained by apply); one that cannot be reached is left out."""
        spec = self.loaded.spec
        if spec.topology == "standalone":
            return {}
        merged: dict[str, NodeRecord] = {}
        listed: list[Host] = []
        carried: dict[str, NodeRecord] = {}
        for found, table, tombstones in fan_out(self._records_on, list(spec.hosts)):
            merged.update(found)
            listed += table
            carried.update(tombstones)
        names = {h.name for h in spec.hosts}
        removed = {h.name: h for h in listed if h.name not in names}
        self._removed.update(removed)
        for host in removed.values():
            try:
                found, _, tombstones = self._records_on(host)
            except OpsctlError:
                found, tombstones = {}, {}
            carried.update(tombstones)
            if not any(not record.retired for record in found.values()):
                self._removed.pop(host.name, None)
            merged.update(found)
        merged = {**carried, **merged}  # a record on its host wins over the copy a table carries
        self._tombstones = {name: record.deployed.to_json() for name, record in merged.items()
                            if record.retired and record.deployed is not None}
        return merged

    def _records_on(self, host: Host) -> tuple[dict[str, NodeRecord], list[Host], dict[str, NodeRecord]]:
        """The node records under the spec's root on host, and the hosts and tombstones of the table lying there."""
        spec = self.loaded.spec
        root = remote_root(spec)
        probe = Node(f"{spec.name}-0", host.name, host.address, 0, "master")

        def look(sftp: paramiko.SFTPClient) -> tuple[dict[str, NodeRecord], list[Host], dict[str, NodeRecord]]:
            try:
                entries = sorted(sftp.listdir(root))
            except OSError:
                return {}, [], {}
            found = {}
            for entry in entries:
                if not is_node_name(spec, entry):
                    continue
                record = parse_record(ssh.read_file(sftp, f"{root}/{entry}/{RECORD}"),
                                      f"{RECORD} of {entry} on host {host.name}")
                if record:
                    found[entry] = record
            table = ssh.read_file(sftp, f"{root}/{HOSTS_FILE}")
            return found, parse_hosts_table(table), parse_tombstones(table)

        return self._over_sftp(probe, look, f"list {root} on")

    def start(self, node: Node) -> None:
        self.flush()
        self._start(node)

    def start_many(self, nodes: Sequence[Node], launched: Callable[[], None] | None = None) -> dict[str, OpsctlError]:
        """Ship what is staged, then start every node at once (one SSH command each, side by side); launched is
        called once they all returned (a start's SSH command returns once the node is up)."""
        try:
            self.flush()
        except OpsctlError as exc:
            first, *rest = nodes
            return {first.name: exc} | {n.name: OpsctlError(f"{n.name} was not started: its files were not shipped",
                                                              f"see {first.name}: {exc.summary}") for n in rest}

        def start_one(node: Node) -> OpsctlError | None:
            try:
                self._start(node)
            except OpsctlError as exc:
                return exc
            return None

        outcomes = fan_out(start_one, list(nodes))
        if launched is not None:
            launched()
        return {n.name: exc for n, exc in zip(nodes, outcomes, strict=True) if exc is not None}

    def _start(self, node: Node) -> None:
        """bin/opsctl-node start (one start of a node at a time on its host; a server of the node that runs
        already counts as started), then the pid it names must be the node's server in /proc."""
        result = self._control(node, "start")
        word, pid = parse_control(result.stdout)
        if result.status != 0 or word not in ("started", "running"):
            detail = (result.stdout + result.stderr).strip()[-2000:]
            hint = ("deploy it first: `opsctl apply` writes its files" if word == "absent"
                    else "the node's log is at " + self.paths(node).log)
            raise OpsctlError(f"cannot start {node.name} on host {node.host}", detail, hint)
        state = self.process_state(node)
        if not state.running or state.pid != pid:
            raise OpsctlError(f"{node.name} on host {node.host} reported {word} as pid {pid}, but that is not "
                              "its server", f"what /proc shows: {state.detail}",
                              "the node's log is at " + self.paths(node).log)

    def stop(self, node: Node, timeout: float = 30.0) -> None:
        self.flush()
        result = self._control(node, "stop", timeout + 10)
        if result.status != 0:
            raise OpsctlError(f"cannot stop {node.name} on host {node.host}", (result.stdout + result.stderr).strip())

    def process_state(self, node: Node) -> ProcessState:
        """The node's server, read over the host's kept SFTP session (no process started: waits poll this).
        The pidfile's pid must be the node's server in /proc (binary, port, working folder). With the pidfile gone or
        stale while something listens on the port, bin/opsctl-node names the listener, checked the same way: a
        running server is never called down for want of its pidfile."""
        spec, paths = self.loaded.spec, self.paths(node)

        def look(sftp: paramiko.SFTPClient) -> tuple[int | None, bool, bool]:
            text = ssh.read_bytes(sftp, paths.pid, PIDFILE_LIMIT) or b""
            if text.strip().isdigit() and self._is_server(sftp, node, int(text)):
                return int(text), True, False
            deployed = ssh.read_bytes(sftp, settings_path(spec, node), 0) is not None
            return None, deployed, deployed and self._port_listens(sftp, node)

        pid, deployed, listens = self._over_sftp(node, look, "look at the processes of")
        if listens:  # the pidfile is gone or stale, but something listens on the node's port: is it the node?
            pid = self._listener(node)
        if pid is not None:
            return ProcessState(node.name, True, pid, f"running as pid {pid} on host {node.host}")
        if deployed:
            return ProcessState(node.name, False, None, f"stopped on host {node.host}")
        return ProcessState(node.name, False, None, f"not deployed on host {node.host}")

    def _is_server(self, sftp: paramiko.SFTPClient, node: Node, pid: int) -> bool:
        """/proc/<pid> shows the node's server: its binary, in its folder, with its config or port."""
        spec, paths = self.loaded.spec, self.paths(node)
        facts = remote_process(sftp, pid)
        folder = self._node_dir(sftp, node) if facts else None
        return bool(facts and folder and is_node_process(facts, binary_path(spec), folder, paths.conf, node.port,
                                                         plaintext_port(spec, node)))

    @staticmethod
    def _port_listens(sftp: paramiko.SFTPClient, node: Node) -> bool:
        """Something listens on the node's address and port in its host's network namespace (/proc/net)."""
        tables = [(ssh.read_bytes(sftp, f"/proc/net/{table}") or b"").decode("ascii", "replace")
                  for table in ("tcp", "tcp6")]
        try:
            return any(listening_inodes(table, node.address, node.port) for table in tables)
        except ValueError:  # a host name, not an address: any listener on the port
            return any(f":{node.port:04X}" in line.split()[1] and line.split()[3] == "0A"
                       for table in tables for line in table.splitlines()[1:] if len(line.split()) > 3)

    def _listener(self, node: Node) -> int | None:
        """The pid of the node's server found on its port by bin/opsctl-node (ss -p), checked in /proc here."""
        word, pid = parse_control(self._control(node, "status").stdout)
        if word != "running" or pid is None:
            return None
        return pid if self._over_sftp(node, lambda sftp: self._is_server(sftp, node, pid), "look at") else None

    def purge(self, node: Node, keep_record: bool = False) -> None:
        state = self.process_state(node)
        if state.running:
            raise RefusedError(f"refusing to delete the folder of {node.name}: its server runs as pid {state.pid}",
                               f"{node.host}:{self.paths(node).dir}", "stop the node first")
        if keep_record:
            self.flush()  # the tombstone lands before anything goes
        self._pending.pop(node.name, None)
        spec = self.loaded.spec
        result = self._run(node, purge_command(remote_root(spec), self.paths(node).dir, node.name, unit_name(node),
                                               host_setting_paths(spec), keep=RECORD if keep_record else None))
        if result.status != 0:
            raise OpsctlError(f"cannot delete the folder of {node.name} on host {node.host}", result.stderr.strip())

    def close(self) -> None:
        """Land staged files, then drop tunnels and SSH connections. Servers outlive the provider on purpose."""
        try:
            self.flush()
        finally:
            with self._lock:
                for tunnel in self._tunnels.values():
                    tunnel.close()
                self._tunnels.clear()
            for sftp in self._sftps.values():
                sftp.close()
            self._sftps.clear()
            for client in self._clients.values():
                ssh.close(client)
            self._clients.clear()

    # --- SSH -----------------------------------------------------------------------------------------------

    def _host(self, node: Node) -> Host:
        """The node's host: the spec's, else a removed one deployed_records found (a host being drained)."""
        host = next((h for h in self.loaded.spec.hosts if h.name == node.host), None) or self._removed.get(node.host)
        if host is None:
            raise OpsctlError(f"host {node.host} of {node.name} is not in the spec, and no host of the spec names "
                              "its SSH settings", hint=f"put host {node.host} back in the spec, then apply again")
        return host

    def _target(self, node: Node) -> ssh.SshTarget:
        return ssh.target_for(self.loaded.spec, self._host(node))

    def _host_lock(self, purpose: str, host: str) -> threading.Lock:
        with self._host_locks_guard:
            return self._host_locks.setdefault((purpose, host), threading.Lock())

    def _client(self, node: Node) -> paramiko.SSHClient:
        """The host's SSH client, connected once and shared by threads (FleetView looks at nodes in parallel);
        hosts connect side by side."""
        with self._host_lock("connect", node.host):
            client = self._clients.get(node.host)
            transport = client.get_transport() if client else None
            if client is None or transport is None or not transport.is_active():
                client = ssh.connect(self._target(node), self.known_hosts)
                self._clients[node.host] = client
            return client

    def _over_sftp(self, node: Node, use: Callable[[paramiko.SFTPClient], T], doing: str) -> T:
        """use(the host's SFTP session): opened once per connection, one caller at a time (paramiko's SFTP client
        takes no concurrent requests); each request is a round trip inside sshd, no process started."""
        try:
            with self._host_lock("sftp", node.host):
                sftp = self._sftps.get(node.host)
                channel = sftp.get_channel() if sftp else None
                if sftp is None or channel is None or channel.closed:
                    sftp = self._sftps[node.host] = ssh.open_sftp(self._client(node), self._target(node))
                return use(sftp)
        except ssh.GONE as exc:
            raise ssh.ssh_error(self._target(node), exc, doing) from None

    def _node_dir(self, sftp: paramiko.SFTPClient, node: Node) -> str | None:
        """The node's folder with links resolved on its host (what /proc/<pid>/cwd shows), once per node."""
        if node.name not in self._node_dirs:
            resolved = ssh.realpath(sftp, self.paths(node).dir)
            if resolved is None:
                return None
            self._node_dirs[node.name] = resolved
        return self._node_dirs[node.name]

    def _run(self, node: Node, command: str, timeout: float = 60.0) -> ssh.CommandResult:
        try:
            return ssh.run(self._client(node), command, timeout, self._target(node).become)
        except ssh.GONE as exc:
            raise ssh.ssh_error(self._target(node), exc, "run a command on") from None

    def _control(self, node: Node, action: str, timeout: float = 60.0) -> ssh.CommandResult:
        return self._run(node, control_command(remote_root(self.loaded.spec), action, node.name), timeout)

    def tunnel(self, node: Node) -> ssh.Tunnel:
        """127.0.0.1:<tunnel.local_port> reaches the node's port as its host sees it (close() when done)."""
        return ssh.Tunnel(self._client(node), node.address, node.port)

    def admin_route(self) -> Route | None:
        """The connector's route when some host has admin_via_ssh, else None (direct connections)."""
        return self.admin_endpoint if any(h.admin_via_ssh for h in self.loaded.spec.hosts) else None

    def admin_endpoint(self, node: Node) -> tuple[str, int]:
        """Where admin connections to node go: its address, or a tunnel (kept until close()) when its host
        has admin_via_ssh."""
        if not self._host(node).admin_via_ssh:
            return node.address, node.port
        with self._lock:
            tunnel = self._tunnels.get(node.name)
            if tunnel is None or not tunnel.active:
                if tunnel is not None:
                    tunnel.close()
                try:
                    tunnel = self._tunnels[node.name] = self.tunnel(node)
                except ssh.GONE as exc:
                    raise ssh.ssh_error(self._target(node), exc, "open an admin tunnel to") from None
        return "127.0.0.1", tunnel.local_port



def remote_process(sftp: paramiko.SFTPClient, pid: int) -> ProcFacts | None:
    """/proc/<pid> on the host as ProcFacts; None when the pid is gone or a zombie."""
    stat = ssh.read_bytes(sftp, f"/proc/{pid}/stat", PROC_LIMIT)
    if stat is None or proc_state(stat) in ("", "Z", "X"):
        return None
    cmdline = ssh.read_bytes(sftp, f"/proc/{pid}/cmdline", PROC_LIMIT) or b""
    return ProcFacts(pid, ssh.readlink(sftp, f"/proc/{pid}/exe"), ssh.readlink(sftp, f"/proc/{pid}/cwd"),
                     parse_cmdline(cmdline))


def proc_state(stat: bytes) -> str:
    """The state letter of a /proc/<pid>/stat line (after the command name, which may hold spaces)."""
    fields = stat.rpartition(b")")[2].split()
    return fields[0].decode("ascii", "replace") if fields else ""


def control_command(root: str, action: str, node: str) -> str:
    """bin/opsctl-node ACTION NODE; prints `absent` when the host has no opsctl files (never deployed or purged)."""
    script = shlex.quote(f"{root}/bin/opsctl-node")
    return f"if [ -x {script} ]; then exec {script} {action} {shlex.quote(node)}; else echo absent; fi"


def purge_command(root: str, node_dir: str, node: str, unit: str, host_files: Sequence[str] = (),
                  keep: str | None = None) -> str:
    """Delete a stopped node's folder, settings and unit; the spec folder and the spec's host settings (host_files)
    too once no node is left there. keep: a file of the folder that stays (a retired node's tombstone record), and
    then the spec folder stays too."""
    q = shlex.quote
    unit_file = q(f"/etc/systemd/system/{unit}.service")
    with_root = " ".join(q(path) for path in [root, *host_files])
    folder = (f"rm -rf -- {q(node_dir)}" if keep is None else f"if [ -d {q(node_dir)} ]; then find {q(node_dir)} "
              f"-mindepth 1 -maxdepth 1 ! -name {q(keep)} -exec rm -rf -- {{}} + || exit 1; fi; rm -f --")
    return "; ".join([
        f"{folder} {q(f'{root}/nodes/{node}.env')} || exit 1",
        f"if [ -f {unit_file} ]; then systemctl disable {q(unit)} >/dev/null 2>&1; rm -f -- {unit_file}; "
        "systemctl daemon-reload >/dev/null 2>&1; fi",
        *([f"if rmdir {q(f'{root}/nodes')} 2>/dev/null; then rm -rf -- {with_root}; fi"] if keep is None else []),
        "true",
    ])
