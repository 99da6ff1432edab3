"""The transactional outbox (issue 25): what it costs the commit path, how fast its relay sends,
how long a message waits, and end to end against half messages.

    python -m benchmarks.outbox_throughput [--seconds 3] [--rounds 2] [--messages 2000]
                                           [--keys 64] [--latency-seconds 4]
                                           [--database-url postgresql+psycopg://...]

One embedded broker (child process), the rocketmq backend (librocketmq 2.1.0), a SQLite file
(``txmsg.sqla.create_engine``: WAL, ``BEGIN IMMEDIATE``) and, with ``--database-url``, PostgreSQL
too (in a schema of its own, dropped at the end).  One writer thread throughout.

* ``commit_ratio``: business transactions/s with one ``outbox.send`` each (a keyed row, over
  ``--keys`` sharding keys), the relay running in the same process, / the same transactions
  without the outbox (one INSERT of an order row).  ``--rounds`` back-to-back pairs for
  ``--seconds`` each, alternating which goes first; the median of the pairs' ratios.  After each
  outbox run the relay drains what is left; the drain time is printed (the relay keeps up when it
  is near zero).  Goal >= 0.8.  ``commit_ratio_pg``: the same on PostgreSQL.
* ``relay_ratio``: ``--messages`` keyed rows written first, then a relay started: messages/s
  until the outbox is empty, / the raw client's plain sends (``Producer.send_sync`` of
  rocketmq-client-python, one thread) of the same number of messages of the same size to the same
  topic, measured in the same run.  Goal >= 0.8.
* ``p50_ms`` / ``p99_ms``: commit (the writer's ``commit()`` returned) to stored on the broker
  (the relay's send answered), with the writer paced at half the relay's rate measured above,
  for ``--latency-seconds``.  Goal p99 <= 50 ms.
* ``vs_half``: end-to-end transactions/s (each transaction's message stored on the broker) through
  the outbox / through ``send_in_transaction`` whose ``execute_local`` writes the same order row
  (``--messages`` transactions each).  Reported, no goal.

Final line::

    RESULT outbox commit_ratio=<x> relay_ratio=<y> p50_ms=<a> p99_ms=<b> vs_half=<z>
        [commit_ratio_pg=<x>] outbox_tps=... plain_tps=... relay_msgs=... raw_msgs=...
        ratio=<min(commit_ratio, relay_ratio)>
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Integer, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import create_topic, unique, wait_until

from benchmarks._rmq_bench import ensure_client_log_dir, remoting_sender
from txmsg import LocalTransactionState, Message, Producer, TxMsg, TxMsgConfig
from txmsg.message import DEDUP_KEY, SendResult
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.outbox import Outbox

BODY = "x" * 128
QUEUES = 8


class Base(DeclarativeBase):
    pass


class BenchOrder(Base):
    """The business row of every transaction."""

    __tablename__ = "outbox_bench_order"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ref: Mapped[str] = mapped_column(String(64))


@dataclass
class Database:
    name: str
    engine: Engine
    sessions: sessionmaker[Session]


@contextmanager
def sqlite_database(workdir: Path) -> Iterator[Database]:
    engine = create_engine(f"sqlite:///{workdir / 'bench.db'}")
    create_tables(engine)
    Base.metadata.create_all(engine)
    try:
        yield Database("sqlite", engine, make_session_factory(engine))
    finally:
        engine.dispose()


@contextmanager
def postgres_database(url: str) -> Iterator[Database]:
    schema = f"outbox_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = create_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    create_tables(engine)
    Base.metadata.create_all(engine)
    try:
        yield Database("postgresql", engine, make_session_factory(engine))
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


class Acks:
    """The relay's sender: the app's producer, noting when each row's send was answered."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}

    def _note(self, properties: Mapping[str, Any] | None, future: Future[SendResult]) -> None:
        key = str((properties or {}).get(DEDUP_KEY, ""))

        def done(f: Future[SendResult]) -> None:
            if f.exception() is None:
                now = time.perf_counter()
                with self.lock:
                    self.at.setdefault(key, now)

        future.add_done_callback(done)

    def count(self) -> int:
        with self.lock:
            return len(self.at)

    def send_async(
        self,
        topic: str,
        payload: Any,
        *,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
        delay_level: int | None = None,
        deliver_at: datetime | float | None = None,
    ) -> Future[SendResult]:
        future = self.producer.send_async(
            topic,
            payload,
            keys=keys,
            tags=tags,
            properties=properties,
            delay_level=delay_level,
            deliver_at=deliver_at,
        )
        self._note(properties, future)
        return future

    def send_orderly_async(
        self,
        topic: str,
        payload: Any,
        *,
        sharding_key: str,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> Future[SendResult]:
        future = self.producer.send_orderly_async(
            topic, payload, sharding_key=sharding_key, keys=keys, tags=tags, properties=properties
        )
        self._note(properties, future)
        return future


class Bench:
    """One broker, one topic, the apps the measurements share."""

    def __init__(self, namesrv: str, workdir: Path, keys: int) -> None:
        self.namesrv = namesrv
        self.workdir = workdir
        self.keys = keys
        self.topic = unique("OutboxBench")
        create_topic(namesrv, self.topic, queues=QUEUES)
        self.apps: list[TxMsg] = []

    def config(self) -> TxMsgConfig:
        return TxMsgConfig(
            name_server=self.namesrv,
            client_log_dir=str(self.workdir / "client-logs"),
            instance_prefix=unique("ob"),
        )

    def relay_app(self, db: Database) -> tuple[TxMsg, Outbox, Acks]:
        """An app with an outbox whose relay (over :class:`Acks`) is not started yet."""
        app = TxMsg(self.config(), backend="rocketmq")
        self.apps.append(app)
        outbox = app.add_outbox(
            group=unique("bench_outbox"), session_factory=db.sessions, relay=False
        )
        app.add_producer(group=outbox.group)
        app.start()
        return app, outbox, Acks(app.producer(outbox.group))

    def close(self) -> None:
        for app in self.apps:
            app.close(timeout=20)

    # ---- the writer's transactions --------------------------------------------------------------
    def plain(self, db: Database, n: int) -> None:
        with db.sessions() as session, session.begin():
            session.add(BenchOrder(ref=f"o-{n}"))

    def with_outbox(self, db: Database, outbox: Outbox, n: int) -> str:
        with db.sessions() as session, session.begin():
            session.add(BenchOrder(ref=f"o-{n}"))
            receipt = outbox.send(session, self.topic, BODY, sharding_key=f"k{n % self.keys}")
        return receipt.message_key


def rate_of(work: Any, seconds: float) -> float:
    """Calls of ``work(n)`` per second for ``seconds``."""
    n = 0
    began = time.perf_counter()
    stop = began + seconds
    while time.perf_counter() < stop:
        work(n)
        n += 1
    return n / (time.perf_counter() - began)


def commit_ratio(
    bench: Bench, db: Database, seconds: float, rounds: int
) -> tuple[float, float, float]:
    """(median ratio, best outbox tx/s, best plain tx/s) - see the module docstring."""
    _, outbox, acks = bench.relay_app(db)
    outbox.start_relay(acks)
    ratios: list[float] = []
    best = {"outbox": 0.0, "plain": 0.0}
    try:
        for round_no in range(rounds):
            order = ["plain", "outbox"] if round_no % 2 == 0 else ["outbox", "plain"]
            got: dict[str, float] = {}
            for name in order:
                if name == "plain":
                    got[name] = rate_of(lambda n: bench.plain(db, n), seconds)
                else:
                    sent_before = acks.count()
                    got[name] = rate_of(lambda n: bench.with_outbox(db, outbox, n), seconds)
                    written = round(got[name] * seconds)
                    t0 = time.perf_counter()
                    wait_until(
                        lambda: outbox.stats().unsent == 0,
                        timeout=300,
                        message="the relay to drain the outbox",
                    )
                    print(
                        f"  {db.name} outbox run: {got[name]:.0f} tx/s; the relay drained what "
                        f"was left in {time.perf_counter() - t0:.2f} s "
                        f"({acks.count() - sent_before} of ~{written} sent)",
                        flush=True,
                    )
                best[name] = max(best[name], got[name])
            ratios.append(got["outbox"] / got["plain"])
            print(
                f"  {db.name} round {round_no + 1}: plain {got['plain']:.0f} tx/s, outbox "
                f"{got['outbox']:.0f} tx/s, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    finally:
        outbox.stop_relay()
    return statistics.median(ratios), best["outbox"], best["plain"]


def relay_rate(bench: Bench, db: Database, messages: int) -> float:
    """Messages/s of a relay emptying ``messages`` rows written beforehand."""
    _, outbox, acks = bench.relay_app(db)
    for n in range(messages):
        bench.with_outbox(db, outbox, n)
    began = time.perf_counter()
    outbox.start_relay(acks)
    try:
        wait_until(
            lambda: acks.count() >= messages,
            timeout=600,
            interval=0.005,
            message="the relay to send every row",
        )
        elapsed = max(acks.at.values()) - began
    finally:
        outbox.stop_relay()
    return messages / elapsed


def raw_rate(bench: Bench, messages: int) -> float:
    """The raw client's plain sends (one thread) of ``messages`` messages."""
    send_one, producer = remoting_sender("plain", bench.namesrv, bench.topic, BODY.encode())
    try:
        send_one()  # routes, connection: not measured
        began = time.perf_counter()
        for _ in range(messages):
            if not send_one():
                raise RuntimeError("the raw client's send was not SEND_OK")
        return messages / (time.perf_counter() - began)
    finally:
        producer.shutdown()


def latencies(bench: Bench, db: Database, rate: float, seconds: float) -> list[float]:
    """Commit -> stored (ms) of transactions paced at ``rate``/s for ``seconds``."""
    _, outbox, acks = bench.relay_app(db)
    outbox.start_relay(acks)
    committed: dict[str, float] = {}
    try:
        interval = 1.0 / rate
        began = time.perf_counter()
        n = 0
        while time.perf_counter() - began < seconds:
            due = began + n * interval
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            key = bench.with_outbox(db, outbox, n)
            committed[key] = time.perf_counter()
            n += 1
        wait_until(
            lambda: all(k in acks.at for k in committed),
            timeout=120,
            interval=0.01,
            message="every paced message stored",
        )
    finally:
        outbox.stop_relay()
    return sorted(max(0.0, acks.at[k] - t) * 1000 for k, t in committed.items())


def end_to_end(bench: Bench, db: Database, transactions: int) -> tuple[float, float]:
    """(outbox tx/s, half-message tx/s), each transaction's message stored on the broker."""
    _, outbox, acks = bench.relay_app(db)
    outbox.start_relay(acks)
    try:
        began = time.perf_counter()
        keys = [bench.with_outbox(db, outbox, n) for n in range(transactions)]
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
            bench.plain(db, int(arg))
            return LocalTransactionState.COMMIT

        def check_local(self, message: Message) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    app = TxMsg(bench.config(), backend="rocketmq")
    bench.apps.append(app)
    group = unique("bench_half")
    app.add_transactional_listener(Pay(), group=group, topics=[bench.topic])
    app.start()
    producer = app.producer(group)
    producer.send_in_transaction(bench.topic, BODY, arg=-1)  # routes, connections
    began = time.perf_counter()
    for n in range(transactions):
        result = producer.send_in_transaction(bench.topic, BODY, arg=n)
        if result.local_state is not LocalTransactionState.COMMIT:
            raise RuntimeError(f"half message {n}: {result}")
    half_tps = transactions / (time.perf_counter() - began)
    return outbox_tps, half_tps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per commit-rate run (3)")
    parser.add_argument("--rounds", type=int, default=2, help="plain/outbox pairs (2)")
    parser.add_argument(
        "--messages", type=int, default=2000, help="relay and end-to-end size (2000)"
    )
    parser.add_argument("--keys", type=int, default=64, help="sharding keys (64)")
    parser.add_argument("--latency-seconds", type=float, default=4.0, help="paced run (4)")
    parser.add_argument("--database-url", help="PostgreSQL too (commit_ratio_pg)")
    args = parser.parse_args(argv)
    ensure_client_log_dir()
    workdir = Path(tempfile.mkdtemp(prefix="outbox-throughput-"))
    logging.basicConfig(level=logging.WARNING, filename=str(workdir / "txmsg.log"))
    broker = BrokerProcess(str(workdir / "data"), str(workdir / "logs")).start()
    bench = Bench(broker.namesrv_addr, workdir, args.keys)
    print(
        f"broker {broker.namesrv_addr}, topic {bench.topic} ({QUEUES} queues), {args.keys} "
        f"sharding keys, {len(BODY)}-byte bodies; logs in {workdir}",
        flush=True,
    )
    extra: dict[str, float] = {}
    try:
        with sqlite_database(workdir) as db:
            ratio, outbox_tps, plain_tps = commit_ratio(bench, db, args.seconds, args.rounds)
            print(f"commit_ratio (SQLite) = {ratio:.3f} (goal >= 0.8)", flush=True)
            relay = relay_rate(bench, db, args.messages)
            raw = raw_rate(bench, args.messages)
            relay_ratio = relay / raw
            print(
                f"relay {relay:.0f} msgs/s, raw plain sends {raw:.0f} msgs/s: relay_ratio = "
                f"{relay_ratio:.3f} (goal >= 0.8)",
                flush=True,
            )
            paced = latencies(bench, db, relay / 2, args.latency_seconds)
            p50 = statistics.median(paced)
            p99 = paced[min(len(paced) - 1, int(len(paced) * 0.99))]
            print(
                f"commit -> stored at {relay / 2:.0f} tx/s ({len(paced)} messages): p50 "
                f"{p50:.1f} ms, p99 {p99:.1f} ms (goal p99 <= 50 ms)",
                flush=True,
            )
            outbox_e2e, half_e2e = end_to_end(bench, db, args.messages)
            vs_half = outbox_e2e / half_e2e
            print(
                f"end to end: outbox {outbox_e2e:.0f} tx/s, half messages {half_e2e:.0f} tx/s: "
                f"vs_half = {vs_half:.3f}",
                flush=True,
            )
        if args.database_url:
            with postgres_database(args.database_url) as pg:
                extra["commit_ratio_pg"], _, _ = commit_ratio(bench, pg, args.seconds, args.rounds)
                print(f"commit_ratio (PostgreSQL) = {extra['commit_ratio_pg']:.3f}", flush=True)
    finally:
        bench.close()
        broker.stop()
    more = "".join(f" {name}={value:.3f}" for name, value in extra.items())
    print(
        f"RESULT outbox commit_ratio={ratio:.3f} relay_ratio={relay_ratio:.3f} p50_ms={p50:.1f} "
        f"p99_ms={p99:.1f} vs_half={vs_half:.3f}{more} outbox_tps={outbox_tps:.0f} "
        f"plain_tps={plain_tps:.0f} relay_msgs={relay:.0f} raw_msgs={raw:.0f} "
        f"ratio={min(ratio, relay_ratio):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
