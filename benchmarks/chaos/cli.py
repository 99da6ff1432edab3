"""``txmsg chaos`` / ``python -m benchmarks.chaos``: run the monkey, print the table, exit 1 on
any violation."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from benchmarks.chaos import tracking
from benchmarks.chaos.faults import FAULT_CHOICES
from benchmarks.chaos.run import (
    BACKENDS,
    ChaosResult,
    ChaosRun,
    RunOptions,
    backend_problem,
    external_problem,
)
from benchmarks.chaos.settings import STREAMS, ChaosSettings

MODES = {
    # strikes, interval between strikes (s), restart pause (s), producers, consumers per service
    "short": (20, (2.0, 5.0), (0.5, 2.0), 2, 2),
    "long": (100, (3.0, 8.0), (0.5, 3.0), 3, 2),
}


NETWORK_STRIKES = {"short": 8, "long": 24}
"""Network strikes per mode (each of the four faults at least once)."""


def parse_faults(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(k.strip() for k in value.split(",") if k.strip()))
    bad = [k for k in kinds if k not in FAULT_CHOICES]
    if bad or not kinds:
        raise click.BadParameter(
            f"{', '.join(bad) or 'nothing'}: use kill, network or kill,network"
        )
    return kinds


def parse_streams(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    streams = tuple(dict.fromkeys(k.strip() for k in value.split(",") if k.strip()))
    bad = [k for k in streams if k not in STREAMS]
    if bad or not streams:
        raise click.BadParameter(
            f"{', '.join(bad) or 'nothing'}: use orders, outbox or orders,outbox"
        )
    return streams


def _pair(value: str) -> tuple[float, float]:
    low, _, high = value.partition(",")
    return float(low), float(high or low)


@click.command("chaos")
@click.option(
    "--mode",
    type=click.Choice(sorted(MODES)),
    default="short",
    show_default=True,
    help="short: 20 strikes, 11 processes (the test suite's run); long: 100 strikes, 12.",
)
@click.option("--strikes", type=click.IntRange(1), help="override the mode's number of strikes")
@click.option("--producers", type=click.IntRange(1), help="order-service processes")
@click.option("--consumers", type=click.IntRange(1), help="processes per downstream service")
@click.option("--interval", help="seconds between strikes, LOW,HIGH")
@click.option("--pause", help="seconds before a killed process restarts, LOW,HIGH")
@click.option("--fail-rate", default=0.1, show_default=True, type=click.FloatRange(0, 1))
@click.option("--slow-rate", default=0.1, show_default=True, type=click.FloatRange(0, 1))
@click.option(
    "--stuck-every",
    default=20,
    show_default=True,
    type=click.IntRange(0),
    help="every N-th order of a paying thread runs its local transaction longer than the broker's "
    "check horizon (discarded, then committed: only the rescuer delivers it); 0 = none",
)
@click.option(
    "--database-url",
    envvar="TXMSG_CHAOS_DATABASE_URL",
    help="PostgreSQL URL (one schema per service); default: SQLite files in the workdir",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    help="where databases, broker data and logs go (default: a new temp dir)",
)
@click.option(
    "--brokers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 26),
    help="broker processes (broker-a, broker-b, ... behind one name server); each is killed on its own",
)
@click.option(
    "--faults",
    "fault_kinds",
    default="kill",
    show_default=True,
    callback=parse_faults,
    help="kill (kill -9 strikes), network (fault-proxy strikes: latency, reset, half-open, "
    "partition - see benchmarks/chaos/faults.py), or kill,network (both at once)",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="rocketmq",
    show_default=True,
    help="the services' txmsg backend: rocketmq (librocketmq over remoting) or rocketmq5 (the "
    "5.x client over gRPC; the broker also serves gRPC on a port kept across restarts; "
    "one broker, kill faults)",
)
@click.option(
    "--name-server",
    default=None,
    metavar="HOST:PORT",
    help="run against this external cluster (e.g. a real RocketMQ) instead of brokers of its own: "
    "no broker is started or killed, strikes hit the services only; --faults kill only",
)
@click.option(
    "--endpoints",
    default=None,
    metavar="HOST:PORT",
    help="with --name-server and --backend rocketmq5: the external cluster's 5.x proxy",
)
@click.option(
    "--streams",
    default="orders",
    show_default=True,
    callback=parse_streams,
    help="orders (the order sample: half messages, its ordered events), outbox (transfers "
    "through the transactional outbox: writers, in-process and `txmsg outbox relay` relays, "
    "orderly idempotent consumers; benchmarks/chaos/outbox_stream.py), or orders,outbox",
)
@click.option(
    "--writers",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="outbox writer processes",
)
@click.option(
    "--relays",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="`txmsg outbox relay` processes (besides writer 0's in-process relay)",
)
@click.option(
    "--warmup",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="seconds before the first strike",
)
@click.option(
    "--network-strikes",
    type=click.IntRange(4),
    help="override the mode's number of network strikes (at least 4: each fault once)",
)
@click.option(
    "--check-max",
    type=click.IntRange(1),
    help="the embedded broker's transactionCheckMax: check-backs before it discards a half "
    "message (default 3: a horizon of about 5 s, as 15 x 60 s is in production; 120 keeps every "
    "strike inside the horizon); not with --name-server, whose brokers keep their own",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--settle-timeout", default=240.0, show_default=True, type=float)
@click.option("-v", "--verbose", is_flag=True, help="log every strike and settle poll")
def chaos_command(
    mode: str,
    strikes: int | None,
    producers: int | None,
    consumers: int | None,
    interval: str | None,
    pause: str | None,
    fail_rate: float,
    slow_rate: float,
    stuck_every: int,
    database_url: str | None,
    workdir: Path | None,
    brokers: int,
    fault_kinds: tuple[str, ...],
    backend: str,
    name_server: str | None,
    endpoints: str | None,
    streams: tuple[str, ...],
    writers: int,
    relays: int,
    warmup: float,
    network_strikes: int | None,
    check_max: int | None,
    seed: int,
    settle_timeout: float,
    verbose: bool,
) -> None:
    """Kill -9 random subsets of broker, producer and consumer processes while orders are paid,
    then prove from the databases that every committed order was processed exactly once."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    problem = backend_problem(backend, brokers, fault_kinds) or external_problem(
        backend, name_server, endpoints, fault_kinds
    )
    if problem:
        raise click.UsageError(problem)
    if check_max is not None and name_server is not None:
        raise click.UsageError(
            "--check-max sets the embedded broker's transactionCheckMax; the brokers of "
            "--name-server keep their own (set transactionCheckMax in their broker.conf)"
        )
    m_strikes, m_interval, m_pause, m_producers, m_consumers = MODES[mode]
    workdir = workdir or Path(tempfile.mkdtemp(prefix="txmsg-chaos-"))
    os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", str(workdir / "rocketmq-client"))
    settings = ChaosSettings(
        workdir=workdir.resolve(),
        producers=producers or m_producers,
        consumers_per_service=consumers or m_consumers,
        fail_rate=fail_rate,
        slow_rate=slow_rate,
        stuck_every=stuck_every,
        seed=seed,
        streams=streams,
        outbox_writers=writers,
        outbox_relays=relays,
    )
    options = RunOptions(
        strikes=strikes or m_strikes,
        interval=_pair(interval) if interval else m_interval,
        pause=_pair(pause) if pause else m_pause,
        settle_timeout=settle_timeout,
        database_url=database_url,
        brokers=brokers,
        faults=fault_kinds,
        network_strikes=network_strikes or NETWORK_STRIKES[mode],
        backend=backend,
        warmup=warmup,
        name_server=name_server,
        endpoints=endpoints,
        **({"check_max": check_max} if check_max is not None else {}),
    )
    console = Console()
    console.print(
        f"chaos run ({mode}, backend {backend}, faults {','.join(fault_kinds)}, streams "
        f"{','.join(streams)}) in {workdir}: "
        + (f"{options.strikes} kill strikes, " if "kill" in fault_kinds else "")
        + (f"{options.network_strikes} network strikes, " if "network" in fault_kinds else "")
        + (
            f"external cluster {name_server} (no broker kills), "
            if name_server
            else f"{options.brokers} broker(s) with transactionCheckMax={options.check_max}, "
        )
        + (f"{settings.producers} producers, " if "orders" in streams else "")
        + (f"{writers} outbox writers, {relays} relay processes, " if "outbox" in streams else "")
        + f"{settings.consumers_per_service} consumers "
        f"per service, database {'PostgreSQL' if database_url else 'SQLite'}"
    )
    result = ChaosRun(settings, options).run()
    if "orders" in streams:
        console.print(table(result))
    if result.outbox is not None:
        console.print(outbox_table(result))
    if result.network:
        if "orders" in streams:  # its figures are the payments'
            console.print(network_table(result))
        for line in network_lines(result):
            print(line)
    violations = result.violations
    for line in violations[:50]:
        console.print(f"[red]VIOLATION[/] {line}")
    if len(violations) > 50:
        console.print(f"[red]... and {len(violations) - 50} more[/]")
    print(result_line(result))
    if result.outbox is not None:
        print(outbox_result_line(result))
    if violations:
        raise SystemExit(1)


def network_table(result: ChaosResult) -> Table:
    """Per network fault: what it did to payment latency, outcomes and duplicate deliveries."""
    out = Table(title="network faults (payments started while the fault was on, until the next)")
    for column in (
        "fault",
        "strikes",
        "s",
        "payments",
        "p50 ms",
        "p95 ms",
        "max ms",
        "ERROR",
        "UNKNOW",
        "duplicates absorbed",
    ):
        out.add_column(column, justify="left" if column == "fault" else "right")
    for fig in result.network:
        out.add_row(
            fig.kind,
            str(fig.strikes),
            f"{fig.seconds:.0f}",
            str(fig.payments),
            f"{fig.median * 1000:.0f}",
            f"{fig.percentile(0.95) * 1000:.0f}",
            f"{max(fig.latencies, default=0) * 1000:.0f}",
            str(fig.errors),
            str(fig.unknown),
            str(fig.duplicates),
        )
    return out


def network_lines(result: ChaosResult) -> list[str]:
    return [
        f"RESULT chaos-fault {fig.kind} strikes={fig.strikes} payments={fig.payments} "
        f"p50_ms={fig.median * 1000:.0f} p95_ms={fig.percentile(0.95) * 1000:.0f} "
        f"errors={fig.errors} unknown={fig.unknown} duplicates={fig.duplicates}"
        for fig in result.network
    ]


def _sizes(found: set[int]) -> str:
    sizes = sorted(found)
    return f"{sizes[0]}..{sizes[-1]} ({len(sizes)} distinct)" if sizes else "-"


def outbox_table(result: ChaosResult) -> Table:
    """The outbox stream's figures (benchmarks/chaos/outbox_stream.py)."""
    snap, stop, monkey = result.outbox, result.outbox_at_stop, result.monkey
    assert snap is not None  # noqa: S101 - called only for runs with the outbox stream
    out = Table(title="outbox stream (transfers through the transactional outbox)")
    out.add_column("what")
    out.add_column("value", justify="right")
    counts = result.process_counts
    rows = [
        (
            "processes (writers / relay processes / ledger consumers)",
            f"{counts['outbox-writer']} / {counts['outbox-relay']} / {counts['ledger']}",
        ),
        ("strikes (kill -9 of a random subset)", len(monkey.strikes)),
        ("subset sizes covered", _sizes(monkey.sizes)),
        ("kills: broker", monkey.kills["broker"]),
        ("kills: writers (writer-0 runs a relay)", monkey.kills["outbox-writer"]),
        ("kills: relay processes", monkey.kills["outbox-relay"]),
        ("transfers attempted", len(snap.attempted)),
        ("transfers committed", len(snap.committed)),
        ("transfers rolled back or killed mid-transaction", snap.rolled_back),
        ("committed messages (3 per transfer, 2 sharding keys)", snap.messages),
        ("unsent when the writers stopped", stop.unsent if stop is not None else "-"),
        ("messages applied by the ledger", snap.applied_count),
        ("redeliveries absorbed (idempotent)", snap.duplicates),
        ("relay lease takeovers (SQLite)", result.relay_takeovers),
        ("unsent / dead rows after settling", f"{snap.unsent} / {snap.dead}"),
        ("violations (outbox stream)", len(result.outbox_violations)),
        ("run / settle time (s)", f"{result.run_seconds:.0f} / {result.settle_seconds:.0f}"),
    ]
    for what, value in rows:
        out.add_row(what, str(value))
    return out


def outbox_result_line(result: ChaosResult) -> str:
    snap = result.outbox
    assert snap is not None  # noqa: S101 - called only for runs with the outbox stream
    kills = result.monkey.kills
    return (
        f"RESULT chaos-outbox committed={len(snap.committed)} rolled_back={snap.rolled_back} "
        f"messages={snap.messages} applied={snap.applied_count} duplicates={snap.duplicates} "
        f"keys={len(snap.expected)} writer_kills={kills['outbox-writer']} "
        f"relay_kills={kills['outbox-relay']} broker_kills={kills['broker']} "
        f"takeovers={result.relay_takeovers} unsent={snap.unsent} dead={snap.dead} "
        f"violations={len(result.violations)} seconds={result.run_seconds:.0f}"
    )


def table(result: ChaosResult) -> Table:
    final, stop, monkey = result.final, result.at_monkey_stop, result.monkey
    out = Table(title=f"txmsg chaos: {len(monkey.strikes)} strikes in {result.run_seconds:.0f} s")
    out.add_column("what")
    out.add_column("value", justify="right")
    rows = [
        (
            "processes (broker / producers / consumers)",
            " / ".join(str(result.process_counts[k]) for k in ("broker", "producer", "consumer")),
        ),
        ("strikes (kill -9 of a random subset)", len(monkey.strikes)),
        ("subset sizes covered", _sizes(monkey.sizes)),
        ("kills: broker", monkey.kills["broker"]),
        ("kills: producer", monkey.kills["producer"]),
        ("kills: consumer", monkey.kills["consumer"]),
        ("orders created", final.orders),
        ("orders committed (PAID)", len(final.paid)),
        ("orders rolled back (attempted, not PAID)", final.attempted - len(final.paid)),
        ("in doubt when the monkey stopped", len(stop.in_doubt)),
        ("  of which committed in the end", len(stop.in_doubt & final.paid)),
        ("in doubt after settling (records IN_FLIGHT)", final.in_flight_records),
        ("settle time (s)", f"{result.settle_seconds:.0f}"),
        *discard_rows(result),
    ]
    services = ("points", "logistics", "cart")
    rows.extend(
        (f"processed by {service}", len(final.processed.get(service, ()))) for service in services
    )
    rows.extend(
        (f"duplicates absorbed by {service}", final.duplicates.get(service, 0))
        for service in services
    )
    stream = final.stream
    rows.extend(
        [
            ("ordered events acknowledged (send_orderly)", len(stream.acked)),
            ("  in doubt (send failed or producer died)", len(stream.in_doubt - stream.acked)),
            ("ordered events applied by tracking (orderly)", stream.applied_count),
            ("  orders with events", len(stream.applied)),
            (
                "  resends skipped / redeliveries absorbed",
                f"{len(stream.skipped)} / {final.stream_duplicates}",
            ),
            ("  keys parked", len(stream.parked)),
            (
                "  killed consumers' in-flight messages finished: handed again / "
                "before the key's next / by the sweeper",
                " / ".join(
                    map(str, tracking.recovered_in(result.settings.workdir / "logs").values())
                ),
            ),
        ]
    )
    rows.append(("violations", len(result.violations)))
    for what, value in rows:
        out.add_row(what, str(value))
    return out


def discard_rows(result: ChaosResult) -> list[tuple[str, object]]:
    """The check horizon's figures (issue 39): discards per broker, the rescuer's outcomes."""
    figures = result.discards
    rows: list[tuple[str, object]] = [
        (
            "half messages discarded after the last check-back (per broker)",
            f"{figures.discards} ({figures.per_broker()})",
        ),
        ("  transactions among them", len(figures.keys)),
        (
            "  rescued by txmsg: re-sent / rolled back / put back into the check cycle",
            f"{figures.count('rescued')} / {figures.count('rolled_back')} / "
            f"{figures.count('put_back')}",
        ),
        ("  not rescued", len(figures.unrescued)),
    ]
    rows.extend((f"  unreadable: {problem}", "") for problem in figures.unreadable)
    return rows


def result_line(result: ChaosResult) -> str:
    final = result.final
    paid = len(final.paid)
    once = min((len(final.processed[s] & final.paid) for s in final.processed), default=0)
    ratio = once / paid if paid else 0.0
    return (
        f"RESULT chaos strikes={len(result.monkey.strikes)} "
        f"kills={sum(result.monkey.kills.values())} committed={paid} "
        f"rolled_back={final.attempted - paid} in_doubt_at_stop={len(result.at_monkey_stop.in_doubt)} "
        f"duplicates={sum(final.duplicates.values())} events={final.stream.applied_count} "
        f"event_orders={len(final.stream.applied)} violations={len(result.violations)} "
        f"ratio={ratio:.3f} discards={result.discards.discards} "
        f"discarded_tx={len(result.discards.keys)} rescues={result.discards.rescues}"
    )
