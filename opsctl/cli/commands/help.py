"""`opsctl help [TOPIC]` (references too long for --help: the spec's fields, the exit codes) and
`opsctl completion bash|zsh` (a shell completion script made from the parser). Registering them imports no
spec, schema or pydantic module: --help stays fast."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from opsctl.base.errors import EXIT_OK

EXIT_CODES = """Exit codes, the same for every command:
  0  ok (plan: no changes; backup --continuous, which runs until stopped: stopped by SIGINT or SIGTERM)
  1  error: bad input (the spec, an option, a file), an unreachable node, a refusal without a terminal
     (pass --auto-approve), an unhealthy status, an audit that could not read a node
  2  plan has changes; apply of a saved plan left steps for a new plan
  3  refused by a safety check, or the question was not answered 'yes': nothing was changed
  4  audit findings
  130, 143  stopped by SIGINT or SIGTERM at the next safe point (re-running picks up where it stopped)"""

STDIN = """-f - reads the spec from standard input (at most 1 MiB of UTF-8):
  cat topology.yaml | opsctl validate -f -
  render-spec | opsctl apply -f - --state-dir /var/lib/opsctl/orders --auto-approve
Such a spec has no folder of its own: its relative paths (secret files, server.binary, TLS files) start at
the working directory, every command that has --state-dir needs it given (the default, .opsctl/<name>, lies
beside a spec file), and the validated spec is not cached."""


def _spec() -> str:
    from opsctl.cli.spechelp import spec_reference
    from opsctl.spec.pydantic_model import spec_schema

    return spec_reference(spec_schema())


# topic -> (what it covers, its text)
TOPICS: dict[str, tuple[str, Callable[[], str]]] = {
    "spec": ("every field of the topology spec: path, type, default, meaning", _spec),
    "exit-codes": ("what each exit code means", lambda: EXIT_CODES),
    "stdin": ("-f -: the spec on standard input", lambda: STDIN),
}


def topics_text() -> str:
    width = max(len(t) for t in TOPICS)
    return "\n".join(["opsctl help TOPIC, one of:", *(f"  {t:<{width}}  {about}" for t, (about, _) in TOPICS.items()),
                      "", "opsctl COMMAND --help shows a command's options; opsctl completion bash|zsh a shell "
                      "completion script."])


def _help(args: argparse.Namespace) -> int:
    print(TOPICS[args.topic][1]() if args.topic else topics_text())
    return EXIT_OK


def _completion(args: argparse.Namespace) -> int:
    from opsctl.cli.completion import script
    from opsctl.cli.main import build_parser

    print(script(build_parser(), args.shell), end="")
    return EXIT_OK


def register_help(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("help", help="reference topics: the spec's fields, exit codes (opsctl help lists them)")
    p.add_argument("topic", nargs="?", choices=tuple(TOPICS), metavar="TOPIC", help=", ".join(TOPICS))
    p.set_defaults(handler=_help)


def register_completion(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("completion", help="print a completion script: source <(opsctl completion bash)")
    p.add_argument("shell", choices=("bash", "zsh"), help="bash or zsh")
    p.set_defaults(handler=_completion)
