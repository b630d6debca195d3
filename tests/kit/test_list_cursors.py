"""A provider list's page cursors, remembered in the instance's database for every process."""

from __future__ import annotations

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.pacing import ListCursors


def test_cursors_round_trip_and_the_last_reading_wins(durable_db_url: str) -> None:
    cursors = ListCursors(DurableDatabase(durable_db_url))
    assert cursors.get("sim|abc|customers") == ()
    cursors.put("sim|abc|customers", ["cus_3", "cus_6"])
    cursors.put("sim|def|customers", ["cus_9"])  # another account's list is its own
    assert cursors.get("sim|abc|customers") == ("cus_3", "cus_6")
    cursors.put("sim|abc|customers", [])  # a list that fits on one page now
    assert ListCursors(DurableDatabase(durable_db_url)).get("sim|abc|customers") == ()
    assert cursors.get("sim|def|customers") == ("cus_9",)
