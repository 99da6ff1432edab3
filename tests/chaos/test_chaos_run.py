"""The short chaos run (issue 7): >= 20 strikes of ``kill -9`` on random subsets of the broker, two
order-service producers and two consumers per downstream service, then the database check.  Since
issue 17 the producers also send each paid order's events with ``send_orderly`` and two orderly
consumers (tracking) apply them: the check proves per-order event order and exactly-once too.

It runs the real command in a subprocess, exactly as ``txmsg chaos --mode short`` does, on
PostgreSQL when the test command provides one (``TXMSG_TEST_PG_URL``), else on SQLite; once per
backend (issue 14.6): ``rocketmq`` over remoting and ``rocketmq5`` over the broker's gRPC endpoint,
with the same checker.

Since issue 39 the broker has a real check horizon (3 check-backs, about 5 s) and every 20th order
runs its local transaction longer than that: the broker discards those half messages (and those
of strikes that keep every producer down), and txmsg's rescuer must deliver the committed ones.
The run reports ``discards`` (copies in ``TRANS_CHECK_MAX_TIME_TOPIC``), ``discarded_tx`` (the
transactions among them) and ``rescues`` (those the rescuer re-sent or resolved as rolled back).
Without the rescuer the committed ones would be lost (9 violations on a real 4.9.8 with that
horizon, issue 39).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.lane import YIELD_CPU

#: 5 s of payments before the first strike (the command's default is 10): the processes are READY
#: before it starts, and the rescue of what the short horizon discards costs the settle some seconds
WARMUP = ["--warmup", "5"]


def assert_discards(fields: dict[str, str]) -> None:
    """The short horizon discarded something, and the rescuer handled every discarded
    transaction (re-sent, rolled back, or put back into the check cycle)."""
    assert int(fields["discards"]) >= int(fields["discarded_tx"]) > 0
    assert int(fields["rescues"]) == int(fields["discarded_tx"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["rocketmq", "rocketmq5"])
def test_short_chaos_run_keeps_every_service_consistent(tmp_path: Path, backend: str) -> None:
    cmd = [
        *YIELD_CPU,
        sys.executable,
        "-m",
        "benchmarks.chaos",
        "--mode",
        "short",
        "--workdir",
        str(tmp_path / "chaos"),
        "--backend",
        backend,
        *WARMUP,
    ]
    pg = os.environ.get("TXMSG_TEST_PG_URL", "").strip()
    if pg:
        cmd += ["--database-url", pg]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=1100, env={**os.environ, "COLUMNS": "120"}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert f"backend {backend}," in output, output[:500]
    result = re.search(r"^RESULT chaos (.*)$", output, re.M)
    assert result, output[-3000:]
    fields = dict(item.split("=") for item in result.group(1).split())
    assert int(fields["strikes"]) >= 20
    assert int(fields["violations"]) == 0
    assert int(fields["committed"]) > 0
    assert int(fields["rolled_back"]) > 0
    assert float(fields["ratio"]) == 1.0
    assert int(fields["events"]) > 0
    assert int(fields["event_orders"]) > 0
    assert_discards(fields)
    # 1 broker + 2 producers + 2 x (points, logistics, cart, tracking)
    assert re.search(r"subset sizes covered\s*│\s*1\.\.11 \(11 distinct\)", output), output[-3000:]
