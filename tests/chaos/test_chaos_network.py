"""The short chaos run with network faults (issue 16 point 1): ``txmsg chaos --mode short --faults
network`` - every broker connection through the fault proxy, 8 strikes covering latency, resets,
half-open connections and a producer partitioned for longer than the check interval - and the same
invariants as the kill -9 run.  It also checks that each fault's figures are printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chaos.faults import FAULTS
from tests.chaos.lane import YIELD_CPU
from tests.chaos.test_chaos_run import WARMUP, assert_discards


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_chaos_run_with_network_faults_keeps_every_service_consistent(
    tmp_path: Path,
) -> None:
    cmd = [
        *YIELD_CPU,
        sys.executable,
        "-m",
        "benchmarks.chaos",
        "--mode",
        "short",
        "--faults",
        "network",
        "--workdir",
        str(tmp_path / "chaos"),
        *WARMUP,
    ]
    pg = os.environ.get("TXMSG_TEST_PG_URL", "").strip()
    if pg:
        cmd += ["--database-url", pg]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=850, env={**os.environ, "COLUMNS": "140"}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    result = re.search(r"^RESULT chaos (.*)$", output, re.M)
    assert result, output[-3000:]
    fields = dict(item.split("=") for item in result.group(1).split())
    assert int(fields["violations"]) == 0
    assert int(fields["kills"]) == 0  # network faults only
    assert int(fields["committed"]) > 0
    assert float(fields["ratio"]) == 1.0
    assert_discards(fields)  # partitions longer than the check horizon discard too
    per_fault = dict(re.findall(r"^RESULT chaos-fault (\S+) strikes=(\d+)", output, re.M))
    assert set(per_fault) == {"none", *FAULTS}, output[-3000:]
    assert all(int(per_fault[kind]) >= 1 for kind in FAULTS)
