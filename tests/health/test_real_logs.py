"""The job on the real RocketMQ 4.9.8 broker's logs agrees with an independent line scan."""

from __future__ import annotations

import json
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
        for k in ("unknown", "rollback", "check_unknown", "check_rollback", "check_commit",
                  "checks", "discarded"):
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
                    counts["check_unknown"] + counts["check_rollback"] + counts["check_commit"])

    # what the real runs did (docs/rocketmq-facts.md): the C++ client's check answers
    # arrive with fromTransactionCheck=false and must still count as checks
    assert sum(g["checks"] for g in s["groups"].values()) > 0
    assert all(g["discarded"] > 0 for g in s["groups"].values())
    assert set(s["flagged"]) == set(s["groups"])  # every run discarded messages
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["flagged"] == s["flagged"]


def test_info_only_has_no_commit_count(spark: object, real_logs: Path, tmp_path: Path) -> None:
    s = _run(spark, [str(real_logs / "info" / "transaction.log")], tmp_path)
    assert s["groups"], "expected producer groups in the INFO log"
    for g in s["groups"].values():
        assert g["commit"] is None and g["unknown_share"] is None
        assert g["unknown_per_minute"] > 0


def test_debug_log_shows_commits(spark: object, real_logs: Path, tmp_path: Path) -> None:
    s = _run(spark, [str(real_logs / "debug")], tmp_path)
    ref = scan([str(real_logs / "debug")])
    for g, v in s["groups"].items():
        assert v["commit"] == ref.groups[g]["commit"]
        assert v["transactions"] == v["unknown"] + v["rollback"] + v["commit"]
