"""Provider state in pages: every customer with its balance, up to 100 per request.

Planning and verifying ask the same question of every account (what is its customer's balance?),
and Stripe's customers list answers it for 100 customers at once, so a night whose balances are
already right costs a request per 100 accounts, not one per account. Each page is its own paced,
retried request: a 429 on page 7 repeats page 7. The list is exact (unlike Stripe's search), so
a customer missing from it was deleted, made after it was read, or older than the pages read;
callers then ask for that one customer by id, as they would without the list.

A provider account can hold far more customers than a batch has accounts (a live account with
a million customers, a batch of fifty); :func:`some_customers` then stops listing after half as
many pages as the accounts it answers for, so reading a batch's balances never costs more than
1.5 requests per account, against one per account read one by one.
"""

from __future__ import annotations

from durable_assets import kit
from durable_assets.payments.gateway import Customer, PageSender
from durable_assets.payments.resources import PaymentGateway


def _paced(payments: PaymentGateway) -> PageSender:
    """Each page as one call through the process's limiter, retried like any read."""
    limiter, backoff = payments.limiter(), payments.backoff()
    return lambda request: kit.call_with_retries(lambda: {"page": request()}, limiter, backoff)["page"]


def every_customer(payments: PaymentGateway) -> list[Customer]:
    """Every live customer of the provider account, newest first, one paced request per page."""
    return payments.customers.list_customers(send=_paced(payments))


def some_customers(payments: PaymentGateway, accounts: int) -> dict[str, Customer]:
    """The newest listed customers by id, from at most ``accounts // 2`` pages (none for one
    account: its own read is cheaper); whoever is not among them is read by id."""
    pages = accounts // 2
    if pages == 0:
        return {}
    return {c.id: c for c in payments.customers.list_customers(send=_paced(payments), max_pages=pages)}
