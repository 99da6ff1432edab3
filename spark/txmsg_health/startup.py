"""A faster local JVM start: a class-data-sharing (AppCDS) archive of the classes Spark loads.

Why: a fresh ``txmsg health`` process spends most of its fixed cost loading and verifying the
~20 000 classes of Spark, Hadoop and Scala out of ~250 jars (measured on the 2-core machine: a
50 000-line run took 19 s as a process, 11.5-13.5 s with this archive). HotSpot (JDK 13+) can
dump the classes a run loaded into an archive at exit (``-XX:ArchiveClassesAtExit``) and map it
at the next start (``-XX:SharedArchiveFile``): the classes are then already parsed and verified.

How: only for the command-line runs (``txmsg health``, ``python -m txmsg_health.job``) that
launch the driver JVM in local mode, and only when the user gave no
``spark.driver.extraJavaOptions`` of their own. The first run asks the JVM to write the archive
into a file of its own (``<archive>.<pid>.tmp``: concurrent first runs never write the same file);
after its job that run stops the JVM, waits for it to exit (the archive is written then, ~10 s
once) and renames the file into place. A temporary archive left by a run that was killed is
adopted by a later run once nobody has written to it for a minute. The archive is keyed by the
pyspark version and the Java home, since it matches one class path and one JVM; a stale or
broken archive is refused by the JVM itself, which then starts without it (``-Xshare:auto``, the
default), with its CDS warnings switched off. ``TXMSG_SPARK_CDS=off`` turns this off,
``TXMSG_SPARK_CDS=DIR`` keeps the archive in DIR (default ``$XDG_CACHE_HOME/txmsg`` or
``~/.cache/txmsg``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import time
from collections.abc import Mapping

ENV = "TXMSG_SPARK_CDS"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
SETTLED_SECONDS = 60.0

pending: tuple[str, str] | None = None
"""(temporary, final) archive this process's JVM writes at exit; see ``finish``."""


def cache_dir(environ: Mapping[str, str]) -> str | None:
    choice = environ.get(ENV, "").strip()
    if choice.lower() in ("off", "0", "false", "no"):
        return None
    if choice:
        return choice
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "txmsg")


def archive_path(directory: str, environ: Mapping[str, str]) -> str:
    import pyspark  # noqa: PLC0415 - optional: the spark extra

    key = (
        f"{pyspark.__version__}|{environ.get('JAVA_HOME', '')}|{os.path.realpath(pyspark.__file__)}"
    )
    return os.path.join(directory, f"spark-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa")


def java_options(environ: Mapping[str, str] | None = None, now: float | None = None) -> str:
    """JVM options that map the archive, or write it at exit when there is none yet ('' = off)."""
    env = os.environ if environ is None else environ
    directory = cache_dir(env)
    if directory is None:
        return ""
    try:
        os.makedirs(directory, exist_ok=True)
        path = archive_path(directory, env)
        if not os.path.isfile(path):
            _adopt_settled(path, time.time() if now is None else now)
        if os.path.isfile(path):
            return f"-XX:SharedArchiveFile={path} {QUIET}"
        if glob.glob(glob.escape(path) + ".*.tmp"):
            return ""  # another run is writing it right now
        global pending  # one driver JVM per process
        pending = (f"{path}.{os.getpid()}.tmp", path)
        return f"-XX:ArchiveClassesAtExit={pending[0]} {QUIET}"
    except (OSError, ImportError):
        return ""  # an unwritable cache: start as usual


def _adopt_settled(path: str, now: float) -> None:
    """Rename the newest settled temporary archive to ``path``; drop other settled ones."""
    settled = []
    for tmp in glob.glob(glob.escape(path) + ".*.tmp"):
        with contextlib.suppress(OSError):
            st = os.stat(tmp)
            if now - st.st_mtime >= SETTLED_SECONDS:
                settled.append((st.st_mtime, tmp))
    settled.sort()
    for i, (_, tmp) in enumerate(settled):
        with contextlib.suppress(OSError):
            if i == len(settled) - 1 and os.path.getsize(tmp) > 0:
                os.replace(tmp, path)
            else:
                os.remove(tmp)


def finish(spark: object | None = None, timeout: float = 180.0) -> None:
    """After the job: if this process's JVM writes the archive, stop it and put the archive in place.

    Stopping the session and closing the gateway makes the JVM exit, which is when it writes the
    archive; a run that writes none returns at once and leaves the JVM to exit with the process.
    """
    global pending  # one driver JVM per process
    if pending is None:
        return
    tmp, path = pending
    pending = None
    if spark is None:
        from pyspark.sql import SparkSession  # noqa: PLC0415 - optional: the spark extra

        spark = SparkSession.getActiveSession()
        if spark is None:
            return
    stop_jvm(spark, timeout)
    with contextlib.suppress(OSError):
        if os.path.getsize(tmp) > 0 and not os.path.exists(path):
            os.replace(tmp, path)


def stop_jvm(spark: object, timeout: float = 180.0) -> None:
    """Stop the session and wait for the JVM this process launched to exit.

    A later session in this process then launches a fresh JVM instead of talking to the gone
    one. Also used by the benchmark: an idle JVM left running slowed the processes timed after
    it by ~2 s (docs/health.md, round 5).
    """
    from pyspark import SparkContext  # noqa: PLC0415 - optional: the spark extra

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()  # type: ignore[attr-defined]
    if gateway is None or proc is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()
    with contextlib.suppress(Exception):
        proc.stdin.close()  # the gateway server exits when its stdin closes
        proc.wait(timeout=timeout)
    SparkContext._gateway = None
    SparkContext._jvm = None
