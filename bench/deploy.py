"""bench/deploy: one deploy.yml run for three hosts of the netns lab (tests/netns.py; needs root), with the
time of each task, against ansible's stock per-file copy of the same node files in the same run.

Rounds: a fresh deploy (nothing on the hosts: users, directories, binary, files, start), then a second
deploy that changes nothing, then `stock`: the same node files pushed by one ansible.builtin.copy task per
file (what deploy.yml did before files were bundled), timed alone. Goal: a fresh deploy <= 10 s.

    .venv/bin/python bench/deploy.py [--lab ID] [--masters 3] [--replicas 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.providers.ansible import AnsibleProvider, plain_name  # noqa: E402
from opsctl.remote.inventory import build_inventory  # noqa: E402
from opsctl.remote.runner import private_dir, run_playbook  # noqa: E402
from opsctl.safefs import write_private  # noqa: E402
from opsctl.specfile import read_spec  # noqa: E402
from tests import netns  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_binary, write_spec  # noqa: E402

STOCK_COPY = """---
- name: Stock per-file copy of the node files
  hosts: all
  gather_facts: false
  tasks:
    - name: Write node configuration files, one copy task per file
      ansible.builtin.copy:
        src: "{{ opsctl_files_dir }}/{{ item.0.name }}/{{ item.1 }}"
        dest: "/tmp/opsctl-bench-stock-{{ item.0.name }}-{{ item.1 }}"
        mode: "0600"
      loop: "{{ opsctl_nodes | subelements('files') }}"
      no_log: true
"""


@contextmanager
def lab(existing: str | None) -> Iterator[netns.Lab]:
    if existing:
        data = netns._load(existing)
        fields = {k: v for k, v in data.items() if k in netns.Lab.__dataclass_fields__}
        yield netns.Lab(**{**fields, "hosts": tuple(netns.TestHost(**h) for h in data["hosts"])})
        return
    created = netns.up(3)
    try:
        yield created
    finally:
        netns.down(created.id)


class TaskClock:
    """Seconds per task name from ansible-runner's events (task start to the next task's start)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.marks: list[tuple[float, str]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") == "playbook_on_task_start":
            self.marks.append((time.monotonic(), str(event.get("event_data", {}).get("task", "?"))))

    def table(self, ended: float) -> list[tuple[str, float]]:
        spans = [*self.marks, (ended, "")]
        return [(name, spans[i + 1][0] - at) for i, (at, name) in enumerate(self.marks)]


def timed_deploy(provider: AnsibleProvider) -> tuple[float, list[tuple[str, float]], list[str]]:
    """Seconds, seconds per task, and the tasks that changed something."""
    clock = TaskClock()
    provider.on_event = clock
    started = time.monotonic()
    result = provider.deploy(start=True)
    ended = time.monotonic()
    return ended - started, clock.table(ended), list(result.changed_tasks)


def timed_stock_copy(provider: AnsibleProvider) -> float:
    files = provider.rendered()
    staging = private_dir(provider.data_dir) / "stock-files"
    for node, named in files.items():
        for name, text in named.items():
            write_private(staging / node / plain_name(name), text)
    playbooks = Path(tempfile.mkdtemp(prefix="opsctl-bench-"))
    (playbooks / "stock.yml").write_text(STOCK_COPY)
    inventory = build_inventory(provider.loaded, str(staging), provider.known_hosts,
                                only={n: sorted(named) for n, named in files.items()})
    started = time.monotonic()
    try:
        run_playbook(str(playbooks / "stock.yml"), provider.data_dir / "stock", inventory)
        return time.monotonic() - started
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(playbooks, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", help="an existing lab id (python -m tests.netns up); default: a new one")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    why = netns.unavailable()
    if why:
        print(f"the netns lab is unavailable: {why}", file=sys.stderr)
        return 1
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with lab(args.lab) as the_lab, tempfile.TemporaryDirectory(prefix="opsctl-bench-deploy-") as tmp:
        os.environ["OPSCTL_SSH_KNOWN_HOSTS"] = the_lab.known_hosts
        spec = make_spec("cluster", "valkey", cluster={"masters": args.masters,
                                                      "replicas_per_master": args.replicas})
        spec["provider"] = "ansible"
        spec["hosts"] = the_lab.spec_hosts()
        spec["server"]["binary"] = server_binary("valkey")
        loaded = read_spec(write_spec(Path(tmp), spec))
        provider = AnsibleProvider(loaded, Path(tmp) / "state", known_hosts=the_lab.known_hosts)
        try:
            print(f"load {os.getloadavg()[0]:.2f} (1 min); {len(loaded.layout.nodes)} nodes on 3 hosts")
            for label in ("fresh", "again"):
                total, tasks, changed = timed_deploy(provider)
                print(f"deploy.yml {label}: {total:.2f} s  (goal for fresh: <= 10 s); changed: {changed}")
                for name, seconds in sorted(tasks, key=lambda t: -t[1])[:8]:
                    print(f"    {seconds:6.2f} s  {name}")
            stock = timed_stock_copy(provider)
            print(f"stock ansible.builtin.copy, one task per file, the node files only: {stock:.2f} s")
            provider.playbook("destroy.yml", {"opsctl_purge": True})
        finally:
            provider.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
