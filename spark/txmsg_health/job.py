"""The PySpark job: broker logs in, ``summary.json`` + Parquet + ``dashboard.html`` out.

Run it three ways with the same arguments (one command line: the click command
``txmsg_health.cli.health``, which ``main`` runs)::

    txmsg health LOGS... --out DIR [--master local[*]]
    python -m txmsg_health.job LOGS... --out DIR
    spark-submit spark/txmsg_health/job.py LOGS... --out DIR      # any master, any URI

Why the shape: the file is read exactly once. Every line goes through a few cheap projections
(``patterns.pipeline``) and one aggregation keyed by (kind, group, address, window, msgId-if-needed,
format, file); that aggregate is small (bounded by groups x windows x files, plus one row per
UNKNOW/checked transaction), and every output is derived from it: the broker of each
row is named from its file's path, and 5.x check-sent lines (no group on the line) get their
group from the same broker's lines about that msgId (grouped together, no join). In local mode
the aggregate comes to the driver once as Arrow and pyarrow derives the outputs
(``arrow_outputs``); elsewhere it is cached and small Spark jobs do. Executors need nothing but Spark:
there are no Python UDFs, so ``spark-submit`` to a cluster ships no Python code to workers.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, timezone
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # spark-submit spark/txmsg_health/job.py: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from txmsg_health import arrow_outputs as A
from txmsg_health import brokers, loopback, output, startup, summary
from txmsg_health import patterns as P
from txmsg_health.inputs import HealthInputError, parse_tz, resolve
from txmsg_health.rules import Thresholds
from txmsg_health.windows_out import WindowsWriter, local_path, rows_in, write_local

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass
class JobConfig:
    """Everything one run needs; the command line (``cli.health``) builds one of these."""

    inputs: list[str]
    out: str
    tz: timezone = field(default_factory=lambda: parse_tz("+08:00"))
    window: str = "minute"
    thresholds: Thresholds = field(default_factory=Thresholds)
    dashboard: bool = True
    parquet_uri: str | None = None  # default: <out>/metrics_by_window.parquet
    broker_regex: str | None = None  # default: the directory per broker (txmsg_health.brokers)


JVM_OPTIONS = "-XX:+UseParallelGC -XX:-DontCompileHugeMethods"
"""The driver JVM's options in local mode. ``-XX:-DontCompileHugeMethods``: the per-line stages
compile into one generated method of ~8 100 bytes of bytecode, just above HotSpot's 8 000-byte
limit, so without it that method - the hot loop over every line - is never JIT-compiled and runs
interpreted (measured: the per-line pipeline cost 2.2x the CPU time; see docs/health.md)."""

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"

REQUIRED_SETTINGS = {"spark.sql.session.timeZone": "UTC"}
"""Not defaults: settings the job's results depend on, given whatever else is configured. The
window table's start is the broker-local window key parsed as UTC minus the broker's offset
(``windows_table``), so another session time zone would shift every ``window_start``."""

DEFAULT_MASTER = "local[*]"
"""The master of a run that starts Spark itself and names none (``txmsg health LOGS --out DIR``)."""


def build_session(
    master: str | None = None, conf: dict[str, str] | None = None, *, fast_start: bool = False
) -> SparkSession:
    """A session tuned for this job (``session_settings``), with ``conf`` on top.

    ``master`` None: the master Spark already has - spark-submit's ``--master`` (setting one here
    would override it: the job would run in the driver instead of on the cluster), or the session
    made earlier in this process - else ``local[*]``. ``fast_start`` (the command-line runs): map a
    class-data-sharing archive into the local driver JVM, written by the first run
    (``txmsg_health.startup``; call ``startup.finish`` after the job).
    """
    from pyspark.sql import SparkSession  # noqa: PLC0415 - optional: the spark extra

    launches = not loopback.jvm_running()  # this call launches the driver JVM
    if master is None and launches:
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName("txmsg-health")
    if master:
        builder = builder.master(master)
    settings = session_settings(
        master or _active_master(),
        conf,
        fast_start=fast_start,
        launches_jvm=launches,
        user_set=user_spark_keys() if launches else running_spark_keys(),
    )
    settings.update(loopback.session_conf(master, settings))  # local driver on 127.0.0.1
    for k, v in settings.items():
        builder = builder.config(k, v)
    with loopback.launch_env(master, settings):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def session_settings(
    master: str | None,
    conf: Mapping[str, str] | None = None,
    *,
    fast_start: bool = False,
    launches_jvm: bool = True,
    user_set: Collection[str] = frozenset(),
) -> dict[str, str]:
    """The builder's settings for a session on ``master``: the job's defaults, ``conf`` on top.

    One rule for every default: the job gives a key only when the user set no value for it, in
    ``conf`` (the job's ``--conf``) or among ``user_set``: for a JVM this session launches,
    spark-defaults.conf and ``PYSPARK_SUBMIT_ARGS`` (``user_spark_keys``); for a JVM already
    running, its configuration (``running_spark_keys``: spark-submit's ``--conf``, its
    spark-defaults.conf, a session made earlier). Why: the builder's value replaces the user's
    (pyspark passes it to spark-submit as ``--conf``, which beats spark-defaults.conf, and a
    builder's setting beats what spark-submit put in the JVM's configuration), so on a cluster
    the cluster's values stay. Only ``REQUIRED_SETTINGS`` are given whatever is configured.

    ``maxPartitionBytes`` is large and ``minPartitionNum`` two per core on purpose: Spark then
    cuts the input into 2 x cores equal splits (bytes / minPartitionNum) instead of 1 GB pieces
    plus a remainder that one core reads alone (10 M lines, 2.48 GB on 2 cores: 1 + 1 + 0.48 GB).
    In local mode the shuffle has one partition per core: every output is derived from a small
    aggregate, and each extra partition is one more task in every later job, and adaptive query
    execution is off (nothing to coalesce or re-plan in partitions this small).

    JVM options (``JVM_OPTIONS``, the class archive with ``fast_start``) only for a driver JVM
    that this session launches (``launches_jvm``) in local mode: a cluster's JVMs are tuned by
    the cluster, and a JVM already running (spark-submit, a SparkConf's context) keeps the options
    it started with whatever the configuration says. Executor options never: a local executor
    runs inside the driver JVM. Pure apart from ``fast_start`` (which may claim the archive to
    write: ``startup``).
    """
    local, cores = _local_cores(master)
    conf = dict(conf or {})
    kept = conf.keys() | set(user_set)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.files.maxPartitionBytes": str(1 << 30),
        "spark.sql.shuffle.partitions": str(cores if local else 8),
        # PySpark otherwise records the Python call site of every Column call in the JVM (for
        # error messages): ~10 py4j round trips per call, 4x the calls for building the per-line
        # stages (patterns.pipeline) and the output queries, paid again by every fresh process
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    if local:  # a cluster keeps Spark's own (its default parallelism, adaptive execution)
        defaults["spark.sql.files.minPartitionNum"] = str(2 * cores)
        # every shuffle here has one partition per core and a small input after the first;
        # re-planning after each stage only costs time (interleaved runs, one session: 50 000
        # lines median 1.3 s vs 2.6 s, 2 M lines 1-4 % faster in each of four pairs)
        defaults["spark.sql.adaptive.enabled"] = "false"
        if (
            launches_jvm and DRIVER_JAVA_OPTIONS not in kept
        ):  # first: java_options claims the archive
            cds = startup.java_options() if fast_start else ""
            defaults[DRIVER_JAVA_OPTIONS] = f"{JVM_OPTIONS} {cds}" if cds else JVM_OPTIONS
    yielded = {k: v for k, v in defaults.items() if k not in kept}
    return {**yielded, **conf, **REQUIRED_SETTINGS}


def running_spark_keys(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Spark keys already set in the JVM this process uses, when it runs before ``build_session``.

    An active SparkContext (``getOrCreate`` reuses it and applies the builder's runtime settings
    to its session): its SparkConf and, with pyspark 4, what its session set since. spark-submit's
    JVM before any context (``PYSPARK_GATEWAY_PORT``): its configuration, which is spark-submit's
    ``--conf``, ``--properties-file`` and spark-defaults.conf. A JVM this process launched for a
    session since stopped: what the user set for that launch (``user_spark_keys``); the rest of
    its configuration came from the earlier builder, the job's own settings.
    """
    from pyspark import SparkConf, SparkContext  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql import SparkSession  # noqa: PLC0415 - optional: the spark extra

    env = os.environ if environ is None else environ
    active = SparkContext._active_spark_context
    if active is not None:
        keys = {k for k, _ in active.getConf().getAll()}
        session = SparkSession._instantiatedSession
        if session is not None and session.sparkContext is active:
            keys.update(getattr(session.conf, "getAll", {}))  # RuntimeConfig.getAll: pyspark 4
        return frozenset(keys)
    if "PYSPARK_GATEWAY_PORT" in env:
        SparkContext._ensure_initialized()  # connects to spark-submit's JVM; launches nothing new
        return frozenset(k for k, _ in SparkConf().getAll())
    return user_spark_keys(env)


def user_spark_keys(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Spark keys the user set for a JVM this process launches, outside the job's ``--conf``.

    Why: pyspark launches the driver JVM through spark-submit with the builder's settings as
    ``--conf``, which beat spark-defaults.conf; so the job leaves out what the user set there.
    Read as spark-submit reads them: ``$SPARK_CONF_DIR`` (else ``$SPARK_HOME/conf``, else the
    pyspark package's ``conf``) ``/spark-defaults.conf``, a ``--properties-file`` in
    ``PYSPARK_SUBMIT_ARGS``, and that variable's ``--conf`` / ``--driver-java-options`` (those win
    over the builder anyway; listed so the job's settings do not claim otherwise).
    """
    env = os.environ if environ is None else environ
    conf_dir = env.get("SPARK_CONF_DIR") or os.path.join(_spark_home(env), "conf")
    files = [os.path.join(conf_dir, "spark-defaults.conf")]
    keys: set[str] = set()
    try:
        args = shlex.split(env.get("PYSPARK_SUBMIT_ARGS", ""))
    except ValueError:
        args = []
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        if name in ("--conf", "-c"):
            keys.add(value.partition("=")[0].strip())
        elif name == "--driver-java-options":
            keys.add(DRIVER_JAVA_OPTIONS)
        elif name == "--properties-file":
            files.append(value)
    for path in files:
        keys.update(_property_keys(path))
    return frozenset(keys)


def _spark_home(env: Mapping[str, str]) -> str:
    if env.get("SPARK_HOME"):
        return env["SPARK_HOME"]
    import pyspark  # noqa: PLC0415 - optional: the spark extra

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _property_keys(path: str) -> set[str]:
    """The keys of a Java properties file (spark-defaults.conf's format); none if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    keys: set[str] = set()
    continued = False
    for raw in lines:
        line = raw.lstrip()
        if continued or not line or line[0] in "#!":  # a value's continuation, blank, comment
            continued = continued and (len(line) - len(line.rstrip("\\"))) % 2 == 1
            continue
        continued = (len(line) - len(line.rstrip("\\"))) % 2 == 1  # odd trailing backslashes
        m = re.match(r"((?:[^\\\s=:]|\\.)+)", line)
        if m:
            keys.add(re.sub(r"\\(.)", r"\1", m.group(1)))
    return keys


def _active_master() -> str | None:
    """The master of this process's SparkContext, if one runs (``getOrCreate`` then reuses it)."""
    from pyspark import SparkContext  # noqa: PLC0415 - optional: the spark extra

    active = SparkContext._active_spark_context
    return None if active is None else active.master


def _local_cores(master: str | None) -> tuple[bool, int]:
    """(local mode?, cores): ``local`` 1, ``local[N]`` / ``local[N,F]`` N, ``local[*]`` all."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", (master or "").strip())
    if not m:
        return False, 8
    n = m.group(1)
    return True, (os.cpu_count() or 1) if n == "*" else int(n or 1)


def classify(spark: SparkSession, paths: list[str], window: str) -> DataFrame:
    """One row per input line: kind, group, address, window key, msgId (only where needed)."""
    df = spark.read.option("recursiveFileLookup", "true").option("lineSep", "\n").text(paths)
    for stage in _pipeline(spark, window):
        df = df.select(*stage)
    return df


_PIPELINES: weakref.WeakKeyDictionary[Any, dict[str, list[list[Column]]]] = (
    weakref.WeakKeyDictionary()
)


def _pipeline(spark: SparkSession, window: str) -> list[list[Column]]:
    """``patterns.pipeline(window)``, built once per SparkContext.

    Why: building the stages takes ~1 400 py4j calls (0.12-0.18 s); a driver that runs the job
    again (a notebook, a scheduler, the benchmark's warm runs) reuses them. The Columns are
    unresolved expressions in the driver JVM, valid for any DataFrame of that JVM; a new
    SparkContext (a new JVM after ``startup.stop_jvm``) builds them again.
    """
    built = _PIPELINES.setdefault(spark.sparkContext, {})
    if window not in built:
        built[window] = P.pipeline(window)
    return built[window]


def aggregate(lines: DataFrame) -> DataFrame:
    """The one shuffle over the input: counts per (kind, group, address, window, msgId)."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    return lines.groupBy("kind", "grp", "addr", "win", "msg", "v", "file").agg(
        F.count(F.lit(1)).alias("n"), F.min("ts").alias("tmin"), F.max("ts").alias("tmax")
    )


def _metric_columns() -> list[tuple[str, tuple[str, ...]]]:
    return [
        ("unknown", (P.FIRST_UNKNOWN,)),
        ("rollback", (P.FIRST_ROLLBACK,)),
        ("commit", (P.FIRST_COMMIT,)),
        ("check_unknown", (P.CHECK_UNKNOWN,)),
        ("check_rollback", (P.CHECK_ROLLBACK,)),
        ("check_commit", (P.CHECK_COMMIT, P.CHECK_COMMIT_DEBUG)),
        ("checks", P.CHECK_KINDS),
        ("discarded", (P.DISCARD,)),
        ("no_channel", (P.NO_CHANNEL,)),
        ("no_channel_broker_log", (P.NO_CHANNEL_BROKER_LOG,)),
        ("check_send_failed", (P.CHECK_SEND_FAILED,)),
        ("bad_lines", (P.BAD,)),
        ("debug_lines", P.DEBUG_KINDS),
    ]


def windows_table(agg: DataFrame, window: str, tz: timezone) -> DataFrame:
    """Per group per window metrics, with the window start converted to UTC."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import LongType  # noqa: PLC0415 - optional: the spark extra

    offset = int((tz.utcoffset(None) or UTC.utcoffset(None)).total_seconds())
    fmt = "yyyy-MM-dd HH:mm" if window == "minute" else "yyyy-MM-dd HH"
    # types as DataType objects, here and below: a type name ("long") is parsed by Spark's SQL
    # parser, which the job otherwise never loads in a fresh process (patterns: no SQL text)
    sums = [
        F.sum(F.when(F.col("kind").isin(*kinds), F.col("n")).otherwise(0))
        .cast(LongType())
        .alias(name)
        for name, kinds in _metric_columns()
    ]
    w = (
        agg.where(F.col("grp").isNotNull() & F.col("win").isNotNull())
        .groupBy("grp", "broker", "win")
        .agg(*sums)
    )
    start = F.to_timestamp(F.col("win"), fmt) - F.make_interval(secs=F.lit(offset))
    return w.select(
        F.col("grp").alias("group"),
        F.col("broker"),
        start.alias("window_start"),
        F.lit(window).alias("window"),
        *[F.col(name) for name, _ in _metric_columns()],
    )


@dataclass
class JobResult:
    summary: dict[str, Any]
    series: dict[str, list[dict[str, Any]]]  # flagged group -> windows, for the dashboard
    seconds: float


def run(spark: SparkSession, cfg: JobConfig) -> JobResult:
    """Run the whole analysis in ``spark`` and write every output into ``cfg.out``."""
    from pyspark import StorageLevel  # noqa: PLC0415 - optional: the spark extra

    t0 = time.perf_counter()
    paths = resolve(cfg.inputs)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        agg = aggregate(classify(spark, paths, cfg.window))
    except Exception as exc:  # AnalysisException for unreadable/missing remote paths
        raise HealthInputError(f"cannot read {', '.join(cfg.inputs)}: {_first_line(exc)}") from exc
    arrow = _arrow_destination(spark, cfg) is not None
    if not arrow:  # read by several jobs; the Arrow path reads it once
        agg = agg.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        result, series = _outputs(agg, paths, cfg)
    finally:
        if not arrow:
            agg.unpersist()
    seconds = time.perf_counter() - t0
    result["seconds"] = round(seconds, 3)
    output.write_summary(cfg.out, result)
    if cfg.dashboard:
        from txmsg_health import dashboard  # noqa: PLC0415 - jinja2 (the spark extra) only for a dashboard

        dashboard.write(cfg.out, result, series)
    return JobResult(result, series, seconds)


ARROW_OUTPUTS = "spark.txmsg.health.arrowOutputs"
"""``false``: derive the outputs with Spark jobs even where the Arrow path could (tests, checks)."""


def _parquet(cfg: JobConfig) -> str:
    return cfg.parquet_uri or os.path.join(os.path.abspath(cfg.out), "metrics_by_window.parquet")


def _arrow_destination(spark: SparkSession, cfg: JobConfig) -> str | None:
    """The local path of the window table when the outputs take the Arrow path, else None.

    The Arrow path needs the driver to be the executor (local mode) and to write the table itself
    (``windows_out.local_path``); ``--conf spark.txmsg.health.arrowOutputs=false`` turns it off.
    """
    if str(spark.conf.get(ARROW_OUTPUTS, "true")).strip().lower() == "false":
        return None
    return local_path(spark, _parquet(cfg))


def _outputs(
    agg: DataFrame, paths: list[str], cfg: JobConfig
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Every output from the aggregate: summary, Parquet table, dashboard series.

    In local mode the aggregate comes to the driver once, as Arrow, and pyarrow derives the rest
    (``arrow_outputs``: no more Spark jobs); elsewhere Spark jobs over the cached aggregate do
    (``_outputs_spark``). Both give the same figures, row for row.
    """
    destination = _arrow_destination(agg.sparkSession, cfg)
    if destination is None:
        return _outputs_spark(agg, paths, cfg)
    return _outputs_arrow(agg, paths, cfg, destination)


def _outputs_arrow(
    agg: DataFrame, paths: list[str], cfg: JobConfig, destination: str
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The outputs from the aggregate collected once as Arrow (local mode).

    The per-transaction figures and the window table are computed in two threads while this one
    makes the totals: pyarrow's kernels release the GIL, and the cores are idle once Spark is done
    (10 M lines: 0.37 s in one thread, 0.23 s in two).
    """
    timings: dict[str, float] = {}
    t = time.perf_counter()
    table = agg.toArrow()
    if table.num_rows == 0:
        raise _empty_input(cfg)
    names = brokers.names(A.files(table), paths, cfg.broker_regex)
    table = A.with_broker(table, names)
    os.makedirs(cfg.out, exist_ok=True)

    def transactions() -> tuple[list[tuple[Any, str, int, int, int, int]], list[Any]]:
        t = time.perf_counter()
        hist, ended = A.histogram(table), A.after_end(table)
        timings["transactions"] = time.perf_counter() - t
        return hist, ended

    def windows() -> Any:
        t = time.perf_counter()
        written = write_local(A.windows(table, _metric_columns(), cfg.window, cfg.tz), destination)
        timings["windows"] = time.perf_counter() - t
        return written

    with ThreadPoolExecutor(2, thread_name_prefix="health-arrow") as pool:
        hist_done, windows_done = pool.submit(transactions), pool.submit(windows)
        totals, addr_rows = _totals(A.totals(table), names)
        timings["scan_and_totals"] = time.perf_counter() - t
        (hist_rows, ended_rows), window_table = hist_done.result(), windows_done.result()
    result = summary.build(
        totals,
        addr_rows,
        hist_rows,
        window=cfg.window,
        tz=cfg.tz,
        thresholds=cfg.thresholds,
        after_end=ended_rows,
    )
    result["inputs"] = list(cfg.inputs)
    result["parquet"] = _parquet(cfg)
    t = time.perf_counter()
    series = _series(rows_in(window_table, list(result["flagged"])))
    timings["series"] = time.perf_counter() - t
    result["timings"] = {
        k: round(timings[k], 3) for k in ("scan_and_totals", "transactions", "windows", "series")
    }
    return result, series


def _empty_input(cfg: JobConfig) -> HealthInputError:
    return HealthInputError(
        f"the input is empty: {', '.join(cfg.inputs)} contain no lines; point at the broker's "
        "log directory (~/logs/rocketmqlogs) or its transaction.log / broker.log files"
    )


def _totals(
    rows: list[Any], names: dict[str, str]
) -> tuple[list[summary.Totals], list[tuple[str, str, str, str, int]]]:
    """The totals and per-address rows of ``summary.build``, each file named by ``names``.

    ``rows``: mappings with the totals query's fields (grp, file, addr, kind, v, n, wmin, wmax).
    """
    totals = [
        (r["grp"], names[r["file"]], r["kind"], r["v"], int(r["n"]), r["wmin"], r["wmax"])
        for r in rows
    ]
    addr_rows = [
        (r["grp"], names[r["file"]], r["addr"], r["kind"], int(r["n"]))
        for r in rows
        if r["addr"] is not None and r["grp"] is not None
    ]
    return totals, addr_rows


def _outputs_spark(
    agg: DataFrame, paths: list[str], cfg: JobConfig
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The outputs by Spark jobs over the cached aggregate (a cluster, a remote destination).

    Small jobs, none of them a join: per-file totals (which also name the files, hence the
    brokers), then per-transaction figures and, at the same time, the window table, then the
    flagged groups' windows for the dashboard. A 5.x check-sent line has no group; it
    gets the group of its transaction, whose other rows are grouped with it by (broker, msgId).
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    timings: dict[str, float] = {}
    t = time.perf_counter()
    rows = [
        r.asDict()
        for r in agg.groupBy("grp", "file", "addr", "kind", "v")
        .agg(
            F.sum("n").alias("n"),
            F.min(_stamp("tmin")).alias("wmin"),
            F.max(_stamp("tmax")).alias("wmax"),
        )
        .collect()
    ]
    timings["scan_and_totals"] = time.perf_counter() - t
    if sum(int(r["n"]) for r in rows) == 0:
        raise _empty_input(cfg)
    names = brokers.names(sorted({r["file"] for r in rows}), paths, cfg.broker_regex)
    totals, addr_rows = _totals(rows, names)
    broker = F.create_map(*[F.lit(x) for kv in sorted(names.items()) for x in kv])[F.col("file")]
    parquet = _parquet(cfg)
    os.makedirs(cfg.out, exist_ok=True)
    windows = WindowsWriter(
        windows_table(agg.withColumn("broker", broker), cfg.window, cfg.tz), parquet
    )
    try:
        # The window table does not depend on the per-transaction figures: written in a second
        # thread while they are computed, so the two small jobs share the cores instead of
        # queueing (each is a few short tasks over the cached aggregate).
        with ThreadPoolExecutor(1, thread_name_prefix="health-windows") as pool:
            written = pool.submit(windows.write)
            t = time.perf_counter()
            hist_rows = _histogram(agg, broker)
            ended_rows = _after_end(agg, broker)
            timings["transactions"] = time.perf_counter() - t
            result = summary.build(
                totals,
                addr_rows,
                hist_rows,
                window=cfg.window,
                tz=cfg.tz,
                thresholds=cfg.thresholds,
                after_end=ended_rows,
            )
            timings["windows"] = written.result()
        result["inputs"] = list(cfg.inputs)
        result["parquet"] = parquet
        t = time.perf_counter()
        series = _series(windows.rows_of(list(result["flagged"])))
        timings["series"] = time.perf_counter() - t
    finally:
        windows.close()
    result["timings"] = {k: round(v, 3) for k, v in timings.items()}
    return result, series


def _histogram(agg: DataFrame, broker: Column) -> list[tuple[Any, str, int, int, int, int]]:
    """(group, broker, checks, transactions, of them ever UNKNOW, checks sent) rows."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import IntegerType  # noqa: PLC0415 - optional: the spark extra

    per_tx = (
        agg.where(F.col("msg").isNotNull())
        .groupBy(broker.alias("broker"), "msg")
        .agg(
            F.min("grp").alias("grp"),  # NULL only on check-sent rows: the transaction's group
            F.sum(F.when(F.col("kind").isin(*P.CHECK_KINDS), F.col("n")).otherwise(0)).alias("a"),
            F.sum(F.when(F.col("kind") == P.CHECK_SENT, F.col("n")).otherwise(0)).alias("s"),
            F.max(F.col("kind").isin(*P.UNKNOWN_KINDS).cast(IntegerType())).alias("u"),
        )
        # check-backs of one transaction: the answers seen, or (5.x) the checks sent if more
        .select("broker", "grp", F.greatest("a", "s").alias("c"), "u", "s")
    )
    return [
        (r.grp, r.broker, int(r.c), int(r.ntx), int(r.nunk), int(r.sent))
        for r in per_tx.groupBy("broker", "grp", "c")
        .agg(F.count(F.lit(1)).alias("ntx"), F.sum("u").alias("nunk"), F.sum("s").alias("sent"))
        .collect()
    ]


def _after_end(
    agg: DataFrame, broker: Column
) -> list[tuple[Any, str, int, int, int, int, int, int]]:
    """Transactions checked after they had ended: ``arrow_outputs.after_end`` as Spark jobs.

    Per transaction (broker, msgId): its check-backs, the first stamp of a logged first-phase end
    and of a COMMIT/ROLLBACK check answer, the last stamp of a check-back; then summed per
    (group, broker, the transaction's own check-backs). Rules: ``summary.AFTER_END_RULES``.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import LongType  # noqa: PLC0415 - optional: the spark extra

    kind, n = F.col("kind"), F.col("n")

    def sum_of(*kinds: str) -> Column:
        return F.sum(F.when(kind.isin(*kinds), n).otherwise(0))

    def stamp_of(fn: Callable[[Column], Column], col: str, *kinds: str) -> Column:
        return fn(F.when(kind.isin(*kinds), _stamp(col)))

    per = (
        agg.where(F.col("msg").isNotNull())
        .groupBy(broker.alias("broker"), "msg")
        .agg(
            F.min("grp").alias("grp"),
            F.greatest(sum_of(*P.CHECK_KINDS), sum_of(P.CHECK_SENT)).alias("c"),
            sum_of(*P.CONCLUSIVE_CHECK_KINDS).alias("k"),
            sum_of(P.DISCARD).alias("d"),
            stamp_of(F.min, "tmin", *P.FIRST_END_KINDS).alias("end"),
            stamp_of(F.min, "tmin", *P.CONCLUSIVE_CHECK_KINDS).alias("concl"),
            stamp_of(F.max, "tmax", P.CHECK_SENT).alias("sent"),
            stamp_of(F.max, "tmax", *P.CHECK_KINDS).alias("ans"),
        )
        .where((F.col("c") > 0) | (F.col("d") > 0))
    )
    last = F.coalesce(F.col("sent"), F.col("ans"))
    at_send = F.coalesce(last > F.col("end"), F.lit(False))
    again = ~at_send & F.coalesce(F.col("sent") > F.col("concl"), F.lit(False))
    caused = (
        F.when(at_send, F.col("c")).when(again, F.greatest(F.col("k") - 1, F.lit(1))).otherwise(0)
    )
    tx = per.select(
        "broker",
        "grp",
        (F.col("c") - caused).alias("own"),
        at_send.cast(LongType()).alias("at_send"),
        again.cast(LongType()).alias("again"),
        caused.alias("caused"),
        F.when(at_send | again, F.col("d")).otherwise(0).alias("disc"),
    )
    return [
        (r.grp, r.broker, int(r.own), int(r.ntx), int(r.a), int(r.b), int(r.c), int(r.d))
        for r in tx.groupBy("broker", "grp", "own")
        .agg(
            F.count(F.lit(1)).alias("ntx"),
            F.sum("at_send").alias("a"),
            F.sum("again").alias("b"),
            F.sum("caused").alias("c"),
            F.sum("disc").alias("d"),
        )
        .collect()
    ]


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per flagged group, its windows summed over brokers, oldest first (the dashboard's chart)."""
    names = [name for name, _ in _metric_columns()]
    per: dict[tuple[str, Any], dict[str, Any]] = {}
    for d in rows:
        cur = per.setdefault((d["group"], d["window_start"]), {**d, **{k: 0 for k in names}})
        for k in names:
            cur[k] += int(d[k])
    series: dict[str, list[dict[str, Any]]] = {}
    for (g, _), d in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        series.setdefault(g, []).append(d)
    return series


def _stamp(col: str) -> Column:
    """``window + seconds offset`` as one sortable string: "2026-11-22 18:12|0004"."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra
    from pyspark.sql.types import StringType  # noqa: PLC0415 - optional: the spark extra

    return F.when(
        F.col(col).isNotNull(),
        F.concat(F.col("win"), F.lit("|"), F.lpad(F.col(col).cast(StringType()), 4, "0")),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def report_line(result: JobResult, out: str) -> str:
    s = result.summary
    return (
        f"{s['lines']['total']} lines, {len(s['groups'])} producer groups, "
        f"{len(s['flagged'])} flagged{': ' + ', '.join(s['flagged'][:10]) if s['flagged'] else ''}; "
        f"{s['lines']['bad']} bad lines; {result.seconds:.1f}s -> {out}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m txmsg_health.job`` and ``spark-submit job.py``: the ``txmsg health`` command.

    Why: one definition of the options and their defaults (``cli.health``; an argparse copy here
    had drifted from it). Kept of this entry point's own: its exit codes (2 for an input the job
    cannot read, as before; click's for usage errors) and messages ("txmsg health: ..." on
    stderr), and the session is left running for the caller (the ``__main__`` block calls
    ``startup.finish``; a test reads the session's configuration after the run).
    """
    import click  # noqa: PLC0415 - the command line only

    from txmsg_health.cli import KEEP_SESSION, health  # noqa: PLC0415 - cli imports this module

    try:
        code = health.main(
            args=argv, prog_name="txmsg_health.job", standalone_mode=False, obj=KEEP_SESSION
        )
    except click.ClickException as exc:
        if isinstance(exc.__cause__, HealthInputError):
            print(f"txmsg health: {exc.__cause__}", file=sys.stderr)
            return 2
        exc.show()
        return exc.exit_code
    except click.Abort:
        print("Aborted!", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    code = main()
    startup.finish()  # a first run on this machine: put the JVM's class archive in place
    sys.exit(code)
