"""The PySpark job: broker logs in, ``summary.json`` + Parquet + ``dashboard.html`` out.

Run it three ways with the same arguments (one command line: the click command
``txmsg_health.cli.health``, which ``main`` runs)::

    txmsg health LOGS... --out DIR [--master local[*]]
    python -m txmsg_health.job LOGS... --out DIR
    spark-submit spark/txmsg_health/job.py LOGS... --out DIR      # any master, any URI

Why the shape: the file is read exactly once and nothing per line or per transaction reaches the
driver, so a day of logs (tens of millions of lines) runs at Spark's default 1 GB driver. Every
line goes through a few cheap projections (``patterns.pipeline``) and one aggregation with two
grouping sets (``reduce.aggregate``): per (kind, group, address, window, format, file), and per
(broker, msgId) with the transaction's figures as numbers. One more aggregation
(``reduce.result``) makes totals, the window table's rows and the transactions counted per
outcome; that small result comes to the driver once as Arrow and pyarrow derives the outputs
(``arrow_outputs``), the same on any master. The files' broker names are known before the read
(``DataFrame.inputFiles``), so a transaction's lines in several files of one broker meet in that
one shuffle. Executors need nothing but Spark: there are no Python UDFs, so ``spark-submit`` to a
cluster ships no Python code to workers.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import timezone
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # spark-submit spark/txmsg_health/job.py: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from txmsg_health import arrow_outputs as A
from txmsg_health import (
    brokers,
    loopback,
    output,
    rescues,
    sizing,
    startup,
    summary,
    windows_out,
    windows_spark,
)
from txmsg_health import patterns as P
from txmsg_health import reduce as R
from txmsg_health.inputs import HealthInputError, parse_tz, resolve
from txmsg_health.rules import Thresholds
from txmsg_health.windows_out import rows_in

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
    rescue_metrics: list[str] = field(default_factory=list)  # txmsg services' scrapes (rescues)


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

    In local mode each run sizes its input splits and its shuffle to the input (``sizing``: about
    128 MB of log per task, equal splits in full waves, one shuffle partition per split) for the
    keys the user did not set (``sizing.SIZED`` lists them); adaptive query execution is off
    (the sizes are chosen already; re-planning after each stage only costs time).

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
        sizing.SHUFFLE_PARTITIONS: str(cores if local else 8),
        # PySpark otherwise records the Python call site of every Column call in the JVM (for
        # error messages): ~10 py4j round trips per call, 4x the calls for building the per-line
        # stages (patterns.pipeline) and the output queries, paid again by every fresh process
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    if local:  # a cluster keeps Spark's own (its default parallelism, adaptive execution)
        defaults["spark.sql.files.minPartitionNum"] = str(2 * cores)
        sized = [
            k for k in (sizing.MAX_PARTITION_BYTES, sizing.SHUFFLE_PARTITIONS) if k not in kept
        ]
        if sized:
            defaults[sizing.SIZED] = ",".join(sized)
        # each run sizes its shuffle already (sizing) and every shuffle after the first is
        # small: re-planning after each stage only costs time (docs/health.md)
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
    """One row per input line: kind, group, address, window key, msgId (only where needed).

    Sizes the run's splits and shuffle to the files first (``sizing.apply``; local mode only).
    """
    return read_lines(spark, paths, window)[0]


def read_lines(spark: SparkSession, paths: list[str], window: str) -> tuple[DataFrame, int]:
    """``classify`` and the input's size in bytes (from the file listing; nothing is read)."""
    df = spark.read.option("recursiveFileLookup", "true").option("lineSep", "\n").text(paths)
    total = sizing.input_bytes(df)
    sizing.apply(spark, df, total)
    for stage in _pipeline(spark, window):
        df = df.select(*stage)
    return df, total


_PIPELINES: weakref.WeakKeyDictionary[Any, dict[str, list[list[Column]]]] = (
    weakref.WeakKeyDictionary()
)


def _pipeline(spark: SparkSession, window: str) -> list[list[Column]]:
    """``patterns.pipeline(window)``, built once per SparkContext.

    Why: building the stages takes ~1 400 py4j calls; a driver that runs the job again (a
    notebook, a scheduler, the benchmark's warm runs) reuses them. The Columns are unresolved
    expressions in the driver JVM, valid for any DataFrame of that JVM; a new SparkContext (a new
    JVM after ``startup.stop_jvm``) builds them again.
    """
    built = _PIPELINES.setdefault(spark.sparkContext, {})
    if window not in built:
        built[window] = P.pipeline(window)
    return built[window]


def broker_column(names: Mapping[str, str], file: str = "file") -> Column:
    """The broker of a line, from its file (``names``: file URI -> broker name).

    One broker is a literal (no lookup per line); several are a map from the few distinct files.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    distinct = set(names.values())
    if len(distinct) == 1:
        return F.lit(next(iter(distinct)))
    return F.create_map(*[F.lit(x) for kv in sorted(names.items()) for x in kv])[F.col(file)]


@dataclass
class JobResult:
    summary: dict[str, Any]
    series: dict[str, list[dict[str, Any]]]  # flagged group -> windows, for the dashboard
    seconds: float


def run(spark: SparkSession, cfg: JobConfig) -> JobResult:
    """Run the whole analysis in ``spark`` and write every output into ``cfg.out``."""
    t0 = time.perf_counter()
    paths = resolve(cfg.inputs)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        lines, input_bytes = read_lines(spark, paths, cfg.window)
        # the files are listed when the input is resolved, before any line is read: their
        # broker names go into the one pass (R.aggregate keys transactions by broker)
        names = brokers.names(lines.inputFiles(), paths, cfg.broker_regex)
    except HealthInputError:
        raise
    except Exception as exc:  # AnalysisException for unreadable/missing remote paths
        raise HealthInputError(f"cannot read {', '.join(cfg.inputs)}: {_first_line(exc)}") from exc
    if not names:
        raise _empty_input(cfg)
    agg = R.aggregate(lines, broker_column(names))
    result, series = _outputs(agg, paths, cfg, names, input_bytes)
    seconds = time.perf_counter() - t0
    result["seconds"] = round(seconds, 3)
    output.write_summary(cfg.out, result)
    if cfg.dashboard:
        from txmsg_health import dashboard  # noqa: PLC0415 - jinja2 (the spark extra) only for a dashboard

        dashboard.write(cfg.out, result, series)
    return JobResult(result, series, seconds)


def _parquet(cfg: JobConfig) -> str:
    return cfg.parquet_uri or os.path.join(os.path.abspath(cfg.out), "metrics_by_window.parquet")


def _outputs(
    agg: DataFrame,
    paths: list[str],
    cfg: JobConfig,
    names: Mapping[str, str] | None = None,
    input_bytes: int = 0,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Every output from the aggregate (``reduce.aggregate``): summary, Parquet table, series.

    One Spark job reduces the aggregate to its small result (``reduce.result``), which comes to
    the driver once as Arrow; pyarrow and plain Python derive the rest, on any master. ``names``:
    the broker of each file, where the caller knows them (else named from the line rows' files).
    An input over ``windows_spark.on_executors``'s limit keeps the window rows in Spark, which
    writes their table (the result is cached for the two jobs that read it).
    """
    spark = agg.sparkSession
    if windows_spark.on_executors(spark, input_bytes):
        from pyspark import StorageLevel  # noqa: PLC0415 - optional: the spark extra

        reduced = R.result(agg).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return _from_result(reduced, paths, cfg, names, on_executors=True)
        finally:
            reduced.unpersist()
    return _from_result(R.result(agg), paths, cfg, names, on_executors=False)


def _from_result(
    reduced: DataFrame,
    paths: list[str],
    cfg: JobConfig,
    names: Mapping[str, str] | None,
    *,
    on_executors: bool,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """``_outputs`` from ``reduce.result``: all of it collected, or (``on_executors``) all but
    the window rows, whose table Spark writes."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - optional: the spark extra

    timings: dict[str, float] = {}
    t = time.perf_counter()
    collected = reduced.filter(F.col("set") != R.WINDOWS) if on_executors else reduced
    tot, win, tx = A.split(collected.toArrow())
    timings["scan_and_totals"] = time.perf_counter() - t
    if tot.num_rows == 0:
        raise _empty_input(cfg)
    t = time.perf_counter()
    named = dict(names or {})
    missing = [f for f in A.files(tot, win) if f not in named]
    if missing:
        named.update(brokers.names(missing, paths, cfg.broker_regex))
    tot, win = A.with_broker(tot, named), A.with_broker(win, named)
    rows = A.transactions(tx, A.group_names(tot))
    totals, addr_rows = _totals(A.totals(tot, cfg.window), named)
    result = summary.build(
        totals,
        addr_rows,
        A.histogram(rows),
        window=cfg.window,
        tz=cfg.tz,
        thresholds=cfg.thresholds,
        after_end=A.after_end(rows),
        late=A.late(rows),
        late_again=A.late(rows, "late2"),
        half_messages=summary.half_messages(*A.half_progress(tot)),
    )
    rescues.annotate(result, rescues.read(cfg.rescue_metrics))
    timings["transactions"] = time.perf_counter() - t
    result["inputs"] = list(cfg.inputs)
    result["parquet"] = _parquet(cfg)
    t = time.perf_counter()
    os.makedirs(cfg.out, exist_ok=True)
    flagged = list(result["flagged"])
    if on_executors:
        table = windows_spark.table(
            reduced.filter(F.col("set") == R.WINDOWS), named, cfg.window, cfg.tz
        )
        windows_spark.write(table, _parquet(cfg))
        timings["windows"] = time.perf_counter() - t
        t = time.perf_counter()
        series = _series(windows_spark.rows_in(table, flagged))
    else:
        window_table = windows_out.write(
            reduced.sparkSession, A.windows(win, cfg.window, cfg.tz), _parquet(cfg)
        )
        timings["windows"] = time.perf_counter() - t
        t = time.perf_counter()
        series = _series(rows_in(window_table, flagged))
    timings["series"] = time.perf_counter() - t
    result["timings"] = {k: round(v, 3) for k, v in timings.items()}
    return result, series


def _empty_input(cfg: JobConfig) -> HealthInputError:
    return HealthInputError(
        f"the input is empty: {', '.join(cfg.inputs)} contain no lines; point at the broker's "
        "log directory (~/logs/rocketmqlogs) or its transaction.log / broker.log files"
    )


def _totals(
    rows: list[Any], names: Mapping[str, str]
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


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per flagged group, its windows summed over brokers, oldest first (the dashboard's chart)."""
    names = [name for name, _ in R.METRICS]
    per: dict[tuple[str, Any], dict[str, Any]] = {}
    for d in rows:
        cur = per.setdefault((d["group"], d["window_start"]), {**d, **{k: 0 for k in names}})
        for k in names:
            cur[k] += int(d[k])
    series: dict[str, list[dict[str, Any]]] = {}
    for (g, _), d in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        series.setdefault(g, []).append(d)
    return series


def spark_failure(exc: BaseException) -> str | None:
    """One line for a Spark failure a user fixes with a setting, or None for any other error.

    Why: a JVM out of memory ends in a page of Py4J traceback (the task's error, or a refused
    connection once the JVM has exited), which names neither the cause nor the fix.
    """
    text = f"{type(exc).__name__}: {exc}"
    # the Py4J gateway refused: the JVM behind it has exited
    gone = isinstance(exc, ConnectionRefusedError) or "Py4JNetworkError" in text
    if "OutOfMemoryError" in text or gone:
        what = (
            "the Spark JVM ran out of memory"
            if "OutOfMemoryError" in text
            else "the Spark JVM exited while the job ran (out of memory, most likely: see above)"
        )
        return (
            f"{what}. Give the driver more: --conf spark.driver.memory=4g (in local mode the "
            "driver also runs the tasks), or spark-submit --driver-memory 4g; on a cluster "
            "raise spark.executor.memory too"
        )
    if "maxResultSize" in text or "TaskResultLost" in text:
        # a result over the cap is dropped; which of the two messages comes first is a race
        return (
            "the results sent to the driver exceed spark.driver.maxResultSize (or were dropped "
            "for it): raise it with --conf spark.driver.maxResultSize=1g"
        )
    return None


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
