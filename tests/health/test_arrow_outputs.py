"""The two ways to derive the outputs (pyarrow on the driver, Spark jobs) give the same results.

Local mode takes the Arrow path by default (``job._outputs_arrow``); a cluster or a remote
destination takes Spark's (``job._outputs_spark``), which ``spark.txmsg.health.arrowOutputs=false``
forces here. Every figure of ``summary.json``, every row of the Parquet table and the dashboard's
series must be equal, on generated logs of several brokers in both formats (minute and hour
windows, two zones) and on the real 4.9.8 broker's logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txmsg_health import arrow_outputs, generate, job
from txmsg_health.inputs import parse_tz

UNTIMED = ("seconds", "timings", "parquet")


@contextmanager
def _spark_path(spark: Any) -> Iterator[None]:
    spark.conf.set(job.ARROW_OUTPUTS, "false")
    try:
        yield
    finally:
        spark.conf.unset(job.ARROW_OUTPUTS)


def _run(spark: Any, cfg: job.JobConfig) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    r = job.run(spark, cfg)
    s = {k: v for k, v in r.summary.items() if k not in UNTIMED}
    rows = pq.read_table(r.summary["parquet"]).to_pylist()
    return s, rows, r.series


def _both(spark: Any, logs: Path, out: Path, **kw: Any) -> dict[str, Any]:
    arrow_cfg = job.JobConfig(inputs=[str(logs)], out=str(out / "arrow"), **kw)
    spark_cfg = job.JobConfig(inputs=[str(logs)], out=str(out / "spark"), **kw)
    assert job._arrow_destination(spark, arrow_cfg) is not None  # local mode: the Arrow path
    by_arrow = _run(spark, arrow_cfg)
    with _spark_path(spark):
        assert job._arrow_destination(spark, spark_cfg) is None
        by_spark = _run(spark, spark_cfg)
    summary_a, rows_a, series_a = by_arrow
    summary_s, rows_s, series_s = by_spark
    assert summary_a == summary_s
    assert rows_a == rows_s  # both sorted by group, broker, window start
    assert series_a == series_s
    assert summary_a["flagged"], "the logs must flag groups, or the series compared are empty"
    assert any(r["unknown"] for r in rows_a)
    return summary_a


@pytest.mark.parametrize(("window", "tz"), [("minute", "+08:00"), ("hour", "-03:30")])
def test_generated_logs_of_several_brokers(
    spark: Any, generated: tuple[Path, generate.Manifest], tmp_path: Path, window: str, tz: str
) -> None:
    logs, _ = generated
    s = _both(spark, logs, tmp_path, window=window, tz=parse_tz(tz))
    assert {f for g in s["groups"].values() for f in g["formats"]} == {"4.9", "5"}
    assert len({b for g in s["groups"].values() for b in g["brokers"]}) > 2


def test_real_broker_logs(spark: Any, real_logs: Path, tmp_path: Path) -> None:
    _both(spark, real_logs / "debug", tmp_path)


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
    assert len(minute) == len(job.P.pipeline("minute"))
