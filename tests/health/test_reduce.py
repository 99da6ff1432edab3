"""The Spark side's result stays small, merges exactly, and the job runs with a capped driver.

``reduce.aggregate`` keys each line by (kind, group, address, window, format, file) and each
transaction by (broker, msgId); ``reduce.result`` brings back only the line rows and the
transactions counted per outcome. Three properties keep the job's memory independent of its
input and live mode exact: the result does not grow with transactions, the aggregate of a whole
equals the merge of its parts' aggregates, and a run with a small driver heap completes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txmsg_health import arrow_outputs, brokers, generate, job
from txmsg_health import patterns as P
from txmsg_health import reduce as R


def _aggregate(spark: Any, paths: list[str]) -> Any:
    lines = job.classify(spark, paths, "minute")
    names = brokers.names(lines.inputFiles(), paths)
    return R.aggregate(lines, job.broker_column(names))


def _sorted_rows(df: Any) -> list[tuple[Any, ...]]:
    cols = sorted(df.columns)
    return sorted((tuple(r[c] for c in cols) for r in df.collect()), key=repr)


def test_the_result_does_not_grow_with_transactions(
    spark: Any, generated: tuple[Path, generate.Manifest]
) -> None:
    """Transactions come back counted per (broker, group, check-backs, own check-backs): at most
    a few rows per group and broker, whatever the number of transactions."""
    logs, _ = generated
    agg = _aggregate(spark, [str(logs)])
    transactions = agg.where("mh IS NOT NULL").count()
    totals, windows, tx = arrow_outputs.split(R.result(agg).toArrow())
    per_group_broker = len({(r["gh"], r["txb"]) for r in tx.to_pylist()})
    assert transactions > 20 * tx.num_rows, (transactions, tx.num_rows)
    assert tx.num_rows <= 12 * per_group_broker
    # totals have no window; windows one row per (group, window, file)
    keys = [(r["grp"], r["win"], r["file"]) for r in windows.to_pylist()]
    assert len(keys) == len(set(keys))
    assert max(totals.num_rows, windows.num_rows) < transactions


def test_the_aggregate_of_a_whole_is_the_merge_of_its_parts(
    spark: Any, generated: tuple[Path, generate.Manifest], tmp_path: Path
) -> None:
    """Live mode merges each batch's aggregate into its state (``reduce.merge``): the same rows
    as aggregating everything at once, for every column (sums, first/last stamps, group hashes)."""
    logs, _ = generated
    broker = sorted(p for p in logs.iterdir() if p.is_dir())[0]
    whole = broker / "transaction.log"
    text = whole.read_text().splitlines(keepends=True)
    half = len(text) // 2
    parts = tmp_path / "parts" / broker.name
    parts.mkdir(parents=True)
    (parts / "a.log").write_text("".join(text[:half]))
    (parts / "b.log").write_text("".join(text[half:]))
    one = tmp_path / "one" / broker.name
    one.mkdir(parents=True)
    shutil.copy(whole, one / "a.log")

    def without_file(df: Any) -> Any:  # the parts are two files: compare per broker
        return R.merge(df.withColumn("file", df["file"].substr(0, 0)))

    a = _aggregate(spark, [str(parts / "a.log")])
    b = _aggregate(spark, [str(parts / "b.log")])
    merged = without_file(R.merge(a.unionByName(b)))
    at_once = without_file(_aggregate(spark, [str(one / "a.log")]))
    assert _sorted_rows(merged) == _sorted_rows(at_once)


def test_group_hashes_name_every_transaction_group(spark: Any, real_logs: Path) -> None:
    """A transaction row carries its group as a 64-bit hash (a string would turn Spark's hash
    aggregation into a sort); every hash is named by a line row's group."""
    totals, _, tx = arrow_outputs.split(
        R.result(_aggregate(spark, [str(real_logs / "info")])).toArrow()
    )
    names = arrow_outputs.group_names(totals)
    hashes = {h for h in tx["gh"].to_pylist() if h is not None}
    assert hashes
    assert hashes <= set(names)
    assert set(names.values()) <= set(totals["grp"].to_pylist())


def test_a_run_with_the_driver_capped_at_512_mb(
    tmp_path: Path, generated: tuple[Path, generate.Manifest]
) -> None:
    """The guard of issue 35: per-transaction data brought to the driver fails here, not at a
    user's. 2 M generated lines (one file, ~0.5 GB) through the job in its own process, driver JVM
    capped at 512 MB and the results it may collect at 16 MB: it completes and flags the planted
    groups. The cap on results is what makes the guard bite at this size: the job before issue 35
    collected 72 MB here (one row per transaction) and ran out of heap only at 10 M lines and
    1 GB; the job's result is ~7 MB (rows per group, window and file)."""
    log = tmp_path / "broker.log"
    man = generate.generate(str(log), 2_000_000, seed=3, layout="single")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYSPARK_SUBMIT_ARGS": "--driver-memory 512m --conf spark.driver.maxResultSize=16m pyspark-shell",
    }
    p = subprocess.run(
        [sys.executable, "-m", "txmsg_health.job", str(log), "--out", str(out), "--no-dashboard"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["lines"]["total"] == man.lines
    assert set(man.planted) <= set(s["flagged"])
    log.unlink()


def test_a_command_line_run_prefers_jemalloc_unless_the_user_chose() -> None:
    before = pa.default_memory_pool()
    try:
        arrow_outputs.prefer_jemalloc({"ARROW_DEFAULT_MEMORY_POOL": "system"})
        assert pa.default_memory_pool().backend_name == before.backend_name
        arrow_outputs.prefer_jemalloc({})
        try:
            pa.jemalloc_memory_pool()
        except NotImplementedError:  # a pyarrow built without it keeps its default
            assert pa.default_memory_pool().backend_name == before.backend_name
        else:
            assert pa.default_memory_pool().backend_name == "jemalloc"
    finally:
        pa.set_memory_pool(before)


def test_the_per_line_stages_are_built_once_per_spark_context(spark: Any) -> None:
    minute = job._pipeline(spark, "minute")
    assert job._pipeline(spark, "minute") is minute
    assert job._pipeline(spark, "hour") is not minute
    assert len(minute) == len(P.pipeline("minute"))


@pytest.mark.parametrize("window", ["minute", "hour"])
def test_stamps_order_like_time_within_a_window_length(window: str) -> None:
    """A stamp is the window key's digits x 10 000 + seconds: ordered like the time."""
    keys = (
        ["2026-11-22 18:12", "2026-11-22 18:59", "2026-11-22 19:00", "2026-12-01 00:00"]
        if window == "minute"
        else ["2026-11-22 18", "2026-11-22 23", "2026-11-23 00", "2027-01-01 00"]
    )
    secs = [0, 59, 3599] if window == "hour" else [0, 30, 59]
    stamps = [
        int("".join(c for c in k if c.isdigit())) * R.STAMP_SCALE + s for k in keys for s in secs
    ]
    assert stamps == sorted(stamps)


def test_a_line_with_a_mangled_timestamp_is_counted_not_fatal(spark: Any, tmp_path: Path) -> None:
    """A line shaped like a timestamp but not one (anonymised, corrupted) that carries a
    transaction mark: its window key is not digits, and an ANSI cast of it would end the job; it
    is counted, the rest of the log analysed."""
    good = (
        "2026-11-22 18:12:04 WARN EndTransactionThread_1 - The producer[10.0.0.5:53211] end "
        "transaction in sending message,  and it's pending status.RequestHeader: "
        "EndTransactionRequestHeader{producerGroup='pg_a', tranStateTableOffset=1, "
        "commitLogOffset=2, commitOrRollback=0, fromTransactionCheck=false, msgId='AB01', "
        "transactionId='AB01'} Remark: null"
    )
    mangled = "XXXX" + good[4:].replace("AB01", "AB02")
    d = tmp_path / "broker-a"
    d.mkdir()
    (d / "transaction.log").write_text(f"{good}\n{mangled}\n")
    s = job.run(spark, job.JobConfig(inputs=[str(d)], out=str(tmp_path / "out"))).summary
    assert s["lines"]["total"] == 2
    assert s["groups"]["pg_a"]["unknown"] >= 1
