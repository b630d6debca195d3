"""The customers list read all pages at once (``credit_migration/listing.py``): whatever changed at
the provider since this process last listed the account, it holds exactly what one cursor lists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_assets.credit_migration import listing
from durable_assets.kit.pacing import Backoff, RateLimiter
from durable_assets.payments.gateway import Customer, EmbeddedGateway


class _Counted(EmbeddedGateway):
    """The embedded provider, counting list requests (what ``/_sim/stats`` counts at a simulator)."""

    pages = 0

    def _list_customers(self, **kwargs: Any) -> object:
        type(self).pages += 1
        return super()._list_customers(**kwargs)


class _Payments:
    """What the listing asks of ``PaymentGateway``, around one embedded provider."""

    def __init__(self, customers: EmbeddedGateway) -> None:
        self.customers = customers
        self.concurrency = 4
        self._limiter = RateLimiter()
        self._cursors: dict[str, list[str]] = {}

    def page_cursors(self, list_name: str) -> tuple[str, ...]:
        return tuple(self._cursors.get(list_name, ()))

    def remember_page_cursors(self, list_name: str, cursors: list[str]) -> None:
        self._cursors[list_name] = list(cursors)

    def limiter(self) -> RateLimiter:
        return self._limiter

    def backoff(self) -> Backoff:
        return Backoff(down_budget_s=5)


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[Any]:
    gateway = _Counted(str(tmp_path / "provider.db"), page_size=3)
    _Counted.pages = 0
    yield _Payments(gateway)
    gateway.close()


def _make(payments: Any, n: int, start: int = 0) -> list[Customer]:
    return [
        payments.customers.create_customer(
            email=None, name=None, metadata={"legacy_account_id": f"L{i}"}, idempotency_key=f"c{i}"
        )
        for i in range(start, start + n)
    ]


def _one_cursor(payments: Any) -> list[str]:
    return [c.id for c in payments.customers.list_customers()]


def _listed_at_once(payments: Any) -> tuple[list[str], int]:
    before = _Counted.pages
    ids = [c.id for c in listing.every_customer(payments)]
    return ids, _Counted.pages - before


def test_a_second_list_asks_for_every_page_at_once_in_as_many_requests(payments: Any) -> None:
    _make(payments, 10)  # four pages of three
    first, first_requests = _listed_at_once(payments)
    again, requests = _listed_at_once(payments)
    assert first == again == _one_cursor(payments)
    assert first_requests == requests == 4


def test_zero_and_one_page_accounts(payments: Any) -> None:
    assert _listed_at_once(payments) == ([], 1)
    _make(payments, 2)
    assert _listed_at_once(payments)[0] == _one_cursor(payments)
    assert _listed_at_once(payments)[0] == _one_cursor(payments)


@pytest.mark.parametrize(
    "change",
    ["made since", "cursor customer deleted", "other customer deleted", "a page emptied", "all deleted"],
)
def test_a_changed_account_lists_what_one_cursor_lists(payments: Any, change: str) -> None:
    made = _make(payments, 12)  # newest first in lists: made[11] .. made[0]
    listing.every_customer(payments)  # cursors: made[9], made[6], made[3]
    deleted: list[Customer] = []
    if change == "made since":
        _make(payments, 5, start=100)
    elif change == "cursor customer deleted":
        deleted = [made[6]]
    elif change == "other customer deleted":
        deleted = [made[7], made[1]]
    elif change == "a page emptied":
        deleted = made[3:6]
    else:
        deleted = made
    for customer in deleted:
        payments.customers.delete_customer(customer.id)
    ids, _requests = _listed_at_once(payments)
    assert ids == _one_cursor(payments)
    assert not {c.id for c in deleted} & set(ids)
    assert len(ids) == len(set(ids)) == len(made) - len(deleted) + (5 if change == "made since" else 0)
