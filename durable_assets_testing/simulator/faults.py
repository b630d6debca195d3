"""The misbehaviour the simulator injects on purpose: latency, injected 500s, lost responses and
rate limiting, each the fault that turns naive retries into double effects."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from durable_assets.errors import UsageError


@dataclass(frozen=True)
class Faults:
    """The misbehaviour the simulator injects; replaceable at runtime via ``configure``."""

    latency_ms: float = 0.0
    error_rate: float = 0.0
    lost_response_rate: float = 0.0
    rate_limit: float | None = None

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise UsageError(f"--latency-ms must be >= 0, got {self.latency_ms}.")
        for name in ("error_rate", "lost_response_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, got {rate}.")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise UsageError(f"--rate-limit must be > 0 requests/s, got {self.rate_limit}.")


class TokenBucket:
    """Admits ``rate`` requests/s on average, with a burst of one second's worth (at least one)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._capacity = max(1.0, rate)
        self._tokens = self._capacity
        self._clock = clock
        self._updated = clock()
        self._lock = threading.Lock()

    def take(self) -> float | None:
        """``None`` if admitted, else the seconds until a token will be available."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._updated) * self._rate)
            self._updated = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return None
            return (1.0 - self._tokens) / self._rate


def format_retry_after(seconds: float) -> str:
    """Whole seconds rounded up (RFC 9110 delta-seconds): ``0.05`` -> ``1``, ``2.0`` -> ``2``; never 0."""
    return str(max(1, math.ceil(seconds)))
