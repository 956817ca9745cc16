"""Warnings that whole groups repeat: a broken env fails every episode the same way (a `start`
that raises: 64 alike lines a step at the quick start's settings, before the guard's one
traceback), so each distinct warning is logged the 1st, 10th, 100th, … time it comes. Torch-free
and importing nothing of agentrl: the records layer (env.py: a reward that fails) uses it too."""

from __future__ import annotations

import logging
import re
from collections import Counter

_seen: Counter[str] = Counter()


def _power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1


def warn_episode(log: logging.Logger, session: str, what: str) -> None:
    """`episode <session> <what>`, logged when this `what` is new or its count a power of ten
    (counted without the object addresses a repr carries: `<coroutine object … at 0x7f…>`)."""
    key = re.sub(r" at 0x[0-9a-fA-F]+", "", what)
    _seen[key] += 1
    n = _seen[key]
    if n == 1:
        log.warning("episode %s %s", session, what)
    elif _power_of_ten(n):
        log.warning("episode %s %s (%d episodes so far; logged at 1, 10, 100, …)", session, what, n)
