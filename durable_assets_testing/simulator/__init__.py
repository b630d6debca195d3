"""A Stripe-compatible HTTP payment simulator (``job provider serve``) with fault injection.

It speaks the subset of Stripe's v1 API the refund pipeline uses, closely enough that the
official ``stripe`` SDK talks to it unmodified, and it can misbehave on purpose: latency,
injected 500s, lost responses (the refund is committed but the client never hears back) and
rate limiting. Those are exactly the faults that turn naive retries into double refunds, so the
pipeline's exactly-once claims are tested against them rather than against a polite server.

All business rules live in :class:`~durable_assets.payments.store.PaymentStore`; this package only
translates HTTP: :mod:`.server` (connections, faults, the order of checks), :mod:`.routes` (one
store call per route), :mod:`.params`, :mod:`.expansion`, :mod:`.responses`, :mod:`.auth` and
:mod:`.faults`.

Routes (everything under ``/v1`` needs an API key the simulator accepts, sent as Stripe takes it:
``Authorization: Bearer KEY`` or HTTP Basic with the key as user, ``curl -u KEY:``; the keys given
with ``--api-key``, else any ``sk_test_`` key; never a live-mode key, since every object here is test
mode). Currencies are Stripe's, and an ``Idempotency-Key`` is bound to the path of its first request,
as at Stripe (both rules are the store's, so the embedded provider keeps them too):

* ``POST /v1/charges``, ``POST /v1/refunds`` (form-encoded like Stripe, ``Idempotency-Key``)
* ``GET /v1/refunds/{id}``, ``GET /v1/refunds?limit=&starting_after=&ending_before=&charge=``
* ``GET /v1/charges/{id}`` and ``GET /v1/charges/{id}/refunds`` (the URL of a charge's refund list)
* ``GET /v1/charges?limit=&starting_after=&ending_before=&customer=``
* ``POST /v1/customers`` (``email``, ``name``, ``metadata[...]``, ``Idempotency-Key``),
  ``GET /v1/customers/{id}``, ``GET /v1/customers?limit=&starting_after=&ending_before=&email=``
* ``POST /v1/customers/{id}`` (update ``email``, ``name``, ``description``, ``metadata[...]``: an
  absent field is kept, an empty one unset, as Stripe's form encoding says)
* ``DELETE /v1/customers/{id}`` (Stripe's semantics: the id then answers ``deleted: true``, lists
  leave it out, writes on it and a second delete are 404)
* ``POST /v1/customers/{id}/balance_transactions`` (``amount``, ``currency``, ``description``,
  ``metadata[...]``, ``Idempotency-Key``), ``GET /v1/customers/{id}/balance_transactions`` and
  ``GET /v1/customers/{id}/balance_transactions/{txn}``
* ``GET /v1/account``: the account this ``--db`` file is, its id made once with the file
* ``expand[]`` on all of them (``expand[]=charge`` on a refund, ``expand[]=customer`` on a balance
  transaction, ``expand[]=data.charge`` on a list); expansion is applied to the answer, so an
  idempotent replay is expanded afresh
* ``GET /_sim/stats`` and ``GET /healthz`` (no auth, no faults)

Every fault applies to every ``/v1`` route alike; a lost response drops the answer of any POST or
DELETE after its work is committed.

Order of checks for a ``/v1`` request: counted in ``requests``, route (404), auth (400 for two
``Authorization`` headers, 401), refund request counted in ``refund_requests``, rate limit (429),
in-flight idempotency key (409), latency, injected error (500), processing, lost response. 401 and
429 answers are immediate: a real edge rejects them before any work. Unauthenticated requests are
not counted in ``refund_requests``.

``requests`` (in ``/_sim/stats``) is every ``/v1`` request this process received, whatever its
answer. Unlike the other counters it is kept in memory, not in the ``--db`` file, so it restarts at
0 with the process: it counts traffic, not effects, and persisting it would cost a synced write
(~2 ms measured) on every request, reads included, which would make the simulator the bottleneck.
``rate_limited``, kept the same way, is how many of them were answered 429: a benchmark's request
floor is ``(requests - rate_limited) / limit``, the requests the provider's limit admitted.

``Retry-After`` on 429 is a whole number of seconds, rounded up and at least 1, because RFC 9110
allows only integers there and strict clients reject anything else; rounding up keeps the promise
that a token is back in the bucket by then (unless another client takes it first).
"""

from durable_assets_testing.simulator.auth import (
    TEST_KEY_PREFIX,
    ApiKeys,
    LiveApiKeyError,
    api_key_from,
    mask_api_key,
)
from durable_assets_testing.simulator.faults import Faults, TokenBucket, format_retry_after
from durable_assets_testing.simulator.server import SimulatorHandler, SimulatorServer, build_server, serve

__all__ = [
    "TEST_KEY_PREFIX",
    "ApiKeys",
    "Faults",
    "LiveApiKeyError",
    "SimulatorHandler",
    "SimulatorServer",
    "TokenBucket",
    "api_key_from",
    "build_server",
    "format_retry_after",
    "mask_api_key",
    "serve",
]
