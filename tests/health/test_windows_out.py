"""The window table's two writers (pyarrow on the driver, Spark's own) leave the same table."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from txmsg_health import windows_out
from txmsg_health.windows_out import local_path, rows_in

UTC = dt.UTC


def _table(spark: Any) -> Any:
    rows = [
        ("g2", "broker-a", dt.datetime(2026, 11, 22, 2, 1, tzinfo=UTC), "minute", 3),
        ("g1", "broker-b", dt.datetime(2026, 11, 22, 2, 0, tzinfo=UTC), "minute", 1),
        ("g1", "broker-a", dt.datetime(2026, 11, 22, 2, 5, tzinfo=UTC), "minute", 2),
        ("g1", "broker-a", dt.datetime(2026, 11, 22, 2, 0, tzinfo=UTC), "minute", 4),
    ]
    return spark.createDataFrame(
        rows, "group string, broker string, window_start timestamp, window string, unknown long"
    )


def _write(spark: Any, uri: str) -> tuple[None, list[dict[str, Any]]]:
    written = windows_out.write(spark, _table(spark).toArrow(), uri)
    return None, rows_in(written, ["g1"])


def test_local_destinations_are_written_by_the_driver(spark: Any, tmp_path: Path) -> None:
    assert local_path(spark, str(tmp_path / "w.parquet")) == str(tmp_path / "w.parquet")
    assert local_path(spark, f"file://{tmp_path}/w.parquet") == f"{tmp_path}/w.parquet"
    assert local_path(spark, "hdfs://nn:8020/health/w.parquet") is None
    assert local_path(spark, "s3a://bucket/health/w.parquet") is None


def test_both_writers_leave_the_same_sorted_table(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_driver = tmp_path / "driver.parquet"
    _, rows_driver = _write(spark, str(by_driver))
    monkeypatch.setattr(windows_out, "local_path", lambda *_: None)  # as for hdfs:// or a cluster
    by_spark = tmp_path / "spark.parquet"
    _, rows_spark = _write(spark, str(by_spark))

    for d in (by_driver, by_spark):
        assert (d / "_SUCCESS").is_file()
        assert len(list(d.glob("part-*.parquet"))) == 1
    read = spark.read.parquet
    assert read(str(by_driver)).collect() == read(str(by_spark)).collect()
    # sorted inside the one part file by group, broker, window start
    assert [(r["group"], r["broker"], r["unknown"]) for r in read(str(by_driver)).collect()] == [
        ("g1", "broker-a", 4),
        ("g1", "broker-a", 2),
        ("g1", "broker-b", 1),
        ("g2", "broker-a", 3),
    ]

    def key(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted(
            (
                r["broker"],
                r["window_start"].astimezone(UTC).replace(tzinfo=None)
                if r["window_start"].tzinfo
                else r["window_start"],
                r["unknown"],
            )
            for r in rows
        )

    assert key(rows_driver) == key(rows_spark)
    assert len(rows_driver) == 3


def test_a_rewrite_replaces_the_table(spark: Any, tmp_path: Path) -> None:
    dest = tmp_path / "w.parquet"
    _write(spark, str(dest))
    (dest / "stale.parquet").write_bytes(b"left by an earlier run")
    _write(spark, str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["_SUCCESS", "part-00000.parquet"]
    assert spark.read.parquet(str(dest)).count() == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
