"""ACL rules of auth.users[].rules, read the way the server reads a users.acl line, and checked before rendering.

Passwords come only from auth.users[].password (opsctl writes their hash): rules never carry one, never
remove it and never make a user passwordless.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from opsctl.base.errors import echo
from opsctl.spec.text import split_args

Problem = tuple[str, str]

_PASSWORD_RULES = {
    "nopass": "nopass lets anyone in as this user with any password",
    "resetpass": "resetpass removes the password opsctl sets",
    "reset": "reset removes the password opsctl sets and every permission",
}
_PASSWORD_PREFIXES = (">", "<", "#", "!")
_FLAGS = {"on", "off", "allkeys", "resetkeys", "allchannels", "resetchannels", "allcommands", "nocommands",
          "sanitize-payload", "skip-sanitize-payload", "clearselectors"}
_KEY_PATTERN = re.compile(r"^(~|%R~|%W~|%RW~)\S+$")
_CHANNEL_PATTERN = re.compile(r"^&\S+$")
_COMMAND_RULE = re.compile(r"^[+-](@[a-z]+|[A-Za-z][A-Za-z0-9_-]*(\|[A-Za-z][A-Za-z0-9_-]*)?)$", re.IGNORECASE)
_ALL_KEYS = {"allkeys", "~*", "%RW~*"}
_ALL_COMMANDS = {"allcommands", "+@all"}


def rule_tokens(rules: str) -> list[str]:
    """The rules as the server's parser splits them (quotes allowed); unparsable text as whitespace words."""
    try:
        return split_args(rules)
    except ValueError:
        return rules.split()


def check_rules(rules: str, allow_unsafe: bool, knows: Callable[[str], bool] = lambda _: True) -> Iterator[Problem]:
    """knows(name): whether the server has the command (as 'get') or ACL category (as '@read')."""
    try:
        tokens = split_args(rules)
    except ValueError:
        yield "has unbalanced quotes", "quote a key pattern as \"~my key*\" or leave quotes out"
        return
    for token in tokens:
        yield from _check_token(token.removeprefix("(").removesuffix(")"), knows)
    if not allow_unsafe and _grants_everything(tokens):
        yield ("gives every command on every key (an administrator, like opsctl's own user)",
               "grant what the application needs (e.g. ~app:* +@read +@write), subtract -@dangerous, "
               "or set hardening.allow_unsafe: true")


def _check_token(token: str, knows: Callable[[str], bool]) -> Iterator[Problem]:
    lowered = token.lower()
    if lowered in _PASSWORD_RULES:
        yield (f"rule {token} is not allowed: {_PASSWORD_RULES[lowered]}",
               "the password comes from auth.users[].password; remove the rule")
    elif token.startswith(_PASSWORD_PREFIXES):
        yield ("holds an inline password or password hash (a rule starting with >, <, # or !)",
               "remove it: the password comes from auth.users[].password (a secret, never in the spec)")
    elif not (lowered in _FLAGS or _KEY_PATTERN.match(token) or _CHANNEL_PATTERN.match(token)
              or _COMMAND_RULE.match(token)):
        yield (f"{echo(token)} is not an ACL rule",
               "use key patterns (~app:*), channels (&*), commands and categories (+get, +@read, -@dangerous)")
    elif _COMMAND_RULE.match(token) and not knows(token[1:].split("|")[0]):
        kind = "ACL category" if token[1] == "@" else "command"
        yield (f"{echo(token)}: unknown {kind} {echo(token[1:].split('|')[0])}",
               "see ACL CAT and COMMAND LIST on the server for the names it knows")


def _grants_everything(tokens: list[str]) -> bool:
    """All keys, and all commands with nothing taken away after the last grant of all commands."""
    all_keys = any(t.lower() in _ALL_KEYS for t in tokens)
    grants = [i for i, t in enumerate(tokens) if t.lower() in _ALL_COMMANDS]
    if not (all_keys and grants):
        return False
    return not any(t.startswith("-") or t.lower() == "nocommands" for t in tokens[grants[-1] + 1:])
