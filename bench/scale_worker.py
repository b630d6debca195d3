"""Scenario 6's measuring process: one size, load -> validate -> candidates, wall time and peak RSS.

Run once per size in a fresh process, so each peak RSS (``ru_maxrss``) belongs to that size alone:

    python -c "from bench.scale_worker import main; main()" 100000
"""

from __future__ import annotations

import json
import resource
import sys
import time


def _peak_mb() -> float:
    """This process's peak RSS. Linux's ``ru_maxrss`` carries the *parent's* high-water mark over
    fork + exec (a child of the bench process would start at its ~270 MB), so the kernel's
    per-address-space ``VmHWM`` is read instead where there is one."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main() -> None:
    size = int(sys.argv[1])
    from durable_assets.refunds.policy import compute_refund_candidates
    from durable_assets.refunds.synthetic import synthetic_invoices
    from durable_assets.refunds.validation import validate_invoices

    imports_mb = _peak_mb()
    t0 = time.perf_counter()
    raw = synthetic_invoices(f"bench-scale-{size}", size)
    t1 = time.perf_counter()
    result = validate_invoices(raw, require_charge_id=False)
    t2 = time.perf_counter()
    candidates = compute_refund_candidates(result.valid)
    t3 = time.perf_counter()
    print(
        json.dumps(
            {
                "invoices": size,
                "load_s": round(t1 - t0, 3),
                "validate_s": round(t2 - t1, 3),
                "candidates_s": round(t3 - t2, 3),
                "total_s": round(t3 - t0, 3),
                "peak_rss_mb": round(_peak_mb(), 1),
                "rss_after_imports_mb": round(imports_mb, 1),
                "valid": len(result.valid),
                "quarantined": len(result.quarantined),
                "candidates": len(candidates),
            }
        )
    )
