"""The one question a command asks before it changes something: on a terminal, typed 'yes'; without one, a refusal
unless --auto-approve (alias --yes). A dry run never asks: it changes nothing."""

from __future__ import annotations

import argparse
import sys

from opsctl.base.errors import OpsctlError, RefusedError


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
