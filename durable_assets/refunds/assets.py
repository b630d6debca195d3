"""The invoice-refund pipeline as Dagster assets, one dynamic partition per batch.

Each batch ID is a partition of the ``batches`` dynamic partitions definition, so every step's
stored output lives at its own path (``storage/<asset>/<batch>``): two batches running at once
can never read or overwrite each other's checkpoints. Steps 4 and 6 cause side effects; they go
through the idempotency ledger and check cancel and fencing before every request.
"""

# No `from __future__ import annotations`: Dagster reads these annotations at definition time.
import functools
from collections.abc import Hashable, Mapping
from typing import Any

import pandas as pd
from dagster import AssetExecutionContext, DynamicPartitionsDefinition, MaterializeResult, MetadataValue

from durable_assets import kit
from durable_assets.payments.gateway import Charge, Refund
from durable_assets.payments.resources import PaymentGateway
from durable_assets.refunds import schema as s
from durable_assets.refunds.errors import RefundAboveRefundableError, RefundCeilingExceededError
from durable_assets.refunds.keys import charge_key, notice_key, refund_item, refund_key, refund_subject
from durable_assets.refunds.policy import compute_refund_candidates, summarize
from durable_assets.refunds.resources import CustomerMailbox, RefundLimits
from durable_assets.refunds.synthetic import charges_to_make, synthetic_invoices
from durable_assets.refunds.validation import read_invoice_file, validate_invoices

BATCHES = DynamicPartitionsDefinition(name="batches")
#: A step of this job: one partition of BATCHES per batch, so batches never share a checkpoint.
step = functools.partial(kit.durable_asset, partitions_def=BATCHES)


class InvoiceSource(kit.BatchInput):
    # No docstring: Dagster would show it as this config's description, and the fields say it all.
    pass


@step(label="Loading invoices", group_name="ingest", effect_scope="charge")
def invoices(
    context: AssetExecutionContext,
    config: InvoiceSource,
    payments: PaymentGateway,
) -> MaterializeResult:
    """Step 1 — the batch's invoices, as strings exactly as given.

    From ``path`` (CSV or Parquet) or, without one, a deterministic synthetic batch derived from
    the batch ID whose charges are created on the payment provider (idempotently, so a retry
    creates no second charge). An unreadable file or missing columns fail here, naming both.
    """
    if config.path:
        with kit.batch_input(context, config.path) as path:  # stored with the batch, or a local file
            raw = read_invoice_file(path)
        return kit.frame_result(raw, {"source": config.path})
    raw = synthetic_invoices(context.partition_key, config.size)
    chargeable = validate_invoices(raw, require_charge_id=False).valid

    def create_charge(intent: kit.Intent) -> Mapping[str, Any]:
        p = intent.params
        charge = payments.gateway.create_charge(
            amount=p["amount"],
            currency=p["currency"],
            customer=p["customer"],
            metadata={"invoice_id": p["invoice_id"]},
            idempotency_key=intent.key,
        )
        return _money_answer(charge)

    intents = [
        kit.Intent(
            charge_key(c.invoice_id),
            {"invoice_id": c.invoice_id, "amount": c.amount, "currency": c.currency, "customer": c.customer},
            item=c.invoice_id,
        )
        for c in charges_to_make(chargeable)
    ]
    report = kit.effect_runner(context, perform=create_charge, provider=payments).run(intents)
    charge_ids = {
        i.params["invoice_id"]: report.results[i.key]["id"] for i in intents if i.key in report.results
    }
    raw[s.CHARGE_ID] = raw[s.INVOICE_ID].map(charge_ids).fillna("")
    return kit.frame_result(
        raw, {"source": "synthetic", "charges_created": report.sent, "charges_reused": report.replayed}
    )


@step(label="Validating invoices", group_name="ingest", retry_policy=None)
def validated_invoices(context: AssetExecutionContext, invoices: pd.DataFrame) -> MaterializeResult:
    """Step 2 — typed, normalised invoices; every bad row is quarantined with its reasons.

    Nothing is dropped silently: valid + quarantined == input, and the quarantine file (with the
    source row number and every reason) is written next to the batch for whoever fixes the data.
    No refund is ever computed from a quarantined row.
    """
    result = validate_invoices(invoices)
    return kit.frame_result(result.valid, kit.reports.write_quarantine(context, result.quarantined))


@step(label="Computing refund candidates", group_name="policy", retry_policy=None)
def refund_candidates(context: AssetExecutionContext, validated_invoices: pd.DataFrame) -> MaterializeResult:
    """Step 3 — who is owed what, by the documented, pure refund policy.

    Rules (first that applies wins): duplicate charge for the same customer, period and currency;
    charged after cancellation; overcharge against the contracted price. Never more than the
    invoice's refundable amount (charged minus already refunded). See docs/input-and-policy.md.
    """
    candidates = compute_refund_candidates(validated_invoices)
    summary = summarize(candidates)
    return kit.frame_result(
        candidates,
        {"refund_total_cents": int(candidates["refund_cents"].sum()), "summary": MetadataValue.json(summary)},
    )


def enforce_guardrails(candidates: pd.DataFrame, limits: RefundLimits) -> None:
    """Fail closed before the first request: a row above its refundable amount, or a batch over a ceiling."""
    over = candidates[candidates["refund_cents"] > candidates["refundable_cents"]]
    if len(over):
        raise RefundAboveRefundableError(
            f"{len(over)} refunds exceed their invoice's refundable amount "
            f"(first: invoice {over.iloc[0][s.INVOICE_ID]}); nothing was sent. Check that invoice's "
            "amount_charged and already_refunded in the input file."
        )
    if len(candidates) > limits.max_refunds_per_batch:
        raise RefundCeilingExceededError(
            f"{len(candidates)} refunds exceed the per-batch ceiling of {limits.max_refunds_per_batch}; "
            "nothing was sent. If this batch is right, raise DURABLE_MAX_REFUNDS_PER_BATCH "
            f"to at least {len(candidates)} and `job resume --override-guardrails` it."
        )
    totals = candidates.groupby(s.CURRENCY)["refund_cents"].sum()
    above = totals[totals > limits.max_amount_per_batch_cents]
    if len(above):
        cur = str(above.index[0])
        raise RefundCeilingExceededError(
            f"refunds of {int(above.iloc[0])} {cur} minor units exceed the per-batch ceiling of "
            f"{limits.max_amount_per_batch_cents}; nothing was sent. If this batch is right, raise "
            f"DURABLE_MAX_AMOUNT_PER_BATCH_CENTS to at least {int(above.iloc[0])} and "
            "`job resume --override-guardrails` it."
        )


def verify_refund(intent: kit.Intent, answer: Mapping[str, Any]) -> str | None:
    """A provider answer that is not exactly what we asked for is held for review, never recorded as done."""
    fields = (("amount", "amount"), ("currency", "currency"), ("charge", "charge_id"))
    problems = kit.answer_mismatches(intent.params, answer, fields)
    if answer.get("status") not in ("succeeded", "pending"):
        problems.append(f"status {answer.get('status')!r}")
    return "; ".join(problems) or None


@step(label="Issuing refunds", group_name="payouts", effect_scope="refund")
def issued_refunds(
    context: AssetExecutionContext,
    refund_candidates: pd.DataFrame,
    payments: PaymentGateway,
    limits: RefundLimits,
) -> MaterializeResult:
    """Step 4 — refunds issued at the payment provider, exactly once each.

    Each refund's idempotency key is derived from the invoice and the reason, is committed to the
    ledger before the request, and travels in the refund's metadata. A retry, resume or second
    worker re-sends the same key and gets the original refund back. Answers that do not match the
    request are held for review. Cancel and takeover are checked before every request.
    """
    enforce_guardrails(refund_candidates, limits)
    gateway = payments.gateway

    def create_refund(intent: kit.Intent) -> Mapping[str, Any]:
        p = intent.params
        return _refund_answer(
            gateway.create_refund(
                charge_id=p["charge_id"],
                amount=p["amount"],
                currency=p["currency"],
                reason=p["reason"],
                metadata={"invoice_id": p["invoice_id"]},
                idempotency_key=intent.key,
            )
        )

    def lookup(entry: kit.LedgerEntry) -> Mapping[str, Any] | None:
        found = gateway.find_refund_by_key(charge_id=entry.params["charge_id"], idempotency_key=entry.key)
        return _refund_answer(found) if found is not None else None

    intents = [
        kit.Intent(
            refund_key(str(row.invoice_id), str(row.reason)),
            {
                "invoice_id": str(row.invoice_id),
                "charge_id": str(row.charge_id),
                "amount": int(str(row.refund_cents)),
                "currency": str(row.currency),
                "reason": str(row.reason),
            },
            subject=refund_subject(str(row.charge_id), str(row.reason)),
            item=refund_item(str(row.invoice_id), str(row.reason)),
        )
        for row in refund_candidates.itertuples(index=False)
    ]
    runner = kit.effect_runner(
        context, perform=create_refund, verify=verify_refund, lookup=lookup, provider=payments
    )
    report = runner.run(intents)
    out = _outcome_frame(intents, report)
    refunded = out[out["status"] == s.RefundOutcome.REFUNDED]
    return kit.frame_result(
        out,
        {
            "refunds_issued": len(refunded),
            "refunded_cents": int(refunded["amount_cents"].sum()),
            kit.reports.HELD_FOR_REVIEW_KEY: int((out["status"] == s.RefundOutcome.HELD_FOR_REVIEW).sum()),
            "already_refunded_for_charge": report.subject_taken,
            "requests_sent": report.sent,
            "reused_from_ledger": report.replayed,
            "reconciled_by_lookup": report.looked_up,
        },
    )


def _money_answer(movement: Charge | Refund) -> dict[str, Any]:
    """What the ledger records of a charge or a refund: its id and the money it moved."""
    return {"id": movement.id, "amount": movement.amount, "currency": movement.currency}


def _refund_answer(refund: Refund) -> dict[str, Any]:
    """A refund's answer adds what :func:`verify_refund` compares besides the money: charge and status."""
    return {**_money_answer(refund), "charge": refund.charge_id, "status": refund.status}


def _outcome_frame(intents: list[kit.Intent], report: kit.EffectReport) -> pd.DataFrame:
    """One row per refund intent: refunded, or held for review with a note a person can act on."""
    rows = []
    for i in intents:
        done = report.results.get(i.key)
        rows.append(
            {
                s.INVOICE_ID: i.params["invoice_id"],
                s.CHARGE_ID: i.params["charge_id"],
                "idempotency_key": i.key,
                "provider_id": (done or {}).get("id", ""),
                "amount_cents": int(i.params["amount"]),
                s.CURRENCY: i.params["currency"],
                "reason": i.params["reason"],
                "status": s.RefundOutcome.REFUNDED if done else s.RefundOutcome.HELD_FOR_REVIEW,
                "review_note": "" if done else _review_note(i, report.review.get(i.key)),
            }
        )
    return kit.tables.typed(pd.DataFrame(rows, columns=list(s.OUTCOME_DTYPES)), s.OUTCOME_DTYPES)


def _review_note(intent: kit.Intent, review: Mapping[str, Any] | None) -> str:
    p = intent.params
    return kit.review_note(
        review,
        subject_taken=lambda key, holder: (
            f"charge {p['charge_id']} was already refunded for {p['reason']} through invoice "
            f"{holder.get('invoice_id', '?')} (key {key}); a charge is refunded at most once per reason"
        ),
    )


@step(label="Reconciling with the provider", group_name="payouts")
def reconciled_refunds(
    context: AssetExecutionContext,
    issued_refunds: pd.DataFrame,
    payments: PaymentGateway,
    runtime: kit.BatchRuntime,
) -> MaterializeResult:
    """Step 5 — every refund we recorded, read back from the provider and compared.

    Read-only: a refund whose amount, currency or status at the provider differs from our record,
    or that the provider does not list, is flagged ``mismatch`` (and gets no customer notice)
    instead of being trusted. Each refunded charge's refunds are listed once (all pages), and that
    one read also records how many refunds there carry our key or our reason: the blocking
    ``no_duplicate_refunds_at_provider`` check reads them here rather than asking the provider again.

    Both ways: a held row's charge is listed too, and a held row for whose charge and reason the
    provider holds a refund reads ``refunded_at_provider`` with those refunds' ids, never
    ``not_refunded`` (after a crash and a deploy, or another invoice's refund of the same charge).
    """
    out = kit.tables.typed(issued_refunds, s.OUTCOME_DTYPES)
    refunded = out["status"] == s.RefundOutcome.REFUNDED
    held = (out["status"] == s.RefundOutcome.HELD_FOR_REVIEW) & (out[s.CHARGE_ID] != "")
    charges = list(dict.fromkeys(str(c) for c in out.loc[refunded | held, s.CHARGE_ID]))
    ours = set(out.loc[refunded, s.CHARGE_ID].astype(str))

    def listing(charge_id: str) -> dict[str, Any]:
        try:
            return {"refunds": payments.gateway.list_charge_refunds(charge_id)}
        except kit.errors.ProviderRejectedError as exc:
            # A held row's charge the provider does not know (the reason it was held) has no refunds
            # there; a refunded row's must exist, and its absence fails closed.
            if charge_id in ours or exc.http_status != 404:
                raise
            return {"refunds": []}

    listings = kit.paced_map(listing, charges, payments)
    at_provider: dict[str, list[Refund]] = {
        charge_id: listing["refunds"] for charge_id, listing in zip(charges, listings, strict=True)
    }
    readings = [
        _read_back(row, at_provider[str(row[s.CHARGE_ID])])
        if done
        else _read_held(row, at_provider.get(str(row[s.CHARGE_ID]), []))
        for row, done in zip(out.to_dict("records"), refunded, strict=True)
    ]
    read = pd.DataFrame(readings, index=out.index, columns=list(_NOT_REFUNDED))
    out = kit.tables.typed(pd.concat([out, read], axis=1), s.RECONCILED_DTYPES)
    kit.report_progress(context, int(refunded.sum()), int(refunded.sum()))
    return kit.frame_result(
        out,
        {
            "matched": int((out["reconciliation"] == "matched").sum()),
            "mismatched": int((out["reconciliation"] == "mismatch").sum()),
            "held_but_refunded_at_provider": int((out["reconciliation"] == "refunded_at_provider").sum()),
            "charges_listed": len(charges),
        },
    )


#: What step 5 records of a row that was not refunded: nothing was read for it.
_NOT_REFUNDED: dict[str, Any] = {
    "reconciliation": "not_refunded",
    "provider_refunds_with_key": 0,
    "provider_ids_with_key": "",
    "provider_refunds_for_reason": 0,
    "provider_ids_for_reason": "",
}


def _read_held(row: Mapping[Hashable, Any], listing: list[Refund]) -> dict[str, Any]:
    """A held row against its charge's refunds at the provider: any for its reason (or with its key)
    are named, so the report accounts for every refund the provider holds for the batch's rows."""
    with_key = [r.id for r in listing if r.idempotency_key == row["idempotency_key"]]
    for_reason = [r.id for r in listing if r.durable_reason == row["reason"]]
    if not with_key and not for_reason:
        return _NOT_REFUNDED
    return {
        "reconciliation": "refunded_at_provider",
        "provider_refunds_with_key": len(with_key),
        "provider_ids_with_key": ", ".join(with_key),
        "provider_refunds_for_reason": len(for_reason),
        "provider_ids_for_reason": ", ".join(for_reason),
    }


def _read_back(row: Mapping[Hashable, Any], listing: list[Refund]) -> dict[str, Any]:
    """One refunded row against its charge's refunds at the provider: ours is the one with our
    provider id (compared as :func:`verify_refund` compares an answer); the others with our key or
    reason are counted, not judged — judging them is the duplicate check's."""
    ours = next((r for r in listing if r.id == row["provider_id"]), None)
    agrees = (
        ours is not None
        and ours.amount == row["amount_cents"]
        and ours.currency == row[s.CURRENCY]
        and ours.status in ("succeeded", "pending")
    )
    with_key = [r.id for r in listing if r.idempotency_key == row["idempotency_key"]]
    for_reason = [r.id for r in listing if r.durable_reason == row["reason"]]
    return {
        "reconciliation": "matched" if agrees else "mismatch",
        "provider_refunds_with_key": len(with_key),
        "provider_ids_with_key": ", ".join(with_key),
        "provider_refunds_for_reason": len(for_reason),
        "provider_ids_for_reason": ", ".join(for_reason),
    }


@step(label="Notifying customers", group_name="customers", effect_scope="notice")
def customer_notices(
    context: AssetExecutionContext,
    reconciled_refunds: pd.DataFrame,
    refund_candidates: pd.DataFrame,
    mailbox: CustomerMailbox,
    payments: PaymentGateway,
) -> MaterializeResult:
    """Step 6 — one notice per refunded customer invoice, through the same exactly-once ledger.

    Only refunds the provider confirmed (reconciliation ``matched``) are announced. The notice key is
    derived from the invoice and reason, so no customer gets two notices for one refund.
    """
    box = mailbox.mailbox
    emails = refund_candidates.set_index(s.INVOICE_ID)[s.CUSTOMER_EMAIL]
    matched = reconciled_refunds[reconciled_refunds["reconciliation"] == "matched"]

    def send(intent: kit.Intent) -> Mapping[str, Any]:
        p = intent.params
        major, minor = divmod(int(p["amount"]), 100)
        return box.send(
            message_id=intent.key,
            recipient=p["to"],
            subject=f"Your refund for invoice {p['invoice_id']}",
            body=f"We refunded {major}.{minor:02d} {str(p['currency']).upper()} ({p['reason']}).",
        )

    intents = [
        kit.Intent(
            notice_key(str(row.invoice_id), str(row.reason)),
            {
                "invoice_id": str(row.invoice_id),
                "to": str(emails[str(row.invoice_id)]),
                "amount": int(str(row.amount_cents)),
                "currency": str(row.currency),
                "reason": str(row.reason),
            },
            item=refund_item(str(row.invoice_id), str(row.reason)),
        )
        for row in matched.itertuples(index=False)
    ]
    # Notices go to the mailbox, not the provider: neither its rate nor its account is theirs.
    runner = kit.effect_runner(
        context, perform=send, concurrency=payments.concurrency, backoff=payments.backoff()
    )
    report = runner.run(intents)
    out = kit.tables.typed(
        pd.DataFrame(
            {
                s.INVOICE_ID: [i.params["invoice_id"] for i in intents],
                "recipient": [i.params["to"] for i in intents],
                "message_id": [i.key for i in intents],
                "sent": [i.key in report.results for i in intents],
            }
        ),
        s.NOTICE_DTYPES,
    )
    return kit.frame_result(out, {"notices_sent": report.sent, "notices_reused_from_ledger": report.replayed})


@step(label="Writing the batch report", group_name="reporting", retry_policy=None)
def batch_report(
    context: AssetExecutionContext,
    validated_invoices: pd.DataFrame,
    reconciled_refunds: pd.DataFrame,
    customer_notices: pd.DataFrame,
) -> MaterializeResult:
    """Step 7 — the batch's report: one line per refund, and the totals, for finance and support.

    Written as CSV with spreadsheet formulas neutralised (invoice fields come from outside).
    """
    notices = kit.tables.typed(customer_notices, s.NOTICE_DTYPES)
    report = kit.tables.typed(reconciled_refunds, s.REPORTED_DTYPES).merge(
        notices[[s.INVOICE_ID, "sent"]].rename(columns={"sent": "notice_sent"}),
        on=s.INVOICE_ID,
        how="left",
    )
    report["notice_sent"] = report["notice_sent"].fillna(False).astype(bool)
    written = kit.reports.write_report(context, report, "refund_report.csv")
    refunded = report[report["status"] == s.RefundOutcome.REFUNDED]
    totals = refunded.groupby(s.CURRENCY)["amount_cents"].sum()
    return kit.frame_result(
        report,
        {
            **written,
            "valid_invoices": len(validated_invoices),
            "refunds": len(refunded),
            kit.reports.HELD_FOR_REVIEW_KEY: int((report["status"] == s.RefundOutcome.HELD_FOR_REVIEW).sum()),
            "notices_sent": int(report["notice_sent"].sum()),
            "refunded_by_currency_cents": MetadataValue.json({str(k): int(v) for k, v in totals.items()}),
        },
    )


ALL_ASSETS = [
    invoices,
    validated_invoices,
    refund_candidates,
    issued_refunds,
    reconciled_refunds,
    customer_notices,
    batch_report,
]

__all__ = ["ALL_ASSETS", "BATCHES", "InvoiceSource"]
