"""`opsctl completion bash|zsh` and `opsctl help TOPIC` (issue 25, convention 8). The completion script is made from
the parser: it parses (bash -n), it knows every command and every option the parser has (walked as
tests/test_cli_abbrev.py walks it), and run in a real bash it offers subcommands, options, choices and files."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from opsctl.cli.main import build_parser, main
from tests.support import missing
from tests.test_cli_abbrev import parsers


@pytest.fixture(scope="module")
def bash_script() -> str:
    from opsctl.cli.completion import script

    return script(build_parser(), "bash")


def test_the_cli_prints_the_script(capsys: pytest.CaptureFixture[str], bash_script: str) -> None:
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == bash_script
    assert main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert zsh.startswith("#compdef opsctl\n") and "bashcompinit" in zsh and zsh.endswith(bash_script)


def test_bash_parses_it(tmp_path: Path, bash_script: str) -> None:
    (tmp_path / "opsctl.bash").write_text(bash_script)
    done = subprocess.run(["bash", "-n", str(tmp_path / "opsctl.bash")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_zsh_parses_it(tmp_path: Path) -> None:
    from opsctl.cli.completion import script

    if shutil.which("zsh") is None:
        missing("zsh (apt-get install zsh)")

    (tmp_path / "_opsctl").write_text(script(build_parser(), "zsh"))
    done = subprocess.run(["zsh", "-n", str(tmp_path / "_opsctl")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_it_lists_every_command_and_option(bash_script: str) -> None:
    for where, parser in parsers(build_parser()):
        path = where.removeprefix("opsctl").strip()
        words = next(line for line in bash_script.splitlines() if line.strip().startswith(f'"{path}") words='))
        offered = words.split('words="', 1)[1].split('"', 1)[0].split()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert set(action.choices) <= set(offered), where
            if action.help == argparse.SUPPRESS:  # hidden (render -o, which says to use --dir): never offered
                assert not set(action.option_strings) & set(offered), where
                continue
            for flag in action.option_strings:
                assert flag in offered, f"{where} {flag}"
                if action.nargs != 0:
                    assert f'"{path}|{flag}")' in bash_script, f"{where} {flag} takes a value"


def complete(tmp_path: Path, script_text: str, *words: str) -> list[str]:
    """What the script offers, in a real bash, for the command line words (the last one being completed)."""
    (tmp_path / "opsctl.bash").write_text(script_text)
    line = " ".join(f"'{w}'" for w in ("opsctl", *words))
    program = (f"source {tmp_path / 'opsctl.bash'}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
               "_opsctl_complete; printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, cwd=tmp_path)
    return [w for w in done.stdout.splitlines() if w]


@pytest.mark.parametrize(("words", "expected"), [
    (("clu",), ["cluster"]),
    (("co",), ["completion"]),
    (("cluster", "re"), ["reshard", "rebalance"]),
    (("cluster", "reshard", "--sl"), ["--slots"]),
    (("plan", "--output", ""), ["text", "json"]),
    (("destroy", "--pu"), ["--purge"]),
    (("help", "s"), ["spec", "stdin"]),
    (("completion", ""), ["bash", "zsh", "-h", "--help"]),
])
def test_bash_offers(tmp_path: Path, bash_script: str, words: tuple[str, ...], expected: list[str]) -> None:
    assert sorted(complete(tmp_path, bash_script, *words)) == sorted(expected)


def test_f_completes_files(tmp_path: Path, bash_script: str) -> None:
    (tmp_path / "orders.yaml").write_text("")
    assert complete(tmp_path, bash_script, "apply", "-f", "ord") == ["orders.yaml"]
    assert complete(tmp_path, bash_script, "cluster", "check", "--file", "ord") == ["orders.yaml"]


def test_help_lists_topics_and_prints_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    assert "spec" in out and "exit-codes" in out
    assert main(["help", "spec"]) == 0
    out = capsys.readouterr().out
    for path in ("auth.admin_user  (string, default \"opsctl\")", "hardening.allow_public_bind  (boolean",
                 "hosts[].address  (string, required)", "nodes.<name>.port  (integer 1..65535)"):
        assert path in out, path


def test_an_unknown_topic_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["help", "nope"])
    assert stopped.value.code == 1 and "invalid choice" in capsys.readouterr().err


def test_every_spec_field_is_in_the_reference() -> None:
    """Every property of the JSON Schema, at every depth, has its line in `opsctl help spec`."""
    from opsctl.cli.commands.help import TOPICS
    from opsctl.spec.pydantic_model import spec_schema

    text = TOPICS["spec"][1]()
    schema = spec_schema()
    names = set(schema["properties"]) | {p for d in schema["$defs"].values() for p in d.get("properties", {})}
    listed = {line.split()[0].rsplit(".", 1)[-1] for line in text.splitlines() if "  (" in line}
    assert names <= listed, sorted(names - listed)
