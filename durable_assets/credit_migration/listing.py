"""Provider state in pages: every customer with its balance, up to 100 per request.

Planning and verifying ask the same question of every account (what is its customer's balance?),
and Stripe's customers list answers it for 100 customers at once, so a night whose balances are
already right costs a request per 100 accounts, not one per account. Each page is its own paced,
retried request: a 429 on page 7 repeats page 7. The list is exact (unlike Stripe's search), so
a customer missing from it was deleted, made after it was read, or older than the pages read;
callers then ask for that one customer by id, as they would without the list.

Every list is whole (#34): a customer made, deleted or re-labelled while a batch runs is seen only
by a list of the whole account, and steps 3, 4 and 6 and the customers check each need that to
hold such an account alone. A provider account with far more customers than a batch has accounts
(a live account with a million, a batch of fifty) therefore costs its whole list four times a batch.

Pages follow a cursor, so a list is one round trip per 100 customers however fast the provider
lets us go: 50 pages at 100 ms are 6 s, and a night lists four times. The cursor of each page is
the last customer of the page before, so a process that has listed an account knows every page's
cursor of the next list in advance (``PaymentGateway.page_cursors``, kept in the instance's database
for every process) and asks for all pages at once. Each page
then must reach the next page's cursor customer (or a customer the next page holds); one that
does not, because customers were made or deleted since, goes on by its own cursor until it does,
and the last page goes on until the provider has no more. So the list holds every customer a
single cursor would have listed, in the same order, in as many requests when nothing changed; a
changed account only costs more pages. An account never listed whole before is read by one cursor.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from durable_assets import kit
from durable_assets.errors import ProviderRejectedError, ProviderResponseMismatchError
from durable_assets.payments.gateway import Customer, PageSender
from durable_assets.payments.resources import PaymentGateway

#: The list whose page cursors the provider account remembers.
CUSTOMERS = "customers"


def _paced(payments: PaymentGateway) -> PageSender:
    """Each page as one call through the process's limiter, retried like any read."""
    limiter, backoff = payments.limiter(), payments.backoff()
    return lambda request: kit.call_with_retries(lambda: {"page": request()}, limiter, backoff)["page"]


def every_customer(payments: PaymentGateway) -> list[Customer]:
    """Every live customer of the provider account, newest first, one paced request per page: all
    pages at once when the account has been listed whole before (by any process of this
    instance), else one after another."""
    cursors = payments.page_cursors(CUSTOMERS)
    if cursors:
        listed = _from_known_cursors(payments, cursors)
    else:
        listed = payments.customers.list_customers(send=_paced(payments))
    size = payments.customers.page_size
    payments.remember_page_cursors(CUSTOMERS, [c.id for c in listed[size - 1 : -1 : size]])
    return listed


def _from_known_cursors(payments: PaymentGateway, cursors: tuple[str, ...]) -> list[Customer]:
    customers, send = payments.customers, _paced(payments)
    starts: list[str | None] = [None, *cursors]

    def page_after(after: str | None) -> tuple[list[Customer], bool]:
        return customers.customers_page(starting_after=after, send=send)

    try:
        with ThreadPoolExecutor(min(len(starts), max(payments.concurrency, 1))) as pool:
            pages = list(pool.map(page_after, starts))
    except ProviderRejectedError:  # a cursor customer deleted since, at a provider that refuses it
        return customers.list_customers(send=send)
    listed: list[Customer] = []
    seen: set[str] = set()
    for n, (page, has_more) in enumerate(pages):
        # Where the next page begins: after its cursor customer, at the first customer it holds.
        cursor = cursors[n] if n < len(cursors) else None
        following = {c.id for c in pages[n + 1][0]} if n < len(cursors) else set()
        joins = set() if cursor is None else {cursor, *following}
        run, more = list(page), has_more
        while more and joins.isdisjoint(c.id for c in run):  # the last page: until no more follow
            older, more = page_after(run[-1].id) if run else ([], True)
            if (more and not older) or not {c.id for c in older}.isdisjoint(r.id for r in run):
                raise ProviderResponseMismatchError(
                    "Payment provider's customers list did not advance"
                    f"{f' after {run[-1].id}' if run else ''}; failing closed."
                )
            run += older
        for customer in run:  # up to where the next page begins, so the order stays newest first
            if customer.id in following:
                break
            if customer.id not in seen:
                seen.add(customer.id)
                listed.append(customer)
            if customer.id == cursor:
                break
    return listed
