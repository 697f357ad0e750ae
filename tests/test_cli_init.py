"""`opsctl init` and the package as users install it (issue 25, convention 9): init writes the example of a topology
shipped in the package, never over an existing file; the wheel holds the templates, playbooks, examples, the
monitoring files (issue 33) and the LICENSE, and installed into a fresh venv without the ansible extra it runs
--version, init, validate, a local plan and metrics rules, while an ansible command names the extra."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

from opsctl import data_dir
from opsctl.cli.commands.scaffold import TOPOLOGIES
from tests.lifecycle import run

ROOT = Path(__file__).resolve().parents[1]
ENV = "ORDERS_REDIS_PASSWORD"  # what the examples read their password from


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "init-test-0123456789abcdef")


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_init_writes_the_shipped_example_and_it_validates(topology: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "spec.yaml"
    code, out, err = run(capsys, "init", "--topology", topology, "--out", str(target))
    assert code == 0, err
    assert target.read_text() == (data_dir("examples") / f"{topology}.yaml").read_text()
    assert yaml.safe_load(target.read_text())["topology"] == topology
    assert f"export {ENV}=" in out and f"opsctl validate -f {target}" in out
    code, _, err = run(capsys, "validate", "-f", str(target))
    assert code == 0, err


def test_init_never_writes_over_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "topology.yaml"
    target.write_text("name: mine\n")
    code, out, err = run(capsys, "init", "--out", str(target))
    assert code == 1 and out == "" and "exists" in err and "--out FILE" in err and "Traceback" not in err
    assert target.read_text() == "name: mine\n"


def test_init_defaults_to_a_cluster_in_topology_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "init", "--output", "json")
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "topology.yaml").read_text())["topology"] == "cluster"


def test_init_dash_prints_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "init", "--topology", "standalone", "--out", "-")
    assert code == 0 and out == (data_dir("examples") / "standalone.yaml").read_text()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    return next(folder.glob("opsctl_redis-*.whl"))


@pytest.mark.integration
def test_the_wheel_holds_the_data_files_and_the_license(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("templates", "playbooks", "examples", "monitoring"):
        shipped = {p.relative_to(ROOT / folder).as_posix() for p in (ROOT / folder).rglob("*") if p.is_file()}
        assert shipped and {f"opsctl/_data/{folder}/{n}" for n in shipped} <= names, folder
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Apache License" in (ROOT / "LICENSE").read_text()


@pytest.mark.integration
def test_the_wheel_installed_without_the_extra(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv, the wheel's dependencies from the package index, no ansible extra."""
    home = tmp_path / "venv"
    venv.create(home, with_pip=True)
    subprocess.run([str(home / "bin" / "pip"), "install", "-q", str(wheel)], check=True, capture_output=True,
                   timeout=600)
    env = {**os.environ, ENV: "init-test-0123456789abcdef"}

    def opsctl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(home / "bin" / "opsctl"), *argv], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120, check=False)

    assert opsctl("--version").stdout.startswith("opsctl ")
    assert opsctl("init", "--topology", "replication").returncode == 0
    assert opsctl("validate", "-f", "topology.yaml").returncode == 0
    plan = opsctl("plan", "-f", "topology.yaml", "--state-dir", str(tmp_path / "state"))
    assert plan.returncode == 2 and "to add" in plan.stdout, plan.stderr
    (tmp_path / "rules").mkdir()  # the monitoring files come from the installed package, not a checkout
    assert opsctl("metrics", "rules", "--dir", str(tmp_path / "rules")).returncode == 0
    assert (tmp_path / "rules" / "alerts.yml").read_bytes() == (ROOT / "monitoring/prometheus/alerts.yml").read_bytes()
    remote = tmp_path / "remote.yaml"
    remote.write_text((tmp_path / "topology.yaml").read_text() + "provider: ansible\n")
    refused = opsctl("plan", "-f", str(remote), "--state-dir", str(tmp_path / "state2"))
    assert refused.returncode == 1 and "pip install 'opsctl-redis[ansible]'" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
