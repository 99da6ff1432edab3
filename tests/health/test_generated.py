"""Generated logs: the planted UNKNOW-heavy groups are flagged, no others; every count agrees
with an independent scan; rules, inputs and bad lines behave as documented."""

from __future__ import annotations

import glob
import gzip
import json
from datetime import timedelta
from pathlib import Path

import pytest
from txmsg_health import generate, job
from txmsg_health.inputs import HealthInputError, parse_tz
from txmsg_health.rules import Thresholds, evaluate

from tests.health.reference import scan


def test_flags_exactly_the_planted_groups(
    generated: tuple[Path, generate.Manifest], generated_result: job.JobResult
) -> None:
    _, man = generated
    s = generated_result.summary
    # planted UNKNOW-heavy groups, and the legacy groups whose check-backs never arrive
    assert sorted(s["flagged"]) == sorted([*man.planted, *man.legacy_groups])
    assert len(s["groups"]) >= 200
    for g in man.planted:
        assert s["groups"][g]["reasons"], g
    # each planted profile trips the rule it was built for
    reasons = " ".join(r for g in man.planted for r in s["groups"][g]["reasons"])
    for rule in (
        "unknown_share",
        "unknown_rate",
        "discards",
        "checks_per_transaction",
        "check_never_arrives",
    ):
        assert rule + ":" in reasons


def test_check_backs_that_never_arrive_come_first(
    generated: tuple[Path, generate.Manifest], generated_result: job.JobResult
) -> None:
    _, man = generated
    s = generated_result.summary
    n = len(man.never_arrives)
    assert n >= 3
    assert set(s["flagged"][:n]) == set(man.never_arrives)
    for g in man.never_arrives:
        v = s["groups"][g]
        first = v["reasons"][0]
        assert first.startswith(
            "check_never_arrives: no producer of this group was connected when "
            f"the broker tried to check back {v['no_channel']} times"
        ), first
        assert "discarded after the check maximum" in first
        assert v["undelivered_checks"] == v["no_channel"] + v["check_send_failed"] > 0
    # the no_producer group's failed sends ("invoke producer exception") are named too
    assert any(s["groups"][g]["check_send_failed"] for g in man.never_arrives)
    assert any("could not be sent" in s["groups"][g]["reasons"][0] for g in man.never_arrives)


def test_counts_match_independent_scan(
    generated: tuple[Path, generate.Manifest], generated_result: job.JobResult
) -> None:
    logs, man = generated
    s = generated_result.summary
    ref = scan([str(logs)])
    assert s["lines"]["total"] == ref.total_lines == man.lines
    assert s["lines"]["bad"] == ref.bad > 0
    assert s["lines"]["checks_sent_unattributed"] == ref.sent_unattributed
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
            "checks_sent",
            "check_send_failed",
        ):
            assert got[k] == c[k], (g, k)
        assert got["commit"] == ref.commit(g), g
        assert got["transactions_with_unknown"] == len(ref.unknown_ids[g]), g
        assert got["undelivered_checks"] == ref.undelivered(g), g
        checked = [n for (gg, _), n in ref.checks_by_tx.items() if gg == g]
        assert got["checked_transactions"] == len(checked), g
        assert got["max_checks_per_transaction"] == (max(checked) if checked else 0), g
    for g in man.legacy_groups:
        assert s["groups"][g]["no_channel"] == ref.undelivered(g) > 0
        assert s["groups"][g]["flagged"]


def test_per_broker(
    generated: tuple[Path, generate.Manifest], generated_result: job.JobResult
) -> None:
    """Every broker directory is a broker; a group flagged on one of its brokers says so."""
    logs, man = generated
    s = generated_result.summary
    ref = scan([str(logs)])
    assert sorted(s["brokers"]) == sorted({b for bs in man.brokers.values() for b in bs})
    assert len(s["brokers"]) == 8
    for g, bs in man.brokers.items():
        # a group also appears where one of its lines was cut short (a bad line, counted there)
        assert set(bs) <= set(s["groups"][g]["brokers"]), g
    for (g, b), c in ref.by_broker.items():
        e = s["groups"][g]["brokers"][b]
        for k in ("unknown", "rollback", "checks", "checks_sent", "discarded", "check_send_failed"):
            assert e[k] == c[k], (g, b, k)
    for g in man.planted:
        v = s["groups"][g]
        assert v["flagged_brokers"] == man.flagged_brokers[g], g
        healthy = sorted(set(v["brokers"]) - set(man.flagged_brokers[g]))
        assert healthy
        assert v["reasons"][-1] == (
            f"broker_scope: flagged on {man.flagged_brokers[g][0]} only; healthy on {', '.join(healthy)}"
        )
        assert g in s["brokers"][man.flagged_brokers[g][0]]["flagged"]
    healthy_groups = set(man.groups) - set(man.planted)
    assert not any(s["groups"][g]["flagged_brokers"] for g in healthy_groups)


def test_49_and_5x_logs_apart_by_format(
    generated: tuple[Path, generate.Manifest], generated_result: job.JobResult
) -> None:
    """One run over 4.9 and 5.x brokers: each broker's format is named; 5.x check-backs are
    counted at INFO from the per-check line, 4.9 brokers have none."""
    s = generated_result.summary
    for b, v in s["brokers"].items():
        assert v["format"] == ("5" if b.startswith("broker-5-") else "4.9"), (b, v)
    five_info = [
        g
        for g, v in s["groups"].items()
        if v["brokers"] and all(b.startswith("broker-5-info") for b in v["brokers"])
    ]
    four = [
        g for g, v in s["groups"].items() if all(b.startswith("broker-49-") for b in v["brokers"])
    ]
    assert five_info
    assert four
    assert all(s["groups"][g]["checks_sent"] == 0 for g in four)
    # at INFO a C++ client's check COMMIT is not logged; the 5.x check line still counts it
    sent = sum(s["groups"][g]["checks_sent"] for g in five_info)
    answered = sum(s["groups"][g]["checks"] for g in five_info)
    assert sent > answered > 0
    for g in five_info:
        v = s["groups"][g]
        assert v["formats"] == {"5": v["formats"]["5"]}
        if v["checks_sent"]:
            assert v["checked_transactions"] > 0


def test_parquet_windows_add_up(spark: object, generated_result: job.JobResult) -> None:
    s = generated_result.summary
    df = spark.read.parquet(s["parquet"])  # type: ignore[attr-defined]
    rows = df.groupBy("group").sum("unknown", "checks", "discarded").collect()
    assert len(rows) == len(s["groups"])
    for r in rows:
        g = s["groups"][r["group"]]
        assert (r["sum(unknown)"], r["sum(checks)"], r["sum(discarded)"]) == (
            g["unknown"],
            g["checks"],
            g["discarded"],
        )
    first = df.orderBy("window_start").first()
    # broker time is UTC+8: the generator starts at 10:00 broker time = 02:00 UTC
    assert first["window_start"].strftime("%H:%M") == "02:00"


def test_thresholds_are_configurable(
    spark: object, generated: tuple[Path, generate.Manifest], tmp_path: Path
) -> None:
    logs, man = generated
    lax = Thresholds(
        max_unknown_share=0.9,
        max_unknown_per_minute=1e9,
        max_discards=10**9,
        max_checks_per_transaction=100,
        max_undelivered_checks=None,
    )
    # and the broker named by a regex over the path instead of the directory per broker
    r = job.run(
        spark,
        job.JobConfig(
            inputs=[str(logs)],
            out=str(tmp_path),
            thresholds=lax,  # type: ignore[arg-type]
            dashboard=False,
            broker_regex=r"/broker-(\d+)-",
        ),
    )
    assert r.summary["flagged"] == []
    assert sorted(r.summary["brokers"]) == ["49", "5"]
    only_never = Thresholds(
        max_unknown_share=0.9,
        max_unknown_per_minute=1e9,
        max_discards=10**9,
        max_checks_per_transaction=100,
    )
    r = job.run(
        spark,
        job.JobConfig(
            inputs=[str(logs)],
            out=str(tmp_path),
            thresholds=only_never,  # type: ignore[arg-type]
            dashboard=False,
        ),
    )
    assert sorted(r.summary["flagged"]) == man.never_arrives


def test_defaults_flag_40_percent_and_not_1_percent() -> None:
    t = Thresholds()
    base = {"unknown_per_minute": 0.0, "discarded": 0, "checks_per_transaction": 1.0}
    assert evaluate({**base, "unknown_share": 0.40, "transactions": 500}, t)
    assert not evaluate({**base, "unknown_share": 0.01, "transactions": 500}, t)


def test_globs_gz_and_mixed_inputs(
    spark: object, generated: tuple[Path, generate.Manifest], tmp_path: Path
) -> None:
    logs, _ = generated
    gz = sorted(glob.glob(str(logs / "*" / "otherdays" / "*.gz")))
    assert gz
    with gzip.open(gz[0], "rt") as f:
        n_gz = sum(1 for _ in f)
    r = job.run(spark, job.JobConfig(inputs=[gz[0]], out=str(tmp_path / "a"), dashboard=False))  # type: ignore[arg-type]
    assert r.summary["lines"]["total"] == n_gz
    r = job.run(
        spark,
        job.JobConfig(
            inputs=[str(logs / "*" / "otherdays" / "*.log.gz")],  # type: ignore[arg-type]
            out=str(tmp_path / "b"),
            dashboard=False,
        ),
    )

    def lines_in(path: str) -> int:
        with gzip.open(path, "rt") as f:
            return sum(1 for _ in f)

    with_all = sum(lines_in(p) for p in gz)
    assert r.summary["lines"]["total"] == with_all


def test_bad_input_is_counted_not_fatal(spark: object, tmp_path: Path) -> None:
    good = (
        "2026-11-22 18:12:04 WARN EndTransactionThread_1 - The producer[127.0.0.1:54012] end "
        "transaction in sending message,  and it's pending status.RequestHeader: "
        "EndTransactionRequestHeader{producerGroup='pg_a', tranStateTableOffset=0, commitLogOffset=0, "
        "commitOrRollback=0, fromTransactionCheck=false, msgId='7F00000100000001', "
        "transactionId='', bname='null'} Remark: "
    )
    lines = [
        good,
        good[: good.index("msgId")],  # truncated inside the header
        good.replace("commitOrRollback=0", "commitOrRollback=99"),  # impossible state
        "\x00\x01\x02 binary \xff junk",
        "",
        "2026-11-22 18:12:0",  # cut timestamp
        good.replace("producerGroup='pg_a'", "producerGroup=''"),
    ]
    p = tmp_path / "transaction.log"
    p.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    s = job.run(spark, job.JobConfig(inputs=[str(p)], out=str(tmp_path / "o"))).summary  # type: ignore[arg-type]
    assert s["lines"]["total"] == len(lines)
    assert s["lines"]["bad"] == 3
    assert s["groups"]["pg_a"]["unknown"] == 1
    assert s["groups"]["pg_a"]["bad_lines"] == 2
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["lines"]["bad"] == 3


def test_empty_and_missing_input_say_what_to_do(spark: object, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "transaction.log").write_text("")
    with pytest.raises(HealthInputError, match="empty"):
        job.run(spark, job.JobConfig(inputs=[str(empty)], out=str(tmp_path / "o")))  # type: ignore[arg-type]
    with pytest.raises(HealthInputError, match="no such file"):
        job.run(spark, job.JobConfig(inputs=[str(tmp_path / "nope.log")], out=str(tmp_path / "o")))  # type: ignore[arg-type]
    with pytest.raises(HealthInputError, match="matches no file"):
        job.run(spark, job.JobConfig(inputs=[str(tmp_path / "*.gz")], out=str(tmp_path / "o")))  # type: ignore[arg-type]


def test_time_zone_option_parses_offsets() -> None:
    assert parse_tz("+08:00").utcoffset(None) == timedelta(hours=8)
    assert parse_tz("UTC+8").utcoffset(None) == timedelta(hours=8)
    assert parse_tz("-0530").utcoffset(None) == -timedelta(hours=5, minutes=30)
    assert parse_tz("Z").utcoffset(None) == timedelta(0)
    with pytest.raises(HealthInputError, match="offset"):
        parse_tz("Asia/Shanghai")
