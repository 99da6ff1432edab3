"""The window table written by Spark straight from the result, for inputs too large to hold it
on the driver.

Why: the window table has one row per group, broker and window, so it grows with the brokers
and the hours an input covers (88 721 rows for 10 M generated lines, 443 605 for the 50 M-line
set of five brokers). Collected to the driver as Arrow (``arrow_outputs``, ``windows_out``) that
is the fastest way for the inputs most runs read, but the driver's memory then grows with the
input: the 50 M-line set held about 600 MB in the Python driver alone. Above
:data:`DRIVER_LIMIT_BYTES` of input the executors aggregate and write the table instead, and
only the flagged groups' rows (the dashboard's series) come to the driver. Both paths leave the
same table (tests/health/test_windows_spark.py). Figures: docs/health.md.
"""

from __future__ import annotations

from datetime import UTC, timezone
from typing import TYPE_CHECKING, Any

from txmsg_health import reduce as R
from txmsg_health.sizing import bytes_setting
from txmsg_health.windows_out import SORT_KEYS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import DataFrame, SparkSession

DRIVER_LIMIT_BYTES = 4 << 30
"""Inputs up to this size bring the window table to the driver (one Spark job fewer, ~1-2 s
less on the 10 M-line benchmark log of 2.48 GB); larger inputs have Spark write it."""

DRIVER_LIMIT_KEY = "spark.txmsg.health.windowsOnDriverBytes"
"""Overrides :data:`DRIVER_LIMIT_BYTES` (``--conf spark.txmsg.health.windowsOnDriverBytes=0``:
Spark writes the table at any size, for a driver with little memory)."""

JAVA_FORMATS = {"minute": "yyyy-MM-dd HH:mm", "hour": "yyyy-MM-dd HH"}
"""``summary.WINDOW_FORMATS`` in Spark's datetime pattern language."""


def on_executors(spark: SparkSession, input_bytes: int) -> bool:
    """Whether Spark, not the driver, writes the window table of an input of ``input_bytes``."""
    example = "0 (Spark writes the table at any size)"
    return input_bytes > bytes_setting(spark, DRIVER_LIMIT_KEY, DRIVER_LIMIT_BYTES, example)


def table(rows: DataFrame, names: Mapping[str, str], window: str, tz: timezone) -> DataFrame:
    """``arrow_outputs.windows`` in Spark: per group, broker and window, the metrics and the
    window's start in UTC. ``rows``: the result's ``WINDOWS`` rows; ``names``: file -> broker."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    metrics = [name for name, _ in R.METRICS]
    mapping = F.create_map(*[F.lit(x) for kv in sorted(names.items()) for x in kv])
    offset = int((tz.utcoffset(None) or UTC.utcoffset(None)).total_seconds())
    # the window key is broker-local time: parsed as UTC (the job's session time zone), then
    # moved by the broker's offset, as the driver's path does with pyarrow
    local = F.try_to_timestamp(F.col("win"), F.lit(JAVA_FORMATS[window]))
    start = F.timestamp_seconds(F.unix_timestamp(local) - F.lit(offset))
    summed = (
        rows.select("grp", mapping[F.col("file")].alias("broker"), "win", *metrics)
        .groupBy("grp", "broker", "win")
        .agg(*[F.sum(m).cast("long").alias(m) for m in metrics])
    )
    return summed.select(
        F.col("grp").alias("group"),
        "broker",
        start.alias("window_start"),
        F.lit(window).alias("window"),
        *metrics,
    )


TIMESTAMP_TYPE = "spark.sql.parquet.outputTimestampType"


def write(windows: DataFrame, uri: str) -> None:
    """Write the table to ``uri`` as the driver's path does: one part file, sorted by
    ``windows_out.SORT_KEYS``, ``_SUCCESS``, and ``window_start`` as microseconds in UTC (Spark's
    default, INT96, reads back in pyarrow as a timestamp without a time zone)."""
    spark = windows.sparkSession
    before = spark.conf.get(TIMESTAMP_TYPE, None)
    spark.conf.set(TIMESTAMP_TYPE, "TIMESTAMP_MICROS")
    try:
        sorted_once = windows.coalesce(1).sortWithinPartitions(*SORT_KEYS)
        sorted_once.write.mode("overwrite").parquet(uri)
    finally:
        if before is None:
            spark.conf.unset(TIMESTAMP_TYPE)
        else:
            spark.conf.set(TIMESTAMP_TYPE, before)


def rows_in(windows: DataFrame, groups: list[str]) -> list[dict[str, Any]]:
    """The rows of ``groups`` (the flagged ones: few) as dicts, in the table's order
    (``windows_out.SORT_KEYS``, as ``windows_out.rows_in`` reads them)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    if not groups:
        return []
    chosen = windows.filter(F.col("group").isin(groups)).toArrow()
    rows: list[dict[str, Any]] = chosen.sort_by([(k, "ascending") for k in SORT_KEYS]).to_pylist()
    return rows
