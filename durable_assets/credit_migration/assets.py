"""The credit migration as Dagster assets: legacy prepaid credit into provider customer balances.

One dynamic partition per batch (``credit_batches``), so two batches never share a checkpoint.
Steps 3 and 5 cause side effects, each through the idempotency ledger with keys from business
identity (:mod:`durable_assets.credit_migration.keys`); the others read. The batch is safe to run
again, resume, or run tomorrow over the same accounts: customers are found, not created twice,
and only balances whose target changed move, by exactly the difference.
"""

# No `from __future__ import annotations`: Dagster reads these annotations at definition time.
import functools
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

import pandas as pd
from dagster import AssetExecutionContext, DynamicPartitionsDefinition, MaterializeResult, MetadataValue
from pydantic import Field

from durable_assets import kit
from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.errors import CreditCeilingExceededError
from durable_assets.credit_migration.keys import (
    adjustment_key,
    adjustment_subject,
    customer_key,
    is_adjustment_key,
)
from durable_assets.credit_migration.listing import every_customer
from durable_assets.credit_migration.plan import (
    BALANCE_DTYPES,
    LISTED_DTYPES,
    balances_at_target,
    balances_never_moved,
    confine_provider_changes,
    naming_every_customer,
    never_moved,
    plan_adjustments,
    provider_change,
    recorded_elsewhere,
)
from durable_assets.credit_migration.resources import CreditLimits
from durable_assets.credit_migration.schema import (
    AccountDecision,
    AdjustmentOutcome,
    CustomerOutcome,
    PlannedAction,
    ProviderChange,
    Verification,
)
from durable_assets.credit_migration.synthetic import synthetic_accounts
from durable_assets.credit_migration.validation import read_legacy_file, validate_accounts
from durable_assets.payments.gateway import BalanceTransaction, Customer, CustomerGateway
from durable_assets.payments.money import format_cents
from durable_assets.payments.resources import PaymentGateway

CREDIT_BATCHES = DynamicPartitionsDefinition(name="credit_batches")
#: A step of this job: one partition of CREDIT_BATCHES per batch, so batches never share a checkpoint.
step = functools.partial(kit.durable_asset, partitions_def=CREDIT_BATCHES)


class LegacyExport(kit.BatchInput):
    path: str | None = Field(default=None, description="CSV or Parquet export; unset = synthetic accounts")


def _read(
    context: AssetExecutionContext,
    payments: PaymentGateway,
    call: Callable[[str], Mapping[str, Any]],
    ids: list[str],
    *,
    settled: int = 0,
) -> list[Mapping[str, Any]]:
    """One paced, retried read per ID, at the provider's concurrency, with the step's progress
    (``settled``: accounts the customers list already answered, counted as done)."""
    total = settled + len(ids)
    kit.report_progress(context, settled, total)
    answers = kit.paced_map(
        call,
        ids,
        payments,
        on_done=lambda n: kit.report_progress(context, settled + n, total),
    )
    return answers


@step(label="Extracting legacy accounts", group_name="extract")
def legacy_accounts(context: AssetExecutionContext, config: LegacyExport) -> MaterializeResult:
    """Step 1 — the night's export of legacy accounts, as strings exactly as given.

    From ``path`` (CSV or Parquet) or, without one, a deterministic synthetic export whose accounts
    are the same in every batch (only some credits change), with about 1% broken rows.
    """
    if config.path:
        with kit.batch_input(context, config.path) as path:  # stored with the batch, or a local file
            raw = read_legacy_file(path)
        return kit.frame_result(raw, {"source": config.path})
    return kit.frame_result(synthetic_accounts(context.partition_key, config.size), {"source": "synthetic"})


@step(label="Validating accounts", group_name="extract", retry_policy=None)
def validated_accounts(context: AssetExecutionContext, legacy_accounts: pd.DataFrame) -> MaterializeResult:
    """Step 2 — typed accounts; every bad row is quarantined with all its reasons, never migrated.

    valid + quarantined == exported; the quarantine file (source row number and reasons) is written
    next to the batch for whoever fixes the export.
    """
    result = validate_accounts(legacy_accounts)
    credit = result.valid.groupby(s.CURRENCY)["credit_cents"].sum()
    return kit.frame_result(
        result.valid,
        {
            **kit.reports.write_quarantine(context, result.quarantined),
            "credit_by_currency_cents": MetadataValue.json({str(k): int(v) for k, v in credit.items()}),
        },
    )


class _CustomersByLegacyId:
    """Every live provider customer that names a legacy account, listed once per step when first needed.

    Listing is exact (Stripe's search is eventually consistent: a customer made a second ago may not
    be found) and cheap: one paced request per 100 customers of the provider account, read before this
    step creates any, so what it holds was made by someone else or by an earlier run. A lookup per
    account narrowed by email would cost a request per account and miss a customer whose email has
    changed since.
    """

    def __init__(
        self, list_customers: Callable[[], list[Customer]], runtime_check: Callable[[], None]
    ) -> None:
        self._list = list_customers
        self._check = runtime_check
        self._lock = threading.Lock()
        self._live: list[Customer] | None = None
        self._index: dict[str, list[Customer]] = {}
        self._folded: dict[str, list[Customer]] = {}
        self._by_email: dict[str, list[Customer]] = {}

    def _read(self) -> None:
        with self._lock:
            if self._live is not None:
                return
            self._check()
            live = [c for c in self._list() if not c.deleted]
            for customer in live:
                legacy = customer.metadata.get(s.LEGACY_ID_METADATA)
                if legacy:
                    self._index.setdefault(legacy, []).append(customer)
                    self._folded.setdefault(_folded(legacy), []).append(customer)
                if customer.email:
                    self._by_email.setdefault(_folded(customer.email), []).append(customer)
            self._live = live

    def find(self, legacy_account_id: str) -> list[Customer]:
        self._read()
        return self._index.get(legacy_account_id, [])

    def near(self, legacy_account_id: str, email: str) -> list[str]:
        """Customers that may be the account's although their metadata does not name it exactly,
        each described: a legacy id equal after case and space folding, or the account's email
        under another legacy id or none. Creating a customer beside one would split the account."""
        self._read()
        found: dict[str, str] = {}
        for c in self._folded.get(_folded(legacy_account_id), []):
            legacy = c.metadata.get(s.LEGACY_ID_METADATA, "")
            if legacy != legacy_account_id:
                found.setdefault(
                    c.id, f"{c.id} names legacy account {legacy!r} (the same but for case or spaces)"
                )
        for c in self._by_email.get(_folded(email), []) if email else []:
            legacy = c.metadata.get(s.LEGACY_ID_METADATA, "")
            if legacy != legacy_account_id:
                names = f"names legacy account {legacy!r}" if legacy else "names no legacy account"
                found.setdefault(c.id, f"{c.id} has the account's email {email} and {names}")
        return list(found.values())


def _folded(text: str) -> str:
    return "".join(text.split()).casefold()


def _customer_answer(customer: Customer) -> dict[str, Any]:
    return {"id": customer.id, s.LEGACY_ACCOUNT_ID: customer.metadata.get(s.LEGACY_ID_METADATA, "")}


def _several_customers_note(acct: str, ids: list[str], recorded: str = "") -> str:
    """Several customers name the account: a second one made beside the one the migration settled
    (``recorded``) is a duplicate made at the provider; otherwise a person picks among them."""
    if recorded in ids:
        change = provider_change(
            acct, recorded, ids, deleted=False, names=acct, when="since the migration last ran"
        )
        if change is not None:
            return change[1]
    return (
        f"{len(ids)} provider customers name legacy account {acct}: {', '.join(ids)}; keep one (delete or "
        "re-label the others' metadata.legacy_account_id), then run the migration again"
    )


def _near_match_note(acct: str, candidates: list[str]) -> str:
    return (
        f"no provider customer names legacy account {acct} exactly, but {'; '.join(candidates)}: if it "
        f"is this account's customer, set its metadata.legacy_account_id to {acct!r} and run the "
        "migration again (it is then adopted); no second customer is created beside it"
    )


def _recorded_customer_problem(
    acct: str, recorded: str, at_provider: list[str], retrieve: Callable[[str], Customer]
) -> str | None:
    """Why an account's customer, settled by an earlier run, can no longer be migrated to, or None.

    The ledger remembers the customer; the provider is the truth about whether it still stands.
    A customer deleted since, joined by a second one naming the same account, or whose metadata a
    person changed is a decision for a person: re-creating or choosing one silently could move
    credit to the wrong customer. Every customer naming the account is named in the note, so the
    report accounts for each one the provider holds (the ``one_customer_per_account`` check holds
    it to that).
    """
    if at_provider == [recorded]:
        return None
    deleted, names = False, acct
    if recorded not in at_provider:
        customer = retrieve(recorded)
        deleted, names = customer.deleted, customer.metadata.get(s.LEGACY_ID_METADATA, "")
    change = provider_change(
        acct, recorded, at_provider, deleted=deleted, names=names, when="since the migration last ran"
    )
    return change[1] if change else None


def _naming_accounts(live: list[Customer]) -> dict[str, list[str]]:
    """The live customers' ids by the legacy account their metadata names (newest first)."""
    at_provider: dict[str, list[str]] = {}
    for customer in live:
        legacy = customer.metadata.get(s.LEGACY_ID_METADATA)
        if legacy and not customer.deleted:
            at_provider.setdefault(legacy, []).append(customer.id)
    return at_provider


def _read_by_id(payments: PaymentGateway, ids: list[str]) -> dict[str, tuple[bool, str]]:
    """Each customer as the provider answers its id now: (deleted, the legacy account its metadata
    names). A 404 (an id the provider no longer knows at all) reads as deleted."""
    retrieve = _retrieving(payments)
    out: dict[str, tuple[bool, str]] = {}
    for customer_id in ids:
        try:
            customer = retrieve(customer_id)
        except kit.errors.ProviderRejectedError as exc:
            if exc.http_status != HTTPStatus.NOT_FOUND:
                raise
            out[customer_id] = (True, "")
            continue
        out[customer_id] = (customer.deleted, customer.metadata.get(s.LEGACY_ID_METADATA, ""))
    return out


def _change_figures(changes: Mapping[ProviderChange, int]) -> dict[str, int]:
    """How many accounts a provider change held, in all and by change (step and check metadata)."""
    return {
        "changed_at_provider": sum(changes.values()),
        **{f"customers_{change.value}": int(changes.get(change, 0)) for change in ProviderChange},
    }


def _retrieving(payments: PaymentGateway) -> Callable[[str], Customer]:
    """Retrieve a customer by id (paced, retried), once per id: a settled account's checks may ask twice."""
    customers = payments.customers

    @functools.cache
    def retrieve(customer_id: str) -> Customer:
        return kit.call_with_retries(
            lambda: {"customer": customers.retrieve_customer(customer_id)},
            payments.limiter(),
            payments.backoff(),
        )["customer"]

    return retrieve


@step(label="Finding or creating customers", group_name="customers", effect_scope="customer")
def provider_customers(
    context: AssetExecutionContext,
    validated_accounts: pd.DataFrame,
    payments: PaymentGateway,
    runtime: kit.BatchRuntime,
) -> MaterializeResult:
    """Step 3 — exactly one provider customer per legacy account: adopted if it exists, else created.

    Before creating a customer for an account the ledger has not settled, the provider's customers are
    looked up by ``metadata.legacy_account_id``: one match is adopted (a sign-up, support staff, an
    earlier migration), several are held for review with every ID named, none is created with the
    account's key (the legacy account ID alone, so every batch, night and worker asks for the same
    customer). An account settled by an earlier night is checked against the provider: a customer
    deleted since, or joined by a second one, is held for review, never re-created; once a person
    made one replacement naming the account (Stripe has no undelete), it is adopted, and the row's
    note says so. Only the held
    accounts wait for a person; the rest of the batch migrates. A held account's note names every
    customer the provider holds for it, so the report accounts for each one.
    """
    customers = payments.customers
    no_customer = _no_customer_decisions(context, payments)
    rows = {
        customer_key(str(acct)): (str(acct), str(email), str(name))
        for acct, email, name in zip(
            validated_accounts[s.LEGACY_ACCOUNT_ID],
            validated_accounts[s.EMAIL],
            validated_accounts[s.NAME],
            strict=True,
        )
        if str(acct) not in no_customer
    }
    index = _CustomersByLegacyId(lambda: every_customer(payments), runtime.check_may_continue)

    def create(intent: kit.Intent) -> Mapping[str, Any]:
        acct, email, name = rows[intent.key]
        customer = customers.create_customer(
            email=email,
            name=name or None,
            metadata={s.LEGACY_ID_METADATA: acct},
            idempotency_key=intent.key,
        )
        return _customer_answer(customer)

    def lookup(entry: kit.LedgerEntry) -> Mapping[str, Any] | None:
        found = index.find(str(entry.params[s.LEGACY_ACCOUNT_ID]))
        if len(found) > 1:
            return {
                "duplicates": [c.id for c in found],
                s.LEGACY_ACCOUNT_ID: entry.params[s.LEGACY_ACCOUNT_ID],
            }
        return _customer_answer(found[0]) if found else None

    def verify(intent: kit.Intent, answer: Mapping[str, Any]) -> str | None:
        if "duplicates" in answer:
            return _several_customers_note(
                str(intent.params[s.LEGACY_ACCOUNT_ID]), list(answer["duplicates"])
            )
        if answer.get(s.LEGACY_ACCOUNT_ID) != intent.params[s.LEGACY_ACCOUNT_ID]:
            return f"customer {answer.get('id')} names legacy account {answer.get(s.LEGACY_ACCOUNT_ID)!r}"
        return None

    # Several customers already name the account: a person picks one. Held before any claim, so no
    # ledger entry records it and the next batch looks again (after a person kept one, it migrates).
    runner = kit.effect_runner(
        context, perform=create, verify=verify, lookup=lookup, lookup_first=True, provider=payments
    )
    several = {key: acct for key, (acct, _email, _name) in rows.items() if len(index.find(acct)) > 1}
    # One of them is the customer an earlier run settled: a second one was made since (duplicated).
    settled_ids = (
        {e.key: str((e.result or {}).get("id", "")) for e in runner.ledger.entries(runner.scope, several)}
        if several
        else {}
    )
    notes = {
        key: _several_customers_note(acct, [c.id for c in index.find(acct)], settled_ids.get(key, ""))
        for key, acct in several.items()
    }
    # No customer names the account exactly, but one nearly does: a person decides whether it is
    # the account's. Held before any claim too, and only for accounts the ledger has never settled
    # (a settled account's customer is checked below, with what the ledger knows of it).
    nearly = {
        key: near
        for key, (acct, email, _name) in rows.items()
        if key not in notes and not index.find(acct) and (near := index.near(acct, email))
    }
    settled = {e.key for e in runner.ledger.entries(runner.scope, nearly)} if nearly else set()
    notes |= {key: _near_match_note(rows[key][0], near) for key, near in nearly.items() if key not in settled}
    intents = [
        kit.Intent(key, {s.LEGACY_ACCOUNT_ID: acct})
        for key, (acct, _email, _name) in rows.items()
        if key not in notes
    ]
    report = runner.run(intents)
    notes.update({key: kit.review_note(review) for key, review in report.review.items()})
    settled_before = [i for i in intents if i.key in report.reused and i.key in report.results]
    adopted: dict[str, tuple[Mapping[str, Any], str]] = {}  # key -> (replacement's answer, note)
    retrieve = _retrieving(payments)
    for intent in settled_before:
        acct = str(intent.params[s.LEGACY_ACCOUNT_ID])
        recorded = str(report.results[intent.key]["id"])
        found = index.find(acct)
        at_provider = [c.id for c in found]
        if recorded not in at_provider and len(found) == 1 and retrieve(recorded).deleted:
            # Stripe has no undelete: a customer a person made to replace the deleted one is the
            # account's now. The ledger keeps what the migration made; the row says what it adopted.
            adopted[intent.key] = (
                _customer_answer(found[0]),
                f"adopted customer {found[0].id}, made at the provider after customer {recorded} "
                f"(which legacy account {acct} was migrated to) was deleted",
            )
            continue
        problem = _recorded_customer_problem(acct, recorded, at_provider, retrieve)
        if problem:
            notes[intent.key] = problem
    ready = {k: v for k, v in report.results.items() if k not in notes} | {
        k: answer for k, (answer, _note) in adopted.items()
    }
    held_notes = {
        key: naming_every_customer(
            acct, notes.get(key, "no provider customer"), [c.id for c in index.find(acct)]
        )
        for key, (acct, _email, _name) in rows.items()
        if key not in ready
    }
    out = kit.tables.typed(
        pd.DataFrame(
            [
                {
                    s.LEGACY_ACCOUNT_ID: i.params[s.LEGACY_ACCOUNT_ID],
                    "customer_id": str((ready.get(i.key) or {}).get("id", "")),
                    "idempotency_key": i.key,
                    "status": CustomerOutcome.READY if i.key in ready else CustomerOutcome.HELD_FOR_REVIEW,
                    "review_note": held_notes.get(i.key, adopted.get(i.key, ({}, ""))[1]),
                }
                for i in [
                    kit.Intent(key, {s.LEGACY_ACCOUNT_ID: acct}) for key, (acct, _e, _n) in rows.items()
                ]
            ],
            columns=list(s.CUSTOMER_DTYPES),
        ),
        s.CUSTOMER_DTYPES,
    )
    out = _with_decided_accounts(out, validated_accounts, no_customer, index)
    held = int((out["status"] == CustomerOutcome.HELD_FOR_REVIEW).sum())
    decided = int((out["status"] == CustomerOutcome.DECIDED_BY_PERSON).sum())
    return kit.frame_result(
        out,
        {
            "customers": len(out) - held - decided,
            "decided_by_person": decided,
            "requests_sent": report.sent,
            "reused_from_ledger": report.replayed,
            "adopted": report.looked_up,
            kit.reports.HELD_FOR_REVIEW_KEY: held,
        },
    )


def _no_customer_decisions(
    context: AssetExecutionContext, payments: PaymentGateway
) -> dict[str, kit.ItemDecision]:
    """The accounts a person decided get no customer (``job decide ... no-customer``), at this account."""
    return {
        item: decision
        for item, decision in kit.decisions_for(context, provider=payments).items()
        if decision.decision == AccountDecision.NO_CUSTOMER
    }


def _with_decided_accounts(
    out: pd.DataFrame,
    accounts: pd.DataFrame,
    no_customer: Mapping[str, kit.ItemDecision],
    index: _CustomersByLegacyId,
) -> pd.DataFrame:
    """Step 3's rows plus one per account of the batch a person decided gets no customer: nothing
    was looked up, made or adopted for it, and its note names the decision (and any customer the
    provider holds for it anyway, so the report still accounts for every one)."""
    decided = [str(a) for a in accounts[s.LEGACY_ACCOUNT_ID] if str(a) in no_customer]
    if not decided:
        return out
    rows = pd.DataFrame(
        [
            {
                s.LEGACY_ACCOUNT_ID: acct,
                "customer_id": "",
                "idempotency_key": "",
                "status": CustomerOutcome.DECIDED_BY_PERSON,
                "review_note": naming_every_customer(
                    acct, f"no customer: {no_customer[acct].describe()}", [c.id for c in index.find(acct)]
                ),
            }
            for acct in decided
        ],
        columns=list(s.CUSTOMER_DTYPES),
    )
    return kit.tables.typed(pd.concat([out, rows], ignore_index=True), s.CUSTOMER_DTYPES)


def _balance_answer(customers: CustomerGateway, customer_id: str) -> dict[str, Any]:
    """The customer's balance, its version, and (plan rule 4) where someone else moved it after our
    last adjustment, what that adjustment left: one request, two when the newest transaction is
    not ours (rare: a person's or another tool's)."""
    answer: dict[str, Any] = never_moved(customer_id)
    try:
        latest = customers.latest_balance_transaction(customer_id)
    except kit.errors.ProviderRejectedError as exc:
        if exc.http_status != HTTPStatus.NOT_FOUND:
            raise
        # Deleted at the provider after step 3 found it: this account's problem, not the batch's.
        return answer | {"missing": True}
    if latest is None:
        return answer
    answer |= {
        "current_cents": latest.ending_balance,
        "current_currency": latest.currency,
        "balance_version": latest.id,
    }
    if not is_adjustment_key(latest.idempotency_key):
        ours = [
            t
            for t in customers.list_balance_transactions(customer_id)
            if is_adjustment_key(t.idempotency_key)
        ]
        if ours:  # newest first, as every provider list
            answer |= {"migrated_cents": ours[0].ending_balance, "migrated_by": ours[0].id}
    return answer


@step(label="Planning balance adjustments", group_name="balances")
def planned_adjustments(
    context: AssetExecutionContext,
    validated_accounts: pd.DataFrame,
    provider_customers: pd.DataFrame,
    payments: PaymentGateway,
    runtime: kit.BatchRuntime,
) -> MaterializeResult:
    """Step 4 — each account's target balance against the balance the provider holds now.

    Read-only. The provider is read again, not trusted from step 3: customers keep changing while a
    batch runs (support staff, sign-ups, other tools), and an account whose customer was deleted,
    joined by a second one, or re-labelled since step 3 found it is held with a note saying so and
    naming every customer involved (a recorded customer the list no longer shows under its account
    is read by id to tell which); a held account's note names every customer naming it now. Only
    that account waits for a person; a resume after a person's fix sees the fix.

    The customers list (one request per 100 customers, the whole provider account, with metadata)
    shows their balances: a customer listed at its target needs nothing more, nor does one
    listed with no currency (never moved: balance 0, no version). Every other
    one's newest balance transaction is read (one request each): its ``ending_balance`` is the
    balance and its id the balance's version, which keys the adjustment. An account at its target
    needs nothing; one whose customer's balance is in another currency is held for review; the rest
    get one adjustment of exactly the difference (rules: ``durable_assets/credit_migration/plan.py``).
    """
    customers = payments.customers
    runtime.check_may_continue()
    live = every_customer(payments)
    now, changes = confine_provider_changes(
        provider_customers,
        _naming_accounts(live),
        _read_by_id(payments, recorded_elsewhere(provider_customers, _naming_accounts(live))),
        when="after step 3 found it, while this batch ran",
    )
    ready = now[now["status"] == CustomerOutcome.READY]
    listed = pd.DataFrame(
        [{"customer_id": c.id, "balance": c.balance, "balance_currency": c.currency or ""} for c in live],
        columns=list(LISTED_DTYPES),
    )
    settled = pd.concat(
        [
            balances_at_target(validated_accounts, now, listed),
            balances_never_moved(now, listed),
        ],
        ignore_index=True,
    ).drop_duplicates("customer_id")
    known = set(settled["customer_id"])
    ids = [str(c) for c in ready["customer_id"] if str(c) not in known]
    answers = _read(
        context,
        payments,
        functools.partial(_balance_answer, customers),
        ids,
        settled=len(ready) - len(ids),
    )
    balances = pd.concat([settled, pd.DataFrame(answers, columns=list(BALANCE_DTYPES))], ignore_index=True)
    kept = {
        item: decision.describe()
        for item, decision in kit.decisions_for(context, provider=payments).items()
        if decision.decision == AccountDecision.KEEP_PROVIDER_BALANCE
    }
    plan = plan_adjustments(validated_accounts, now, balances, kept)
    adjust = plan[plan["action"] == PlannedAction.ADJUST]
    return kit.frame_result(
        plan,
        {
            **_change_figures(changes),
            "adjustments": len(adjust),
            "unchanged": int((plan["action"] == PlannedAction.UNCHANGED).sum()),
            kit.reports.HELD_FOR_REVIEW_KEY: int((plan["action"] == PlannedAction.HELD_FOR_REVIEW).sum()),
            "decided_by_person": int((plan["action"] == PlannedAction.DECIDED_BY_PERSON).sum()),
            "balances_read_one_by_one": len(ids),
            "adjustment_by_currency_cents": MetadataValue.json(_by_currency(adjust, "adjustment_cents")),
        },
    )


def _by_currency(frame: pd.DataFrame, column: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in frame.groupby(s.CURRENCY)[column].sum().items()}


def enforce_credit_limits(adjustments: pd.DataFrame, limits: CreditLimits) -> None:
    """Fail closed before the first balance moves: too many adjustments, or too much credit moved."""
    if len(adjustments) > limits.max_adjustments_per_batch:
        raise CreditCeilingExceededError(
            f"{len(adjustments)} balance adjustments exceed the per-batch ceiling of "
            f"{limits.max_adjustments_per_batch}; no balance was moved. If this batch is right, raise "
            f"DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH to at least {len(adjustments)} and "
            "`job resume --override-guardrails` it."
        )
    moved = adjustments.assign(moved=adjustments["adjustment_cents"].abs()).groupby(s.CURRENCY)["moved"].sum()
    above = moved[moved > limits.max_credit_per_batch_cents]
    if len(above):
        currency, cents = str(above.index[0]), int(above.iloc[0])
        raise CreditCeilingExceededError(
            f"balance adjustments moving {format_cents(cents, currency)} exceed the per-batch ceiling "
            f"of {format_cents(limits.max_credit_per_batch_cents, currency)}; no balance was moved. If "
            f"this batch is right, raise DURABLE_MAX_CREDIT_PER_BATCH_CENTS to at least {cents} and "
            "`job resume --override-guardrails` it."
        )


def _transaction_answer(transaction: BalanceTransaction) -> dict[str, Any]:
    return {
        "id": transaction.id,
        "customer": transaction.customer_id,
        "amount": transaction.amount,
        "currency": transaction.currency,
        "ending_balance": transaction.ending_balance,
    }


#: A lookup's answer for an intent whose customer was deleted at the provider before the intent's
#: answer was recorded (its value: the customer's id). Held for review, never sent.
CUSTOMER_DELETED_ANSWER = "customer_deleted"


def verify_adjustment(intent: kit.Intent, answer: Mapping[str, Any]) -> str | None:
    """An answer that is not exactly the transaction we asked for is held for review, never trusted."""
    if CUSTOMER_DELETED_ANSWER in answer:
        return f"customer {answer[CUSTOMER_DELETED_ANSWER]} was deleted at the provider"
    fields = (("customer", "customer_id"), ("amount", "amount"), ("currency", "currency"))
    return "; ".join(kit.answer_mismatches(intent.params, answer, fields)) or None


@step(label="Applying balance adjustments", group_name="balances", effect_scope="balance")
def applied_adjustments(
    context: AssetExecutionContext,
    planned_adjustments: pd.DataFrame,
    payments: PaymentGateway,
    credit_limits: CreditLimits,
) -> MaterializeResult:
    """Step 5 — one customer balance transaction per planned adjustment, exactly once.

    Keyed by the account, the balance version the plan read and the target, committed to the
    ledger before the request and carried in the transaction's ``metadata.idempotency_key``. Only
    the first adjustment claimed from a balance version is ever sent (a second plan from the same
    balance is held for review). The per-batch ceilings are checked before the first request. An
    adjustment held because the provider's answer was not what was asked carries that answer's
    transaction id: the transaction exists, whatever the row's status.

    A customer deleted at the provider after the plan is that account's alone: the provider's 404
    under the adjustment's key (a key it had applied would be answered with its transaction) holds
    the row, saying nothing moved. An intent older than the provider's key retention is looked up
    before it is sent again; if its customer is gone, its transactions went with it, so the row is
    held saying the outcome is unknown, and nothing is sent.
    """
    adjust = planned_adjustments[planned_adjustments["action"] == PlannedAction.ADJUST]
    enforce_credit_limits(adjust, credit_limits)
    customers = payments.customers

    def apply(intent: kit.Intent) -> Mapping[str, Any]:
        p = intent.params
        transaction = customers.create_balance_transaction(
            customer_id=p["customer_id"],
            amount=p["amount"],
            currency=p["currency"],
            description=f"Prepaid credit migrated from legacy account {p[s.LEGACY_ACCOUNT_ID]}",
            metadata={s.LEGACY_ID_METADATA: p[s.LEGACY_ACCOUNT_ID]},
            idempotency_key=intent.key,
        )
        return _transaction_answer(transaction)

    def lookup(entry: kit.LedgerEntry) -> Mapping[str, Any] | None:
        customer_id = str(entry.params["customer_id"])
        try:
            listed = customers.list_balance_transactions(customer_id)
        except kit.errors.ProviderRejectedError as exc:
            if (
                exc.http_status != HTTPStatus.NOT_FOUND
                or not customers.retrieve_customer(customer_id).deleted
            ):
                raise
            # Deleted since the intent: its transactions are gone with it, so whether the first
            # request reached it is unknowable, and sending again could only be refused. Held.
            return {CUSTOMER_DELETED_ANSWER: customer_id}
        found = [t for t in listed if t.idempotency_key == entry.key]
        return _transaction_answer(found[0]) if len(found) == 1 else None

    intents = [
        kit.Intent(
            adjustment_key(
                str(row.legacy_account_id),
                str(row.customer_id),
                str(row.balance_version),
                int(str(row.target_cents)),
            ),
            {
                s.LEGACY_ACCOUNT_ID: str(row.legacy_account_id),
                "customer_id": str(row.customer_id),
                "amount": int(str(row.adjustment_cents)),
                "currency": str(row.currency),
                "balance_version": str(row.balance_version),
                "target": int(str(row.target_cents)),
            },
            subject=adjustment_subject(str(row.customer_id), str(row.balance_version)),
        )
        for row in adjust.itertuples(index=False)
    ]
    runner = kit.effect_runner(
        context, perform=apply, verify=verify_adjustment, lookup=lookup, provider=payments
    )
    report = runner.run(intents)
    out = _applied_frame(planned_adjustments, intents, report)
    return kit.frame_result(
        out,
        {
            **_adjustment_figures(out),
            "requests_sent": report.sent,
            "reused_from_ledger": report.replayed,
            "reconciled_by_lookup": report.looked_up,
            "balance_already_claimed": report.subject_taken,
        },
    )


def _adjustment_figures(frame: pd.DataFrame) -> dict[str, Any]:
    """Step 5's outcome counts, which the report repeats under the same keys: the summary reads
    either step's (the last to report wins), so both must spell them alike."""
    applied = frame[frame["status"] == AdjustmentOutcome.APPLIED]
    return {
        "adjustments_applied": len(applied),
        "unchanged": int((frame["status"] == AdjustmentOutcome.UNCHANGED).sum()),
        kit.reports.HELD_FOR_REVIEW_KEY: int((frame["status"] == AdjustmentOutcome.HELD_FOR_REVIEW).sum()),
        "decided_by_person": int((frame["status"] == AdjustmentOutcome.DECIDED_BY_PERSON).sum()),
        "applied_by_currency_cents": MetadataValue.json(_by_currency(applied, "adjustment_cents")),
    }


def _applied_frame(plan: pd.DataFrame, intents: list[kit.Intent], report: kit.EffectReport) -> pd.DataFrame:
    """One row per planned account: applied, unchanged, or held with a note a person can act on.

    A held row whose ledger answer names a balance transaction (the provider answered the key, but
    not with what was asked) carries its id: that transaction exists, and the report says so rather
    than read as if no money moved.
    """
    key_of = {i.params[s.LEGACY_ACCOUNT_ID]: i.key for i in intents}
    rows = []
    for row in plan.itertuples(index=False):
        acct = str(row.legacy_account_id)
        key = key_of.get(acct, "")
        done = report.results.get(key) if key else None
        transaction_id = str((done or {}).get("id", ""))
        if row.action == PlannedAction.UNCHANGED:
            status, note = AdjustmentOutcome.UNCHANGED, str(row.review_note)
        elif row.action == PlannedAction.HELD_FOR_REVIEW:
            status, note = AdjustmentOutcome.HELD_FOR_REVIEW, str(row.review_note)
        elif row.action == PlannedAction.DECIDED_BY_PERSON:
            status, note = AdjustmentOutcome.DECIDED_BY_PERSON, str(row.review_note)
        elif done is not None:
            status, note = AdjustmentOutcome.APPLIED, str(row.review_note)
        else:
            review = report.review.get(key)
            transaction_id = _answered_transaction(review)
            status, note = (
                AdjustmentOutcome.HELD_FOR_REVIEW,
                (
                    _deleted_note(acct, str(row.customer_id), review)
                    or kit.review_note(review, subject_taken=_claimed_note)
                )
                + (
                    f"; balance transaction {transaction_id} exists at the provider (its answer to this "
                    "adjustment's key) and is not counted as applied: check its customer and amount"
                    if transaction_id
                    else ""
                ),
            )
        rows.append(
            {
                s.LEGACY_ACCOUNT_ID: acct,
                "customer_id": str(row.customer_id),
                s.CURRENCY: str(row.currency),
                "target_cents": int(str(row.target_cents)),
                "adjustment_cents": int(str(row.adjustment_cents))
                if status != AdjustmentOutcome.UNCHANGED
                else 0,
                "idempotency_key": key,
                "transaction_id": transaction_id,
                "status": status,
                "review_note": note,
            }
        )
    return kit.tables.typed(pd.DataFrame(rows, columns=list(s.APPLIED_DTYPES)), s.APPLIED_DTYPES)


def _deleted_note(acct: str, customer_id: str, review: Mapping[str, Any] | None) -> str | None:
    """The note of an adjustment held because its customer was deleted at the provider after the
    plan, or None for any other review.

    A 404 answered under the adjustment's own key means the provider never applied that key (a
    request that had reached it would be answered with its transaction), so nothing moved. A lookup
    (an intent older than the provider's key retention) that found the customer deleted cannot
    tell: its transactions went with it, and nothing was sent again.
    """
    review = review or {}
    answer = review.get("provider_answer")
    if isinstance(answer, Mapping) and CUSTOMER_DELETED_ANSWER in answer:
        return (
            f"customer {customer_id}, which legacy account {acct} is migrated to, was deleted at the "
            "provider before this adjustment's answer was recorded; its balance transactions went with "
            "it, so whether the adjustment reached it first is unknown, and it was not sent again: make "
            "the account's customer again at the provider (the next night adopts it and migrates the "
            "whole credit to it) or leave the account without one"
        )
    if review.get("http_status") == HTTPStatus.NOT_FOUND and review.get("code") == "resource_missing":
        return (
            f"customer {customer_id}, which legacy account {acct} is migrated to, was deleted at the "
            "provider after this batch planned its adjustment (the provider answers 404 under the "
            "adjustment's key); nothing was moved: make the account's customer again at the provider "
            "(the next night adopts it) or leave the account without one"
        )
    return None


def _answered_transaction(review: Mapping[str, Any] | None) -> str:
    """The balance transaction the provider answered a held key with ("" if none): a mismatched
    answer is recorded with the review, and it names an object that exists at the provider. Only
    this key's own answer: a subject's holder (another key) answers for its own row."""
    answer = (review or {}).get("provider_answer")
    return str(answer.get("id") or "") if isinstance(answer, Mapping) else ""


def _claimed_note(holder_key: str, holder: Mapping[str, Any]) -> str:
    """An adjustment whose balance version another adjustment claimed first: plan again from its result."""
    return (
        f"another adjustment (key {holder_key}, to {holder.get('target', '?')}) was already "
        "claimed from the same balance; run the migration again to plan from the balance it left"
    )


@step(label="Verifying balances", group_name="balances")
def verified_balances(
    context: AssetExecutionContext,
    applied_adjustments: pd.DataFrame,
    payments: PaymentGateway,
    runtime: kit.BatchRuntime,
) -> MaterializeResult:
    """Step 6 — every migrated account's balance read back from the provider and compared with its target.

    Read-only, from the customers list (one request per 100 customers, read after step 5's last
    adjustment). A balance that is not exactly the target is ``mismatch``. A customer changed at
    the provider since the plan read it (deleted, joined by a second customer naming the account,
    or its ``metadata.legacy_account_id`` changed by hand: one request by id tells which) is
    ``customer_deleted`` / ``customer_duplicated`` / ``customer_relabelled``, with a note naming
    every customer involved; the report holds each such account alone. A held account's note is
    brought up to date with every customer naming it now.
    """
    runtime.check_may_continue()
    live = every_customer(payments)
    listed = {c.id: c for c in live}
    at_provider = _naming_accounts(live)
    applied = kit.tables.typed(applied_adjustments, s.APPLIED_DTYPES)
    # Held, or left as a person decided: nothing of this batch's to read back.
    not_moved = (AdjustmentOutcome.HELD_FOR_REVIEW, AdjustmentOutcome.DECIDED_BY_PERSON)
    held = applied["status"].isin(not_moved)
    migrated = applied[~held]
    elsewhere = [
        str(cus)
        for acct, cus in zip(migrated[s.LEGACY_ACCOUNT_ID], migrated["customer_id"], strict=True)
        if str(cus) not in at_provider.get(str(acct), [])
    ]
    read_by_id = _read_by_id(payments, elsewhere)
    retrieve = _retrieving(payments)
    rows = []
    for acct, cus, status, note, target in zip(
        applied[s.LEGACY_ACCOUNT_ID],
        applied["customer_id"],
        applied["status"],
        applied["review_note"],
        applied["target_cents"],
        strict=True,
    ):
        found = at_provider.get(str(acct), [])
        if status in not_moved:
            named = naming_every_customer(str(acct), str(note), found)
            rows.append((0, Verification.NOT_MIGRATED, named if named != note else ""))
            continue
        deleted, names = read_by_id.get(str(cus), (False, str(acct)))
        change = provider_change(
            str(acct), str(cus), found, deleted=deleted, names=names, when="after its balance was planned"
        )
        if change is not None:
            balance = (
                0
                if deleted
                else (listed[str(cus)].balance if str(cus) in listed else retrieve(str(cus)).balance)
            )
            rows.append((balance, s.VERIFICATION_OF_CHANGE[change[0]], change[1]))
            continue
        balance = listed[str(cus)].balance
        rows.append((balance, Verification.MATCHED if balance == int(target) else Verification.MISMATCH, ""))
    out = applied.copy()
    out["provider_balance_cents"] = pd.Series([r[0] for r in rows], index=out.index, dtype="int64")
    out["verification"] = pd.Series([r[1].value for r in rows], index=out.index, dtype="str")
    out["provider_note"] = pd.Series([r[2] for r in rows], index=out.index, dtype="str")
    out = kit.tables.typed(out, s.VERIFIED_DTYPES)
    changes = {
        change: int((out["verification"] == verification).sum())
        for change, verification in s.VERIFICATION_OF_CHANGE.items()
    }
    kit.report_progress(context, len(out), len(out))
    return kit.frame_result(
        out,
        {
            "matched": int((out["verification"] == Verification.MATCHED).sum()),
            "mismatched": int((out["verification"] == Verification.MISMATCH).sum()),
            "not_migrated": int(held.sum()),
            **_change_figures(changes),
        },
    )


@step(label="Writing the migration report", group_name="reporting", retry_policy=None)
def migration_report(
    context: AssetExecutionContext,
    validated_accounts: pd.DataFrame,
    applied_adjustments: pd.DataFrame,
    verified_balances: pd.DataFrame,
) -> MaterializeResult:
    """Step 7 — one line per account (credit, target, adjustment, outcome), and the totals.

    Written as CSV with spreadsheet formulas neutralised (names and emails come from outside).
    """
    applied = kit.tables.typed(applied_adjustments, s.APPLIED_DTYPES)
    verified = kit.tables.typed(verified_balances, s.VERIFIED_DTYPES)[
        [s.LEGACY_ACCOUNT_ID, "verification", "provider_balance_cents", "provider_note"]
    ]
    accounts = kit.tables.typed(validated_accounts, s.ACCOUNT_DTYPES)[[s.LEGACY_ACCOUNT_ID, "credit_cents"]]
    merged = applied.merge(accounts, on=s.LEGACY_ACCOUNT_ID).merge(verified, on=s.LEGACY_ACCOUNT_ID)
    # A balance that missed its target is that account's problem: held, the rest of the batch stands.
    missed = merged["verification"] == Verification.MISMATCH
    if missed.any():  # pandas refuses an empty list under an all-False mask
        merged.loc[missed, "review_note"] = [
            f"balance read back is {format_cents(int(got), str(ccy))}, target "
            f"{format_cents(int(want), str(ccy))}: it moved outside this migration after the plan; "
            "check the customer's balance transactions"
            for got, want, ccy in merged.loc[
                missed, ["provider_balance_cents", "target_cents", s.CURRENCY]
            ].itertuples(index=False)
        ]
        merged.loc[missed, "status"] = AdjustmentOutcome.HELD_FOR_REVIEW.value
    # A customer changed at the provider after the plan (deleted, duplicated, re-labelled), and a held
    # account's customers named anew: step 6's note says what the provider holds now.
    changed = merged["provider_note"] != ""
    if changed.any():
        merged.loc[changed, "review_note"] = [
            note
            + (
                f"; its adjustment was applied first (balance transaction {txn})"
                if txn and st == AdjustmentOutcome.APPLIED
                else ""
            )
            for note, txn, st in merged.loc[
                changed, ["provider_note", "transaction_id", "status"]
            ].itertuples(index=False)
        ]
        merged.loc[changed, "status"] = AdjustmentOutcome.HELD_FOR_REVIEW.value
    report = kit.tables.typed(merged, s.REPORT_DTYPES)
    written = kit.reports.write_report(context, report, "migration_report.csv")
    return kit.frame_result(
        report,
        {
            **written,
            "accounts": len(report),
            **_adjustment_figures(report),
            "balances_matched": int((report["verification"] == Verification.MATCHED).sum()),
        },
    )


ALL_ASSETS = [
    legacy_accounts,
    validated_accounts,
    provider_customers,
    planned_adjustments,
    applied_adjustments,
    verified_balances,
    migration_report,
]

__all__ = ["ALL_ASSETS", "CREDIT_BATCHES", "LegacyExport"]
