"""Issue 35.3: a group whose local transactions are slower than the first phase is flagged on
RocketMQ 5, beside a misconfigured broker too.

The logs are a real Apache RocketMQ 5.3.3's (broker + proxy in local mode) with two producer
groups of the official 5.x Python client (``tests/data/real-rocketmq-5.3.3-slow/``: README.md,
``make_logs.py``, the truth each producer recorded): ``h35-demo``, a normal service (200
transactions, 7 left UNKNOW at send), and ``h35-slow`` (74 transactions, 64 left UNKNOW at send,
every one answered COMMIT at its first check-back). A 5.x client logs nothing at send and the
slow group never answers UNKNOW at a check, so its only trace is that the broker checked its
transactions back before any end record of theirs (``summary.LATE_RULE``).

* ``misconfigured/``: transactionTimeOut 2000 < transactionOpBatchInterval 3000: the broker also
  checks transactions committed at send (40 of the demo's).
* ``well-configured/``: the same traffic with transactionOpBatchInterval 500.

Expected at both settings: only the slow group flagged; a broker finding only at 3000.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from txmsg_health import job

DATA = Path(__file__).resolve().parents[1] / "data" / "real-rocketmq-5.3.3-slow"
DEMO, SLOW = "h35-demo", "h35-slow"
RUNS = ("misconfigured", "well-configured")


def _truth(run: str) -> dict[str, Any]:
    t: dict[str, Any] = json.loads((DATA / f"truth-{run}.json").read_text())
    return t["topics"]


@pytest.fixture(scope="module")
def results(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for run in RUNS:
        if not (DATA / run / "transaction.log").is_file():
            pytest.fail(
                f"real 5.3.3 logs missing at {DATA / run}: they are tracked in git; "
                "restore them with `git checkout -- tests/data`",
                pytrace=False,
            )
        d = tmp_path_factory.mktemp(run)
        out[run] = job.run(spark, job.JobConfig(inputs=[str(DATA / run)], out=str(d))).summary
    return out


def test_only_the_slow_group_is_flagged_at_both_settings(
    results: dict[str, dict[str, Any]],
) -> None:
    for run in RUNS:
        s = results[run]
        assert s["flagged"] == [SLOW], run
        reasons = s["groups"][SLOW]["reasons"]
        assert any(r.startswith("unknown_share:") for r in reasons), (run, reasons)
        assert s["groups"][DEMO]["reasons"] == [], run


def test_the_broker_finding_only_at_the_default_op_batch(
    results: dict[str, dict[str, Any]],
) -> None:
    mis, well = results["misconfigured"], results["well-configured"]
    assert [f["broker"] for f in mis["broker_findings"]] == ["misconfigured"]
    assert "transactionOpBatchInterval" in mis["broker_findings"][0]["reason"]
    # two slow transactions were checked once more at 500 ms: not a misconfigured broker
    assert (
        well["groups"][SLOW]["ended_checked_again"]
        <= _truth("well-configured")[SLOW]["ended_transactions_checked"]
    )
    assert well["broker_findings"] == []


def test_the_brokers_half_messages_are_the_transactions_begun(
    results: dict[str, dict[str, Any]],
) -> None:
    """The check service's progress through the half queue, less the half messages it put back
    for its check-backs, is every transaction both producers began."""
    for run in RUNS:
        truth = _truth(run)
        begun = sum(t["transactions"] for t in truth.values())
        assert results[run]["brokers"][run]["half_messages"] == begun, run


def test_checked_before_ending_matches_the_truth(results: dict[str, dict[str, Any]]) -> None:
    """Every transaction left UNKNOW at send was checked before it ended, and is counted; on the
    well-configured broker nothing else is."""
    well, truth = results["well-configured"], _truth("well-configured")
    for g in (DEMO, SLOW):
        unknown_at_send = truth[g]["first_phase"].get("unknown", 0)
        assert well["groups"][g]["checked_before_end"] == unknown_at_send, g
        assert well["groups"][g]["undecided"] == unknown_at_send, g
    mis, truth = results["misconfigured"], _truth("misconfigured")
    # the misconfigured broker also checked transactions committed at send: they look the same
    # (a COMMIT at send is not logged), so there only the ones answered COMMIT twice count
    demo, slow = mis["groups"][DEMO], mis["groups"][SLOW]
    assert demo["checked_before_end"] > truth[DEMO]["first_phase"]["unknown"]
    assert demo["undecided"] < slow["undecided"]
    assert slow["undecided"] >= 0.9 * truth[SLOW]["first_phase"]["unknown"]
    assert demo["undecided_share_of_broker"] < 0.10 < slow["undecided_share_of_broker"]
