"""The payment provider's counters as a test asserts them: every one at once, zero unless named.

Asserting the whole dict (not one counter) is what catches an effect counted where it should not
be; naming only the non-zero ones keeps each assertion about what the test did.
"""

from __future__ import annotations

#: What the store counts (``PaymentStore.stats``), written out here as the contract under test:
#: refunds, then customers and their balances.
_REFUND_COUNTERS = ("refund_requests", "refunds_created", "idempotent_replays")
STORE_COUNTERS = (*_REFUND_COUNTERS, "customers_created", "balance_transactions_created", "customers_deleted")
#: The simulator adds ``requests``: every ``/v1`` request it received, whatever its answer; and
#: ``rate_limited``: how many of them it answered 429.
SIMULATOR_COUNTERS = (*STORE_COUNTERS, "requests", "rate_limited")


def counters(**counted: int) -> dict[str, int]:
    """The store's counters, zero but for ``counted``; with ``requests``, the simulator's."""
    names = SIMULATOR_COUNTERS if "requests" in counted else STORE_COUNTERS
    unknown = sorted(set(counted) - set(names))
    if unknown:
        raise TypeError(f"no such counter: {unknown}")
    return {**dict.fromkeys(names, 0), **counted}
