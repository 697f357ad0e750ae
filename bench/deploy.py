"""bench/deploy: one deploy.yml run for three hosts of the netns lab (tests/netns.py; needs root), phase by
phase, against ansible's stock per-file copy of the same node files in the same run.

Rounds: a fresh deploy (nothing on the hosts: users, directories, binary, files, start), then a second
deploy that changes nothing, then `stock`: the same node files pushed by one ansible.builtin.copy task per
file (what deploy.yml did before files were bundled), timed alone. Goal: a fresh deploy <= 10 s.

Each round prints its wall time, the CPU time it took on this machine (ansible-runner, ansible-playbook, its
workers and ssh clients) and on the hosts (every process in their network namespaces: sshd sessions, the
installer, the servers it starts), and the machine's load: on a shared machine the wall time follows the load,
the CPU time much less. Phases: `start` is ansible-runner and ansible-playbook starting (imports, inventory,
playbook) until the play begins, then each task until the next one starts, then `end` (stats, exit).
Then `opsctl apply` of the same spec on the emptied hosts, a second apply (empty plan) and `status`, as a
user runs them (process start included), with the number of ansible-runner runs the apply made.

    .venv/bin/python bench/deploy.py [--lab ID] [--masters 3] [--replicas 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.providers.ansible import AnsibleProvider, plain_name  # noqa: E402
from opsctl.providers.remote.inventory import build_inventory  # noqa: E402
from opsctl.providers.remote.runner import parse_event, private_dir, run_playbook  # noqa: E402
from opsctl.state.safefs import write_private  # noqa: E402
from opsctl.state.specfile import read_spec  # noqa: E402
from tests import netns  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_binary, write_spec  # noqa: E402

FLOOR = """---
- name: One SSH command per host, nothing else
  hosts: all
  gather_facts: false
  tasks:
    - name: Run true
      ansible.builtin.raw: "true"
      changed_when: false
"""

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


def phases(artifacts: Path, started: float, ended: float) -> list[tuple[str, float]]:
    """Seconds per phase of the newest run under artifacts, from its job events' timestamps: `start` until the
    play begins, each task until the next one starts, `end` from the stats to the run's return (started and
    ended: wall clock)."""
    newest = max(artifacts.iterdir(), key=lambda folder: folder.stat().st_mtime)
    marks: list[tuple[float, str]] = []
    for path in (newest / "job_events").glob("*.json"):
        event = parse_event(path.read_text()) or {}
        kind, at = event.get("event"), datetime.fromisoformat(str(event.get("created"))).timestamp()
        if kind == "playbook_on_play_start":
            marks.append((at, "(play)"))
        elif kind == "playbook_on_task_start":
            marks.append((at, str(event.get("event_data", {}).get("task", "?"))))
        elif kind == "playbook_on_stats":
            marks.append((at, "end"))
    spans = [(started, "start"), *sorted(marks), (ended, "")]
    return [(name, spans[i + 1][0] - at) for i, (at, name) in enumerate(spans[:-1])]


def host_cpu(the_lab: netns.Lab) -> float:
    """CPU seconds of every process in the lab's namespaces, with what they reaped (finished sessions)."""
    ticks = 0
    for host in the_lab.hosts:
        for pid in netns._netns_pids(host.netns):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def local_cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def timed_deploy(provider: AnsibleProvider, the_lab: netns.Lab) -> dict[str, Any]:
    """Seconds, CPU seconds here and on the hosts, seconds per phase, and the tasks that changed something."""
    here, there = local_cpu(), host_cpu(the_lab)
    started = time.time()
    result = provider.deploy(start=True)
    ended = time.time()
    here = local_cpu() - here
    time.sleep(1.0)  # sessions that just ended are reaped by sshd: then their CPU shows in its counters
    return {"seconds": ended - started, "cpu_here": here, "cpu_hosts": host_cpu(the_lab) - there,
            "phases": phases(provider.data_dir / "artifacts", started, ended), "changed": list(result.changed_tasks)}


def timed_floor(provider: AnsibleProvider) -> float:
    """The least any deploy.yml run costs: ansible-runner and ansible-playbook starting, one command per host."""
    playbooks = Path(tempfile.mkdtemp(prefix="opsctl-bench-"))
    (playbooks / "floor.yml").write_text(FLOOR)
    inventory = build_inventory(provider.loaded, str(playbooks), provider.known_hosts)
    started = time.monotonic()
    try:
        run_playbook(str(playbooks / "floor.yml"), provider.data_dir / "floor", inventory)
        return time.monotonic() - started
    finally:
        shutil.rmtree(playbooks, ignore_errors=True)


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


def timed_cli(spec: Path, *args: str) -> tuple[float, float]:
    """Seconds and CPU seconds (this machine) of `opsctl ARGS -f spec` as a user runs it; exits non-zero: raise."""
    before, started = local_cpu(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "opsctl.cli.main", *args, "-f", str(spec)], capture_output=True,
                          text=True, check=False)
    seconds, cpu = time.monotonic() - started, local_cpu() - before
    if done.returncode != 0:
        raise SystemExit(f"opsctl {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, cpu


def apply_rounds(spec: Path, state: Path) -> None:
    """opsctl apply of the spec on empty hosts (one deploy.yml run, the nodes started at once, the cluster
    formed), apply again (an empty plan), status: what a user waits for, process start included."""
    for label, args in (("apply", ("apply", "--auto-approve")), ("apply again", ("apply", "--auto-approve")),
                        ("status", ("status",))):
        load = os.getloadavg()[0]
        seconds, cpu = timed_cli(spec, *args)
        runs = len(list((state / "ansible" / "artifacts").glob("*"))) if label == "apply" else None
        note = f"; ansible-runner runs: {runs}" if runs is not None else ""
        print(f"opsctl {label}: {seconds:.2f} s, CPU {cpu:.2f} s here; load {load:.2f}{note}")
    timed_cli(spec, "destroy", "--auto-approve", "--purge")


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
        spec_file = write_spec(Path(tmp), spec)
        loaded = read_spec(spec_file)
        provider = AnsibleProvider(loaded, Path(tmp) / "state", known_hosts=the_lab.known_hosts)
        try:
            print(f"{len(loaded.layout.nodes)} nodes on 3 hosts; {os.cpu_count()} cpus here")
            for label in ("fresh", "again"):
                load = os.getloadavg()[0]
                run = timed_deploy(provider, the_lab)
                print(f"deploy.yml {label}: {run['seconds']:.2f} s (goal for fresh: <= 10 s); "
                      f"CPU {run['cpu_here']:.2f} s here + {run['cpu_hosts']:.2f} s on the hosts; "
                      f"load {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
                      f"changed: {len(run['changed'])} {run['changed']}")
                for name, seconds in run["phases"]:
                    print(f"    {seconds:6.2f} s  {name}")
            load = os.getloadavg()[0]
            floor = timed_floor(provider)
            print(f"floor: ansible-runner running one `raw: true` per host: {floor:.2f} s (load {load:.2f})")
            load = os.getloadavg()[0]
            stock = timed_stock_copy(provider)
            print(f"stock ansible.builtin.copy, one task per file, the node files only: {stock:.2f} s "
                  f"(load {load:.2f})")
            provider.playbook("destroy.yml", {"opsctl_purge": True})
        finally:
            provider.close()
        apply_rounds(spec_file, spec_file.parent / ".opsctl" / loaded.spec.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
