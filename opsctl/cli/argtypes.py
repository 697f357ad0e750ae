"""argparse types for command options: every number has a range, checked before anything is touched."""

from __future__ import annotations

import argparse
import math
from typing import Generic, TypeVar

from opsctl.base.errors import echo

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
