"""Waiting on a condition with a deadline, for real processes that take as long as they take.

Tests and the benchmark poll (run storage, a port, a file) rather than sleep for a guessed time:
a guess is either too short on a loaded machine (flaky) or too long everywhere (slow). When the
deadline passes, the message names what was awaited and the last value the predicate returned,
so a timeout in CI says more than "condition not reached".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from .machine import scaled, slowness

T = TypeVar("T")


class WaitTimeout(AssertionError, TimeoutError):
    """The deadline passed. An ``AssertionError`` so pytest reports it as a failed check, and a
    ``TimeoutError`` so code that is not a test (the benchmark) can catch it for what it is."""


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: float = 0.05,
    what: str = "the condition",
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that value.

    Exceptions from ``predicate`` propagate at once (a predicate asserts that the process it
    watches is still alive, so a crash fails fast instead of at the deadline). After ``timeout``
    seconds it raises :class:`WaitTimeout` naming ``what``, the number of polls and the last value
    seen; ``detail`` (e.g. a process's log tail) is called then and appended.

    ``timeout`` is written for a quiet machine: the wait allows it times the machine's measured
    slowness (tests/support/machine.py), and the message says both.
    """
    limit = scaled(timeout)
    started = time.monotonic()
    deadline = started + limit
    polls = 0
    while True:
        value = predicate()
        polls += 1
        if value:
            return value
        if time.monotonic() >= deadline:
            message = (
                f"timed out after {time.monotonic() - started:.1f} s (limit {limit:.1f} s: {timeout:g} s "
                f"on a quiet machine x{slowness():.2f}; {polls} polls) waiting for {what}; "
                f"last value: {_short(value)}"
            )
            if detail is not None:
                message += f"\n{detail()}"
            raise WaitTimeout(message)
        time.sleep(interval)


def _short(value: object, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
