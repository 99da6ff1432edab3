"""The transactional outbox (issues 25 and 38): what ``outbox.send`` costs the writer, how fast a
relay in its own process drains a backlog, how long a committed message waits for the broker, and
end to end against half messages.

    python -m benchmarks.outbox_throughput [--seconds 1] [--rounds 5] [--backlog 8000]
                                           [--keys 64] [--latency-seconds 3] [--latency-rounds 3]
                                           [--messages 2000] [--database-url postgresql+psycopg://...]

One embedded broker (child process), the rocketmq backend (librocketmq 2.1.0), a SQLite file
(``txmsg.sqla.create_engine``: WAL, ``BEGIN IMMEDIATE``) and PostgreSQL (``--database-url``, by
default ``TXMSG_TEST_PG_URL`` when set; a schema of its own, dropped at the end).  One writer
thread.  The business transaction is a realistic one: read an account row (``session.get``),
update it, insert an order row; the outbox variant then calls ``outbox.send`` once, keyless or
with a sharding key (``--keys`` keys).

Why rounds and medians: on a shared machine the CPU this process gets changes from one second to
the next, so the two sides of a ratio are measured back to back in each round (alternating which
goes first) after an unmeasured warm-up; the median of the rounds' ratios is reported, every
round is printed, and so is the load average.

* ``writer_ratio_<db>_<kind>``: outbox transactions/s / the same transaction without
  ``outbox.send``, no relay running anywhere (the rows wait; what a writer pays when its relay
  runs in another process).  ``--rounds`` pairs of ``--seconds`` windows.  Goal >= 0.8 on both
  databases, both kinds.  ``send_cpu_us_<db>_<kind>``: the writer thread's CPU per outbox
  transaction minus per plain one (median of the rounds): what ``outbox.send`` adds per call in
  the writer's process (on PostgreSQL the server's own work is not in it).  ``writer_ratio`` is
  the lowest of them.
* ``drain_ratio_<db>``: ``txmsg outbox relay --app benchmarks._outbox_relay_app:app`` in a process
  of its own, started and ready; then ``--backlog`` rows (keyless and keyed alternately) commit
  in one transaction; the drain rate is the rows / the time from the first row stored on the
  broker to the last (the broker's store timestamps, read back with pulls), / the writer's peak
  outbox transaction rate (the fastest outbox window of either kind above).  Goal >= 1.2.
  ``drain2_ratio`` (PostgreSQL): the same with two relay processes, / one.  Goal >= 1.6.
* ``p99_ms`` (in-process relay, SQLite; ``p99_ms_pg`` on PostgreSQL): commit (the writer's
  ``commit()`` returned, wall clock) to stored (the broker's store timestamp, ms), with the
  relay in the writer's process and the writer paced at half the rate that process sustains
  (``sustained_tps``: outbox transactions/s with the relay running, median of three windows),
  keyed rows, ``--latency-rounds`` rounds of ``--latency-seconds``: the median of the rounds'
  p99.  Goal <= 50 ms.  Each round prints how many of the transactions due were committed.
  ``p99_process_ms`` (PostgreSQL): the same with the relay in its own process (woken by the
  writer's NOTIFY), the writer paced at half the rate it sustains beside that process.  Goal
  <= 50 ms.  ``p99_process_ms_sqlite``: the same on SQLite, where the relay process finds the
  rows at its poll (1 s): no goal, it shows what NOTIFY saves.
* ``vs_half`` (SQLite): end-to-end transactions/s (each transaction's message stored) through the
  outbox with its relay in process / through ``send_in_transaction`` whose ``execute_local`` runs
  the same business transaction (``--messages`` transactions each).  Goal >= 1.0.

Final line::

    RESULT outbox writer_ratio=<min> writer_ratio_sqlite_keyless=... writer_ratio_sqlite_keyed=...
        [writer_ratio_pg_keyless=... writer_ratio_pg_keyed=...] send_cpu_us_...=...
        drain_ratio=<min> drain_ratio_sqlite=... [drain_ratio_pg=... drain2_ratio=...]
        p99_ms=... [p99_ms_pg=... p99_process_ms=...] p99_process_ms_sqlite=... vs_half=...
        sustained_tps...=... peak_tps...=... drain_msgs...=... load=<1-min load average>
        ratio=<writer_ratio>
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Integer, delete, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from txmsg_broker.app import BrokerProcess
from txmsg_broker.codec import GET_MAX_OFFSET, PULL_MESSAGE, SUCCESS
from txmsg_broker.message_codec import decode_messages
from txmsg_broker.rawclient import call
from txmsg_broker.testing import create_topic, unique, wait_until

from benchmarks._answered import AnsweredSender
from benchmarks._orders import BenchOrder, OrderBase
from benchmarks._rmq_bench import ensure_client_log_dir
from txmsg import LocalTransactionState, Message, Producer, TxMsg, TxMsgConfig
from txmsg.message import DEDUP_KEY
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.outbox import Outbox, OutboxKey, OutboxMessage

BODY = "x" * 128
QUEUES = 8
ACCOUNTS = 64
ROOT = Path(__file__).resolve().parent.parent
TXMSG = str(Path(sys.executable).parent / "txmsg")
RELAY_APP = "benchmarks._outbox_relay_app:app"


class AccountBase(DeclarativeBase):
    """The metadata of :class:`BenchAccount`."""


class BenchAccount(AccountBase):
    """The row the business transaction reads and updates."""

    __tablename__ = "bench_account"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    balance: Mapped[int] = mapped_column(Integer)


@dataclass
class Database:
    name: str
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    schema: str | None = None


def _prepare(engine: Engine) -> None:
    create_tables(engine)
    OrderBase.metadata.create_all(engine)
    AccountBase.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all(BenchAccount(id=i, balance=0) for i in range(1, ACCOUNTS + 1))


@contextmanager
def sqlite_database(workdir: Path) -> Iterator[Database]:
    url = f"sqlite:///{workdir / 'bench.db'}"
    engine = create_engine(url)
    _prepare(engine)
    try:
        yield Database("sqlite", url, engine, make_session_factory(engine))
    finally:
        engine.dispose()


@contextmanager
def postgres_database(url: str) -> Iterator[Database]:
    schema = f"outbox_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = create_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    _prepare(engine)
    try:
        yield Database("pg", url, engine, make_session_factory(engine), schema)
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


# ---- the broker's side: what was stored, and when ------------------------------------------------
def stored(broker: str, topic: str) -> int:
    """Messages stored in ``topic`` (the sum of its queues' max offsets)."""
    total = 0
    for queue_id in range(QUEUES):
        answer = call(broker, GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        if answer.code == SUCCESS:
            total += int(answer.ext("offset"))
    return total


def _pull(broker: str, topic: str, queue_id: int, offset: int, count: int) -> Any:
    return call(
        broker,
        PULL_MESSAGE,
        {
            "consumerGroup": "outbox_bench_reader",
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": str(offset),
            "maxMsgNums": count,
            "sysFlag": 0,
            "commitOffset": "0",
            "subVersion": "0",
            "suspendTimeoutMillis": "0",
            "subscription": "*",
        },
    )


def store_times(broker: str, topic: str) -> dict[str, int]:
    """Each stored message's ``TXMSG_DEDUP_KEY`` -> the broker's store timestamp (ms)."""
    out: dict[str, int] = {}
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            answer = _pull(broker, topic, queue_id, offset, 32)
            if answer.code != SUCCESS:
                break
            for message in decode_messages(answer.body):
                out[message.properties.get(DEDUP_KEY, "")] = message.store_timestamp
            offset = int(answer.ext("nextBeginOffset"))
    return out


def first_and_last(broker: str, topic: str) -> tuple[int, int]:
    """The earliest and the latest store timestamp (ms) of ``topic``'s messages."""
    times: list[int] = []
    for queue_id in range(QUEUES):
        answer = call(broker, GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        last = int(answer.ext("offset")) - 1 if answer.code == SUCCESS else -1
        for offset in {0, last} if last >= 0 else set():
            found = _pull(broker, topic, queue_id, offset, 1)
            if found.code == SUCCESS:
                times.extend(m.store_timestamp for m in decode_messages(found.body))
    return min(times), max(times)


class Acks:
    """The relay's sender (:class:`AnsweredSender`), with when each row's send was answered."""

    def __init__(self, producer: Producer) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}
        self.sender = AnsweredSender(producer, self._answered)

    def _answered(self, key: str) -> None:
        now = time.perf_counter()
        with self.lock:
            self.at.setdefault(key, now)

    def count(self) -> int:
        with self.lock:
            return len(self.at)


class RelayProcess:
    """``txmsg outbox relay --app benchmarks._outbox_relay_app:app`` for one outbox."""

    def __init__(self, bench: Bench, db: Database, group: str) -> None:
        self.log = bench.workdir / f"{unique('relay')}.log"
        env = {
            **os.environ,
            "OUTBOX_BENCH_DB": db.url,
            "OUTBOX_BENCH_SCHEMA": db.schema or "",
            "OUTBOX_BENCH_GROUP": group,
            "OUTBOX_BENCH_NAMESRV": bench.namesrv,
            "OUTBOX_BENCH_LOGS": str(bench.workdir / "client-logs"),
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [TXMSG, "outbox", "relay", "--app", RELAY_APP],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self) -> None:
        wait_until(
            lambda: (
                "relaying" in self.log.read_text(errors="replace") or self.proc.poll() is not None
            ),
            timeout=120,
            interval=0.05,
            message="the relay process to start",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"the relay process exited: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Bench:
    """One broker, the apps the measurements share."""

    def __init__(self, broker: BrokerProcess, workdir: Path, keys: int) -> None:
        self.namesrv = broker.namesrv_addr
        self.broker = broker.broker_addr
        assert broker.proc is not None  # noqa: S101 - started
        self.broker_pid = broker.proc.pid
        self.workdir = workdir
        self.keys = keys
        self.apps: list[TxMsg] = []
        self.serial = iter(range(10**9))  # unique order refs

    def topic(self) -> str:
        topic = unique("OutboxBench")
        create_topic(self.namesrv, topic, queues=QUEUES)
        return topic

    def config(self) -> TxMsgConfig:
        return TxMsgConfig(
            name_server=self.namesrv,
            client_log_dir=str(self.workdir / "client-logs"),
            instance_prefix=unique("ob"),
        )

    def relay_app(self, db: Database) -> tuple[TxMsg, Outbox, Producer]:
        """An app with an outbox whose in-process relay is not started yet."""
        app = TxMsg(self.config(), backend="rocketmq")
        self.apps.append(app)
        outbox = app.add_outbox(
            group=unique("bench_outbox"), session_factory=db.sessions, relay=False
        )
        app.add_producer(group=outbox.group)
        app.start()
        return app, outbox, app.producer(outbox.group)

    def close(self) -> None:
        for app in self.apps:
            app.close(timeout=20)

    # ---- the writer's transactions --------------------------------------------------------------
    @staticmethod
    def business(session: Session, n: int) -> None:
        """Read an account, update it, insert an order."""
        account = session.get_one(BenchAccount, 1 + n % ACCOUNTS)
        account.balance += 1
        session.add(BenchOrder(ref=f"o-{n}"))

    def plain(self, db: Database) -> None:
        n = next(self.serial)
        with db.sessions() as session, session.begin():
            self.business(session, n)

    def with_outbox(self, db: Database, outbox: Outbox, topic: str, keyed: bool) -> str:
        n = next(self.serial)
        with db.sessions() as session, session.begin():
            self.business(session, n)
            if keyed:
                receipt = outbox.send(session, topic, BODY, sharding_key=f"k{n % self.keys}")
            else:
                receipt = outbox.send(session, topic, BODY)
        return receipt.message_key


@dataclass
class Window:
    """One timed run of a writer: transactions/s and the writer thread's CPU per transaction."""

    rate: float
    thread_us: float


def window(work: Callable[[], Any], seconds: float) -> Window:
    """Call ``work()`` for ``seconds``: its rate and CPU cost."""
    n = 0
    thread0 = time.thread_time()
    began = time.perf_counter()
    stop = began + seconds
    while time.perf_counter() < stop:
        work()
        n += 1
    elapsed = time.perf_counter() - began
    return Window(n / elapsed, (time.thread_time() - thread0) / max(n, 1) * 1e6)


def clear(db: Database, group: str) -> None:
    """Drop an outbox's rows (a writer measurement's backlog)."""
    with db.sessions() as session, session.begin():
        session.execute(delete(OutboxMessage).where(OutboxMessage.outbox == group))
        session.execute(delete(OutboxKey).where(OutboxKey.outbox == group))


@dataclass
class WriterFigures:
    ratio: float
    ratios: list[float]
    send_cpu_us: float
    peak_tps: float
    outbox_tps: float
    plain_tps: float


def writer_ratio(
    bench: Bench, db: Database, keyed: bool, seconds: float, rounds: int
) -> WriterFigures:
    """Pairs of windows, the business transaction with and without ``outbox.send``; no relay."""
    outbox = Outbox(group=unique("bench_writer"), session_factory=db.sessions)
    topic = bench.topic()
    kind = "keyed" if keyed else "keyless"

    def run(name: str, length: float) -> Window:
        if name == "plain":
            return window(lambda: bench.plain(db), length)
        return window(lambda: bench.with_outbox(db, outbox, topic, keyed), length)

    run("plain", min(seconds, 0.5))  # warm-up: caches, connections; not counted
    run("outbox", min(seconds, 0.5))
    ratios: list[float] = []
    added: list[float] = []
    rates: dict[str, list[float]] = {"outbox": [], "plain": []}
    for round_no in range(rounds):
        order = ["plain", "outbox"] if round_no % 2 == 0 else ["outbox", "plain"]
        got = {name: run(name, seconds) for name in order}
        ratios.append(got["outbox"].rate / got["plain"].rate)
        added.append(got["outbox"].thread_us - got["plain"].thread_us)
        for name, value in got.items():
            rates[name].append(value.rate)
        print(
            f"  {db.name} {kind} writer round {round_no + 1}: plain {got['plain'].rate:.0f} tx/s "
            f"({got['plain'].thread_us:.0f} us CPU/tx), outbox {got['outbox'].rate:.0f} tx/s "
            f"({got['outbox'].thread_us:.0f} us CPU/tx), ratio {ratios[-1]:.3f}",
            flush=True,
        )
    clear(db, outbox.group)
    return WriterFigures(
        ratio=statistics.median(ratios),
        ratios=ratios,
        send_cpu_us=statistics.median(added),
        peak_tps=max(rates["outbox"]),
        outbox_tps=statistics.median(rates["outbox"]),
        plain_tps=statistics.median(rates["plain"]),
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Drain:
    rate: float
    """Rows/s from the first row stored to the last."""
    relay_us: float
    """CPU of the relay process(es) per row."""
    broker_us: float
    """CPU of the broker process per row."""
    seconds: float
    """From the first row stored to the last."""


def drain(bench: Bench, db: Database, relays: int, backlog: int) -> Drain:
    """How fast ``relays`` relay processes drain a backlog of ``backlog`` rows (see the module
    docstring), and the CPU they and the broker spend per row meanwhile."""
    group = unique("bench_drain")
    topic = bench.topic()
    procs = [RelayProcess(bench, db, group) for _ in range(relays)]
    pids = [p.proc.pid for p in procs] + [bench.broker_pid]
    try:
        for proc in procs:
            proc.wait_ready()
        cpu0 = [cpu_seconds(pid) for pid in pids]
        writer = Outbox(group=group, session_factory=db.sessions)
        with db.sessions() as session, session.begin():
            for n in range(backlog):
                key = {"sharding_key": f"k{n % bench.keys}"} if n % 2 else {}
                writer.send(session, topic, BODY, **key)  # type: ignore[arg-type]
        wait_until(
            lambda: stored(bench.broker, topic) >= backlog,
            timeout=600,
            interval=0.05,
            message="the relay process(es) to send the backlog",
        )
        cpu = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu0, strict=True)]
    finally:
        for proc in procs:
            proc.stop()
    first, last = first_and_last(bench.broker, topic)
    seconds = max((last - first) / 1000, 0.001)
    return Drain(
        rate=(backlog - 1) / seconds,
        relay_us=sum(cpu[:-1]) / backlog * 1e6,
        broker_us=cpu[-1] / backlog * 1e6,
        seconds=seconds,
    )


def sustained(bench: Bench, db: Database, outbox: Outbox, topic: str, seconds: float) -> float:
    """Outbox transactions/s (keyed rows) a writer commits while the relay runs (in this process or
    another one), median of three windows, each followed by the relay catching up."""
    window(lambda: bench.with_outbox(db, outbox, topic, True), 0.3)  # warm-up
    rates = [
        window(lambda: bench.with_outbox(db, outbox, topic, True), seconds).rate for _ in range(3)
    ]
    return statistics.median(rates)


def paced(
    bench: Bench, db: Database, outbox: Outbox, rate: float, seconds: float, rounds: int
) -> list[list[float]]:
    """Rounds of keyed transactions paced at ``rate``/s: commit -> stored (ms) of each, sorted;
    each round on a topic of its own, printed with how many of the transactions due were
    committed (fewer: the process cannot sustain the pace)."""
    out = []
    for number in range(1, rounds + 1):
        topic = bench.topic()
        bench.with_outbox(db, outbox, topic, True)  # the topic's route, not measured
        committed: dict[str, float] = {}
        interval = 1.0 / rate
        began = time.perf_counter()
        n = 0
        while time.perf_counter() - began < seconds:
            pause = began + n * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            key = bench.with_outbox(db, outbox, topic, True)
            committed[key] = time.time()
            n += 1

        def all_stored(topic: str = topic, count: int = n + 1) -> bool:
            return stored(bench.broker, topic) >= count

        wait_until(
            all_stored,
            timeout=120,
            interval=0.05,
            message="every paced message stored",
        )
        at = store_times(bench.broker, topic)
        waits = sorted(max(0.0, at[k] - t * 1000) for k, t in committed.items())
        out.append(waits)
        print(
            f"  {db.name} paced round {number}: {len(waits)} of {rate * seconds:.0f} "
            f"transactions due at {rate:.0f} tx/s committed, p50 {statistics.median(waits):.1f} "
            f"ms, p99 {p99(waits):.1f} ms",
            flush=True,
        )
    return out


def p99(values: list[float]) -> float:
    """The 99th percentile of sorted ``values``."""
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def in_process_latency(
    bench: Bench, db: Database, seconds: float, rounds: int
) -> tuple[float, float, float]:
    """(p99 ms, p50 ms, sustained tx/s) with the relay in this process."""
    _, outbox, producer = bench.relay_app(db)
    outbox.start_relay(producer)
    try:
        rate = sustained(bench, db, outbox, bench.topic(), 1.0)
        print(f"  {db.name} sustained with the relay in process: {rate:.0f} tx/s", flush=True)
        rounds_ = paced(bench, db, outbox, rate / 2, seconds, rounds)
    finally:
        outbox.stop_relay()
    return (
        statistics.median(p99(r) for r in rounds_),
        statistics.median(statistics.median(r) for r in rounds_),
        rate,
    )


def process_latency(
    bench: Bench, db: Database, seconds: float, rounds: int
) -> tuple[float, float, float]:
    """(p99 ms, p50 ms, sustained tx/s) with the relay in a process of its own."""
    group = unique("bench_process")
    proc = RelayProcess(bench, db, group)
    try:
        proc.wait_ready()
        writer = Outbox(group=group, session_factory=db.sessions)
        topic = bench.topic()
        rate = sustained(bench, db, writer, topic, 1.0)
        print(f"  {db.name} sustained beside a relay process: {rate:.0f} tx/s", flush=True)
        rounds_ = paced(bench, db, writer, rate / 2, seconds, rounds)
    finally:
        proc.stop()
    return (
        statistics.median(p99(r) for r in rounds_),
        statistics.median(statistics.median(r) for r in rounds_),
        rate,
    )


def end_to_end(bench: Bench, db: Database, transactions: int) -> tuple[float, float]:
    """(outbox tx/s, half-message tx/s), each transaction's message stored on the broker."""
    _, outbox, producer = bench.relay_app(db)
    acks = Acks(producer)
    topic = bench.topic()
    outbox.start_relay(acks.sender)
    try:
        bench.with_outbox(db, outbox, topic, True)  # the topic's route
        wait_until(lambda: acks.count() >= 1, timeout=60, message="the first message")
        began = time.perf_counter()
        keys = [bench.with_outbox(db, outbox, topic, True) for _ in range(transactions)]
        wait_until(
            lambda: all(k in acks.at for k in keys),
            timeout=600,
            interval=0.005,
            message="every outbox message stored",
        )
        outbox_tps = transactions / (max(acks.at[k] for k in keys) - began)
    finally:
        outbox.stop_relay()

    class Pay:
        def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
            bench.plain(db)
            return LocalTransactionState.COMMIT

        def check_local(self, message: Message) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    app = TxMsg(bench.config(), backend="rocketmq")
    bench.apps.append(app)
    group = unique("bench_half")
    app.add_transactional_listener(Pay(), group=group, topics=[topic])
    app.start()
    tx_producer = app.transactional_producer(group)
    tx_producer.send_in_transaction(topic, BODY, arg=-1)  # routes, connections
    began = time.perf_counter()
    for n in range(transactions):
        result = tx_producer.send_in_transaction(topic, BODY, arg=n)
        if result.local_state is not LocalTransactionState.COMMIT:
            raise RuntimeError(f"half message {n}: {result}")
    half_tps = transactions / (time.perf_counter() - began)
    return outbox_tps, half_tps


def measure(bench: Bench, db: Database, args: argparse.Namespace, out: dict[str, float]) -> None:
    """Every figure of one database into ``out``."""
    name = db.name
    peaks = []
    for keyed in (False, True):
        kind = "keyed" if keyed else "keyless"
        got = writer_ratio(bench, db, keyed, args.seconds, args.rounds)
        out[f"writer_ratio_{name}_{kind}"] = got.ratio
        out[f"send_cpu_us_{name}_{kind}"] = got.send_cpu_us
        peaks.append(got.peak_tps)
        print(
            f"writer_ratio ({name}, {kind}) = {got.ratio:.3f} (goal >= 0.8), median of "
            f"{len(got.ratios)} rounds {sorted(round(r, 3) for r in got.ratios)}; outbox "
            f"{got.outbox_tps:.0f} tx/s (peak {got.peak_tps:.0f}), plain {got.plain_tps:.0f} "
            f"tx/s; outbox.send adds {got.send_cpu_us:.0f} us of the writer's CPU",
            flush=True,
        )
    peak = max(peaks)
    out[f"peak_tps_{name}"] = peak
    one = drain(bench, db, 1, args.backlog)
    out[f"drain_msgs_{name}"] = one.rate
    out[f"drain_ratio_{name}"] = one.rate / peak
    out[f"drain_relay_cpu_us_{name}"] = one.relay_us
    out[f"drain_broker_cpu_us_{name}"] = one.broker_us
    print(
        f"drain ({name}): one relay process sent {args.backlog} rows at {one.rate:.0f} msgs/s; "
        f"the writer's peak {peak:.0f} tx/s: drain_ratio = {one.rate / peak:.3f} (goal >= 1.2); "
        f"{one.relay_us:.0f} us of the relay's CPU and {one.broker_us:.0f} us of the broker's "
        f"per row ({one.relay_us * one.rate / 1e6:.2f} and {one.broker_us * one.rate / 1e6:.2f} "
        "cores while draining)",
        flush=True,
    )
    if name == "pg":
        two = drain(bench, db, 2, args.backlog)
        out["drain2_msgs_pg"] = two.rate
        out["drain2_ratio"] = two.rate / one.rate
        out["drain2_relay_cpu_us"] = two.relay_us
        out["drain2_broker_cpu_us"] = two.broker_us
        print(
            f"drain (pg): two relay processes {two.rate:.0f} msgs/s: drain2_ratio = "
            f"{two.rate / one.rate:.3f} (goal >= 1.6); {two.relay_us:.0f} us of the relays' CPU "
            f"and {two.broker_us:.0f} us of the broker's per row "
            f"({two.relay_us * two.rate / 1e6:.2f} and {two.broker_us * two.rate / 1e6:.2f} "
            "cores while draining)",
            flush=True,
        )
    p99_ms, p50_ms, rate = in_process_latency(bench, db, args.latency_seconds, args.latency_rounds)
    suffix = "" if name == "sqlite" else f"_{name}"
    out[f"p99_ms{suffix}"] = p99_ms
    out[f"p50_ms{suffix}"] = p50_ms
    out[f"sustained_tps{suffix}"] = rate
    print(
        f"commit -> stored, relay in process ({name}) at {rate / 2:.0f} tx/s: p50 {p50_ms:.1f} "
        f"ms, p99 {p99_ms:.1f} ms (medians of {args.latency_rounds} rounds; goal p99 <= 50 ms)",
        flush=True,
    )
    p99_ms, p50_ms, rate = process_latency(bench, db, args.latency_seconds, args.latency_rounds)
    suffix = "" if name == "pg" else f"_{name}"
    out[f"p99_process_ms{suffix}"] = p99_ms
    out[f"p50_process_ms{suffix}"] = p50_ms
    out[f"sustained_process_tps{suffix}"] = rate
    print(
        f"commit -> stored, relay in its own process ({name}) at {rate / 2:.0f} tx/s: p50 "
        f"{p50_ms:.1f} ms, p99 {p99_ms:.1f} ms"
        + (" (goal p99 <= 50 ms)" if name == "pg" else " (SQLite: no NOTIFY, the relay polls)"),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per writer window (1)")
    parser.add_argument("--rounds", type=int, default=5, help="writer window pairs per kind (5)")
    parser.add_argument("--backlog", type=int, default=8000, help="rows per drain (8000)")
    parser.add_argument("--messages", type=int, default=2000, help="vs_half size (2000)")
    parser.add_argument("--keys", type=int, default=64, help="sharding keys (64)")
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="per paced round (3)")
    parser.add_argument("--latency-rounds", type=int, default=3, help="paced rounds (3)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TXMSG_TEST_PG_URL") or None,
        help="PostgreSQL (default: TXMSG_TEST_PG_URL)",
    )
    parser.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    args = parser.parse_args(argv)
    ensure_client_log_dir()
    workdir = Path(tempfile.mkdtemp(prefix="outbox-throughput-"))
    logging.basicConfig(level=logging.WARNING, filename=str(workdir / "txmsg.log"))
    broker = BrokerProcess(str(workdir / "data"), str(workdir / "logs")).start()
    bench = Bench(broker, workdir, args.keys)
    load = os.getloadavg()[0]
    print(
        f"broker {broker.namesrv_addr} ({QUEUES} queues per topic), {args.keys} sharding keys, "
        f"{len(BODY)}-byte bodies; load average {load:.1f} on {os.cpu_count()} cores; logs in "
        f"{workdir}",
        flush=True,
    )
    out: dict[str, float] = {}
    try:
        with sqlite_database(workdir) as db:
            measure(bench, db, args, out)
            outbox_e2e, half_e2e = end_to_end(bench, db, args.messages)
            out["vs_half"] = outbox_e2e / half_e2e
            print(
                f"end to end: outbox {outbox_e2e:.0f} tx/s, half messages {half_e2e:.0f} tx/s: "
                f"vs_half = {out['vs_half']:.3f} (goal >= 1.0)",
                flush=True,
            )
        if args.database_url and not args.sqlite_only:
            with postgres_database(args.database_url) as pg:
                measure(bench, pg, args, out)
    finally:
        bench.close()
        broker.stop()
    writer = min(v for k, v in out.items() if k.startswith("writer_ratio_"))
    drained = min(v for k, v in out.items() if k.startswith("drain_ratio_"))
    end = os.getloadavg()[0]
    figures = " ".join(
        f"{k}={v:.0f}"
        if k.startswith(("send_cpu", "sustained", "peak", "drain_msgs", "drain2_m"))
        or "cpu_us" in k
        else f"{k}={v:.1f}"
        if k.startswith(("p99", "p50"))
        else f"{k}={v:.3f}"
        for k, v in out.items()
    )
    print(
        f"RESULT outbox writer_ratio={writer:.3f} drain_ratio={drained:.3f} {figures} "
        f"load={load:.1f} load_end={end:.1f} ratio={writer:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
