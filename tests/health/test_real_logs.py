"""The job on the real RocketMQ 4.9.8 broker's logs agrees with an independent line scan."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from txmsg_health import job

from tests.health.reference import scan


def _run(spark: object, paths: list[str], out: Path) -> dict:
    return job.run(spark, job.JobConfig(inputs=paths, out=str(out))).summary  # type: ignore[arg-type]


def test_counts_match_independent_scan(spark: object, real_logs: Path, tmp_path: Path) -> None:
    paths = [str(real_logs / "info"), str(real_logs / "debug")]
    s = _run(spark, paths, tmp_path)
    ref = scan(paths)

    assert s["lines"]["total"] == ref.total_lines
    assert s["lines"]["bad"] == ref.bad
    tx_groups = {g for g, c in ref.groups.items() if any(c.values())}
    assert set(s["groups"]) == tx_groups
    for g, c in ref.groups.items():
        got = s["groups"][g]
        for k in (
            "unknown",
            "rollback",
            "check_unknown",
            "check_rollback",
            "check_commit",
            "checks",
            "discarded",
        ):
            assert got[k] == c[k], (g, k)
        assert got["commit"] == ref.commit(g), g
        assert got["transactions_with_unknown"] == len(ref.unknown_ids[g]), g
        checked = [n for (gg, _), n in ref.checks_by_tx.items() if gg == g]
        assert got["checked_transactions"] == len(checked), g
        assert got["max_checks_per_transaction"] == (max(checked) if checked else 0), g
        for (gg, addr), counts in ref.by_addr.items():
            if gg == g:
                assert got["addresses"][addr]["unknown"] == counts["unknown"], (g, addr)
                assert got["addresses"][addr]["checks"] == (
                    counts["check_unknown"] + counts["check_rollback"] + counts["check_commit"]
                )

    # what the real runs did (docs/rocketmq-facts.md): the C++ client's check answers
    # arrive with fromTransactionCheck=false and must still count as checks
    assert sum(g["checks"] for g in s["groups"].values()) > 0
    assert all(g["discarded"] > 0 for g in s["groups"].values())
    assert set(s["flagged"]) == set(s["groups"])  # every run discarded messages
    # 4.9.8 writes the commit/rollback op record at once: it never checks an ended transaction
    assert s["broker_findings"] == []
    assert all(g["broker_caused_discards"] == 0 for g in s["groups"].values())
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["flagged"] == s["flagged"]
    # the directory given is the broker; 4.9.8 quotes the header, writes no 5.x check lines, and
    # every check-back of these runs reached the producer
    assert sorted(s["brokers"]) == ["debug", "info"]
    assert all(b["format"] == "4.9" for b in s["brokers"].values())
    for g in s["groups"].values():
        assert g["undelivered_checks"] == 0
        assert g["checks_sent"] == 0
        assert not any(r.startswith("check_never_arrives") for r in g["reasons"])


def test_check_back_never_arrives_on_real_logs(
    spark: object, real_logs: Path, tmp_path: Path
) -> None:
    """Two brokers' real logs; on broker-b the producer of RefTxProducerB_102008 went away.

    The failure lines are the 4.9.8 broker's own texts (AbstractTransactionalMessageCheckListener
    and ProducerManager; seen verbatim on the real broker, docs/rocketmq-facts.md): one failed
    check writes "channel is null" to transaction.log and "channel table is empty" to broker.log,
    so 3 events in both files count 3, not 6.
    """
    a, b = tmp_path / "logs" / "broker-a", tmp_path / "logs" / "broker-b"
    shutil.copytree(real_logs / "info", a)
    shutil.copytree(real_logs / "debug", b)
    group = "RefTxProducerB_102008"
    with (
        open(b / "transaction.log", "a", encoding="utf-8") as tx,
        open(b / "broker.log", "a", encoding="utf-8") as br,
    ):
        for sec in (30, 32, 34):
            tx.write(
                f"2026-11-22 18:21:{sec} WARN Transaction-msg-check-thread - Check transaction "
                f"failed, channel is null. groupId={group}\n"
            )
            br.write(
                f"2026-11-22 18:21:{sec} WARN Transaction-msg-check-thread - Check transaction "
                f"failed, channel table is empty. groupId={group}\n"
            )
        br.write(
            "2026-11-22 18:21:36 ERROR Transaction-msg-check-thread - Check transaction failed "
            f"because invoke producer exception. group={group}, msgId=7F00000100002A9F0000000000"
            "0A8C12, error=org.apache.rocketmq.remoting.exception.RemotingTimeoutException: "
            "invokeOnewayImpl tryAcquire semaphore timeout, 10ms, waiting thread nums: 0 "
            "semaphoreOnewayValue: 0\n"
        )
    s = _run(spark, [str(tmp_path / "logs")], tmp_path / "out")
    v = s["groups"][group]
    assert (v["no_channel"], v["check_send_failed"], v["undelivered_checks"]) == (3, 1, 4)
    assert s["flagged"][0] == group
    assert v["reasons"][0].startswith(
        "check_never_arrives: no producer of this group was connected when the broker tried to "
        "check back 3 times"
    )
    assert v["flagged_brokers"] == ["broker-b"]
    assert list(v["brokers"]) == ["broker-b"]
    assert sorted(s["brokers"]) == ["broker-a", "broker-b"]
    assert group in s["brokers"]["broker-b"]["flagged"]
    html = (tmp_path / "out" / "dashboard.html").read_text()
    assert html.index(group) < html.index("Other flagged groups")


def test_info_only_has_no_commit_count(spark: object, real_logs: Path, tmp_path: Path) -> None:
    s = _run(spark, [str(real_logs / "info" / "transaction.log")], tmp_path)
    assert s["groups"], "expected producer groups in the INFO log"
    for g in s["groups"].values():
        assert g["commit"] is None
        assert g["unknown_share"] is None
        assert g["unknown_per_minute"] > 0


def test_debug_log_shows_commits(spark: object, real_logs: Path, tmp_path: Path) -> None:
    s = _run(spark, [str(real_logs / "debug")], tmp_path)
    ref = scan([str(real_logs / "debug")])
    for g, v in s["groups"].items():
        assert v["commit"] == ref.groups[g]["commit"]
        assert v["transactions"] == v["unknown"] + v["rollback"] + v["commit"]
