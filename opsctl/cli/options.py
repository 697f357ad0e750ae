"""The options many commands share, each declared here once: the spec file, the state dir, the output format,
--auto-approve and --dry-run.

Only argparse (and the typing modules) is imported: every run builds its parser from these, `--help` and
`--version` included.

argparse types for command options: every number has a range, checked before anything is touched.

The one question a command asks before it changes something: on a terminal, typed 'yes'; without one, a refusal
unless --auto-approve (alias --yes). A dry run never asks: it changes nothing.

Options that mean something in one mode of a command only: given in another, they are refused (never accepted
and ignored), before anything is read or locked. Such options default to None in argparse, so that "given" is
known; the mode's defaults are filled in once the check passed."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from opsctl.base.errors import OpsctlError, RefusedError, echo

if TYPE_CHECKING:
    from opsctl.spec.load import LoadedSpec

SPEC_HELP = "topology spec (YAML; '-' reads it from standard input, then give --state-dir where the command has it)"
STATE_DIR_HELP = "where local state lives (default: .opsctl/<name> next to the spec)"
STATE_DIR_TUNNELS_HELP = "where local state lives (default: .opsctl/<name> next to the spec; SSH tunnels use it)"
AUTO_APPROVE_HELP = "do not ask for confirmation"
OUTPUTS = ("text", "json")


def add_spec_file(parser: argparse.ArgumentParser, required: bool = True, about: str = SPEC_HELP) -> None:
    """-f/--file: the topology spec a command works on (required but for commands with another form)."""
    parser.add_argument("-f", "--file", required=required, help=about)


def add_state_dir(parser: argparse.ArgumentParser, about: str = STATE_DIR_HELP) -> None:
    """--state-dir: where local state lives; about says what this command keeps there."""
    parser.add_argument("--state-dir", help=about)


def add_offline(parser: argparse.ArgumentParser) -> None:
    """--offline (args.offline): the commands that write a deploy's files from the records (render, inventory)."""
    parser.add_argument("--offline", action="store_true",
                        help="read no record (no SSH, no state dir): the nodes where a first deploy puts them, for CI "
                             "jobs without network (after a change of shape, not where the deployed nodes run)")


def placed_unless_offline(loaded: LoadedSpec, args: argparse.Namespace) -> LoadedSpec:
    """The spec placed from the nodes' records (opsctl.runtime.opening.placed_or_first), its note on stderr; with
    --offline the positional layout, nothing read."""
    if args.offline:
        return loaded
    from opsctl.cli.output import say
    from opsctl.runtime.opening import placed_or_first
    from opsctl.state.localdirs import state_dir_for

    placed, note = placed_or_first(loaded, state_dir_for(loaded, args.state_dir), getattr(args, "known_hosts", None))
    if note:
        say(note, getattr(args, "output", None) == "json")
    return placed


def add_output(parser: argparse.ArgumentParser, choices: tuple[str, ...] = OUTPUTS, about: str | None = None,
               moved: Moved | None = None) -> None:
    """-o/--output: how the result prints (a format, as kubectl's -o json), the first choice by default.
    moved: where the command's -o went when it named a folder or file (any value but a format is told so)."""
    parser.add_argument("-o", "--output", choices=choices, default=choices[0], help=about,
                        type=_format(choices, moved) if moved else str)


class Moved(NamedTuple):
    """What a command's -o named before it meant a format, and the option that takes it now."""

    command: str
    what: str  # "folder", "file"
    option: str  # "--dir", "--out"


def add_dir(parser: argparse.ArgumentParser, about: str, default: str | None = None) -> None:
    """--dir: the folder a command writes into (never -o/--output: that names a format)."""
    parser.add_argument("--dir", metavar="DIR", required=default is None, default=default, help=about)


def refuse_unless_printing(folder: str) -> None:
    """render --show-origins prints (--dir -): it writes no folder."""
    if folder != "-":
        raise OpsctlError("--show-origins prints the merged spec: it writes no folder",
                          hint="give --dir - with --show-origins")


def add_moved_output(parser: argparse.ArgumentParser, moved: Moved) -> None:
    """-o/--output on a command that has no format but whose -o named its folder: a clear usage error, not
    argparse's 'unrecognized arguments'."""
    parser.add_argument("-o", "--output", help=argparse.SUPPRESS, type=_format((), moved))


def _format(choices: tuple[str, ...], moved: Moved) -> Callable[[str], str]:
    """A format, or the usage error that says where the folder or file went."""

    def parse(text: str) -> str:
        if text in choices:
            return text
        formats = f" ({'|'.join(choices)})" if choices else ""
        raise argparse.ArgumentTypeError(
            f"-o/--output names an output format{formats}, not a {moved.what}: {moved.command} takes the "
            f"{moved.what} it writes as {moved.option} (use {moved.option} {text[:200]})")
    return parse


def add_spec_options(parser: argparse.ArgumentParser, state_dir_help: str = STATE_DIR_HELP,
                     output: bool = False) -> None:
    """-f/--file and --state-dir, in this order, and --output text|json after them when output."""
    add_spec_file(parser)
    add_state_dir(parser, state_dir_help)
    if output:
        add_output(parser)


def add_auto_approve(parser: argparse.ArgumentParser, about: str = AUTO_APPROVE_HELP) -> None:
    """--auto-approve, alias --yes (args.auto_approve): change things without asking, as pipelines must. Every
    command that changes something has both (opsctl.cli.options asks otherwise)."""
    parser.add_argument("--auto-approve", "--yes", dest="auto_approve", action="store_true", help=about)


def add_dry_run(parser: argparse.ArgumentParser, about: str) -> None:
    """--dry-run (args.dry_run): check and show, change nothing; about says what this command shows."""
    parser.add_argument("--dry-run", action="store_true", help=about)


def check_stdin_spec(args: argparse.Namespace) -> None:
    """-f - (the spec on standard input) has no folder, the default state dir's place: a command that has
    --state-dir needs it given, before anything is read (opsctl.state.specfile.STDIN_RULE)."""
    if getattr(args, "offline", False) and not getattr(args, "with_files", False):
        return  # --offline reads no record; only inventory --with-files' TLS files live in the state dir
    if getattr(args, "file", None) == "-" and hasattr(args, "state_dir") and args.state_dir is None:
        from opsctl.base.errors import OpsctlError
        from opsctl.state.specfile import STDIN_RULE

        raise OpsctlError("-f - needs --state-dir for this command", STDIN_RULE,
                          "pass --state-dir DIR (the folder a spec file's runs would use is .opsctl/<name> beside it)"
                          + (", or --offline to read no record" if getattr(args, "offline", True) is False else ""))


def add_metrics_textfile(parser: argparse.ArgumentParser) -> None:
    """--metrics-textfile DIR (args.metrics_textfile): the run's own signals for node_exporter's textfile collector,
    written at its end whatever its outcome (opsctl.cli.runsignals)."""
    parser.add_argument("--metrics-textfile", metavar="DIR",
                        help="write this run's outcome, duration and keys moved to DIR/opsctl_<topology>_<command>"
                             ".prom for node_exporter's textfile collector (the folder must exist)")


def add_force_lock(parser: argparse.ArgumentParser) -> None:
    """--force-lock (args.force_lock), on every command that takes the topology lock (opsctl.net.topolock)."""
    parser.add_argument("--force-lock", action="store_true",
                        help="go on when fewer than a majority of the servers answer to grant the topology lock "
                             "(they are down, not on the other side of a network split): a warning says what it "
                             "risks")


Number = TypeVar("Number", int, float)


class Ranged(Generic[Number]):
    """A whole number (int) or a finite number (float) from low to high, both included.

    `type=ranged(int, 1, 16384)`; argparse prints "argument --shard: 0 is out of range (1..16384)"."""

    def __init__(self, kind: type[Number], low: Number, high: Number) -> None:
        self.kind: type[Number] = kind
        self.low: Number = low
        self.high: Number = high
        self.__name__ = f"{kind.__name__} from {low:g} to {high:g}"

    def __call__(self, text: str) -> Number:
        noun = "a whole number" if self.kind is int else "a number"
        try:
            value: Number = self.kind(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{echo(text)} is not {noun}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{echo(text)} is not a finite number")
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"{echo(text)} is out of range ({self.low:g}..{self.high:g})")
        return value

    def __repr__(self) -> str:
        return f"ranged({self.kind.__name__}, {self.low!r}, {self.high!r})"


def ranged(kind: type[Number], low: Number, high: Number) -> Ranged[Number]:
    return Ranged(kind, low, high)


SLOTS = ranged(int, 1, 16384)
SECONDS = ranged(float, 0.1, 86400.0)
RATE = ranged(float, 1.0, 1e9)  # per second: 0, negative, nan and inf are refused


def confirm(args: argparse.Namespace, question: str, hint: str = "pass --auto-approve in pipelines") -> None:
    """Return when the run may go on; raise (exit 1 without a terminal, 3 when the answer is not 'yes') otherwise.
    Nothing was changed either way: every command asks before its first change."""
    if getattr(args, "auto_approve", False) or getattr(args, "dry_run", False):
        return
    if not sys.stdin.isatty():
        raise OpsctlError("refusing to change anything without confirmation", "standard input is not a terminal",
                          hint)
    answer = input(f"{question} Only 'yes' is accepted: ")
    if answer.strip() != "yes":
        raise RefusedError("cancelled, nothing changed")


def flag(dest: str) -> str:
    """The option's spelling on the command line: from_tls_ca -> --from-tls-ca (from_ -> --from)."""
    return "--" + dest.rstrip("_").replace("_", "-")


def refuse_given(args: argparse.Namespace, dests: tuple[str, ...], goes_with: str, hint: str) -> None:
    """Refuse every option of dests the command line gave (not None, not False): `--x, --y go with <goes_with>`."""
    given = [flag(dest) for dest in dests if getattr(args, dest, None) not in (None, False)]
    if given:
        verb = "goes" if len(given) == 1 else "go"
        raise OpsctlError(f"{', '.join(given)} {verb} with {goes_with}", hint=hint)


def fill_defaults(args: argparse.Namespace, defaults: Mapping[str, object]) -> None:
    """The defaults of the options refuse_given guards, for those not given."""
    for dest, value in defaults.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
