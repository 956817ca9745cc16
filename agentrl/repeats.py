"""Warnings that whole groups repeat: a broken env fails every episode the same way (a `start`
that raises: 64 alike lines a step at the quick start's settings, before the guard's one
traceback), so each distinct warning is logged the 1st, 10th, 100th, … time it comes."""

from __future__ import annotations

import logging
from collections import Counter

_seen: Counter[str] = Counter()


def _power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1


def warn_episode(log: logging.Logger, session: str, what: str) -> None:
    """`episode <session> <what>`, logged when this `what` is new or its count a power of ten."""
    _seen[what] += 1
    n = _seen[what]
    if n == 1:
        log.warning("episode %s %s", session, what)
    elif _power_of_ten(n):
        log.warning("episode %s %s (%d episodes so far; logged at 1, 10, 100, …)", session, what, n)
