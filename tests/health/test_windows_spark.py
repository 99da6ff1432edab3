"""An input over the driver's limit has Spark write the window table (``windows_spark``): the
same table, summary and dashboard series as the driver's path, and no window row collected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from txmsg_health import generate, job, windows_spark
from txmsg_health import reduce as R


def _table(out: Path) -> Any:
    return pq.read_table(str(out / "metrics_by_window.parquet"))


def test_spark_writes_the_same_table_series_and_summary(
    spark: Any,
    generated: tuple[Path, generate.Manifest],
    generated_result: job.JobResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logs, man = generated
    collected: list[int] = []
    to_arrow = type(spark.range(1)).toArrow

    def counting(df: Any) -> Any:  # every table the driver collects: no window row among them
        table = to_arrow(df)
        if "set" in table.column_names:
            collected.append(sum(1 for s in table["set"].to_pylist() if s == R.WINDOWS))
        return table

    monkeypatch.setattr(type(spark.range(1)), "toArrow", counting)
    spark.conf.set(windows_spark.DRIVER_LIMIT_KEY, "0")
    try:
        result = job.run(spark, job.JobConfig(inputs=[str(logs)], out=str(tmp_path)))
    finally:
        spark.conf.unset(windows_spark.DRIVER_LIMIT_KEY)
    assert collected == [0]

    by_driver = Path(generated_result.summary["parquet"]).parent
    ours, theirs = _table(tmp_path), _table(by_driver)
    assert ours.schema.names == theirs.schema.names
    assert ours.num_rows == theirs.num_rows > 1000  # two brokers of each kind, many windows
    assert ours.to_pylist() == theirs.to_pylist()  # sorted the same way, same values
    assert result.series == generated_result.series
    assert sorted(result.series) == sorted(result.summary["flagged"])
    for key in ("flagged", "groups", "lines", "brokers"):
        assert result.summary[key] == generated_result.summary[key], key
    assert sorted(result.summary["flagged"]) == sorted([*man.planted, *man.legacy_groups])


def test_the_limit_is_a_number_of_bytes(spark: Any) -> None:
    assert not windows_spark.on_executors(spark, windows_spark.DRIVER_LIMIT_BYTES)
    assert windows_spark.on_executors(spark, windows_spark.DRIVER_LIMIT_BYTES + 1)
    spark.conf.set(windows_spark.DRIVER_LIMIT_KEY, "lots")
    try:
        with pytest.raises(ValueError, match="windowsOnDriverBytes=0"):
            windows_spark.on_executors(spark, 1)
    finally:
        spark.conf.unset(windows_spark.DRIVER_LIMIT_KEY)
