"""`opsctl completion bash|zsh`: a completion script generated from the argument parser itself, so it offers exactly
the commands, options and choices this opsctl has. Pure: a parser in, shell text out. One bash function serves
zsh too (through bashcompinit), so the two shells cannot disagree. What it offers where: docs/internals.md."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from opsctl.base.frozen import Frozen, frozen

SHELLS = ("bash", "zsh")


@frozen
class Command(Frozen):
    """One parser of the tree: the words that reach it, its subcommands, its option strings, the choices each
    value-taking option offers (None: a path, files; (): a value completion cannot guess), positional choices."""

    path: str
    subcommands: tuple[str, ...]
    options: tuple[str, ...]
    values: tuple[tuple[str, tuple[str, ...] | None], ...]
    positionals: tuple[str, ...]


def commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Command]:
    """Every parser of the tree, the root (path "") first."""
    subcommands: list[str] = []
    children: list[tuple[str, argparse.ArgumentParser]] = []
    options: list[str] = []
    values: list[tuple[str, tuple[str, ...] | None]] = []
    positionals: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            children += list(action.choices.items())
            subcommands += list(action.choices)
        elif action.option_strings and action.help == argparse.SUPPRESS:
            continue  # hidden: there only to say where a moved option went (render -o), never offered
        elif action.option_strings:
            options += action.option_strings
            if action.nargs != 0:
                offered = _offered(action)
                values += [(flag, offered) for flag in action.option_strings]
        elif action.choices is not None:
            positionals += [str(c) for c in action.choices]
    yield Command(path, tuple(subcommands), tuple(options), tuple(values), tuple(positionals))
    for name, child in children:
        yield from commands(child, f"{path} {name}".strip())


def _offered(action: argparse.Action) -> tuple[str, ...] | None:
    if action.choices is not None:
        return tuple(str(c) for c in action.choices)
    return None if action.type is None else ()


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for shell (one of SHELLS), for `source <(opsctl completion bash)` or an rc file."""
    body = _bash(list(commands(parser)), parser.prog)
    if shell == "zsh":
        return f"#compdef {parser.prog}\nautoload -U +X bashcompinit && bashcompinit\n{body}"
    return body


def _bash(tree: list[Command], prog: str) -> str:
    fn = f"_{prog.replace('-', '_')}_complete"
    steps = "\n".join(f'            "{c.path}") case "$w" in {"|".join(c.subcommands)}) path="{c.path} $w";; esac;;'
                      for c in tree if c.subcommands)
    words = "\n".join(f'        "{c.path}") words="{" ".join((*c.subcommands, *c.positionals, *c.options))}";;'
                      for c in tree)
    values = "\n".join(_value_case(c) for c in tree if c.values)
    return f"""# {prog} completion, generated from its argument parser: `source <({prog} completion bash)`
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" path="" w i words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$path" in
{steps}
        esac
        path="${{path# }}"
    done
    case "$path|$prev" in
{values}
    esac
    case "$path" in
{words}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F {fn} {prog}
"""


def _value_case(command: Command) -> str:
    lines = []
    for flag, offered in command.values:
        pattern = f'"{command.path}|{flag}"'
        if offered is None:
            lines.append(f'        {pattern}) COMPREPLY=($(compgen -f -- "$cur")); return;;')
        elif offered:
            lines.append(f'        {pattern}) COMPREPLY=($(compgen -W "{" ".join(offered)}" -- "$cur")); return;;')
        else:
            lines.append(f"        {pattern}) COMPREPLY=(); return;;")
    return "\n".join(lines)
