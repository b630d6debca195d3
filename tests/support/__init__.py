"""What the tests and the benchmark share to drive real processes: one copy of each helper.

It lives under ``tests/`` (not in the installed ``durable_assets`` package) because only the test
suite and ``bench/`` need it; ``bench`` imports it as ``tests.support`` from the repository root
(``scripts/bench.sh`` and ``python -m bench`` run with the root on ``sys.path``). Nothing here
imports pytest, so the benchmark does not depend on it:

- :mod:`.polling`: ``wait_until``, a deadline that says what it waited for and what it last saw.
- :mod:`.network`: ``free_port``; ``ServedInThread`` (a server in a thread, always shut down).
- :mod:`.processes`: children in their own session, SIGKILL, reaping their process groups.
- :mod:`.homes`: throwaway ``DAGSTER_HOME`` folders (SQLite or a per-test Postgres database).
- :mod:`.simulator`: the Stripe-compatible simulator, in a thread or as `job provider serve`.
- :mod:`.dagster_dev`: `dagster dev`, its code server and ``scripts/ui.sh``, with a stop that takes
  seconds.
- :mod:`.batches`: a synthetic batch's refund candidates, recomputed from its id.
"""
