"""Write the per-window table (``metrics_by_window.parquet``) and read the dashboard's rows back.

Why two writers: the table is small (one row per group, broker and window: 88 721 rows for
10 M generated lines) and Spark's Parquet writer is the most expensive way to write it in a
fresh process, where it loads and warms up the writer, the output committer and the sort
(2.35 s on a cold first call, 0.7-0.86 s warm, against 1.2 s and 0.5 s for collecting it through
Arrow and writing it with pyarrow; docs/health.md, round 4). So where the driver can write the
destination itself (local mode, a local path, Hadoop's default file system local too) the table
comes to the driver as Arrow and pyarrow writes it; anywhere else (``hdfs://``, ``s3a://``, a
cluster whose executors write where the driver cannot) Spark's writer does, as before. Both
leave the same layout: a directory with one sorted part file and ``_SUCCESS``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

SORT_KEYS = ("group", "broker", "window_start")


def local_path(spark: SparkSession, uri: str) -> str | None:
    """The local path the driver can write ``uri`` to itself, or None where Spark must write it."""
    if not (spark.sparkContext.master or "").startswith("local"):
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    if (
        parsed.scheme and len(parsed.scheme) > 1
    ):  # hdfs://, s3a://, ... (one letter: a Windows drive)
        return None
    default_fs = spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    return os.path.abspath(uri) if str(default_fs).startswith("file:") else None


class WindowsWriter:
    """Writes the window table once and answers the dashboard's query from what it wrote."""

    def __init__(self, wt: DataFrame, uri: str) -> None:
        self._wt = wt
        self._uri = uri
        self._local = local_path(wt.sparkSession, uri)
        self._table: pa.Table | None = None
        if self._local is None:
            self._wt = wt.persist()  # read again for the dashboard's rows

    def write(self) -> float:
        """Write the table; returns the seconds taken (the job's ``windows`` timing)."""
        t = time.perf_counter()
        if self._local is None:
            # a global orderBy would cost an extra sampling job
            (
                self._wt.coalesce(1)
                .sortWithinPartitions(*SORT_KEYS)
                .write.mode("overwrite")
                .parquet(self._uri)
            )
        else:
            self._table = write_local(self._wt.toArrow(), self._local)
        return time.perf_counter() - t

    def rows_of(self, groups: list[str]) -> list[dict[str, Any]]:
        """The rows of ``groups`` (call after ``write``), as dicts."""
        if not groups:
            return []
        if self._table is not None:
            return rows_in(self._table, groups)
        from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

        return [r.asDict() for r in self._wt.where(F.col("group").isin(*groups)).collect()]

    def close(self) -> None:
        if self._local is None:
            self._wt.unpersist()


def write_local(table: pa.Table, path: str) -> pa.Table:
    """Sort the table as Spark's writer would and write it to the local ``path``; returns it sorted."""
    table = table.sort_by([(k, "ascending") for k in SORT_KEYS])
    _write_dir(table, path)
    return table


def rows_in(table: pa.Table, groups: list[str]) -> list[dict[str, Any]]:
    """The rows of ``groups`` in a window table, as dicts."""
    import pyarrow as pa  # noqa: PLC0415 - the spark extra
    import pyarrow.compute as pc  # noqa: PLC0415 - the spark extra

    if not groups:
        return []
    wanted = pc.is_in(table["group"], value_set=pa.array(groups, pa.string()))
    rows: list[dict[str, Any]] = table.filter(wanted).to_pylist()
    return rows


def _write_dir(table: pa.Table, path: str) -> None:
    """``path``/part-00000.parquet and ``_SUCCESS``, replacing what was there (as Spark's
    ``mode("overwrite")``): written beside it first, so a failed write leaves the old table."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - the spark extra

    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.")
    try:
        pq.write_table(table, os.path.join(tmp, "part-00000.parquet"))
        open(os.path.join(tmp, "_SUCCESS"), "wb").close()
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
