"""The pure parts of the remote side: inventory, event summaries, control-script output, bastions."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from opsctl.cli.main import main
from opsctl.providers.ansible import parse_control, proc_state
from opsctl.providers.remote import ssh
from opsctl.providers.remote.inventory import build_inventory, parse_bastion, remote_paths
from opsctl.providers.remote.runner import PlaybookTask, child_env, failure_error, summarize, task_event
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, admin_for, make_spec, write_spec


def remote(tmp_path: Path, topology: str = "cluster", **extra):
    spec = make_spec(topology, **extra)
    spec["provider"] = "ansible"
    for i, host in enumerate(spec["hosts"]):
        host.update(ssh_user="ops", ssh_key="/keys/id", ssh_port=2200 + i)
    spec["hosts"][2]["bastion"] = "h1"
    return read_spec(write_spec(tmp_path, spec))


def test_inventory_groups_and_host_vars(tmp_path):
    loaded = remote(tmp_path)
    inv = build_inventory(loaded, "/files", "/kh")
    prefix = f"opsctl_{loaded.spec.name}".replace("-", "_")
    top = inv["all"]["children"][prefix]
    # prefixed (issue 25, convention 10): a bare `masters` group clashed in an inventory merged with another spec's
    assert set(top["children"]) == {f"{prefix}_cluster", f"{prefix}_masters", f"{prefix}_replicas"}
    assert top["vars"]["opsctl_root"] == f"/var/lib/opsctl/{loaded.spec.name}"
    h1, h3 = inv["all"]["hosts"]["h1"], inv["all"]["hosts"]["h3"]
    assert h1["ansible_port"] == 2200 and h1["ansible_user"] == "ops"
    assert "UserKnownHostsFile=/kh" in h1["ansible_ssh_common_args"]
    assert "ProxyCommand=" in h3["ansible_ssh_common_args"] and "ops@" in h3["ansible_ssh_common_args"]
    nodes = [n for h in inv["all"]["hosts"].values() for n in h["opsctl_nodes"]]
    assert len(nodes) == 6 and all(n["files"] == ["redis.conf"] for n in nodes)
    assert PASSWORD not in yaml.safe_dump(inv)


def test_inventory_only_and_sentinel_files(tmp_path):
    loaded = remote(tmp_path, "sentinel")
    first = loaded.layout.nodes[0]
    inv = build_inventory(loaded, "/f", "/kh", only={first.name: ["opsctl-node.json"]})
    assert list(inv["all"]["hosts"]) == [first.host]
    assert inv["all"]["hosts"][first.host]["opsctl_nodes"][0]["files"] == ["opsctl-node.json"]
    sentinel = loaded.layout.sentinels[0]
    assert remote_paths(loaded.spec, sentinel).conf.endswith(f"/{sentinel.name}/sentinel.conf")


def test_inventory_command_writes_files_0600(tmp_path):
    path = write_spec(tmp_path, {**make_spec("standalone"), "provider": "ansible"})
    assert main(["inventory", "-f", str(path), "--dir", str(tmp_path / "inv"), "--with-files"]) == 0
    name = yaml.safe_load(path.read_text())["name"]
    text = (tmp_path / "inv" / f"{name}.yml").read_text()
    assert PASSWORD not in text
    installers = list((tmp_path / "inv" / f"{name}.files").iterdir())
    assert [p.name for p in installers] == ["install-h1.sh"]  # one per host with nodes, holding their files
    assert installers[0].stat().st_mode & 0o777 == 0o600 and PASSWORD.encode() in installers[0].read_bytes()


def test_summarize_counts_and_failures():
    events = [
        {"event": "runner_on_ok", "event_data": {"host": "h1", "task": "A", "res": {"changed": True}}},
        {"event": "runner_on_ok", "event_data": {"host": "h2", "task": "A", "res": {"changed": False}}},
        {"event": "runner_on_ok", "stdout": "changed: [h3]", "event_data": {"host": "h3", "task": "Files",
                                                                               "res": {"censored": "no_log"}}},
        {"event": "runner_on_ok", "stdout": "ok: [h1]", "event_data": {"host": "h1", "task": "Files",
                                                                          "res": {"censored": "no_log"}}},
        {"event": "runner_on_failed", "event_data": {"host": "h2", "task": "Write", "res": {"censored": "x"}}},
        {"event": "runner_on_unreachable", "event_data": {"host": "h3", "task": "B", "res": {"msg": "no route"}}},
    ]
    result = summarize("deploy.yml", 2, events)
    assert (result.changed, result.ok, result.changed_tasks) == (2, 4, ("h1: A", "h3: Files"))
    error = failure_error(result)
    assert "h2" in error.summary and "Write" in error.summary
    assert "no_log" in error.detail and "h3: task 'B': unreachable: no route" in error.detail


def test_runner_events_become_typed_task_events():
    ignored = {"event": "runner_on_failed", "event_data": {"host": "h1", "task": "Probe", "ignore_errors": True}}
    changed = {"event": "runner_on_ok", "stdout": "changed: [h3]", "event_data": {"host": "h3", "task": "Files"}}
    assert task_event("deploy.yml", changed) == PlaybookTask("deploy.yml", "h3", "Files", "changed")
    assert task_event("deploy.yml", ignored) == PlaybookTask("deploy.yml", "h1", "Probe", "failed (ignored)")
    assert task_event("deploy.yml", {"event": "playbook_on_start"}) is None
    assert summarize("deploy.yml", 0, [ignored]).succeeded


def test_child_env_drops_the_callers_environment(tmp_path):
    env = child_env({"PATH": "/bin", "HOME": "/root", "SECRET_PW": PASSWORD}, tmp_path, "/tmp/cp")
    assert "SECRET_PW" not in env and env["HOME"] == "/root" and env["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_parsers():
    assert parse_control("started 42\n") == ("started", 42)
    assert parse_control("failed: x did not start") == ("failed", None)
    assert parse_control("") == ("", None)
    assert parse_bastion("jump@10.0.0.1:2222", "root") == ("jump", "10.0.0.1", 2222)
    assert parse_bastion("[::1]:23", "u") == ("u", "::1", 23)
    assert parse_bastion("bastion.example", "u") == ("u", "bastion.example", 22)
    assert proc_state(b"4242 (valkey-server 1.2.3.4:7000) S 1 4242") == "S"  # the name may hold spaces and ")"
    assert proc_state(b"4242 (a) b) Z 1") == "Z" and proc_state(b"") == ""


def test_playbooks_pass_syntax_check_and_lint():
    import shutil
    import subprocess
    import sys

    from tests.support import missing

    bindir = Path(sys.executable).parent
    playbooks = Path(__file__).resolve().parent.parent / "playbooks"
    names = ["deploy.yml", "restart.yml", "destroy.yml", "exporters.yml"]
    check = subprocess.run([str(bindir / "ansible-playbook"), "--syntax-check", "-i", "localhost,", *names],
                           cwd=playbooks, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    lint = shutil.which("ansible-lint", path=str(bindir))
    if not lint:
        missing("ansible-lint (pip install ansible-lint)")
    site = playbooks.parent / "inventories" / "site.example.yml"  # the role from a site playbook, as users do
    result = subprocess.run([str(lint), "--offline", "--nocolor", str(playbooks), str(site)], capture_output=True,
                            text=True, check=False, cwd=playbooks.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_control_and_purge_commands_run_in_a_real_shell(tmp_path):
    """The commands AnsibleProvider sends over SSH, run here by sh against a fake host root."""
    import subprocess

    from opsctl.providers.ansible import control_command, purge_command

    root = tmp_path / "spec root"
    run = lambda command: subprocess.run(["sh", "-c", command], capture_output=True, text=True)  # noqa: E731
    assert run(control_command(str(root), "status", "n-1")).stdout == "absent\n"  # never deployed
    for node in ("n-1", "n-2"):
        (root / node).mkdir(parents=True)
        (root / node / "redis.conf").write_text("port 1\n")
    (root / "nodes").mkdir()
    (root / "bin").mkdir()
    (root / "nodes" / "n-1.env").write_text("")
    (root / "nodes" / "n-2.env").write_text("")
    assert run(purge_command(str(root), str(root / "n-1"), "n-1", "opsctl-n-1")).returncode == 0
    assert not (root / "n-1").exists() and (root / "n-2").exists() and (root / "bin").exists()
    assert run(purge_command(str(root), str(root / "n-2"), "n-2", "opsctl-n-2")).returncode == 0
    assert not root.exists()  # the last node of the spec on this host takes the spec folder with it


def test_admin_via_ssh_routes_admin_connections_and_needs_the_ansible_provider(tmp_path):
    from opsctl.base.errors import SpecError
    from opsctl.net.connector import Connector

    loaded = remote(tmp_path, "standalone")
    node = loaded.layout.nodes[0]
    admin = admin_for(Connector(loaded, lambda n: ("127.0.0.1", 4242)), node)
    kwargs = admin.client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"]) == ("127.0.0.1", 4242)
    assert admin.endpoint == node.endpoint and admin.name == node.name  # errors still name the node
    assert admin_for(loaded, node).client.connection_pool.connection_kwargs["host"] == node.address

    spec = make_spec("standalone")
    spec["hosts"][0]["admin_via_ssh"] = True
    with pytest.raises(SpecError) as caught:
        read_spec(write_spec(tmp_path, spec))
    assert "admin_via_ssh needs provider: ansible" in caught.value.render()


class _DroppedChannel:
    """A paramiko channel whose SSH connection has gone: paramiko raises a bare EOFError on every request."""

    def __init__(self) -> None:
        self.sock, self.peer = socket.socketpair()
        self.peer.sendall(b"reply")

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def sendall(self, data: bytes) -> None:
        raise EOFError()

    def close(self) -> None:
        self.sock.close()
        raise EOFError()


def test_a_tunnel_pump_ends_quietly_when_the_ssh_connection_drops():
    """A dropped connection ended the pump thread with an unhandled EOFError (CI printed it as a thread
    exception); it must end the thread and close the local end."""
    conn, client = socket.socketpair()
    client.sendall(b"PING\r\n")
    thread_errors: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, thread_errors.append
    try:
        thread = threading.Thread(target=ssh.pump, args=(conn, _DroppedChannel(), threading.Event()))
        thread.start()
        thread.join(5)
    finally:
        threading.excepthook = previous
    assert not thread.is_alive() and thread_errors == []
    assert conn.fileno() == -1


def test_an_ssh_error_for_a_dropped_connection_says_so():
    error = ssh.ssh_error(ssh.SshTarget("h1", "10.0.0.1", 22, "ops", None), EOFError())
    assert error.summary.startswith("cannot connect to host h1 (ops@10.0.0.1:22)")
    assert error.detail == "the SSH connection closed"


def test_paramiko_logs_nothing_on_the_operators_stderr():
    """paramiko logs a refused tunnel channel at ERROR before opsctl reports it: with no handler Python printed
    'Secsh channel 0 open FAILED: ...' bare on stderr during remote applies."""
    code = ("import logging, opsctl.providers.remote.ssh\n"
            "logging.getLogger('paramiko.transport').error('Secsh channel 0 open FAILED: Connection refused')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr == ""


def test_a_login_other_than_root_escalates_through_sudo(tmp_path):
    """ssh_user other than root: opsctl's own commands run through `sudo -n` (as Ansible's become does), quoted
    whole; root logs in and runs them as they are."""
    assert ssh.SshTarget("h1", "10.0.0.1", 22, "ops").become and not ssh.SshTarget("h1", "10.0.0.1").become
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sudo").write_text('#!/bin/sh\n[ "$1" = -n ] && [ "$2" = -- ] || exit 9\nshift 2\nexec "$@"\n')
    (fake / "sudo").chmod(0o755)
    command = ssh.become_command("printf '%s|' \"a b\" $((1 + 1)); echo")
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False,
                          env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert (done.returncode, done.stdout) == (0, "a b|2|\n"), done.stderr
    error = ssh.become_error(ssh.SshTarget("h1", "10.0.0.1", 22, "ops"), "sudo: a password is required")
    assert error.summary == "cannot become root on host h1 (ops@10.0.0.1:22)"
    assert "ops ALL=(root) NOPASSWD: ALL" in error.hint and error.detail == "sudo: a password is required"


def test_purge_removes_the_specs_host_settings_with_its_last_node(tmp_path):
    """sysctl.d, tmpfiles.d and logrotate.d files of the spec go with the spec folder, not before."""
    from opsctl.providers.ansible import purge_command

    root, etc = tmp_path / "spec", tmp_path / "etc"
    etc.mkdir()
    settings = [etc / "60-opsctl-x.conf", etc / "opsctl-x"]
    for path in settings:
        path.write_text("x\n")
    for node in ("n-1", "n-2"):
        (root / node).mkdir(parents=True)
        (root / "nodes").mkdir(exist_ok=True)
        (root / "nodes" / f"{node}.env").write_text("")
    purge = lambda node: subprocess.run(  # noqa: E731
        ["sh", "-c", purge_command(str(root), str(root / node), node, f"opsctl-{node}", [str(p) for p in settings])],
        capture_output=True, text=True, check=False)
    assert purge("n-1").returncode == 0 and all(p.exists() for p in settings)
    assert purge("n-2").returncode == 0 and not root.exists() and not any(p.exists() for p in settings)


def test_host_settings_follow_the_specs_tcp_backlog(tmp_path):
    from opsctl.providers.remote.bundle import logrotate_text, sysctl_text, tmpfiles_text

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    loaded = remote(tmp_path / "a", "standalone", config={"tcp-backlog": 8192})
    assert sysctl_text(loaded.spec).splitlines()[1:] == ["vm.overcommit_memory = 1", "net.core.somaxconn = 8192"]
    assert "net.core.somaxconn = 1024" in sysctl_text(remote(tmp_path / "b", "standalone").spec)
    assert "w /sys/kernel/mm/transparent_hugepage/enabled - - - - never" in tmpfiles_text(loaded.spec)
    rotate = logrotate_text(loaded.spec)
    assert f"/var/lib/opsctl/{loaded.spec.name}/*/server.log {{" in rotate and "    copytruncate\n" in rotate
