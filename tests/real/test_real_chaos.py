"""A short chaos run against the real cluster: ``kill -9`` strikes on the order-service producers
and the downstream consumers while orders are paid, then the database check.  The broker belongs
to the user, so it is never struck (``benchmarks.chaos --name-server``: no broker process of the
run's own); the broker-kill fault is covered on the embedded broker by tests/chaos."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: one at a time (one xdist worker, ``--dist loadgroup``): a chaos run uses fixed topic and group names: two at once on one cluster consume each other's messages
pytestmark = [pytest.mark.real_broker, pytest.mark.xdist_group("real-cluster-chaos")]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_short_chaos_run_on_the_real_cluster(
    backend: str, backend_flags: list[str], tmp_path: Path
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.chaos",
        "--mode",
        "short",
        "--strikes",
        "8",
        "--warmup",
        "5",
        "--workdir",
        str(tmp_path / "chaos"),
        "--backend",
        backend,
        *backend_flags,
    ]
    pg = os.environ.get("TXMSG_TEST_PG_URL", "").strip()
    if pg:
        cmd += ["--database-url", pg]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=1100, env={**os.environ, "COLUMNS": "120"}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "no broker kills" in output, output[:500]
    result = re.search(r"^RESULT chaos (.*)$", output, re.M)
    assert result, output[-3000:]
    fields = dict(item.split("=") for item in result.group(1).split())
    assert int(fields["strikes"]) >= 8
    assert int(fields["violations"]) == 0
    assert int(fields["committed"]) > 0
    assert int(fields["rolled_back"]) > 0
    assert float(fields["ratio"]) == 1.0
    assert int(fields["event_orders"]) > 0
