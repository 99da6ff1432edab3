"""Input splits and shuffle partitions sized to each run's input, in local mode.

Why: a task's memory should not grow with the input. With a fixed number of partitions (one per
core), a 50 M-line input puts 25 times the transactions of a 2 M-line one into each hash map of
the aggregation, which then spills to disk and holds the heap at its limit; the peak memory of the
process and the cost per line both grow with the input. Sized per run, every map task reads about
``split_limit`` bytes of log and every reduce task aggregates the transactions of about that
much, at any input size. The limit follows the memory a task is sure to get: a split whose hash map
outgrows it spills, and a spilling aggregation costs more than the extra tasks of smaller splits.
Figures: docs/health.md ("Memory that does not grow with the input").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SPLIT_BYTES = 1 << 30
"""At most how much log one task reads, whatever the memory: beyond it fewer tasks save nothing."""

HASH_BYTES_PER_LOG_BYTE = 0.35
"""Peak execution memory of a map task's aggregation per byte of log it reads (measured 0.30 on
generated logs: docs/health.md), with a margin."""

RESERVED_BYTES = 300 << 20
"""The heap Spark keeps out of its memory pool (``UnifiedMemoryManager``'s reserved memory)."""

MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
SPLIT_BYTES_KEY = "spark.txmsg.health.splitBytes"
"""Overrides ``split_limit`` for a session (``--conf spark.txmsg.health.splitBytes=268435456``):
splits still get an equal share of the input, in full waves."""
SIZED = "spark.txmsg.health.sized"
"""The session's list (comma-separated) of the keys above that the job sizes per run: set by
``job.session_settings`` in local mode for each key the user did not set."""


def plan(total_bytes: int, cores: int, split_bytes: int = SPLIT_BYTES) -> dict[str, str]:
    """The two settings for an input of ``total_bytes`` on ``cores`` cores.

    The number of splits is a multiple of the cores and the splits are equal, so the last wave of
    tasks is full (2.48 GB on 2 cores with a 1 GB limit: 4 splits of 620 MB, not 1 + 1 + 0.48 GB
    with the last read by one core alone). The shuffle gets one partition per split: the first
    shuffle carries about one row per transaction, so each reduce task aggregates what one split
    holds.
    """
    cores = max(1, cores)
    splits = cores * max(1, math.ceil(total_bytes / (cores * max(1, split_bytes))))
    split = max(1, math.ceil(total_bytes / splits))
    return {MAX_PARTITION_BYTES: str(split), SHUFFLE_PARTITIONS: str(splits)}


def split_limit(heap_bytes: int, memory_fraction: float, cores: int) -> int:
    """The largest split whose aggregation fits the memory a task is sure to get.

    Spark's unified pool is (heap - ``RESERVED_BYTES``) x ``spark.memory.fraction``; each of
    ``cores`` running tasks is guaranteed half its share, pool / (2 x cores), before it spills.
    Spark's defaults (1 GB driver, 0.6, 2 cores): ~260 MB, so the benchmark's 10 M lines (2.48 GB)
    read as 10 splits of 248 MB, where 4 of 620 MB spilled 0.6 GB per stage.
    """
    pool = max(0, heap_bytes - RESERVED_BYTES) * memory_fraction
    fits = int(pool / (2 * max(1, cores)) / HASH_BYTES_PER_LOG_BYTE)
    return max(1 << 20, min(SPLIT_BYTES, fits))


def session_split_limit(spark: SparkSession) -> int:
    """``split_limit`` for this local session's JVM (the driver is the executor)."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime  # type: ignore[union-attr]  # a live session
    heap = int(runtime.getRuntime().maxMemory())
    fraction = float(spark.sparkContext.getConf().get("spark.memory.fraction", "0.6"))
    return split_limit(heap, fraction, spark.sparkContext.defaultParallelism)


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
    limit = bytes_setting(spark, SPLIT_BYTES_KEY, session_split_limit(spark), "268435456 (256 MB)")
    parallelism = spark.sparkContext.defaultParallelism
    chosen = {k: v for k, v in plan(total, parallelism, limit).items() if k in keys}
    for k, v in chosen.items():
        spark.conf.set(k, v)
    return chosen
