"""Keep a local-mode Spark driver on 127.0.0.1 unless the user chose an address.

Why: on a host whose name resolves to a loopback address, Spark warns "hostname resolves to a
loopback address ...; using <another address> instead" and binds the driver (block manager, RPC
and file server ports) to the first non-loopback interface. A local-mode job needs nobody else to
reach it, so exposing those ports on the network is both noisy and wrong. txmsg keeps every
process it starts on loopback by default; this module does the same for the health job.

How: Spark derives ``spark.driver.host`` (and from it ``spark.driver.bindAddress``) from
``SPARK_LOCAL_HOSTNAME`` / ``SPARK_LOCAL_IP``, and reads them once, when the JVM starts, which is
also when the warning is printed. So when this process is about to launch the JVM we set both to
127.0.0.1 in the environment for the duration of the launch only; Spark's own
precedence then still lets ``spark-defaults.conf`` and ``--conf spark.driver.host=...`` win. When
the JVM already runs (``spark-submit``, or a session made earlier) the variable can no longer
help, so we set the two driver keys explicitly, unless the JVM's configuration already has them.

The user's choice always wins: ``SPARK_LOCAL_IP`` / ``SPARK_LOCAL_HOSTNAME`` in the environment, or
``spark.driver.host`` / ``spark.driver.bindAddress`` given with ``--conf`` or in
``spark-defaults.conf``, turn all of this off. Non-local masters are left alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

LOOPBACK = "127.0.0.1"
DRIVER_KEYS = ("spark.driver.host", "spark.driver.bindAddress")
ENV_KEYS = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")


def is_local(master: str | None) -> bool:
    """``local``, ``local[4]``, ``local[*]``, ``local-cluster[...]``: everything runs on this host."""
    return bool(master) and str(master).strip().startswith("local")


def user_chose_address(conf: Mapping[str, str], environ: Mapping[str, str]) -> bool:
    """True when the user configured the driver's address in any way Spark honours."""
    return any(k in conf for k in DRIVER_KEYS) or any(environ.get(k) for k in ENV_KEYS)


def driver_conf(
    master: str | None, conf: Mapping[str, str], environ: Mapping[str, str]
) -> dict[str, str]:
    """The driver keys to add to ``conf`` so a local driver binds to loopback (may be empty).

    ``conf`` must hold everything the user configured: the job's ``--conf`` values and, when the
    JVM already runs, its own configuration (spark-submit's ``--conf`` and spark-defaults.conf).
    """
    if not is_local(master) or user_chose_address(conf, environ):
        return {}
    return {k: LOOPBACK for k in DRIVER_KEYS}


@contextlib.contextmanager
def launch_env(master: str | None, conf: Mapping[str, str]) -> Iterator[None]:
    """Around the JVM launch: ``SPARK_LOCAL_IP`` and ``SPARK_LOCAL_HOSTNAME`` = 127.0.0.1, then restored.

    ``SPARK_LOCAL_IP`` alone stops the warning but Spark then names the driver by the reverse
    lookup of 127.0.0.1 ("localhost", which may resolve to ::1); ``SPARK_LOCAL_HOSTNAME`` makes
    ``spark.driver.host`` (and so ``spark.driver.bindAddress``) exactly 127.0.0.1. Restoring matters: the variable must not leak into subprocesses this process starts later.
    """
    if not is_local(master) or user_chose_address(conf, os.environ):
        yield
        return
    old = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ.update(dict.fromkeys(ENV_KEYS, LOOPBACK))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def jvm_running() -> bool:
    """Whether a Spark JVM already exists for this process (spark-submit, or an earlier session)."""
    from pyspark import SparkContext  # noqa: PLC0415 - optional: the spark extra

    return SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ


def running_jvm_conf() -> tuple[str | None, dict[str, str]]:
    """The running JVM's master and driver-address keys (from spark-submit / spark-defaults.conf)."""
    from pyspark import SparkConf, SparkContext  # noqa: PLC0415 - optional: the spark extra

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM; launches nothing new
    jconf = SparkConf()  # loads the JVM's system properties
    found = {k: v for k in DRIVER_KEYS if (v := jconf.get(k)) is not None}
    return jconf.get("spark.master"), found


def session_conf(master: str | None, conf: Mapping[str, str]) -> dict[str, str]:
    """Driver keys for the session builder; empty when :func:`launch_env` will do the job.

    Only when the JVM already runs without a SparkContext (``spark-submit``) are explicit keys
    needed; with an active SparkContext the driver is bound already and nothing can change it.
    """
    if not jvm_running():
        return {}
    from pyspark import SparkContext  # noqa: PLC0415 - optional: the spark extra

    if SparkContext._active_spark_context is not None:
        return {}
    jvm_master, jvm_keys = running_jvm_conf()
    return driver_conf(master or jvm_master, {**jvm_keys, **conf}, os.environ)
