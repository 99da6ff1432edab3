"""Issue 26.4: a misconfigured 5.x broker is told from UNKNOW-heavy producers.

The logs are a real Apache RocketMQ 5.3.3's (broker + proxy in local mode), written while two
producer groups of the official 5.x Python client ran on it (``tests/data/real-rocketmq-5.3.3/``:
README.md, ``make_logs.py``). The truth files are what the producers recorded at run time:
every check-back they received and whether the transaction had already ended (answered at send,
or answered COMMIT/ROLLBACK at an earlier check).

* ``misconfigured/``: ``transactionTimeOut=2000`` with the default ``transactionOpBatchInterval``
  (3000): the broker checks transactions that had ended. Expected: a broker finding naming the
  setting; the healthy group not flagged; the UNKNOW-heavy group flagged for its UNKNOW answers.
* ``well-configured/``: the same with ``transactionOpBatchInterval=500``: no broker finding, the
  same verdict on the groups.

The job sees a lower bound of the broker's checks (commits are not logged at INFO, so a committed
transaction checked once looks like one that was UNKNOW at send from a 5.x client, which logs
nothing then); the tests assert the bound against the truth, not a copied figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from txmsg_health import dashboard, job, summary
from txmsg_health.rules import Thresholds, evaluate

from tests.health.reference import scan

DATA = Path(__file__).resolve().parents[1] / "data" / "real-rocketmq-5.3.3"
HEALTHY, UNKNOWN = "h26-healthy", "h26-unknown"
RUNS = ("misconfigured", "well-configured")


def _truth(run: str) -> dict[str, Any]:
    t: dict[str, Any] = json.loads((DATA / f"truth-{run}.json").read_text())
    return t["topics"]


@pytest.fixture(scope="module")
def logs() -> Path:
    for run in RUNS:
        if not (DATA / run / "transaction.log").is_file():
            pytest.fail(
                f"real 5.3.3 logs missing at {DATA / run}: they are tracked in git; "
                "restore them with `git checkout -- tests/data`",
                pytrace=False,
            )
    return DATA


@pytest.fixture(scope="module")
def results(
    spark: Any, logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for run in RUNS:
        d = tmp_path_factory.mktemp(run)
        out[run] = job.run(spark, job.JobConfig(inputs=[str(logs / run)], out=str(d))).summary
        out[run]["_out"] = str(d)
    return out


def test_counts_match_independent_scan(results: dict[str, dict[str, Any]], logs: Path) -> None:
    """The 5.3.3 lines are read as a line-by-line scan reads them: a gRPC first-phase ROLLBACK
    (filled transactionId, ``Remark: null``) is a first-phase answer, not a check answer."""
    for run in RUNS:
        s, ref = results[run], scan([str(logs / run)])
        assert s["lines"]["total"] == ref.total_lines
        assert s["lines"]["bad"] == ref.bad == 0
        for g in (HEALTHY, UNKNOWN):
            for k in ("rollback", "check_unknown", "check_rollback", "check_commit", "checks"):
                assert s["groups"][g][k] == ref.groups[g][k], (run, g, k)
            assert s["groups"][g]["checks_sent"] == ref.groups[g]["checks_sent"], (run, g)


def test_first_phase_answers_and_check_backs_match_the_truth(
    results: dict[str, dict[str, Any]],
) -> None:
    for run in RUNS:
        truth = _truth(run)
        for g in (HEALTHY, UNKNOWN):
            got, t = results[run]["groups"][g], truth[g]
            # rollbacks at send are logged (commits are not, at INFO; a 5.x client sends
            # nothing for an UNKNOW at send)
            assert got["rollback"] == t["first_phase"].get("rollback", 0), (run, g)
            assert got["unknown"] == 0
            # every check-back the producers received was logged as sent and answered
            assert got["checks_sent"] == got["checks"] == t["checks"], (run, g)
            assert got["check_unknown"] == t["unknown_answers"], (run, g)
            assert got["transactions_with_unknown"] == t["unknown_answers"], (run, g)


def test_misconfigured_broker_is_a_broker_finding(results: dict[str, dict[str, Any]]) -> None:
    s, truth = results["misconfigured"], _truth("misconfigured")
    assert len(s["broker_findings"]) == 1
    f = s["broker_findings"][0]
    assert f["broker"] == "misconfigured"
    assert f["setting"] == "transactionTimeOut < transactionOpBatchInterval"
    assert "transactionTimeOut" in f["reason"]
    assert "transactionOpBatchInterval" in f["reason"]
    assert s["brokers"]["misconfigured"]["finding"] == f["reason"]
    # both signals seen on the real broker, and never more than truly happened
    assert f["checked_after_first_phase_end"] > 0
    assert f["checked_again_after_answer"] > 0
    ended_checked = sum(truth[g]["ended_transactions_checked"] for g in truth)
    assert 0 < f["transactions"] <= ended_checked
    assert f["check_backs"] <= sum(truth[g]["checks_of_ended_transactions"] for g in truth)
    for g in (HEALTHY, UNKNOWN):
        got = s["groups"][g]
        found = got["ended_checked_at_send"] + got["ended_checked_again"]
        assert found <= truth[g]["ended_transactions_checked"], g
        assert got["broker_caused_checks"] <= truth[g]["checks_of_ended_transactions"], g
    # the healthy group's checks are all the broker's: each of its rolled-back transactions that
    # was checked is found (a rollback at send is logged)
    rolled_back_checked = sum(
        1
        for tx in truth[HEALTHY]["by_msg_id"].values()
        if tx["first"] == "rollback" and tx["answers"]
    )
    assert s["groups"][HEALTHY]["ended_checked_at_send"] == rolled_back_checked > 0


def test_producers_judged_on_their_own_answers(results: dict[str, dict[str, Any]]) -> None:
    """Same verdict on both brokers: the healthy group is not flagged for what the misconfigured
    broker did; the UNKNOW-heavy one is flagged for its UNKNOW answers."""
    for run in RUNS:
        s = results[run]
        assert s["flagged"] == [UNKNOWN], run
        reasons = s["groups"][UNKNOWN]["reasons"]
        assert any(r.startswith("unknown_share:") for r in reasons), (run, reasons)
        assert s["groups"][HEALTHY]["reasons"] == []


def test_well_configured_broker_has_no_finding(results: dict[str, dict[str, Any]]) -> None:
    s = results["well-configured"]
    assert s["broker_findings"] == []
    assert s["brokers"]["well-configured"]["finding"] is None
    for g in (HEALTHY, UNKNOWN):
        assert s["groups"][g]["broker_caused_checks"] == 0


def test_broker_caused_checks_and_discards_do_not_flag_a_group() -> None:
    """The rules judge a group on its own check-backs and discards: the same figures flag it when
    they are its own and do not when the broker caused them."""
    base = {
        "unknown": 0,
        "transactions": None,
        "unknown_share": None,
        "unknown_per_minute": 0.0,
        "checks_per_transaction": 5.0,
        "max_checks_per_transaction": 5,
        "discarded": 4,
    }
    own = {
        **base,
        "broker_caused_checks": 0,
        "broker_caused_discards": 0,
        "own_checks_per_transaction": 5.0,
        "own_max_checks_per_transaction": 5,
    }
    brokers = {
        **base,
        "broker_caused_checks": 16,
        "broker_caused_discards": 4,
        "own_checks_per_transaction": 1.0,
        "own_max_checks_per_transaction": 1,
    }
    t = Thresholds()
    assert [r.split(":")[0] for r in evaluate(own, t)] == ["discards", "checks_per_transaction"]
    assert evaluate(brokers, t) == []
    assert [r.split(":")[0] for r in evaluate(base, t)] == ["discards", "checks_per_transaction"]


def test_finding_can_be_turned_off(results: dict[str, dict[str, Any]]) -> None:
    groups = results["misconfigured"]["groups"]
    assert summary.broker_findings(groups, Thresholds(max_ended_checked=None)) == []
    assert summary.broker_findings(groups, Thresholds(max_ended_checked=1000)) == []
    assert len(summary.broker_findings(groups, Thresholds())) == 1


def test_dashboard_shows_the_finding(results: dict[str, dict[str, Any]]) -> None:
    s = results["misconfigured"]
    page = Path(s["_out"], "dashboard.html").read_text()
    assert 'id="broker-findings"' in page
    assert "transactionOpBatchInterval" in page
    clean = results["well-configured"]
    assert 'id="broker-findings"' not in dashboard.render(clean, {})
