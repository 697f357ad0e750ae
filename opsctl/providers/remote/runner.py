"""Run playbooks through ansible-runner in a private data dir, with a scrubbed environment.

The child gets only PATH, HOME, locale and the ANSIBLE_* settings below: ansible-runner writes its whole environment
into artifacts/<ident>/command, and the caller's may hold the spec's password. Extra vars hold paths only. Progress:
the JSON events ansible-runner prints (-j), as typed PlaybookTask events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from opsctl import data_dir
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Event, Redrawn
from opsctl.base.frozen import Frozen, frozen
from opsctl.providers.remote.inventory import inventory_yaml
from opsctl.state.safefs import make_dir, trusted_owners, write_private


@frozen
class PlaybookTask(Frozen, Event):
    """A task of an Ansible playbook finished on a host: ok, changed, failed, unreachable or skipped."""

    kind: ClassVar[str] = "playbook-task"
    redrawn: ClassVar[Redrawn] = "bar"
    playbook: str
    host: str
    task: str
    status: str

    def line(self) -> str:
        return f"{self.playbook}: {self.host}: {self.status}: {self.task}"


KEPT_ENV = ("HOME", "LANG", "LC_ALL", "TZ", "SSH_AUTH_SOCK", "USER")
TASK_STATUS = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_unreachable": "unreachable",
               "runner_on_skipped": "skipped"}


@dataclass(frozen=True)
class TaskFailure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass(frozen=True)
class PlaybookResult:
    playbook: str
    rc: int
    changed: int = 0
    ok: int = 0
    failures: tuple[TaskFailure, ...] = ()
    changed_tasks: tuple[str, ...] = field(default=())

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and not self.failures


# --- pure partners -----------------------------------------------------------------------------------------


def failure_message(res: dict[str, Any]) -> str:
    if res.get("censored"):
        return "details hidden (the task handles secrets: no_log)"
    parts = [str(res.get("msg") or "").strip(), str(res.get("stderr") or "").strip(),
             str(res.get("stdout") or "").strip()]
    return "\n".join(p for p in parts if p)[:2000] or "task failed"


def summarize(playbook: str, rc: int, events: Iterable[dict[str, Any]]) -> PlaybookResult:
    """Count changed/ok tasks and collect failures (host, task, message) from ansible-runner events."""
    changed, ok, failures, changed_tasks = 0, 0, [], []
    for event in events:
        task = task_event(playbook, event)
        res = (event.get("event_data") or {}).get("res") or {}
        if task is None:
            continue
        if task.status in ("ok", "changed"):
            ok += 1
            if task.status == "changed":
                changed += 1
                changed_tasks.append(f"{task.host}: {task.task}")
        elif task.status in ("failed", "unreachable"):
            failures.append(TaskFailure(task.host, task.task, failure_message(res), task.status == "unreachable"))
    return PlaybookResult(playbook, rc, changed, ok, tuple(failures), tuple(changed_tasks))


def task_event(playbook: str, event: dict[str, Any]) -> PlaybookTask | None:
    """The typed form of an ansible-runner event that ends a task on a host; None for any other event."""
    status = TASK_STATUS.get(str(event.get("event", "")))
    if status is None:
        return None
    data = event.get("event_data") or {}
    # a no_log task's result reaches the event censored, without "changed"; its display line keeps it
    if status == "ok" and ((data.get("res") or {}).get("changed")
                           or str(event.get("stdout", "")).lstrip().startswith("changed:")):
        status = "changed"
    if status == "failed" and data.get("ignore_errors"):
        status = "failed (ignored)"
    return PlaybookTask(playbook, str(data.get("host", "?")), str(data.get("task", "?")), status)


def failure_error(result: PlaybookResult) -> OpsctlError:
    lines = [f"{f.host}: task '{f.task}': {'unreachable: ' if f.unreachable else ''}{f.message}"
             for f in result.failures] or [f"ansible-playbook exited with status {result.rc}"]
    first = result.failures[0] if result.failures else None
    where = f" on host {first.host}, task '{first.task}'" if first else ""
    hint = ("check the host's address, ssh_user, ssh_key and known_hosts" if first and first.unreachable
            else "the playbook's artifacts are in the ansible data dir under the state dir")
    return OpsctlError(f"{result.playbook} failed{where}", "\n".join(lines), hint)


def child_env(base: dict[str, str], data: Path, control_dir: str) -> dict[str, str]:
    env = {k: base[k] for k in KEPT_ENV if k in base}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "/usr/bin:/bin")])
    env.update({
        "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_PIPELINING": "True", "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_LOCAL_TEMP": str(data / "tmp"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": control_dir, "ANSIBLE_SSH_CONTROL_PATH": "%(directory)s/%%C",
        "ANSIBLE_DISPLAY_ARGS_TO_STDOUT": "False", "ANSIBLE_FORKS": "10", "ANSIBLE_GATHERING": "explicit",
        # No log file, whatever an ansible.cfg says (an empty value made ansible warn on every run).
        "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_LOG_PATH": os.devnull,
    })
    return env


# --- I/O -----------------------------------------------------------------------------------------------------


def private_dir(path: Path) -> Path:
    """A 0700 folder of opsctl's own (created if missing); a link or someone else's folder is refused."""
    make_dir(path, 0o700, trusted_owners())
    return path


def run_playbook(name: str, data: Path, inventory: dict[str, Any], extravars: dict[str, Any] | None = None,
                 on_event: Emit | None = None, timeout: float = 1800.0) -> PlaybookResult:
    """Run playbooks/<name> against inventory (no secrets in it). Raises OpsctlError on failure."""
    data = private_dir(data)
    for sub in ("inventory", "env", "tmp"):
        private_dir(data / sub)
    write_private(data / "inventory" / "hosts.yml", inventory_yaml(inventory))
    write_private(data / "env" / "extravars", json.dumps(extravars or {}))
    playbooks = data_dir("playbooks")
    ident = f"{name.removesuffix('.yml')}-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "ansible_runner", "run", str(data), "-p", str(playbooks / name), "-j",
            "--project-dir", str(playbooks), "--ident", ident, "--rotate-artifacts", "20"]
    events: list[dict[str, Any]] = []
    # SSH control sockets need a short path (< 108 bytes): a private folder in the temp dir, removed after.
    with tempfile.TemporaryDirectory(prefix="opsctl-cp-") as control_dir:
        rc = _stream(name, argv, child_env(dict(os.environ), data, control_dir), data, events, on_event, timeout)
    result = summarize(name, rc, events)
    if not result.succeeded:
        raise failure_error(result)
    return result


def _stream(playbook: str, argv: list[str], env: dict[str, str], data: Path, events: list[dict[str, Any]],
            on_event: Emit | None, timeout: float) -> int:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=env, text=True, cwd=str(data)) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = parse_event(line)
            if event is not None:
                events.append(event)
                if on_event and (task := task_event(playbook, event)):
                    on_event(task)
        return proc.wait(timeout=timeout)


def parse_event(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
