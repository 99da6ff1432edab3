"""The health job's one command line: ``txmsg health``, ``python -m txmsg_health.job`` and
``spark-submit spark/txmsg_health/job.py`` all run the click command ``health`` (``job.main`` for
the last two), so every entry point has the same options and the same defaults."""

from __future__ import annotations

import contextlib

import click

from txmsg_health import arrow_outputs, brokers, job, rescues, startup
from txmsg_health import follow as live
from txmsg_health.inputs import HealthInputError, parse_tz, resolve
from txmsg_health.rules import Thresholds

_D = Thresholds()

KEEP_SESSION = "txmsg_health: keep the session"
"""``ctx.obj`` of a caller that stops the session itself (``job.main``): no ``startup.finish``."""


@click.command("health")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory: summary.json, metrics_by_window.parquet, dashboard.html.",
)
@click.option(
    "--master",
    default=None,
    show_default=f"{job.DEFAULT_MASTER}, or spark-submit's --master under spark-submit",
    help="Spark master URL, e.g. local[2], or spark://host:7077 for a standalone cluster.",
)
@click.option(
    "--tz",
    default="+08:00",
    show_default=True,
    help="Zone of the broker's timestamps (RocketMQ logs in UTC+8 whatever the host).",
)
@click.option(
    "--window", type=click.Choice(["minute", "hour"]), default="minute", show_default=True
)
@click.option(
    "--max-unknown-share",
    type=float,
    default=_D.max_unknown_share,
    show_default=True,
    help="Flag when UNKNOW answers exceed this share of first-phase answers (needs DEBUG commits).",
)
@click.option(
    "--min-transactions",
    type=int,
    default=_D.min_transactions,
    show_default=True,
    help="Judge the share only from this many first-phase answers on.",
)
@click.option(
    "--max-unknown-per-minute",
    type=float,
    default=_D.max_unknown_per_minute,
    show_default=True,
    help="Flag above this UNKNOW rate when COMMITs are not logged.",
)
@click.option("--max-discards", type=int, default=_D.max_discards, show_default=True)
@click.option(
    "--max-checks-per-transaction",
    type=float,
    default=_D.max_checks_per_transaction,
    show_default=True,
)
@click.option(
    "--max-undelivered-checks",
    "--max-no-channel",
    "max_undelivered_checks",
    type=int,
    default=_D.max_undelivered_checks,
    show_default=True,
    help="Flag a group above this many check-backs that never reached a producer "
    "(no channel / send failed); negative turns the rule off.",
)
@click.option(
    "--max-ended-checked",
    type=int,
    default=_D.max_ended_checked,
    show_default=True,
    help="Report a broker finding above this many transactions the broker checked back after "
    "they had ended (transactionTimeOut < transactionOpBatchInterval); negative turns it off.",
)
@click.option(
    "--max-ended-checked-share",
    type=float,
    default=_D.max_ended_checked_share,
    show_default=True,
    help="...and above this share of the transactions the broker checked back.",
)
@click.option(
    "--parquet-uri", default=None, help="Write the Parquet table to this URI instead of --out."
)
@click.option(
    "--broker-regex",
    default=None,
    help="Name each file's broker by this regex's group 1 in its path "
    "(default: the directory per broker, e.g. logs/broker-a/transaction.log -> broker-a).",
)
@click.option(
    "--rescue-metrics",
    multiple=True,
    metavar="FILE|URL",
    help="A txmsg service's metrics (a saved Prometheus scrape or its /metrics URL; repeat for "
    "several instances): the discard finding then says what txmsg's rescuer did with them.",
)
@click.option("--no-dashboard", is_flag=True)
@click.option(
    "--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Extra Spark configuration."
)
@click.option(
    "--follow",
    is_flag=True,
    help="Live mode: keep reading new lines and rotated files of the PATH directories; "
    "outputs are replaced after every trigger; Ctrl-C / SIGTERM stops cleanly.",
)
@click.option(
    "--trigger", default="30s", show_default=True, help="With --follow: how often to update."
)
@click.option(
    "--checkpoint",
    default=None,
    help="With --follow: checkpoint directory (default OUT/_checkpoint); keep it to resume.",
)
def health(
    paths: tuple[str, ...],
    out: str,
    master: str | None,
    tz: str,
    window: str,
    max_unknown_share: float,
    min_transactions: int,
    max_unknown_per_minute: float,
    max_discards: int,
    max_checks_per_transaction: float,
    max_undelivered_checks: int,
    max_ended_checked: int,
    max_ended_checked_share: float,
    parquet_uri: str | None,
    broker_regex: str | None,
    rescue_metrics: tuple[str, ...],
    no_dashboard: bool,
    confs: tuple[str, ...],
    follow: bool,
    trigger: str,
    checkpoint: str | None,
) -> None:
    """Score producer groups from RocketMQ broker logs and flag UNKNOW-heavy ones.

    PATH may be files (transaction.log, broker.log, rotated .gz), a broker's log directory, a
    glob, or any Spark-readable URI (hdfs://, s3a://). The same job runs on a cluster with
    `spark-submit [--master URL] spark/txmsg_health/job.py PATH... --out DIR` (same options).
    With --follow it keeps running on Spark Structured Streaming over the log directories
    (docs/health.md, live mode).
    """
    try:
        cfg = job.JobConfig(
            inputs=list(paths),
            out=out,
            tz=parse_tz(tz),
            window=window,
            thresholds=Thresholds(
                max_unknown_share=max_unknown_share,
                min_transactions=min_transactions,
                max_unknown_per_minute=max_unknown_per_minute,
                max_discards=max_discards,
                max_checks_per_transaction=max_checks_per_transaction,
                max_undelivered_checks=None
                if max_undelivered_checks < 0
                else max_undelivered_checks,
                max_ended_checked=None if max_ended_checked < 0 else max_ended_checked,
                max_ended_checked_share=max_ended_checked_share,
            ),
            dashboard=not no_dashboard,
            parquet_uri=parquet_uri,
            broker_regex=broker_regex,
            rescue_metrics=list(rescue_metrics),
        )
        resolve(cfg.inputs)
        rescues.read(cfg.rescue_metrics)  # unreadable: said before Spark starts
        brokers.names([], [], broker_regex)
        bad = [c for c in confs if "=" not in c]
        if bad:
            raise HealthInputError(f"--conf {bad[0]!r}: use KEY=VALUE")
        seconds = live.parse_trigger(trigger)
        spark = job.build_session(
            master, dict(c.split("=", 1) for c in confs), fast_start=not follow
        )
        if follow:
            live.follow(spark, live.FollowConfig(cfg, seconds, checkpoint))
            return
        arrow_outputs.prefer_jemalloc()  # this process runs the job once
        result = job.run(spark, cfg)
    except HealthInputError as exc:
        _finish_after_failure()
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:
        failure = job.spark_failure(exc)
        if failure is None:
            raise
        _finish_after_failure()
        raise click.ClickException(failure) from None
    click.echo(job.report_line(result, out))
    if click.get_current_context().obj != KEEP_SESSION:
        startup.finish(spark)


def _finish_after_failure() -> None:
    """A first run that ends in a clear error still puts the JVM's class archive in place
    (``startup.finish``): left as a temporary file, the runs of the next minute would start
    without it. Best effort: the error being reported matters more."""
    if click.get_current_context().obj == KEEP_SESSION:
        return
    with contextlib.suppress(Exception):
        startup.finish()
