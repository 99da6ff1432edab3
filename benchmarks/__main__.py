"""Run every benchmark with a small default size and print one table of results.

``python -m benchmarks`` (or ``txmsg bench``).  Each script runs in its own process (they start
brokers, Spark sessions and native clients) and ends with a ``RESULT <name> ... ratio=<x>`` line;
this runner collects those lines next to each benchmark's goal.  Ratios are measured within one
run of each script, because this machine is noisy; compare nothing across runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import click
from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Bench:
    module: str
    goal: str
    small: tuple[str, ...]
    full: tuple[str, ...] = ()


BENCHES: tuple[Bench, ...] = (
    Bench(
        "import_time",
        "import txmsg < 150 ms (ratio = 150 ms / median)",
        ("--runs", "10"),
        ("--runs", "30"),
    ),
    Bench(
        "broker_throughput",
        "ours/real RocketMQ 4.9.8 msgs/s >= 1.0",
        ("--seconds", "2"),
        ("--seconds", "5"),
    ),
    Bench(
        "grpc_throughput",
        "official 5.x client over gRPC / C++ client over remoting msgs/s >= 0.7 "
        "(ratio = worst of plain/tx x 1/4 threads)",
        ("--seconds", "2"),
        ("--seconds", "5"),
    ),
    Bench(
        "send_overhead",
        "txmsg/raw send_in_transaction >= 0.9",
        ("--seconds", "1", "--rounds", "2"),
        (),
    ),
    Bench(
        "check_scaling",
        "check-backs/s / (N/0.1 s) >= 0.9, no duplicates",
        ("--transactions", "64", "--ns", "1,4,16"),
        (),
    ),
    Bench(
        "otel_overhead",
        "OpenTelemetry / none: production set-up (ParentBased(TraceIdRatioBased(0.1)), "
        "BatchSpanProcessor, periodic metric reader) send_ratio_sampled >= 0.95 and check_ratio "
        ">= 0.95 (ratio = the lower); always on + batch send_ratio >= 0.85; API without an SDK "
        "send_ratio_api >= 0.99; send_added_us printed",
        ("--rounds", "2", "--seconds", "1", "--transactions", "64"),
        (),
    ),
    Bench(
        "health_vs_duckdb",
        "warm Spark <= 1.5x DuckDB, process <= 3x, counts equal",
        ("--lines", "300000", "--runs", "1"),
        (),
    ),
    Bench(
        "fuzz_broker",
        "decoders + live sockets: crashes=0 hangs=0, stored_ok ratio 1.0",
        ("--inputs", "100000", "--socket-inputs", "5000"),
        ("--inputs", "1000000"),
    ),
    Bench(
        "announce_latency",
        "new group known to the broker <= 1 s after start / first send "
        "(ratio = 1 s / worst median)",
        ("--runs", "3"),
        ("--runs", "5", "--baseline"),
    ),
    Bench(
        "orderly_throughput",
        "orderly listener: other keys' msgs/s with one key poisoned / "
        "unpoisoned >= 0.9 (ratio); txmsg/raw orderly consumer t1 and t8 >= 0.15, txmsg's own "
        "cost overhead_ms <= 0.1 ms per message on one thread",
        ("--messages", "3000", "--rounds", "1"),
        (),
    ),
    Bench(
        "outbox_throughput",
        "outbox: writer tx/s with/without outbox.send >= 0.8 (SQLite, PostgreSQL; keyless, "
        "keyed), relay process drains >= 1.2x the writer's peak (two on PostgreSQL >= 1.6x one), "
        "p99 commit->stored <= 50 ms in process and out of process, vs_half >= 1.0 "
        "(ratio = the lowest writer_ratio)",
        (
            "--rounds",
            "3",
            "--backlog",
            "4000",
            "--messages",
            "500",
            "--latency-seconds",
            "2",
            "--latency-rounds",
            "2",
        ),
        (),
    ),
    Bench(
        "delivery_latency",
        "outbox commit -> first delivery p99 <= 100 ms on the embedded broker, rocketmq and "
        "rocketmq5, plain and ordered (ratio = 100 ms / worst p99)",
        ("--seconds", "2"),
        ("--seconds", "5", "--rounds", "3"),
    ),
    Bench(
        "async_send",
        "rocketmq5 + asyncpg (the default): awaited transactional sends on one loop / sync API "
        "on 64 threads >= 0.95 (median of 5 rounds), lag_over_idle_p99_ms <= 10, "
        "loop_lag_max_ms <= 100, async check-backs bound >= 0.9",
        ("--sends", "256", "--checks", "48"),
        (),
    ),
    Bench(
        "chaos",
        "kill -9 chaos: every committed order processed exactly once (ratio 1.0, 0 violations)",
        ("--mode", "short"),
        ("--mode", "long"),
    ),
)


def _result_line(output: str) -> str | None:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return lines[-1] if lines else None


def _ratio(result: str | None) -> str:
    if not result:
        return "-"
    for token in result.split():
        if token.startswith("ratio="):
            return token.removeprefix("ratio=")
    return "-"


@click.command("bench")
@click.option("--full", is_flag=True, help="use each script's own (README-sized) defaults")
@click.option("--only", multiple=True, help="run only these benchmarks (repeatable)")
@click.option("--timeout", default=1800.0, show_default=True, help="per-benchmark limit in seconds")
def bench_command(full: bool, only: tuple[str, ...], timeout: float) -> None:
    """Run every benchmark script and print one table of RESULT lines with their goals."""
    console = Console()
    table = Table(title="txmsg benchmarks (ratios measured within one run)")
    for column in ("benchmark", "goal", "ratio", "seconds", "RESULT line"):
        table.add_column(column, overflow="fold")
    failed = False
    for bench in BENCHES:
        if only and bench.module not in only:
            continue
        args = bench.full if full else bench.small
        console.print(f"[bold]running[/] benchmarks.{bench.module} {' '.join(args)}")
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", f"benchmarks.{bench.module}", *args],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            output, code = "", -1
        result = _result_line(output)
        if code != 0 or result is None:
            failed = True
            tail = "\n".join(output.splitlines()[-5:])
            result = f"(exit {code}, no RESULT line) {tail}"
        table.add_row(
            bench.module, bench.goal, _ratio(result), f"{time.monotonic() - started:.0f}", result
        )
    console.print(table)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    bench_command()
