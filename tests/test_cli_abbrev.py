"""No prefix of an option stands for the option (issue 25, defect 4): `destroy --pur --auto` ran as
`--purge --auto-approve`; a typo must never select a destructive flag."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from opsctl.cli.main import build_parser, main


def parsers(parser: argparse.ArgumentParser, prefix: str = "opsctl") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the tree, the root first, each with the words that reach it."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{prefix} {name}")


def test_no_parser_takes_a_prefix_for_an_option() -> None:
    abbreviating = [where for where, parser in parsers(build_parser()) if parser.allow_abbrev]
    assert not abbreviating, abbreviating


@pytest.mark.parametrize("argv", [
    ["destroy", "-f", "x.yaml", "--pur", "--auto"],
    ["apply", "-f", "x.yaml", "--auto"],
    ["cluster", "fix", "-f", "x.yaml", "--reassign"],
    ["failover", "-f", "x.yaml", "--shard", "1", "--mode", "force", "--ye"],
])
def test_an_abbreviated_flag_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)  # x.yaml does not exist: argparse refuses first, nothing is read or touched
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and "Traceback" not in err
