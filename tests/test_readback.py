"""Files opsctl reads back (node record, saved plan, failover report, state-dir contents) and the paths it is
given: every bad shape is `error: <file>: what; hint: fix`, exit 1, before anything is done (issue 11 item 9)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from opsctl.cli.main import main
from opsctl.failover.report import read_past_failover
from opsctl.state.safefs import FileProblem
from tests.support import make_spec, write_spec

Shape = Callable[[Path], None]


def text(value: str) -> Shape:
    return lambda path: path.write_text(value)


def json_of(value: object) -> Shape:
    return text(json.dumps(value))


def folder(path: Path) -> None:
    path.mkdir()


def link(path: Path) -> None:
    (path.parent / "elsewhere.json").write_text("{}")
    path.symlink_to(path.parent / "elsewhere.json")


def binary(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00garbage")


def huge(path: Path) -> None:
    with path.open("wb") as handle:
        handle.truncate(200 * 1024 * 1024)  # sparse: costs nothing on disk


def fifo(path: Path) -> None:
    os.mkfifo(path)


COMMON: dict[str, Shape] = {
    "empty": text(""), "truncated": text('{"digest": "ab'), "nan": text("NaN"), "list": json_of([1]),
    "string": json_of("x"), "null": text("null"), "folder": folder, "binary": binary, "huge": huge, "fifo": fifo,
    "deep": text("[" * 100_000),
}

RECORD_SHAPES: dict[str, Shape] = {
    **COMMON, "link": link,
    "digest-number": json_of({"digest": 5}), "directives-string": json_of({"directives": "port 1"}),
    "directive-short": json_of({"directives": [["port"]]}), "directive-number": json_of({"directives": [["a", 1]]}),
    "applied-string": json_of({"applied": "yesterday"}), "applied-inf": text('{"applied": 1e999}'),
    "pending-string": json_of({"pending_restart": "yes"}),
}

PLAN = {"format": 1, "spec": "x", "spec_digest": "d", "fingerprint": "f", "notes": [], "warnings": [],
        "steps": [{"kind": "start", "node": "n", "reason": "r"}]}


def plan_with(**kw: object) -> Shape:
    return json_of({**PLAN, **kw})


PLAN_SHAPES: dict[str, Shape] = {
    **COMMON, "format-2": plan_with(format=2), "format-string": plan_with(format="1"),
    "no-spec": json_of({k: v for k, v in PLAN.items() if k != "spec"}), "spec-number": plan_with(spec=1),
    "steps-object": plan_with(steps={}), "step-string": plan_with(steps=["start n"]),
    "step-unknown-kind": plan_with(steps=[{"kind": "rm -rf", "node": "n", "reason": "r"}]),
    "step-no-kind": plan_with(steps=[{"node": "n", "reason": "r"}]),
    "step-node-number": plan_with(steps=[{"kind": "start", "node": 5, "reason": "r"}]),
    "step-extra-field": plan_with(steps=[{"kind": "start", "node": "n", "reason": "r", "evil": 1}]),
    "step-bool-as-int": plan_with(steps=[{"kind": "restart", "node": "n", "reason": "r", "shard": True}]),
    "notes-numbers": plan_with(notes=[1, 2]), "warnings-string": plan_with(warnings="w"),
}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def assert_file_error(code: int, err: str, path: Path) -> None:
    assert code == 1, err
    assert f"error: {path}" in err and "hint: " in err, err
    assert "internal error" not in err and "Traceback" not in err


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    return write_spec(tmp_path, make_spec("standalone", "valkey", hosts=1))


@pytest.mark.parametrize("shape", RECORD_SHAPES)
def test_a_bad_node_record_names_the_file(spec_file: Path, shape: str, capsys: pytest.CaptureFixture[str]) -> None:
    from opsctl.state.specfile import read_spec

    node = read_spec(spec_file).layout.nodes[0].name
    folder = spec_file.parent / ".opsctl" / read_spec(spec_file).spec.name / node
    folder.mkdir(parents=True)
    RECORD_SHAPES[shape](folder / "opsctl-node.json")
    code, err = run(["status", "-f", str(spec_file)], capsys)
    assert_file_error(code, err, folder / "opsctl-node.json")


@pytest.mark.parametrize("shape", PLAN_SHAPES)
def test_a_bad_saved_plan_names_the_file_before_anything_is_done(spec_file: Path, shape: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plan = spec_file.parent / "plan.json"
    PLAN_SHAPES[shape](plan)
    code, err = run(["apply", "-f", str(spec_file), "--plan", str(plan), "--auto-approve"], capsys)
    assert_file_error(code, err, plan)
    assert not (spec_file.parent / ".opsctl").exists()  # refused before the state dir was even made


def test_a_missing_saved_plan(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["apply", "-f", str(spec_file), "--plan", str(spec_file.parent / "nope.json")], capsys)
    assert_file_error(code, err, spec_file.parent / "nope.json")


REPORT = {"outcome": "succeeded", "started": 1000.0, "phases_ms": {"total": 500.0}, "target": {"master": "a"},
          "new_master": "b"}


def report_with(**kw: object) -> Shape:
    return json_of({**REPORT, **kw})


REPORT_SHAPES: dict[str, Shape] = {
    **{k: v for k, v in COMMON.items() if k != "fifo"}, "link": link,
    "started-string": report_with(started="monday"), "started-missing": json_of({"outcome": "succeeded"}),
    "started-future": report_with(started=time.time() + 3000 * 365 * 86400),
    "started-negative": report_with(started=-5), "phases-list": report_with(phases_ms=[1]),
    "total-negative": report_with(phases_ms={"total": -1}), "target-string": report_with(target="a"),
    "master-number": report_with(target={"master": 1}), "new-master-list": report_with(new_master=["b"]),
    "outcome-number": report_with(outcome=1),
}


@pytest.mark.parametrize("shape", REPORT_SHAPES)
def test_a_bad_failover_report_names_the_file(tmp_path: Path, shape: str) -> None:
    path = tmp_path / "1000.000-shard1-succeeded.json"
    REPORT_SHAPES[shape](path)
    with pytest.raises(FileProblem) as caught:
        read_past_failover(path)
    rendered = caught.value.render()
    assert rendered.startswith(f"error: {path}") and "hint: " in rendered
    if shape == "started-future":
        assert "in the future" in rendered and "clock" in rendered


def test_a_good_report_still_counts(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    json_of(REPORT)(path)
    past = read_past_failover(path)
    assert past is not None and past.finished == 1000.5


def _state_is_file(state: Path, node: Path) -> Path:
    state.parent.mkdir(parents=True)
    state.write_text("x")
    return state


def _state_is_link(state: Path, node: Path) -> Path:
    (state.parent.parent / "elsewhere").mkdir()
    state.parent.mkdir(parents=True)
    state.symlink_to(state.parent.parent / "elsewhere")
    return state


def _dot_opsctl_is_link(state: Path, node: Path) -> Path:
    (state.parent.parent / "elsewhere").mkdir()
    state.parent.symlink_to(state.parent.parent / "elsewhere")
    return state.parent


def _node_is_file(state: Path, node: Path) -> Path:
    state.mkdir(parents=True)
    node.write_text("x")
    return node


def _node_is_link(state: Path, node: Path) -> Path:
    state.mkdir(parents=True)
    (state / "elsewhere").mkdir()
    node.symlink_to(state / "elsewhere")
    return node


def _pidfile_is_link(state: Path, node: Path) -> Path:
    node.mkdir(parents=True)
    (node / "opsctl-node.json").symlink_to("/etc/passwd")
    return node / "opsctl-node.json"


@pytest.mark.parametrize("make", [_state_is_file, _state_is_link, _dot_opsctl_is_link, _node_is_file, _node_is_link,
                                  _pidfile_is_link])
def test_odd_state_dir_contents_name_the_path(spec_file: Path, make: Callable[[Path, Path], Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from opsctl.state.specfile import read_spec

    loaded = read_spec(spec_file)
    state = spec_file.parent / ".opsctl" / loaded.spec.name
    bad = make(state, state / loaded.layout.nodes[0].name)
    commands = [["status", "-f", str(spec_file)], ["apply", "-f", str(spec_file), "--auto-approve"]]
    if make is not _pidfile_is_link:  # purge deletes a folder holding a link (rmtree never follows one)
        commands.append(["destroy", "-f", str(spec_file), "--auto-approve", "--purge"])
    for argv in commands:
        code, err = run(argv, capsys)
        assert_file_error(code, err, bad)
    assert not (spec_file.parent / "elsewhere").exists() or not any((spec_file.parent / "elsewhere").iterdir())


@pytest.mark.parametrize("argv_of", [
    lambda spec, tmp: ["failover", "-f", spec, "--shard", "1", "--yes", "--report", f"{tmp}/no/such/dir/r.json"],
    lambda spec, tmp: ["failover", "-f", spec, "--shard", "1", "--yes", "--report", tmp],
    lambda spec, tmp: ["failover", "-f", spec, "--shard", "1", "--yes", "--report", f"{tmp}/linked/r.json"],
    lambda spec, tmp: ["plan", "-f", spec, "--out", f"{tmp}/missing/plan.json"],
    lambda spec, tmp: ["plan", "-f", spec, "--out", tmp],
    lambda spec, tmp: ["status", "-f", spec, "--state-dir", f"{tmp}/topology.yaml"],
    lambda spec, tmp: ["render", "-f", spec, "--dir", f"{tmp}/topology.yaml"],
])
def test_output_and_state_paths_are_checked_first(spec_file: Path, argv_of: Callable[[str, str], list[str]],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (spec_file.parent / "linked").symlink_to(spec_file.parent)
    argv = argv_of(str(spec_file), str(spec_file.parent))
    code, err = run(argv, capsys)
    assert code == 1 and "error: " in err and "hint: " in err and "internal error" not in err, err
    assert not (spec_file.parent / ".opsctl").exists()


def test_plan_out_never_writes_through_a_link(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = spec_file.parent / "victim"
    victim.write_text("precious")
    (spec_file.parent / "plan.json").symlink_to(victim)
    code, err = run(["plan", "-f", str(spec_file), "--out", str(spec_file.parent / "plan.json")], capsys)
    assert code == 1 and "symbolic link" in err
    assert victim.read_text() == "precious"
