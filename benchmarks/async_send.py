"""Awaitable transactional sends on one event loop vs the sync API on N threads (issues 27, 38.3).

    python -m benchmarks.async_send [--n 64] [--sends 1280] [--rounds 5] [--others]
                                    [--backend rocketmq5|rocketmq]
                                    [--database-url postgresql://...|sqlite]
                                    [--async-driver asyncpg|psycopg] [--loop asyncio|uvloop]

The defaults measure the recommended asyncio stack (docs/guide/async.md): the **rocketmq5**
backend (its split send awaits the half message and the end on the loop, no pool thread) and
**asyncpg** on PostgreSQL against the sync API with psycopg on the same database.  The database is
``--database-url``, else ``$TXMSG_BENCH_PG_URL``, else ``$TXMSG_TEST_PG_URL``, else what
``scripts/pg.sh`` prints (it starts a throw-away server); ``--database-url sqlite`` runs a SQLite
file per side (aiosqlite vs sqlite3), ``--async-driver psycopg`` psycopg's async mode.  ``--others``
then runs the other configurations (aiosqlite, psycopg async, the rocketmq backend), 3 rounds each,
and prints their figures as ``figures ...`` lines: figures, not goals.

One run, one embedded broker (child process), one SQLite file per side (or, with
``--database-url``, that database for both sides: psycopg's async mode against psycopg), each
behind a pool of ``--pool`` connections (8):

* **async**: ``async with app:``, one event loop running ``--n`` concurrent requests; each is
  ``await app.async_transactional_producer(g).send_in_transaction(...)`` whose ``async def execute_local``
  awaits a database write (an insert through async SQLAlchemy, aiosqlite) and answers COMMIT.
  While it runs, a probe on the same loop sleeps 10 ms again and again and records how late each
  wake-up is: the loop's lag (p99 reported).  An event loop with nothing else to do runs the same
  probe on a thread of its own meanwhile: the lag any loop gets in that process at that rate
  (the GIL's other holders, the OS run queue on these cores, garbage collections), the floor
  under the loop's figure (``idle_loop_lag_p99_ms``).
* **sync**: the same on the sync API: ``--n`` threads of a pool, each
  ``producer.send_in_transaction(...)`` whose plain ``execute_local`` makes the same insert
  through sync SQLAlchemy, with the idle loop's probe beside it (``sync_idle_loop_lag_p99_ms``:
  what a loop would get in a process sending at the sync side's rate).
* ``--no-write``: the same without the insert, to tell the send path's cost from the drivers'.
* **check bound**: ``--checks`` transactions left UNKNOW by an ``async def execute_local``, then
  checked back by an ``async def check_local`` awaiting 100 ms, at ``concurrency`` 16.  Within
  the broker's check pass that checks them, the ideal rate is what whole rounds of 16 allow,
  ``M / (ceil(M / 16) * 0.1 s)``; ``check_bound`` is the measured rate over it (as
  ``benchmarks.check_scaling`` reports for the threaded path).

Each side also prints the process CPU time it spent per send, split by thread kind (the loop's
thread, the app's send pool, aiosqlite's thread per connection, the sync side's request threads,
and ``native``: librocketmq's own threads), and the thread switches per send by kind
(:mod:`benchmarks._thread_cpu`).  On 2 cores shared by the GIL-bound sides the ratio follows those:
a side's throughput is roughly what its CPU per send allows, and every await that crosses threads
(the send pool, aiosqlite's thread per connection) costs a wake-up, a GIL hand-over and a
context switch that the sync side's thread, doing it all itself, never pays.

``--rounds`` (3) runs both sides that many times, which side goes first alternating; the result
has the medians (the ratio is theirs), each round's figures printed above it.

Final line: ``RESULT async_send async_tps=<a> sync_tps=<b> ratio=<median of the rounds' async/sync>
ratio_of_medians=<a/b> lag_over_idle_p99_ms=<l - f> loop_lag_max_ms=<m> loop_lag_p99_ms=<l> check_bound=<c>
idle_loop_lag_p99_ms=<f> sync_idle_loop_lag_p99_ms=<g> rounds=<r> stack=<backend>+<driver>
gc_freeze=<on|off>``:
medians of the rounds (``ratio``: of each round's ratio, its two sides run back to back; before
2026-11-29 ``ratio`` was ``ratio_of_medians``) but ``lag_over_idle_p99_ms`` (the median of each round's loop lag p99 minus
the idle loop's p99 of the same round) and ``loop_lag_max_ms`` (the largest lag of any round).
Goals (issue 38.3), for the default stack at N = 64 (the start-up heap frozen, as
docs/guide/async.md recommends for a service; ``--no-gc-freeze`` measures it as started):
``ratio`` >= 0.95 (median of 5 rounds), ``lag_over_idle_p99_ms`` <= 10, ``loop_lag_max_ms`` <=
100; async check-backs ``check_bound`` >= 0.9 (issue 27).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Integer, String
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import create_topic

from txmsg import LocalTransactionState, Message, TxMsg, TxMsgConfig
from txmsg.aio.sqla import create_async_engine, make_async_session_factory
from txmsg.sqla import create_engine, make_session_factory

from . import _thread_cpu

S = LocalTransactionState
T = TypeVar("T")
CHECK_SLEEP = 0.1
CHECK_CONCURRENCY = 16
PROBE_SLEEP = 0.01


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "bench_row"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64))


def _config(args: argparse.Namespace, broker: Any, tmp: Path) -> TxMsgConfig:
    if args.backend == "rocketmq5":
        return TxMsgConfig(backend="rocketmq5", endpoints=broker.grpc_endpoint)
    return TxMsgConfig(
        backend="rocketmq",
        name_server=broker.namesrv_addr,
        client_log_dir=str(tmp / "client-logs"),
        instance_prefix="bench",
    )


def _url(args: argparse.Namespace, tmp: Path, side: str) -> str:
    return args.database_url or f"sqlite:///{tmp / f'{side}.db'}"


def _async_url(args: argparse.Namespace, tmp: Path, side: str) -> str:
    """The async side's database: ``--database-url`` with ``--async-driver`` if one is given."""
    url = _url(args, tmp, side)
    if args.async_driver is None:
        return url
    sa_url = make_url(url)
    return sa_url.set(
        drivername=f"{sa_url.get_backend_name()}+{args.async_driver}"
    ).render_as_string(hide_password=False)


def _kind(loop_thread: int | None) -> Any:
    """Names the thread kinds of :func:`_thread_cpu.split` for this benchmark."""

    def kind(thread: threading.Thread) -> str:
        if thread.native_id == loop_thread:
            return "loop"
        name = thread.name
        if name.startswith("txmsg-async-send"):
            return "send-pool"
        if name.startswith("bench-request"):
            return "request-threads"
        if name == "bench-idle-loop":
            return "idle-loop"
        if "_connection_worker_thread" in name:
            return "aiosqlite"
        return "other"

    return kind


def _split_text(cpu: dict[str, float], switched: dict[str, float], sends: int) -> str:
    """CPU µs and thread switches per send, by thread kind."""
    text = f"by thread: {_thread_cpu.render(cpu, sends)}"
    if switched:
        total = sum(switched.values()) / sends
        text += (
            f"; {total:.1f} thread switches a send: "
            f"{_thread_cpu.render(switched, sends, scale=1, digits=1)}"
        )
    return text


async def _probe_lag(stop: asyncio.Event | threading.Event, lags: list[float]) -> None:
    """Sleep 10 ms again and again until ``stop``; record how late each wake-up is."""
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(PROBE_SLEEP)
        lags.append(time.perf_counter() - began - PROBE_SLEEP)


def _p99_ms(lags: list[float]) -> float:
    """The 99th percentile of ``lags`` (seconds) in milliseconds; 0 for none."""
    ordered = sorted(lags)
    return (
        ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] * 1000 if lags else 0.0
    )


@contextlib.contextmanager
def _frozen_heap(enabled: bool) -> Iterator[None]:
    """With ``--gc-freeze``: what a service does once started (``gc.collect(); gc.freeze()``),
    so full collections stop walking its start-up objects; undone after the side."""
    if not enabled:
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class IdleLoopProbe:
    """An event loop with nothing to do but the lag probe, on a thread of its own, while a side
    sends: how late a 10 ms timer fires in that process at that rate, whatever a loop does (the
    GIL's other holders, the OS run queue, garbage collections).  The async side's lag is the
    loop's own work on top of this floor."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(_probe_lag(self._stop, self.lags)),
            name="bench-idle-loop",
        )

    def __enter__(self) -> IdleLoopProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _run_loop(args: argparse.Namespace, main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the event loop ``--loop`` names: asyncio's own, or uvloop (what
    ``uvicorn[standard]`` runs a FastAPI service on)."""
    if args.loop == "uvloop":
        try:  # not a dependency: only this option needs it
            uvloop: Any = importlib.import_module("uvloop")
        except ImportError as exc:
            main.close()
            raise SystemExit(f"--loop uvloop needs uvloop: pip install uvloop ({exc})") from exc
        result: T = uvloop.run(main)
        return result
    return asyncio.run(main)


def run_async(
    args: argparse.Namespace, broker: Any, tmp: Path, topic: str, name: str = "async"
) -> tuple[float, float, float, float, float, str, float]:
    """Async sends: (transactions per second, p99 loop lag in ms, p99 lag of an idle event loop
    beside it in ms, process CPU µs per send, the loop thread's CPU µs per send, the CPU per send
    by thread kind, the loop's largest lag in ms)."""
    engine = create_async_engine(_async_url(args, tmp, name), pool_size=args.pool, max_overflow=0)
    sessions = make_async_session_factory(engine)

    class Pay:
        async def execute_local(self, message: Message, arg: Any) -> S:
            if args.no_write:
                await asyncio.sleep(0)
                return S.COMMIT
            async with sessions() as session, session.begin():
                session.add(Row(key=message.transaction_key or ""))
            return S.COMMIT

        async def check_local(self, message: Message) -> S:
            return S.COMMIT

    app = TxMsg(_config(args, broker, tmp), async_send_threads=args.n)
    group = f"bench-{name}"
    app.add_transactional_listener(Pay(), group=group, topics=[topic])

    async def main() -> tuple[float, float, float, float, float, str, float]:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        lags: list[float] = []
        stop = asyncio.Event()

        async with app:
            producer = app.async_transactional_producer(group)
            await producer.send_in_transaction(topic, "warm-up")
            remaining = args.sends

            async def request() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    result = await producer.send_in_transaction(topic, {"n": remaining})
                    assert result.local_state is S.COMMIT  # noqa: S101 - a benchmark's sanity

            with _frozen_heap(args.gc_freeze), IdleLoopProbe() as idle:
                prober = asyncio.create_task(_probe_lag(stop, lags))
                threads, switches = _thread_cpu.snapshot(), _thread_cpu.switches()
                began, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
                await asyncio.gather(*(request() for _ in range(args.n)))
                elapsed = time.perf_counter() - began
                cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
                kind = _kind(threading.get_native_id())
                by_kind = _thread_cpu.split(threads, _thread_cpu.snapshot(), kind)
                switched = _thread_cpu.split(switches, _thread_cpu.switches(), kind)
                stop.set()
                await prober
        await engine.dispose()
        per_send = 1e6 / args.sends
        return (
            args.sends / elapsed,
            _p99_ms(lags),
            _p99_ms(idle.lags),
            cpu * per_send,
            loop_cpu * per_send,
            _split_text(by_kind, switched, args.sends),
            max(lags, default=0.0) * 1000,
        )

    return _run_loop(args, main())


def run_sync(
    args: argparse.Namespace, broker: Any, tmp: Path, topic: str, name: str = "sync"
) -> tuple[float, float, float, str]:
    """Sync sends on ``--n`` threads: (transactions per second, p99 lag of an idle event loop in
    the process meanwhile in ms, process CPU µs per send, the CPU per send by thread kind)."""
    engine = create_engine(_url(args, tmp, name), pool_size=args.pool, max_overflow=0)
    Base.metadata.create_all(engine)
    sessions = make_session_factory(engine)

    class Pay:
        def execute_local(self, message: Message, arg: Any) -> S:
            if args.no_write:
                return S.COMMIT
            with sessions() as session, session.begin():
                session.add(Row(key=message.transaction_key or ""))
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app = TxMsg(_config(args, broker, tmp))
    group = f"bench-{name}"
    app.add_transactional_listener(Pay(), group=group, topics=[topic])
    lock = threading.Lock()
    remaining = args.sends
    with app:
        producer = app.transactional_producer(group)
        producer.send_in_transaction(topic, "warm-up")

        def request() -> None:
            nonlocal remaining
            while True:
                with lock:
                    if remaining <= 0:
                        return
                    remaining -= 1
                    n = remaining
                result = producer.send_in_transaction(topic, {"n": n})
                assert result.local_state is S.COMMIT  # noqa: S101 - a benchmark's sanity

        with (
            _frozen_heap(args.gc_freeze),
            ThreadPoolExecutor(args.n, thread_name_prefix="bench-request") as pool,
            IdleLoopProbe() as idle,
        ):
            threads, switches = _thread_cpu.snapshot(), _thread_cpu.switches()
            began, cpu = time.perf_counter(), time.process_time()
            for future in [pool.submit(request) for _ in range(args.n)]:
                future.result()
            elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
            by_kind = _thread_cpu.split(threads, _thread_cpu.snapshot(), _kind(None))
            switched = _thread_cpu.split(switches, _thread_cpu.switches(), _kind(None))
    engine.dispose()
    return (
        args.sends / elapsed,
        _p99_ms(idle.lags),
        cpu * 1e6 / args.sends,
        _split_text(by_kind, switched, args.sends),
    )


def run_checks(args: argparse.Namespace, broker: Any, tmp: Path, topic: str) -> dict[str, float]:
    """Async check-backs at concurrency 16: the measured rate within one check pass vs the
    bound whole rounds of 16 allow."""
    starts: list[float] = []
    answered: dict[str, float] = {}
    active = 0
    most = 0
    lock = threading.Lock()

    class Unknown:
        async def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        async def check_local(self, message: Message) -> S:
            nonlocal active, most
            with lock:
                starts.append(time.monotonic())
                active += 1
                most = max(most, active)
            await asyncio.sleep(CHECK_SLEEP)
            with lock:
                active -= 1
                answered.setdefault(message.transaction_key or "", time.monotonic())
            return S.COMMIT

    app = TxMsg(_config(args, broker, tmp))
    app.add_transactional_listener(
        Unknown(),
        group="bench-check",
        topics=[topic],
        executor={"concurrency": CHECK_CONCURRENCY},
    )

    async def main() -> None:
        async with app:
            producer = app.async_transactional_producer("bench-check")
            await asyncio.gather(
                *(producer.send_in_transaction(topic, {"n": i}) for i in range(args.checks))
            )
            deadline = time.monotonic() + args.max_wait
            while len(answered) < args.checks and time.monotonic() < deadline:
                await asyncio.sleep(0.1)

    _run_loop(args, main())
    # the check pass that answered most: starts closer than a check interval belong together
    starts.sort()
    passes: list[list[float]] = [[]]
    for t in starts:
        if passes[-1] and t - passes[-1][-1] > 0.5:
            passes.append([])
        passes[-1].append(t)
    biggest = max(passes, key=len)
    ends = sorted(v for v in answered.values() if biggest[0] <= v <= biggest[-1] + 5)
    m = len(biggest)
    rate = m / (ends[-1] - biggest[0]) if ends and m else 0.0
    bound = m / (math.ceil(m / CHECK_CONCURRENCY) * CHECK_SLEEP) if m else 1.0
    return {
        "answered": float(len(answered)),
        "pass_checks": float(m),
        "rate": rate,
        "bound": bound,
        "ratio": rate / bound,
        "overlap": float(most),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64, help="concurrent requests (and threads)")
    parser.add_argument("--sends", type=int, default=1280, help="transactions per side")
    parser.add_argument("--checks", type=int, default=160, help="transactions checked back")
    parser.add_argument("--max-wait", type=float, default=120.0)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval for the run (seconds; Python's default 0.005): how long a "
        "thread may hold the GIL before another gets it, which bounds the loop's lag",
    )
    parser.add_argument(
        "--pool",
        type=int,
        default=8,
        help="connections of each side's engine (SQLite has one writer; aiosqlite runs a "
        "thread per connection, so more only add threads competing for the GIL)",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="one PostgreSQL database for both sides; default $TXMSG_BENCH_PG_URL, else "
        "$TXMSG_TEST_PG_URL, else what scripts/pg.sh prints (it starts a throw-away server); "
        "'sqlite': a SQLite file per side (aiosqlite vs sqlite3)",
    )
    parser.add_argument(
        "--async-driver",
        default=None,
        help="the async side's driver on PostgreSQL: asyncpg (default: the recommended stack; "
        "the sync side keeps psycopg) or psycopg (psycopg's async mode)",
    )
    parser.add_argument(
        "--others",
        action="store_true",
        help="then run the other configurations (aiosqlite, psycopg async, the rocketmq "
        "backend with asyncpg), 3 rounds each, and print their figures (no goals) before the "
        "RESULT line of the recommended stack",
    )
    parser.add_argument(
        "--no-write",
        action="store_true",
        help="execute_local writes nothing (the async one awaits asyncio.sleep(0)): what the "
        "awaited send itself costs against the threaded one, without the database drivers",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of both sides, the first side alternating (sync first in odd rounds): the "
        "medians are reported, so a burst of load on a shared machine skews one round only",
    )
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each side calls gc.collect(); gc.freeze() once started and warmed up, as "
        "docs/guide/async.md recommends a service do after start-up: CPython's full collections "
        "then skip those objects (on this VM one walk of the ~110 000 start-up objects stops "
        "every thread for 30-50 ms). On by default, the recommended stack; --no-gc-freeze "
        "measures a service as started",
    )
    parser.add_argument("--backend", choices=("rocketmq", "rocketmq5"), default="rocketmq5")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the async side's event loop: asyncio's own (default) or uvloop (pip install "
        "uvloop; what uvicorn[standard] serves FastAPI on)",
    )
    args = parser.parse_args(argv)
    args.database_url, args.async_driver = _database(args.database_url, args.async_driver)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    logging.basicConfig(level=logging.WARNING)
    grpc: dict[str, Any] = {"grpc_port": 0} if args.backend == "rocketmq5" else {}
    broker = BrokerProcess(
        transaction_timeout_ms=200, check_interval_ms=3000, check_max=15, **grpc
    ).start()
    try:
        with tempfile.TemporaryDirectory(prefix="txmsg-async-bench-") as tmp_dir:
            tmp = Path(tmp_dir)
            topics = {}
            sides = [f"{side}{r}" for r in range(args.rounds) for side in ("async", "sync")]
            for side in [*sides, "check"]:
                topics[side] = f"bench_{side}_{int(time.time())}"
                create_topic(broker.namesrv_addr, topics[side], message_type="TRANSACTION")
            database = make_url(args.database_url).get_backend_name() if args.database_url else None
            print(
                f"backend {args.backend}; N={args.n}; {args.sends} sends per side; GIL switch "
                f"interval {sys.getswitchinterval() * 1000:g} ms; database "
                f"{database or 'sqlite (a file per side)'}, pool {args.pool}"
                f"{f'; async driver {args.async_driver}' if args.async_driver else ''}"
                f"{'; event loop uvloop' if args.loop == 'uvloop' else ''}"
                f"{'; gc.freeze() after start-up' if args.gc_freeze else ''}"
                f"{'; no write (--no-write)' if args.no_write else ''}",
                flush=True,
            )
            sync_runs: list[float] = []
            async_runs: list[float] = []
            lags: list[float] = []
            floors: list[float] = []
            async_floors: list[float] = []
            peaks: list[float] = []
            for r in range(args.rounds):
                for side in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                    name = f"{side}{r}"
                    if side == "sync":
                        tps, floor, cpu, threads = run_sync(args, broker, tmp, topics[name], name)
                        sync_runs.append(tps)
                        floors.append(floor)
                        print(
                            f"round {r + 1} sync:  {tps:.1f} tx/s on {args.n} threads; an idle "
                            f"loop's lag p99 {floor:.2f} ms; CPU {cpu:.0f} us a send ({threads})",
                            flush=True,
                        )
                    else:
                        tps, lag, floor, cpu, loop_cpu, threads, peak = run_async(
                            args, broker, tmp, topics[name], name
                        )
                        async_runs.append(tps)
                        lags.append(lag)
                        async_floors.append(floor)
                        peaks.append(peak)
                        print(
                            f"round {r + 1} async: {tps:.1f} tx/s on one loop; loop lag p99 "
                            f"{lag:.2f} ms (max {peak:.1f}), an idle loop's beside it "
                            f"{floor:.2f} ms: {lag - floor:.2f} over it; CPU "
                            f"{cpu:.0f} us a send ({loop_cpu:.0f} on the loop's thread; "
                            f"{threads})",
                            flush=True,
                        )
            sync_tps, async_tps = statistics.median(sync_runs), statistics.median(async_runs)
            lag, floor = statistics.median(lags), statistics.median(floors)
            async_floor = statistics.median(async_floors)
            checks = run_checks(args, broker, tmp, topics["check"])
            print(
                f"checks: {checks['pass_checks']:.0f} in one pass at {checks['rate']:.1f}/s, "
                f"bound {checks['bound']:.1f}/s, most at once {checks['overlap']:.0f}, "
                f"answered {checks['answered']:.0f}/{args.checks}",
                flush=True,
            )
    finally:
        broker.stop()
    over = statistics.median(a - f for a, f in zip(lags, async_floors, strict=True))
    peak = max(peaks)
    print(
        f"medians of {args.rounds} rounds: async {async_tps:.1f} tx/s, sync {sync_tps:.1f} tx/s, "
        f"loop lag p99 {lag:.2f} ms (an idle loop's beside it {async_floor:.2f} ms, beside the "
        f"sync side {floor:.2f} ms; over the idle loop's {over:.2f} ms), the largest lag of all "
        f"rounds {peak:.1f} ms; ratios per round "
        f"{' '.join(f'{a / b:.2f}' for a, b in zip(async_runs, sync_runs, strict=True))}",
        flush=True,
    )
    stack = _stack_name(args)
    if args.others:
        _run_others(argv if argv is not None else sys.argv[1:])
    # each round's two sides ran back to back: their ratio, median over the rounds (as the
    # other benchmarks pair their sides); the ratio of the two medians is printed beside it
    ratio = statistics.median(a / b for a, b in zip(async_runs, sync_runs, strict=True))
    print(
        f"RESULT async_send async_tps={async_tps:.1f} sync_tps={sync_tps:.1f} "
        f"ratio={ratio:.2f} ratio_of_medians={async_tps / sync_tps:.2f} "
        f"lag_over_idle_p99_ms={over:.2f} "
        f"loop_lag_max_ms={peak:.1f} loop_lag_p99_ms={lag:.2f} "
        f"check_bound={checks['ratio']:.2f} idle_loop_lag_p99_ms={async_floor:.2f} "
        f"sync_idle_loop_lag_p99_ms={floor:.2f} rounds={args.rounds} stack={stack} "
        f"gc_freeze={'on' if args.gc_freeze else 'off'}",
        flush=True,
    )
    return 0


def _stack_name(args: argparse.Namespace) -> str:
    """``<backend>+<async driver>``: the configuration a RESULT line measured."""
    driver = args.async_driver or ("aiosqlite" if args.database_url is None else "psycopg")
    return f"{args.backend}+{driver}"


OTHERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rocketmq5+aiosqlite (SQLite, a file per side)", ("--database-url", "sqlite")),
    ("rocketmq5+psycopg async", ("--async-driver", "psycopg")),
    ("rocketmq+asyncpg (librocketmq)", ("--backend", "rocketmq")),
)
"""The configurations ``--others`` measures beside the recommended stack: figures, no goals."""


def _run_others(argv: list[str]) -> None:
    """Each of :data:`OTHERS` in a process of its own (3 rounds, this run's other options); their
    RESULT lines printed as ``figures`` lines."""
    keep: list[str] = []
    skip = {"--others", "--backend", "--async-driver", "--database-url", "--rounds"}
    rest = iter(argv)
    for arg in rest:
        name = arg.split("=", 1)[0]
        if name in skip:
            if "=" not in arg and name != "--others":
                next(rest, None)
            continue
        keep.append(arg)
    for label, extra in OTHERS:
        command = [sys.executable, "-m", "benchmarks.async_send", *keep, "--rounds", "3", *extra]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        figures = lines[-1].removeprefix("RESULT async_send ") if lines else "(no RESULT line)"
        print(f"figures {label}: {figures}", flush=True)
        if not lines:
            print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)


def _database(url: str | None, driver: str | None) -> tuple[str | None, str | None]:
    """The database and async driver of the run: PostgreSQL with asyncpg unless told otherwise
    (``--database-url sqlite``: a SQLite file per side, None here)."""
    if url == "sqlite":
        return None, None
    if url is None:
        url = os.environ.get("TXMSG_BENCH_PG_URL") or os.environ.get("TXMSG_TEST_PG_URL")
    if url is None:
        script = Path(__file__).resolve().parent.parent / "scripts" / "pg.sh"
        try:
            url = subprocess.run(
                ["bash", str(script)], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(
                "the recommended async stack runs on PostgreSQL: pass --database-url "
                "postgresql+psycopg://... (or export TXMSG_TEST_PG_URL=$(scripts/pg.sh)), or "
                f"--database-url sqlite for SQLite files ({exc})"
            ) from exc
    return url, driver or "asyncpg"


if __name__ == "__main__":
    raise SystemExit(main())
