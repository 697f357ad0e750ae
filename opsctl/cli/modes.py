"""Options that mean something in one mode of a command only: given in another, they are refused (never accepted
and ignored), before anything is read or locked. Such options default to None in argparse, so that "given" is
known; the mode's defaults are filled in once the check passed."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from opsctl.base.errors import OpsctlError


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
