"""Which API keys the simulator accepts and how it reads them, as Stripe does: a wrong key is a
401 here too, so a client misconfigured for Stripe fails against the simulator first."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass

from durable_assets.errors import UsageError

#: Accepted when no ``--api-key`` is given: any test-mode secret key, like the one in Stripe's docs.
TEST_KEY_PREFIX = "sk_test_"
_KEY_PREFIXES = tuple(f"{kind}_{mode}_" for kind in ("sk", "rk", "pk") for mode in ("test", "live"))
#: Keys that reach live-mode data at Stripe; never accepted here, where every object is test mode.
LIVE_KEY_PREFIXES = tuple(prefix for prefix in _KEY_PREFIXES if "_live_" in prefix)


class LiveApiKeyError(UsageError):
    """``--api-key`` named a live-mode key: accepting it would let a live key read and write the
    simulator's test-mode objects (all ``livemode: false``), which Stripe never allows."""


@dataclass(frozen=True)
class ApiKeys:
    """Which API keys the simulator accepts: the ``--api-key`` values, or any ``sk_test_`` key.

    Stripe answers 401 for a key it does not know; accepting anything would let a client whose
    ``STRIPE_API_KEY`` is wrong pass every test here and fail on its first call to Stripe.
    """

    keys: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for key in self.keys:
            if not key or any(character.isspace() or character == ":" for character in key):
                raise UsageError(f"--api-key must be non-empty, without spaces or ':', got {key!r}.")
            if key.startswith(LIVE_KEY_PREFIXES):
                raise LiveApiKeyError(
                    f"--api-key {mask_api_key(key)} is a live-mode key; the simulator holds test-mode data "
                    "only: give a test-mode key (sk_test_..., rk_test_...) or one of your own naming."
                )

    @classmethod
    def of(cls, keys: Iterable[str]) -> ApiKeys:
        return cls(frozenset(keys))

    def accepts(self, key: str) -> bool:
        """A live key is never accepted (``keys`` cannot hold one): Stripe answers a live key
        that has no live account the same 401 as any unknown key."""
        if self.keys:
            return key in self.keys
        return key.startswith(TEST_KEY_PREFIX) and len(key) > len(TEST_KEY_PREFIX)


def api_key_from(header: str | None) -> str:
    """The key of ``Bearer KEY``, or of HTTP Basic with the key as user (``curl -u KEY:``); else ``""``."""
    scheme, _, credentials = (header or "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        return credentials
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[0]
    return ""


def mask_api_key(key: str) -> str:
    """Stripe's way of naming a wrong key: the mode prefix and the last four characters only."""
    prefix = next((prefix for prefix in _KEY_PREFIXES if key.startswith(prefix)), "")
    rest = key[len(prefix) :]
    return prefix + "*" * max(len(rest) - 4, 0) + rest[-4:]
