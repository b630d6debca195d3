"""Capture, as SQL text, a database of our tables made by a release that predates migrations.

The migration tests must start from what an older release really wrote (``create_all`` and the
kit's own writes), not from what we believe it wrote. Run this with the OLD code on the path and
commit its output under ``tests/kit/data/``::

    git archive c331e5e | tar -x -C /tmp/legacy        # the last release without migrations
    PYTHONPATH=/tmp/legacy PYTHONDONTWRITEBYTECODE=1 .venv/bin/python scripts/make_legacy_durable_db.py \\
        --sqlite tests/kit/data/durable_c331e5e.sqlite.sql \\
        --postgres postgresql://postgres@127.0.0.1:5432/scratch --pg-out tests/kit/data/durable_c331e5e.pg.sql

The rows: a finished ledger entry (its stored result must replay after the upgrade), an intent
still ``started``, the lease of a batch that failed mid-run, its progress, a cancel request and,
where the release had them, a subject claim and a pending webhook.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import durable_assets.kit.db as kit_db
from durable_assets.kit.cancel import CancelStore
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.ledger import Intent, Ledger
from durable_assets.kit.progress import Progress, ProgressStore

BATCH = "legacy-batch"
RUN = "legacy-run-0001"


def populate(url: str) -> None:
    """Write the rows through the old release's own API, as one of its batches would have."""
    db = kit_db.DurableDatabase(url)
    ledger = Ledger(db)
    subject = (
        {"subject": "ch_legacy|requested_by_customer"} if "subject" in Intent.__dataclass_fields__ else {}
    )
    done = Intent("refund-legacy-done", {"charge": "ch_legacy", "amount": 1250}, **subject)
    pending = Intent("refund-legacy-pending", {"charge": "ch_other", "amount": 700})
    ledger.claim("refund", [done, pending], owner=RUN)
    ledger.record_results("refund", {done.key: {"id": "re_legacy_1", "amount": 1250, "status": "succeeded"}})
    LeaseStore(db).acquire(BATCH, RUN, owner="legacy-host:4242")
    ProgressStore(db).write(BATCH, RUN, Progress(4, 7, "Issuing refunds", 1, 2))
    CancelStore(db).request("legacy-canceled-batch")
    if hasattr(kit_db, "webhook_outbox"):
        from durable_assets.ops.webhooks.outbox import Outbox

        Outbox(db).enqueue(
            batch_id=BATCH,
            run_id=RUN,
            event_type="batch.failed",
            webhook_id="msg_legacy",
            body='{"type":"batch.failed"}',
            urls=["http://127.0.0.1:9/hook"],
        )
    db.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sqlite", type=Path, help="write the SQLite database's dump here")
    parser.add_argument("--postgres", help="an EMPTY Postgres database to populate and dump")
    parser.add_argument("--pg-out", type=Path, help="write the Postgres dump here")
    args = parser.parse_args()
    if args.sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "durable.db"
            populate(f"sqlite:///{path}")
            with sqlite3.connect(path) as conn:
                args.sqlite.write_text("\n".join(conn.iterdump()) + "\n")
    if args.postgres:
        populate(args.postgres)
        dump = subprocess.run(
            ["pg_dump", "--no-owner", "--no-privileges", "--inserts", "--table=durable_*", args.postgres],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # psql meta-commands (\\restrict with a random token) would make every capture differ.
        args.pg_out.write_text("".join(line for line in dump.splitlines(True) if not line.startswith("\\")))


if __name__ == "__main__":
    main()
