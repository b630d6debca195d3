"""Concurrent notices share commits, and each is still delivered exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

from durable_assets.refunds.notices import Mailbox


def test_concurrent_notices_share_commits_and_each_is_delivered_once(tmp_path: Path) -> None:
    box = Mailbox(tmp_path / "mailbox.db")
    start = threading.Barrier(16)
    answers: list[dict[str, object]] = []

    def send(worker: int) -> None:
        start.wait()
        for n in range(25):
            # Every message twice: the second is a re-send after a crash, absorbed by its id.
            for _ in range(2):
                answers.append(box.send(message_id=f"m{worker}-{n}", recipient="c", subject="s", body="b"))

    threads = [threading.Thread(target=send, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    box.close()

    reopened = Mailbox(tmp_path / "mailbox.db")  # what a returned send promised is in the file
    assert reopened.count() == 400
    assert reopened.counters() == {"delivered": 400, "duplicates_suppressed": 400}
    assert sum(1 for a in answers if a["duplicate"]) == 400
    assert box._writer.commits < 800, "16 senders at once must share transactions"
