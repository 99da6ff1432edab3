"""``txmsg demo``: the order sample end to end, with faults, on an embedded broker.

What it does, in order:

1. starts an embedded RocketMQ-compatible broker with short check timings (transaction timeout and
   check interval of about a second) in a temporary directory;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from samples.order.faults import FaultPlan, Tally
from samples.order.verify import CONSUMER_GROUPS, Outcome, progress, verify


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


@click.command("demo")
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
    default=120.0,
    show_default=True,
    type=click.FloatRange(5.0),
    help="seconds to wait for everything to settle",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where the broker and databases live (default: a new temporary directory)",
)
@click.option("--keep", is_flag=True, help="keep the work directory afterwards")
def demo(
    orders: int,
    fail_rate: float,
    slow_rate: float,
    lose_ack_rate: float,
    seed: int | None,
    threads: int,
    timeout: float,
    workdir: Path | None,
    keep: bool,
) -> None:
    """Run the order sample on an embedded broker with injected faults and check consistency."""
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
    )
    code = run(options, Console())
    raise SystemExit(code)


def run(options: DemoOptions, console: Console, broker: Any = None) -> int:
    """Run the demo; returns the exit code (0 = CONSISTENT).  ``broker``: use this running
    broker (tests pass the fixture's) instead of starting one."""
    from samples.order.demo_run import DemoRun  # imports the broker and the client lazily

    own_dir = options.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="txmsg-demo-")) if own_dir else options.workdir
    assert workdir is not None
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", str(workdir / "rocketmq-client"))
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
    try:
        with console.status("starting the embedded broker and the services..."):
            demo_run.start()
        console.print(
            f"broker up at {demo_run.name_server}; transaction timeout "
            f"{options.transaction_timeout_ms} ms, check interval {options.check_interval_ms} ms"
        )
        errors = _pay_all(demo_run, options, console)
        settled = _settle(demo_run, options, console)
        outcome = verify(demo_run.dbs, demo_run.order_ids, demo_run.plan, demo_run.tally)
        outcome.mismatches.extend(errors)
        if not settled:
            outcome.mismatches.append(
                f"did not settle within {options.timeout:.0f} s (see the counts above)"
            )
    except Exception as exc:  # report it like a mismatch, with the logs kept for a look
        logging.getLogger("txmsg.demo").exception("demo failed")
        console.print(f"[bold red]demo failed[/]: {type(exc).__name__}: {exc}")
        outcome = None
    finally:
        with console.status("shutting down..."):
            try:
                demo_run.close()
            except Exception as exc:
                console.print(f"[red]shutdown problem[/]: {type(exc).__name__}: {exc}")
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()
    ok = outcome is not None and outcome.consistent
    _report(console, outcome, demo_run.plan, time.monotonic() - started)
    if own_dir and not options.keep and ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        console.print(f"work dir kept: {workdir} (logs: demo.log, broker/logs, rocketmq-client)")
    return 0 if ok else 1


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
                except Exception as exc:
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
    return (
        f"in flight {o.in_flight}  check-backs resolved {o.resolved_by_check}/{o.answered_unknow}"
        f"  {applied}  duplicates absorbed {dups} (lost acks {lost})"
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
