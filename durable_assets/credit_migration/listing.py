"""Provider state in pages: every customer with its balance, up to 100 per request.

Planning and verifying ask the same question of every account (what is its customer's balance?),
and Stripe's customers list answers it for 100 customers at once, so a night whose balances are
already right costs a request per 100 accounts, not one per account. Each page is its own paced,
retried request: a 429 on page 7 repeats page 7. The list is exact (unlike Stripe's search), so
a customer missing from it was deleted or made after it was read; callers then ask for that one
customer by id, as they would without the list.
"""

from __future__ import annotations

from durable_assets import kit
from durable_assets.payments.gateway import Customer
from durable_assets.payments.resources import PaymentGateway


def every_customer(payments: PaymentGateway) -> list[Customer]:
    """Every live customer of the provider account, newest first, one paced request per page."""
    limiter, backoff = payments.limiter(), payments.backoff()
    return payments.customers.list_customers(
        send=lambda request: kit.call_with_retries(lambda: {"page": request()}, limiter, backoff)["page"]
    )


def by_id(customers: list[Customer]) -> dict[str, Customer]:
    """The listed customers by id (a list never holds one twice: the gateway fails closed on that)."""
    return {customer.id: customer for customer in customers}
