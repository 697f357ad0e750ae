"""One CLI grammar for every subcommand (issue 25, convention 8), asserted by walking the parser: every command
that changes something takes --auto-approve (alias --yes) and --dry-run; every command that can lose data asks on a
terminal and, without one, refuses unless --auto-approve; -f/--file and --output mean the same everywhere."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from opsctl.cli.main import build_parser
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec
from tests.test_cli_abbrev import parsers

# The commands that change a topology: the rest read it (status, plan, check, audit, backup, tls ca) or write only
# files the user names (render, inventory, schema, validate).
MUTATING = {"apply", "destroy", "restart", "failover", "cluster reshard", "cluster rebalance", "cluster fix",
            "bigkey delete", "restore", "tls rotate"}
# That print one fixed format (schema: JSON Schema; help: reference text; completion: a shell script; metrics
# targets: Prometheus file_sd JSON (-o json, the one format), written to a file with --out as plan --out does;
# render: files into --dir,
# its -o/--output only says so, as -o named that folder before).
NO_OUTPUT_FORMAT = {"schema", "help", "completion", "metrics targets", "render"}


def leaves() -> dict[str, argparse.ArgumentParser]:
    """Every command a user runs (a parser without subcommands), by its words after `opsctl`."""
    found = {}
    for where, parser in parsers(build_parser()):
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions) and where != "opsctl":
            found[where.removeprefix("opsctl ")] = parser
    return found


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_the_tree_has_every_command() -> None:
    assert set(leaves()) >= MUTATING, sorted(MUTATING - set(leaves()))


@pytest.mark.parametrize("command", sorted(MUTATING))
def test_every_mutating_command_has_auto_approve_yes_and_dry_run(command: str) -> None:
    flags = options(leaves()[command])
    assert flags.get("--auto-approve") is not None and flags.get("--yes") is flags["--auto-approve"], command
    assert flags["--auto-approve"].dest == "auto_approve"
    assert "--dry-run" in flags and flags["--dry-run"].dest == "dry_run", command


def test_yes_is_an_alias_everywhere_or_nowhere() -> None:
    """--yes is --auto-approve wherever either exists, never another option."""
    for command, parser in leaves().items():
        flags = options(parser)
        if "--yes" in flags or "--auto-approve" in flags:
            assert flags.get("--yes") is flags.get("--auto-approve"), command


def test_output_is_text_or_json_everywhere_it_means_a_format() -> None:
    for command, parser in leaves().items():
        if command in NO_OUTPUT_FORMAT:
            continue
        output = options(parser).get("--output")
        assert output is not None, f"opsctl {command} has no --output"
        assert options(parser).get("-o") is output, command  # -o is the format wherever there is one
        assert output.choices is not None and "json" in output.choices, command
        assert output.choices[0] in ("text", "table"), command  # a format for people by default


def test_file_is_the_spec_everywhere() -> None:
    for command, parser in leaves().items():
        flags = options(parser)
        if "--file" in flags:
            assert flags["-f"] is flags["--file"] and flags["--file"].dest == "file", command


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return write_spec(tmp_path, make_spec("cluster"))


@pytest.mark.parametrize("argv", [
    ["cluster", "reshard", "--from", "a", "--to", "b", "--slots", "1"],
    ["cluster", "rebalance"],
    ["cluster", "fix", "--reassign-unreachable"],
    ["bigkey", "delete", "some:key"],
    ["restore", "--from", "/nonexistent", "--mode", "replace"],
    ["tls", "rotate"],
    ["destroy"],
    ["apply"],
    ["failover", "--shard", "1"],
])
def test_data_losing_commands_refuse_without_a_terminal(argv: list[str], spec: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Under pytest stdin is not a terminal: each refuses before it changes anything, and but apply (whose plan is
    made under its locks) before it writes anything. destroy of a topology with nothing running has nothing to ask
    about, and writes nothing either."""
    words = 2 if argv[0] in ("cluster", "bigkey", "tls") else 1
    code, out, err = run(capsys, *argv[:words], "-f", str(spec), *argv[words:])
    if argv[0] == "destroy":
        assert code == 0 and out.startswith("nothing to stop"), err
    elif argv[0] == "tls":  # a spec without TLS has nothing to rotate: refused before the question
        assert code == 1 and "the spec has no TLS to rotate" in err, err + out
    else:
        assert code == 1 and "without confirmation" in err and "--auto-approve" in err, err + out
    if argv[0] != "apply":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["topology.yaml"]
