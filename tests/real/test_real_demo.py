"""``txmsg demo`` against the real cluster, as a user would run it first: the order sample with
failing, slow and ack-losing consumers, ending CONSISTENT (every committed order processed
exactly once by every downstream service, no rolled-back order processed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: one at a time (one xdist worker, ``--dist loadgroup``): the demo uses fixed topic and group names (DEMO_NAMES): two demos at once on one cluster consume each other's messages
pytestmark = [pytest.mark.real_broker, pytest.mark.xdist_group("real-cluster-demo")]


@pytest.mark.timeout(900)
def test_demo_is_consistent_on_the_real_cluster(
    backend: str, backend_flags: list[str], tmp_path: Path
) -> None:
    txmsg = str(Path(sys.executable).with_name("txmsg"))  # the console script of this venv
    cmd = [
        txmsg,
        "demo",
        "--backend",
        backend,
        *backend_flags,
        "--orders",
        "60",
        "--seed",
        "7",
        "--workdir",
        str(tmp_path),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=800, env={**os.environ, "COLUMNS": "120"}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "CONSISTENT" in output, output[-3000:]
    assert "INCONSISTENT" not in output, output[-3000:]
