"""A run lineage's Dagster event logs, tailed as one feed whose ids only increase.

A lineage is a first run plus its re-executions. Each event gets the id
``run_index * RUN_STRIDE + storage_id``: the Dagster event-log storage id inside the run, offset by
the run's position in the lineage. Storage ids alone do not order a lineage: SQLite instances keep
one event-log file per run, and each numbers its events from 1. With the offset, ids increase
across runs, a cursor is just the last id seen, and any server process derives the same ids from
storage, so a client may resume against a restarted server.

A record is handed out only once a later poll has seen it again (one poll interval after it first
appeared). Postgres allocates storage ids before commit, so two writers (the worker and a `job
cancel`) can commit out of id order; a reader that moved its cursor past the higher id at once would
skip the lower one forever. Holding records for one poll lets such a late commit land first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dagster import DagsterEventType, DagsterInstance, DagsterRun, EventLogRecord

from durable_assets.kit.runtime import EventLogCursor

#: Storage ids per run before the next run's ids begin. 10**12 keeps every id below 2**53, so
#: JavaScript clients read them exactly, for lineages of up to 9,000 runs.
RUN_STRIDE = 10**12


def encode_id(run_index: int, storage_id: int) -> int:
    return run_index * RUN_STRIDE + storage_id


def run_end_id(run_index: int) -> int:
    """The last id of run ``run_index``'s range: no record of the run has it (storage ids stay below
    :data:`RUN_STRIDE`) and every record of a later run is above it. The id of an event that ends
    a run without a record of its own (a lost worker's), the same whichever process computes it."""
    return encode_id(run_index, RUN_STRIDE - 1)


def decode_id(event_id: int) -> tuple[int, int]:
    """``(run_index, storage_id)`` of an id made by :func:`encode_id`."""
    return divmod(event_id, RUN_STRIDE)


@dataclass(frozen=True)
class LineageRecord:
    event_id: int
    run: DagsterRun
    record: EventLogRecord


class LineageFeed:
    """Tails the event logs of a lineage from a cursor (0 = from the beginning).

    ``runs`` returns the lineage, oldest first, each time it is called: a re-execution created
    while the feed is open joins it. :meth:`poll` reports the end once the newest run has finished
    and every one of its records has been handed out.
    """

    def __init__(
        self,
        instance: DagsterInstance,
        runs: Callable[[], Sequence[DagsterRun]],
        of_type: set[DagsterEventType],
        *,
        after: int = 0,
        page_size: int = 1000,
    ) -> None:
        self.instance = instance
        self._runs = runs
        self._of_type = of_type
        self.cursor = after
        self._frontier = after
        self._page_size = page_size

    def _fetch(self, runs: Sequence[DagsterRun]) -> tuple[list[LineageRecord], bool]:
        """Records after the cursor, in id order; and whether that is all of them for now."""
        start_run, start_storage_id = decode_id(self.cursor)
        out: list[LineageRecord] = []
        for index in range(start_run, len(runs)):
            cursor = (
                EventLogCursor.from_storage_id(start_storage_id).to_string()
                if index == start_run and start_storage_id > 0
                else None
            )
            page = self.instance.get_records_for_run(
                runs[index].run_id, cursor=cursor, of_type=self._of_type, limit=self._page_size
            )
            out += [LineageRecord(encode_id(index, r.storage_id), runs[index], r) for r in page.records]
            if page.has_more:
                return out, False
        return out, True

    def poll(self) -> tuple[list[LineageRecord], bool]:
        """The records now settled, in id order, and whether the lineage has ended."""
        runs = list(self._runs())  # read before the events: a finished run's last event is then fetched
        if not runs:
            return [], False
        finished = runs[-1].is_finished
        fetched, complete = self._fetch(runs)
        ready = [r for r in fetched if r.event_id <= self._frontier]
        if ready:
            self.cursor = ready[-1].event_id
        if fetched:
            self._frontier = max(self._frontier, fetched[-1].event_id)
        return ready, finished and complete and len(ready) == len(fetched)

    @property
    def settled(self) -> bool:
        """Every record fetched so far has been handed out (none is held back for a late commit)."""
        return self._frontier <= self.cursor

    def ended_at_cursor(self) -> bool:
        """The newest run has finished and nothing follows the cursor: a resumed client has it all."""
        runs = list(self._runs())
        if not runs or not runs[-1].is_finished:
            return False
        fetched, complete = self._fetch(runs)
        return complete and not fetched
