"""Every numeric option of every command has a range, checked by argparse before anything runs (issue 11 item 11)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from opsctl.cli.main import build_parser, main
from opsctl.cli.options import Ranged

NUMERIC_DEFAULTS = (int, float)


def walk(parser: argparse.ArgumentParser, prefix: str = "opsctl") -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, f"{prefix} {name}")
        else:
            yield prefix, action


def test_every_numeric_option_has_a_range() -> None:
    unranged = []
    numeric = 0
    for where, action in walk(build_parser()):
        looks_numeric = isinstance(action.default, NUMERIC_DEFAULTS) and not isinstance(action.default, bool)
        if action.type in (int, float) or (looks_numeric and not isinstance(action.type, Ranged)):
            unranged.append(f"{where} {'/'.join(action.option_strings)}")
        numeric += isinstance(action.type, Ranged)
    assert not unranged, f"numeric options without a range: {unranged}"
    assert numeric >= 20


@pytest.mark.parametrize("argv", [
    ["failover", "-f", "x.yaml", "--shard", "0"],
    ["failover", "-f", "x.yaml", "--shard", "1", "--timeout", "-1"],
    ["failover", "-f", "x.yaml", "--shard", "1", "--timeout", "nan"],
    ["failover", "-f", "x.yaml", "--shard", "1", "--timeout", "3601"],  # past what the cool-down check reads back
    ["restart", "-f", "x.yaml", "--nodes", ""],
    ["restart", "-f", "x.yaml", "--nodes", "a,,b"],
    ["restart", "-f", "x.yaml", "--parallel-shards", "0"],
    ["apply", "-f", "x.yaml", "--wait-timeout", "inf"],
    ["audit", "-f", "x.yaml", "--batch", "0"],
    ["audit", "-f", "x.yaml", "--window", "0"],
    ["audit", "-f", "x.yaml", "--max-ops-per-sec", "nan"],
    ["bigkey", "delete", "-f", "x.yaml", "k", "--chunk", "0"],
    ["bigkey", "delete", "-f", "x.yaml", "k", "--max-ops-per-sec", "-5"],
    ["cluster", "reshard", "-f", "x.yaml", "--from", "a", "--to", "b", "--slots", "1", "--max-keys-per-sec", "0"],
    ["cluster", "rebalance", "-f", "x.yaml", "--threshold", "500"],
    ["cluster", "rebalance", "-f", "x.yaml", "--threshold", "nan"],
    ["cluster", "rebalance", "-f", "x.yaml", "--weight", "a=-1"],
    ["cluster", "rebalance", "-f", "x.yaml", "--weight", "a=nan"],
    ["cluster", "rebalance", "-f", "x.yaml", "--weight", "=1"],
    ["cluster", "rebalance", "-f", "x.yaml", "--by", "cpu", "--window", "0"],
    ["cluster", "rebalance", "-f", "x.yaml", "--by", "cpu", "--window", "nan"],
    ["cluster", "rebalance", "-f", "x.yaml", "--by", "ram"],
])
def test_out_of_range_is_refused_before_the_spec_is_read(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)  # x.yaml does not exist: the refusal comes from argparse, before anything is read or touched
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "error: argument" in err and "Traceback" not in err


@pytest.mark.parametrize(("argv", "said"), [
    (["--by", "cpu", "--weight", "a=2"], "--weight weighs slot counts"),
    (["--window", "5"], "--window measures a load"),
    (["--by", "memory", "--window", "5"], "--by memory reads the keys once"),
    (["--by", "keys", "--placement"], "--placement moves members"),
])
def test_rebalance_options_that_do_not_go_together(argv: list[str], said: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "rebalance", "-f", "x.yaml", *argv]) == 1  # refused before the spec is read
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_long_bad_values_are_cut_in_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["audit", "-f", "x.yaml", "--batch", "9" * 5000], ["status", "-f", "x.yaml", "--output", "x" * 5000]):
        with pytest.raises(SystemExit):
            main(argv)
        error = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error:"))
        assert len(error) < 400


@pytest.mark.parametrize("lost", ["ConnectionError", "TimeoutError"])
def test_a_node_lost_mid_command_is_an_error_not_a_bug(lost: str, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.exceptions

    def handler(_args: argparse.Namespace) -> int:
        raise getattr(redis.exceptions, lost)("Error 111 connecting to 127.0.0.1:7001. Connection refused.")

    parser = argparse.ArgumentParser()
    parser.set_defaults(handler=handler)
    monkeypatch.setattr("opsctl.cli.main.build_parser", lambda *_: parser)
    assert main([]) == 1
    err = capsys.readouterr().err
    assert "a node stopped answering mid-way" in err and "127.0.0.1:7001" in err and "internal error" not in err
    assert "opsctl status" in err


def test_failover_timeout_ends_where_the_cool_down_check_reads_a_report_back() -> None:
    from opsctl.cli.commands.failover import MAX_PHASE_SECONDS
    from opsctl.failover.report import MAX_TIMEOUT_S

    assert MAX_PHASE_SECONDS == MAX_TIMEOUT_S
