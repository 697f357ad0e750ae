"""The Ansible stack is the `ansible` extra (issue 25, convention 9): with paramiko, ansible_runner and ansible
unimportable (blocked in sys.modules, as an install without the extra has them), every local command still runs,
validate checks an ansible spec, and an ansible command stops with one clear error naming the extra."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE_SPEC = ROOT / "tests" / "specs" / "good" / "cluster-overrides.yaml"
EXTRA_LIBRARIES = ("paramiko", "ansible_runner", "ansible")
# Run in a child: the blocked modules must not be loaded by the test process itself.
WITHOUT_EXTRA = """
import contextlib, io, json, sys
for name in {blocked!r}:
    sys.modules[name] = None
from opsctl.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, out.getvalue(), err.getvalue()])
loaded = sorted(n for n in sys.modules if n.split('.')[0] in {blocked!r} and sys.modules[n] is not None)
print(json.dumps({{"results": results, "loaded": loaded}}))
"""


def _without_extra(*commands: list[str]) -> tuple[list[tuple[int, str, str]], list[str]]:
    env = {**os.environ, PASSWORD_ENV: PASSWORD}
    script = WITHOUT_EXTRA.format(blocked=EXTRA_LIBRARIES)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(list(commands))], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    return [tuple(r) for r in answer["results"]], answer["loaded"]


def test_local_commands_and_validate_run_without_the_extra(tmp_path: Path) -> None:
    local = write_spec(tmp_path, make_spec("replication", hosts=2))
    state = str(tmp_path / "state")
    results, loaded = _without_extra(
        ["validate", "-f", str(ANSIBLE_SPEC)],
        ["validate", "-f", str(local)],
        ["render", "-f", str(local), "--dir", str(tmp_path / "out")],
        ["plan", "-f", str(local), "--state-dir", state],
        ["status", "-f", str(local), "--state-dir", state],
    )
    (validate_ansible, validate_local, render, plan, status) = results
    assert validate_ansible[0] == 0 and "shop" in validate_ansible[1], validate_ansible
    assert validate_local[0] == 0 and render[0] == 0, (validate_local, render)
    assert plan[0] == 2 and "to add" in plan[1] and "Traceback" not in plan[2], plan
    assert status[0] == 1 and "down" in status[1] and "Traceback" not in status[2], status  # nothing runs yet
    assert loaded == []


def test_an_ansible_command_names_the_extra(tmp_path: Path) -> None:
    results, _ = _without_extra(
        ["plan", "-f", str(ANSIBLE_SPEC), "--state-dir", str(tmp_path / "state")],
        ["status", "-f", str(ANSIBLE_SPEC), "--state-dir", str(tmp_path / "state")],
        ["inventory", "-f", str(ANSIBLE_SPEC), "--dir", str(tmp_path / "inv")],
    )
    for code, out, err in results:
        assert code == 1 and out == "", (code, out, err)
        assert "provider: ansible needs ansible-runner, ansible-core, paramiko" in err, err
        assert "pip install 'opsctl-redis[ansible]'" in err and "Traceback" not in err, err


def test_only_the_ansible_provider_imports_the_extras_libraries() -> None:
    """Top-level imports of paramiko/ansible_runner live in providers.ansible and providers.remote.ssh only, each
    guarded so a missing library becomes the extra's error; every other module reaches them through those two."""
    importers: dict[str, bool] = {}
    for path in (ROOT / "opsctl").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] in EXTRA_LIBRARIES for n in names):
                guarded = any(isinstance(t, ast.Try) and node in ast.walk(t) for t in ast.walk(tree))
                importers[str(path.relative_to(ROOT))] = guarded
    assert importers == {"opsctl/providers/ansible.py": True, "opsctl/providers/remote/ssh.py": True}
