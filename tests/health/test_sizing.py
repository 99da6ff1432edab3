"""Each local run sizes its input splits and its shuffle to the input (``txmsg_health.sizing``).

Why it matters: with one shuffle partition per core, a 50 M-line input put 25 times the
transactions of a 2 M-line one into each hash map of the aggregation, which spilled and held the
heap at its limit. These tests pin the rule and that a run applies it to the session it runs in.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession
from txmsg_health import job, sizing

MB = 1 << 20


@pytest.mark.parametrize(
    ("total", "cores", "splits"),
    [
        (2_478_905_512, 2, 4),  # the benchmark's 10 M lines: 4 of 620 MB, not 1 + 1 + 0.48 GB
        (494_241_883, 2, 2),  # 2 M lines
        (5 * 2_478_905_512, 2, 12),  # 50 M lines in five files
        (12 * MB, 2, 2),  # small: one split per core
        (0, 4, 4),
        (3000 * MB, 1, 3),
    ],
)
def test_splits_are_equal_full_waves_of_at_most_1_gb(total: int, cores: int, splits: int) -> None:
    p = sizing.plan(total, cores)
    assert int(p[sizing.SHUFFLE_PARTITIONS]) == splits
    assert splits % cores == 0
    split = int(p[sizing.MAX_PARTITION_BYTES])
    assert split * splits >= total > split * (splits - 1) or total == 0
    assert split <= sizing.SPLIT_BYTES


def test_the_split_limit_is_what_a_task_is_sure_to_get() -> None:
    """At Spark's defaults (a 1 GB driver: a 910 MB heap, memory fraction 0.6) on 2 cores a task
    is sure of ~92 MB; a split's aggregation takes ~0.3 of its bytes, so splits stay near 260 MB
    (4 of 620 MB spilled 0.6 GB per stage on the benchmark's 10 M lines)."""
    default = sizing.split_limit(910 * MB, 0.6, 2)
    assert 250 * MB < default < 270 * MB
    assert sizing.plan(2_478_905_512, 2, default)[sizing.SHUFFLE_PARTITIONS] == "10"
    assert sizing.split_limit(910 * MB, 0.6, 4) < default  # more tasks share the pool
    assert sizing.split_limit(16 * 1024 * MB, 0.6, 2) == sizing.SPLIT_BYTES  # capped
    assert sizing.split_limit(200 * MB, 0.6, 2) == 1 * MB  # a heap below the reserve: the floor


def test_a_session_sizes_by_its_own_heap(spark: object) -> None:
    assert isinstance(spark, SparkSession)
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()  # type: ignore[union-attr]
    cores = spark.sparkContext.defaultParallelism
    assert sizing.session_split_limit(spark) == sizing.split_limit(int(heap), 0.6, cores)


def test_local_sessions_size_what_the_user_left_unset() -> None:
    local = job.session_settings("local[2]")
    assert local[sizing.SIZED].split(",") == [sizing.MAX_PARTITION_BYTES, sizing.SHUFFLE_PARTITIONS]
    mine = job.session_settings("local[2]", {sizing.SHUFFLE_PARTITIONS: "64"})
    assert mine[sizing.SIZED] == sizing.MAX_PARTITION_BYTES
    assert mine[sizing.SHUFFLE_PARTITIONS] == "64"
    assert sizing.SIZED not in job.session_settings("spark://host:7077")  # a cluster: AQE sizes


def test_a_run_sizes_the_session_to_its_files(spark: object, tmp_path: Path) -> None:
    """The session fixture sets shuffle partitions itself: only the split size is the job's."""
    assert isinstance(spark, SparkSession)
    assert sizing.sized_keys(spark) == [sizing.MAX_PARTITION_BYTES]
    log = tmp_path / "broker-a" / "transaction.log"
    log.parent.mkdir()
    log.write_bytes(b"x" * 3_000_000 + b"\n")
    raw = spark.read.text(str(log))
    assert sizing.apply(spark, raw) == {sizing.MAX_PARTITION_BYTES: str(3_000_001 // 2 + 1)}
    assert spark.conf.get(sizing.MAX_PARTITION_BYTES) == str(3_000_001 // 2 + 1)
    assert spark.conf.get(sizing.SHUFFLE_PARTITIONS) == "2"  # the fixture's, left alone


def test_a_session_can_take_smaller_splits(spark: object, tmp_path: Path) -> None:
    """``spark.txmsg.health.splitBytes``: a machine with little memory per core reads smaller
    splits, still in full waves; a value that is not a number says what to give."""
    assert isinstance(spark, SparkSession)
    assert sizing.plan(2_478_905_512, 2, 256 * MB)[sizing.SHUFFLE_PARTITIONS] == "10"
    log = tmp_path / "broker-a" / "transaction.log"
    log.parent.mkdir()
    log.write_bytes(b"x" * 3_000_000 + b"\n")
    raw = spark.read.text(str(log))
    spark.conf.set(sizing.SPLIT_BYTES_KEY, str(1 * MB))
    try:
        assert sizing.apply(spark, raw) == {sizing.MAX_PARTITION_BYTES: str(3_000_001 // 4 + 1)}
        spark.conf.set(sizing.SPLIT_BYTES_KEY, "lots")
        with pytest.raises(ValueError, match="268435456"):
            sizing.apply(spark, raw)
    finally:
        spark.conf.unset(sizing.SPLIT_BYTES_KEY)
