"""End to end: the demo's run on the embedded broker fixture with the real RocketMQ client —
faults injected, everything settles, and all four databases agree."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from txmsg_samples.order.demo import DemoOptions, demo, run

pytest.importorskip("txmsg_rocketmq.backend")


def test_demo_run_is_consistent(txmsg_broker_factory: Any, tmp_path: Path) -> None:
    # check_max 30 (not the fixture's 3), as the demo: slow local transactions outlive a few checks
    broker = txmsg_broker_factory(check_max=30, delay_scale=0.01)
    options = DemoOptions(
        orders=40,
        fail_rate=0.2,
        slow_rate=0.2,
        lose_ack_rate=0.1,
        seed=11,
        threads=4,
        timeout=90.0,
        workdir=tmp_path / "demo",
    )
    out = io.StringIO()
    code = run(options, Console(file=out, width=120), broker=broker)
    text = out.getvalue()
    assert code == 0, text
    assert "CONSISTENT" in text
    assert "INCONSISTENT" not in text
    assert "resolved by check-back" in text
    assert (tmp_path / "demo" / "demo.log").is_file()


def test_demo_rejects_bad_rates() -> None:
    result = CliRunner().invoke(demo, ["--fail-rate", "1.5"])
    assert result.exit_code == 2
    assert "--fail-rate" in result.output
