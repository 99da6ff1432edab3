"""Input splits and shuffle partitions sized to each run's input, in local mode.

Why: a task's memory should not grow with the input. With a fixed number of partitions (one per
core), a 50 M-line input puts 25 times the transactions of a 2 M-line one into each hash map of
the aggregation, which then spills to disk and holds the heap at its limit; the peak memory of the
process and the cost per line both grow with the input. Sized per run, every map task reads about
``SPLIT_BYTES`` of log and every reduce task aggregates the transactions of about that much, at
any input size. Figures: docs/health.md ("Memory that does not grow with the input").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SPLIT_BYTES = 1 << 30
"""At most how much log one task reads. Not Spark's 128 MB: below about 1 GB each task and each
shuffle partition cost the DuckDB comparison more than they saved (docs/health.md, "Sized to the
input")."""

MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
SPLIT_BYTES_KEY = "spark.txmsg.health.splitBytes"
"""Overrides :data:`SPLIT_BYTES` for a session (``--conf spark.txmsg.health.splitBytes=268435456``):
a machine with little memory per core takes smaller splits; each still gets an equal share."""
SIZED = "spark.txmsg.health.sized"
"""The session's list (comma-separated) of the keys above that the job sizes per run: set by
``job.session_settings`` in local mode for each key the user did not set."""


def plan(total_bytes: int, cores: int, split_bytes: int = SPLIT_BYTES) -> dict[str, str]:
    """The two settings for an input of ``total_bytes`` on ``cores`` cores.

    The number of splits is a multiple of the cores and the splits are equal, so the last wave of
    tasks is full (10 M lines, 2.48 GB on 2 cores: 4 splits of 620 MB, not 1 + 1 + 0.48 GB with
    the last read by one core alone; 50 M lines, 12.4 GB: 12 of 985 MB). The shuffle gets one
    partition per split: the first shuffle
    carries about one row per transaction, so each reduce task aggregates what one split holds.
    """
    cores = max(1, cores)
    splits = cores * max(1, math.ceil(total_bytes / (cores * max(1, split_bytes))))
    split = max(1, math.ceil(total_bytes / splits))
    return {MAX_PARTITION_BYTES: str(split), SHUFFLE_PARTITIONS: str(splits)}


def sized_keys(spark: SparkSession) -> list[str]:
    """The keys this session lets the job size per run (none on a cluster or where user-set)."""
    return [k for k in (spark.conf.get(SIZED, "") or "").split(",") if k]


def bytes_setting(spark: SparkSession, key: str, default: int, example: str) -> int:
    """The session's setting ``key`` in bytes, ``default`` where unset; a value that is not a
    number ends the run with an error that shows ``example`` (bytes and what they do)."""
    raw = spark.conf.get(key, None)
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ValueError(
            f"{key}={raw!r} is not a number of bytes; give e.g. --conf {key}={example}, "
            f"or leave it out ({default})"
        ) from None


def input_bytes(raw: DataFrame) -> int:
    """The bytes of the files behind ``raw`` (the files as read, before any projection).

    The total comes from the file listing Spark already made (the relation's size statistic:
    the files' bytes), so nothing is read and remote paths work the same.
    """
    stats = raw._jdf.queryExecution().optimizedPlan().stats()
    return int(str(stats.sizeInBytes()))  # a Scala BigInt: py4j gives an int or its object


def apply(spark: SparkSession, raw: DataFrame, total: int | None = None) -> dict[str, str]:
    """Size the run over ``raw`` (the files as read, before any projection) of ``total`` bytes
    (``input_bytes``, where the caller has not read it yet); returns what it set."""
    keys = sized_keys(spark)
    if not keys:
        return {}
    total = input_bytes(raw) if total is None else total
    limit = bytes_setting(spark, SPLIT_BYTES_KEY, SPLIT_BYTES, "268435456 (256 MB)")
    parallelism = spark.sparkContext.defaultParallelism
    chosen = {k: v for k, v in plan(total, parallelism, limit).items() if k in keys}
    for k, v in chosen.items():
        spark.conf.set(k, v)
    return chosen
