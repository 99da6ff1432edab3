"""The outbox stream's short chaos run (issue 25): ``txmsg chaos --streams outbox`` - two writer
processes committing transfers with three outbox messages each (two sharding keys, some
transactions rolled back), writer 0's in-process relay and a ``txmsg outbox relay`` process, two
orderly idempotent ledger consumers - while ``kill -9`` strikes random subsets of them and the
broker; and the same with ``--faults network`` instead.  The checker (tested on its own in
test_outbox_check.py) proves from the databases: no committed message lost, none of a
rolled-back transaction, per-key commit order, every effect exactly once, the outbox empty.

Each run is the real command in a subprocess (about a minute), on PostgreSQL when the test
command provides one (``TXMSG_TEST_PG_URL``), else on SQLite; the kill run on both backends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chaos.faults import FAULTS
from tests.chaos.lane import YIELD_CPU

SHORT = ["--streams", "outbox", "--warmup", "4", "--interval", "1.5,3", "--pause", "0.5,1.5"]


def _run(tmp_path: Path, *extra: str) -> tuple[str, dict[str, str]]:
    cmd = [
        *YIELD_CPU,
        sys.executable,
        "-m",
        "benchmarks.chaos",
        *SHORT,
        "--workdir",
        str(tmp_path / "chaos"),
        *extra,
    ]
    pg = os.environ.get("TXMSG_TEST_PG_URL", "").strip()
    if pg:
        cmd += ["--database-url", pg]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=550, env={**os.environ, "COLUMNS": "120"}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    result = re.search(r"^RESULT chaos-outbox (.*)$", output, re.M)
    assert result, output[-3000:]
    fields = dict(item.split("=") for item in result.group(1).split())
    assert int(fields["violations"]) == 0, output[-6000:]
    assert int(fields["unsent"]) == 0
    assert int(fields["dead"]) == 0
    assert int(fields["committed"]) > 0
    assert int(fields["rolled_back"]) > 0
    assert int(fields["messages"]) == 3 * int(fields["committed"])
    assert int(fields["applied"]) == int(fields["messages"])
    assert int(fields["keys"]) >= 2
    return output, fields


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["rocketmq", "rocketmq5"])
def test_outbox_stream_survives_kill_9(tmp_path: Path, backend: str) -> None:
    output, fields = _run(tmp_path, "--strikes", "6", "--backend", backend)
    assert "streams outbox" in output, output[:500]
    # 1 broker + 2 writers + 1 relay process + 2 ledger consumers: every subset size struck
    assert re.search(r"^RESULT chaos strikes=6 ", output, re.M), output[-3000:]
    assert re.search(r"subset sizes covered\s*│\s*1\.\.6 \(6 distinct\)", output), output[-3000:]
    assert int(fields["writer_kills"]) > 0
    assert int(fields["relay_kills"]) > 0
    assert int(fields["broker_kills"]) > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_outbox_stream_survives_network_faults(tmp_path: Path) -> None:
    output, fields = _run(tmp_path, "--faults", "network", "--network-strikes", "4")
    assert int(fields["writer_kills"]) == int(fields["relay_kills"]) == 0  # network faults only
    struck = dict(re.findall(r"^RESULT chaos-fault (\S+) strikes=(\d+)", output, re.M))
    assert all(int(struck.get(kind, 0)) >= 1 for kind in FAULTS), output[-3000:]
