"""``txmsg demo``: the order sample end to end, with faults, on an embedded broker or your cluster.

What it does, in order:

1. with a name server given (``--name-server``, ``TXMSG_NAME_SERVER`` or ``name_server`` in
   ``txmsg.toml``) it runs against that cluster and creates its topic there the way ``txmsg topic
   create`` does, or, when the cluster refuses, prints the commands that create it and exits 1
   before sending anything; with none given it starts an embedded RocketMQ-compatible broker with
   short check timings (transaction timeout and check interval of about a second) in a temporary
   directory.  Its first line says which;
2. creates four SQLite databases (orders, points, logistics, cart) and N orders;
3. pays every order through ``OrderService.pay`` (a real transactional message through the real
   RocketMQ client), where a seeded fault plan makes some local transactions fail (-> ROLLBACK),
   some answer late (-> UNKNOW, then the broker's check-back reads the transaction record) and
   some consumers "crash" after committing (-> the broker redelivers; the idempotent consumer
   absorbs the duplicate);
4. waits until everything settles and checks all four databases against each other and against
   the plan; prints the table and CONSISTENT, or every mismatch and exits with code 1.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from txmsg_rocketmq.settings import RocketMQSettings, check_name_server

from txmsg import ConfigError
from txmsg.config import resolve_config
from txmsg_samples.order.cluster import ClusterNotReady
from txmsg_samples.order.faults import FaultPlan, Tally
from txmsg_samples.order.verify import CONSUMER_GROUPS, Outcome, progress, verify

BACKENDS = ("rocketmq", "rocketmq5")
"""The backends the demo runs on: ``rocketmq`` (librocketmq over remoting, via a name server)
and ``rocketmq5`` (the official 5.x client over gRPC, via proxy endpoints)."""

EMBEDDED_TIMEOUT = 120.0
CLUSTER_TIMEOUT = 300.0
"""A real cluster checks back every transactionCheckInterval (60 s by default), not every second."""


@dataclass(frozen=True)
class DemoOptions:
    orders: int = 200
    fail_rate: float = 0.1
    slow_rate: float = 0.1
    lose_ack_rate: float = 0.05
    seed: int = 0
    threads: int = 8
    timeout: float = 120.0
    workdir: Path | None = None
    keep: bool = False
    answer_within: float = 0.3
    transaction_timeout_ms: int = 1000
    check_interval_ms: int = 1000
    check_max: int = 30
    in_flight_timeout: float = 20.0
    """Below the broker's check horizon (timeout + check_max x interval = 31 s): a transaction
    still in flight after this is fenced and rolled back before the broker would discard it."""
    background_workers: int = 32
    backend: str = "rocketmq"
    """The services' txmsg backend, one of :data:`BACKENDS`."""
    backend_from: str = ""
    """Where ``backend`` came from (``--backend``, ``TXMSG_BACKEND``...), for the first line."""
    name_server: str | None = None
    """Run against this cluster (``host:port[;host:port]``); None: start an embedded broker.
    With ``rocketmq5`` it is only used to create the topic (the services use ``endpoints``)."""
    endpoints: str | None = None
    """``rocketmq5``: run against these 5.x proxy endpoints (``host:port[;host:port]``); None:
    start an embedded broker with its gRPC endpoint on."""
    endpoints_from: str = ""
    name_server_from: str = ""
    """Where ``name_server`` came from (``--name-server``, ``TXMSG_NAME_SERVER``...), for the
    first line of output."""
    run_id: str | None = None
    """Put in this run's order ids (default: random), so messages of other runs are skipped."""
    client_settings: dict[str, Any] = field(default_factory=dict)
    """Further txmsg settings from the user's configuration (``access_key``/``secret_key``,
    for rocketmq5 also ``namespace``/``tls``)."""
    metrics_port: int | None = None
    """Serve the services' OpenTelemetry metrics for Prometheus on this port while the demo runs
    (0: a free one; :mod:`txmsg_samples.order.metrics`); None: no endpoint."""


class DemoConfigError(click.ClickException):
    """The user's txmsg configuration is invalid (exit code 2, like a bad option)."""

    exit_code = 2


def _check_name_server(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_name_server(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _check_endpoints(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        from txmsg_rocketmq5.settings import check_endpoints  # noqa: PLC0415 - extra txmsg-samples[rocketmq5]

        return check_endpoints(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _origin(sources: Any, key: str) -> str | None:
    origin: str | None = sources.keys.get(key)
    if origin is not None and origin.startswith("file "):
        origin = f"{key} in {origin[len('file ') :]}"
    return origin


@dataclass(frozen=True)
class Backend5Target:
    """Which backend the demo uses and, for rocketmq5, which endpoints (None: embedded)."""

    backend: str
    backend_from: str
    endpoints: str | None
    endpoints_from: str
    settings: dict[str, Any]
    """``namespace``/``tls`` of the user's configuration (rocketmq5 only)."""


def backend_target(backend: str | None, endpoints: str | None) -> Backend5Target:
    """The backend (``--backend``, else ``TXMSG_BACKEND`` / ``backend`` in txmsg.toml, else
    rocketmq) and, for rocketmq5, the endpoints: ``--endpoints``, else ``TXMSG_ENDPOINTS`` /
    ``endpoints`` in txmsg.toml; only endpoints that are *set* count (the built-in default
    127.0.0.1:8081 does not).  ``--endpoints`` alone picks rocketmq5."""
    try:
        config, sources = resolve_config()
    except ConfigError as exc:
        raise DemoConfigError(
            f"{exc} (fix it, or unset it to run on the embedded broker)"
        ) from None
    if backend is not None:
        origin = "--backend"
    elif (configured := _origin(sources, "backend")) is not None:
        backend, origin = config.backend, configured
    elif endpoints is not None:
        backend, origin = "rocketmq5", "--endpoints"
    else:
        backend, origin = "rocketmq", ""
    if backend not in BACKENDS:
        raise DemoConfigError(
            f"the demo runs on backend rocketmq or rocketmq5, not {backend!r} (from {origin}); "
            "pass --backend rocketmq5 or --backend rocketmq"
        )
    if backend != "rocketmq5":
        if endpoints is not None:
            raise DemoConfigError(
                f"--endpoints is for backend rocketmq5 (a RocketMQ 5 proxy), but the backend is "
                f"rocketmq (from {origin}); add --backend rocketmq5, or use --name-server"
            )
        return Backend5Target(backend, origin, None, "", {})
    from txmsg_rocketmq5.settings import RocketMQ5Settings  # noqa: PLC0415 - extra txmsg-samples[rocketmq5]

    values = RocketMQ5Settings.of(config)
    settings: dict[str, Any] = {"tls": values.tls} if values.tls else {}
    if values.namespace:
        settings["namespace"] = values.namespace
    if endpoints is not None:
        return Backend5Target(backend, origin, endpoints, "--endpoints", settings)
    where = _origin(sources, "endpoints")
    if where is None:
        return Backend5Target(backend, origin, None, "", settings)
    return Backend5Target(backend, origin, values.endpoints, where, settings)


def target(name_server: str | None) -> tuple[str | None, str, dict[str, Any]]:
    """``(name server or None, where it came from, client settings)``: ``--name-server`` first,
    then the configuration (``TXMSG_NAME_SERVER``, ``txmsg.toml`` / ``$TXMSG_CONFIG``).  Only a
    name server that is *set* counts: the built-in default 127.0.0.1:9876 does not, so with
    nothing set the demo starts its own broker."""
    try:
        config, sources = resolve_config()
    except ConfigError as exc:
        raise DemoConfigError(
            f"{exc} (fix it, or unset it to run on the embedded broker)"
        ) from None
    values = RocketMQSettings.of(config)
    client = {
        k: v
        for k, v in (("access_key", values.access_key), ("secret_key", values.secret_key))
        if v is not None
    }
    if name_server is not None:
        return name_server, "--name-server", client
    origin = _origin(sources, "name_server")
    if origin is None:
        return None, "", client
    return values.name_server, origin, client


@click.command("demo")
@click.option(
    "--name-server",
    "name_server",
    default=None,
    callback=_check_name_server,
    metavar="HOST:PORT",
    help="run against this RocketMQ cluster (host:port[;host:port]) instead of an embedded broker; "
    "default: TXMSG_NAME_SERVER or name_server in txmsg.toml, else the embedded broker",
)
@click.option(
    "--backend",
    "backend",
    default=None,
    type=click.Choice(BACKENDS),
    help="the services' txmsg backend: rocketmq (librocketmq, name server) or rocketmq5 (the "
    "official 5.x client over gRPC, endpoints); default: TXMSG_BACKEND or backend in txmsg.toml, "
    "else rocketmq (rocketmq5 when only --endpoints is given)",
)
@click.option(
    "--endpoints",
    "endpoints",
    default=None,
    callback=_check_endpoints,
    metavar="HOST:PORT",
    help="rocketmq5: run against this RocketMQ 5 proxy (host:port[;host:port]) instead of an "
    "embedded broker; default: TXMSG_ENDPOINTS or endpoints in txmsg.toml, else the embedded "
    "broker's gRPC endpoint.  A proxy cannot create topics: add --name-server and the demo "
    "creates its topic, else it must exist (as TRANSACTION)",
)
@click.option("--orders", "orders", default=200, show_default=True, type=click.IntRange(1, 20_000))
@click.option(
    "--fail-rate",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="share of local transactions that fail (-> ROLLBACK)",
)
@click.option(
    "--slow-rate",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="share of local transactions that answer late (-> UNKNOW, then check-back)",
)
@click.option(
    "--lose-ack-rate",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="share of paid orders whose consumers crash after committing (-> redelivery)",
)
@click.option("--seed", type=int, default=None, help="random seed (default: random, printed)")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--timeout",
    default=None,
    type=click.FloatRange(5.0),
    help=f"seconds to wait for everything to settle (default {EMBEDDED_TIMEOUT:.0f}, "
    f"{CLUSTER_TIMEOUT:.0f} against a cluster)",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where the broker and databases live (default: a new temporary directory)",
)
@click.option("--keep", is_flag=True, help="keep the work directory afterwards")
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="serve the services' metrics for Prometheus at http://127.0.0.1:PORT/metrics while the "
    "demo runs (OpenTelemetry SDK + Prometheus exporter: pip install 'txmsg-samples[metrics]'; "
    "dashboard: docs/grafana/txmsg-dashboard.json)",
)
def demo(
    name_server: str | None,
    backend: str | None,
    endpoints: str | None,
    orders: int,
    fail_rate: float,
    slow_rate: float,
    lose_ack_rate: float,
    seed: int | None,
    threads: int,
    timeout: float | None,
    workdir: Path | None,
    keep: bool,
    metrics_port: int | None,
) -> None:
    """Run the order sample with injected faults and check consistency: on your cluster when a
    name server (rocketmq) or endpoints (rocketmq5) are set (--name-server / --endpoints,
    TXMSG_NAME_SERVER / TXMSG_ENDPOINTS, txmsg.toml), else on an embedded broker."""
    name_server, origin, client = target(name_server)
    chosen = backend_target(backend, endpoints)
    if chosen.backend == "rocketmq5" and name_server and chosen.endpoints is None:
        raise DemoConfigError(
            f"backend rocketmq5 against your cluster needs its proxy's gRPC endpoints (name server "
            f"{name_server} from {origin} is not enough): add --endpoints HOST:PORT "
            "(TXMSG_ENDPOINTS), or unset the name server to run on the embedded broker"
        )
    if chosen.backend == "rocketmq5" and chosen.endpoints is None:
        name_server, origin = None, ""  # the embedded broker's own name server
    client |= chosen.settings
    if timeout is None:
        timeout = CLUSTER_TIMEOUT if (name_server or chosen.endpoints) else EMBEDDED_TIMEOUT
    options = DemoOptions(
        orders=orders,
        fail_rate=fail_rate,
        slow_rate=slow_rate,
        lose_ack_rate=lose_ack_rate,
        seed=seed if seed is not None else random.SystemRandom().randrange(1, 1_000_000),
        threads=threads,
        timeout=timeout,
        workdir=workdir,
        keep=keep,
        backend=chosen.backend,
        backend_from=chosen.backend_from,
        name_server=name_server,
        name_server_from=origin,
        endpoints=chosen.endpoints,
        endpoints_from=chosen.endpoints_from,
        client_settings=client,
        metrics_port=metrics_port,
    )
    code = run(options, Console())
    raise SystemExit(code)


def run(options: DemoOptions, console: Console, broker: Any = None) -> int:
    """Run the demo; returns the exit code (0 = CONSISTENT).  ``broker``: use this running
    broker (tests pass the fixture's) instead of starting one."""
    endpoint = None
    if options.metrics_port is not None:
        from txmsg_samples.order.metrics import serve_metrics  # noqa: PLC0415 - optional packages

        endpoint = serve_metrics(options.metrics_port)  # before the services start: all counted
        console.print(f"metrics for Prometheus at {endpoint.url} while the demo runs")
    try:
        return _run(options, console, broker)
    finally:
        if endpoint is not None:
            endpoint.close()


def _run(options: DemoOptions, console: Console, broker: Any) -> int:
    from txmsg_samples.order.demo_run import DemoRun  # noqa: PLC0415 - imports the broker and the client lazily

    own_dir = options.workdir is None
    workdir = (
        Path(tempfile.mkdtemp(prefix="txmsg-demo-")) if options.workdir is None else options.workdir
    )
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", str(workdir / "rocketmq-client"))
    console.print(_where_line(options, broker), soft_wrap=True)
    console.print(
        f"[bold]txmsg demo[/]: {options.orders} orders, fail-rate {options.fail_rate}, "
        f"slow-rate {options.slow_rate}, lose-ack-rate {options.lose_ack_rate}, "
        f"seed {options.seed}  (work dir {workdir})"
    )
    log_handler = _log_to(workdir / "demo.log")
    started = time.monotonic()
    demo_run = DemoRun(options, workdir, broker)
    outcome: Outcome | None = None
    errors: list[str] = []
    not_ready: ClusterNotReady | None = None
    try:
        with console.status("starting the broker and the services..."):
            topics = demo_run.start()
        for line in topics:
            console.print(line, markup=False, soft_wrap=True)
        if demo_run.broker is not None:  # ours, or the caller's with the options' timings
            grpc = f", gRPC endpoint {demo_run.endpoints}" if demo_run.endpoints else ""
            console.print(
                f"broker up at {demo_run.name_server}{grpc}; transaction timeout "
                f"{options.transaction_timeout_ms} ms, check interval {options.check_interval_ms} ms"
            )
        else:
            console.print(
                f"services up against {demo_run.endpoints or demo_run.name_server}; the cluster's transactionTimeOut "
                "and transactionCheckInterval decide when check-backs come (RocketMQ's defaults: "
                f"6 s, 60 s); waiting up to {options.timeout:.0f} s to settle"
            )
        errors = _pay_all(demo_run, options, console)
        settled = _settle(demo_run, options, console)
        outcome = verify(demo_run.dbs, demo_run.order_ids, demo_run.plan, demo_run.tally)
        outcome.mismatches.extend(errors)
        if not settled:
            outcome.mismatches.append(
                f"did not settle within {options.timeout:.0f} s (see the counts above)"
            )
    except ClusterNotReady as exc:  # nothing sent: say what to do, no table
        not_ready = exc
    except Exception as exc:  # report it like a mismatch, with the logs kept for a look
        logging.getLogger("txmsg.demo").exception("demo failed")
        console.print(f"[bold red]demo failed[/]: {type(exc).__name__}: {exc}")
        outcome = None
    finally:
        with console.status("shutting down..."):
            try:
                demo_run.close()
            except Exception as exc:  # noqa: BLE001 - reported; the result still counts
                console.print(f"[red]shutdown problem[/]: {type(exc).__name__}: {exc}")
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()
    if not_ready is not None:
        console.print("[bold red]cannot run against this cluster yet[/]:")
        console.print(str(not_ready), markup=False, soft_wrap=True)
        if own_dir and not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return 1
    ok = outcome is not None and outcome.consistent
    _report(console, outcome, demo_run.plan, time.monotonic() - started)
    if own_dir and not options.keep and ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        console.print(f"work dir kept: {workdir} (logs: demo.log, broker/logs, rocketmq-client)")
    return 0 if ok else 1


def _where_line(options: DemoOptions, broker: Any) -> str:
    """The first line: which broker the demo runs on, and how to choose the other."""
    from txmsg_samples.order.demo_run import DEMO_NAMES as names  # noqa: PLC0415 - lazily, as run()

    backend = f"backend {options.backend}" + (
        f" (from {options.backend_from})" if options.backend_from else ""
    )
    if broker is not None:
        return f"txmsg demo on the broker at {broker.namesrv_addr} (given by the caller), {backend}"
    if options.backend == "rocketmq5":
        if options.endpoints:
            return (
                f"txmsg demo against your RocketMQ 5 proxy at {options.endpoints} "
                f"(from {options.endpoints_from or 'the options'}), {backend}: "
                f"topic {names.topic}, producer group {names.producer_group}, consumer groups "
                + ", ".join(names.consumer_group(g) for g in CONSUMER_GROUPS)
            )
        return (
            f"txmsg demo on its own embedded broker over its gRPC endpoint, {backend} (no "
            "endpoints set; --endpoints HOST:PORT, TXMSG_ENDPOINTS or endpoints in txmsg.toml "
            "runs it against your RocketMQ 5 proxy)"
        )
    if options.name_server:
        return (
            f"txmsg demo against your cluster at {options.name_server} "
            f"(from {options.name_server_from or 'the options'}): topic {names.topic}, "
            f"producer group {names.producer_group}, consumer groups "
            + ", ".join(names.consumer_group(g) for g in CONSUMER_GROUPS)
        )
    return (
        "txmsg demo on its own embedded broker (no name server set; --name-server HOST:PORT, "
        "TXMSG_NAME_SERVER or name_server in txmsg.toml runs it against your cluster)"
    )


def _log_to(path: Path) -> logging.Handler:
    """Send the run's logs (expected WARNINGs for injected faults included) to a file, not the
    terminal, where the progress display lives."""
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return handler


def _pay_all(demo_run: Any, options: DemoOptions, console: Console) -> list[str]:
    """Pay every order from ``threads`` threads, with a progress bar."""
    errors: list[str] = []
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
    )
    counts = {"COMMIT": 0, "ROLLBACK": 0, "UNKNOW": 0}
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("paying orders", total=len(demo_run.order_ids), detail="")
        with ThreadPoolExecutor(options.threads, thread_name_prefix="demo-pay") as pool:
            futures: dict[Future[Any], str] = {
                pool.submit(demo_run.pay, oid): oid for oid in demo_run.order_ids
            }
            for future in as_completed(futures):
                oid = futures[future]
                try:
                    state = future.result()
                    name = getattr(state, "name", str(state))
                    counts[name] = counts.get(name, 0) + 1
                except Exception as exc:  # noqa: BLE001 - every failed payment is a finding
                    errors.append(f"order {oid}: pay() raised {type(exc).__name__}: {exc}")
                detail = "  ".join(f"{k} {v}" for k, v in counts.items())
                if errors:
                    detail += f"  errors {len(errors)}"
                bar.update(task, advance=1, detail=detail)
    return errors


def _settle(demo_run: Any, options: DemoOptions, console: Console) -> bool:
    """Wait until nothing is in flight, every consumer caught up and every lost ack was
    redelivered, and it stays so for a moment."""
    deadline = time.monotonic() + options.timeout
    quiet_since: float | None = None
    with console.status("settling...") as status:
        while time.monotonic() < deadline:
            now = progress(demo_run.dbs, demo_run.tally)
            status.update(_settle_line(now))
            if now.settled:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 1.5:
                    console.print(f"settled: {_settle_line(now)}")
                    return True
            else:
                quiet_since = None
            time.sleep(0.25)
    console.print(f"[red]not settled[/]: {_settle_line(progress(demo_run.dbs, demo_run.tally))}")
    return False


def _settle_line(o: Outcome) -> str:
    applied = "  ".join(
        f"{g.split('-')[0]} {o.applied.get(g, 0)}/{o.paid}" for g in CONSUMER_GROUPS
    )
    dups = sum(o.duplicates.values())
    lost = sum(o.lost_acks.values())
    foreign = f"  skipped {o.foreign} of other runs" if o.foreign else ""
    return (
        f"in flight {o.in_flight}  check-backs resolved {o.resolved_by_check}/{o.answered_unknow}"
        f"  {applied}  duplicates absorbed {dups} (lost acks {lost}){foreign}"
    )


def _report(console: Console, o: Outcome | None, plan: FaultPlan | None, seconds: float) -> None:
    if o is None:
        console.print("[bold red]the demo did not get far enough to check anything[/]")
        return
    table = Table(title=f"txmsg demo: {o.orders} orders in {seconds:.1f} s", show_lines=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("expected", justify="right")
    slow = len(plan.slow) if plan else 0
    table.add_row("orders paid (COMMIT)", str(o.paid), str(o.expected_paid))
    table.add_row("orders rolled back", str(o.rolled_back), str(o.expected_rolled_back))
    if o.timed_out:
        table.add_row("  of which in-flight timeout", str(o.timed_out), "-")
    # the slow ones, plus any that queued long enough behind them to miss answer_within
    table.add_row("answered UNKNOW at first", str(o.answered_unknow), f">= {slow}")
    table.add_row("resolved by check-back", str(o.resolved_by_check), str(o.answered_unknow))
    table.add_row("points entries", str(o.points_entries), str(o.paid))
    table.add_row("logistics shipments", str(o.shipments), str(o.paid))
    table.add_row("cart checkouts", str(o.cart_checkouts), str(o.paid))
    dups = sum(o.duplicates.values())
    lost = sum(o.lost_acks.values())
    table.add_row("duplicates absorbed", str(dups), f">= {lost}")
    if o.foreign:
        table.add_row("messages of other runs skipped", str(o.foreign), "-")
    console.print(table)
    if o.consistent:
        console.print("[bold green]CONSISTENT[/]")
        return
    console.print(f"[bold red]INCONSISTENT[/]: {len(o.mismatches)} mismatches")
    for line in o.mismatches[:200]:
        console.print(f"  - {line}")
    if len(o.mismatches) > 200:
        console.print(f"  ... and {len(o.mismatches) - 200} more")


__all__ = ["DemoOptions", "Tally", "demo", "run"]
