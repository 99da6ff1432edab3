"""Commit -> first delivery through the transactional outbox (issue 38, section 2).

    python -m benchmarks.delivery_latency [--rate 200] [--seconds 5] [--rounds 1] [--keys 64]
                                          [--backends rocketmq,rocketmq5]
                                          [--kinds plain,ordered] [--poll-interval 1.0]
                                          [--threads 4] [--timeline FILE]
                                          [--name-server HOST:PORT [--endpoints HOST:PORT]]

One embedded broker (child process) with its gRPC endpoint on, so it serves both backends:
``rocketmq`` (librocketmq 2.1.0 over remoting) and ``rocketmq5`` (the official 5.x client over
gRPC).  Per backend one app, as a service would run it: an outbox on a SQLite file with its relay
in the app's process, and two listeners of a *consumer* service on a SQLite file of its own (the
orderly listener parks there):

* **plain**: keyless outbox rows to a plain topic (NORMAL on RocketMQ 5), a concurrent listener
  (``@message_listener``, 4 threads);
* **ordered**: rows with a sharding key (``--keys`` keys) to an ordered topic (FIFO on RocketMQ 5)
  read by an orderly listener (``orderly=True``, 4 threads; on RocketMQ 5 its group is created as
  an orderly group first, as an operator would).

Topics and groups are created before anything starts (8 queues each), and a warm-up sends rows
until every row of a round reached its listener (routes, rebalance, queue locks), none of it
measured.  Then one writer thread runs business transactions paced at ``--rate`` per second for
``--seconds`` (an order row and one ``outbox.send`` each), per kind and round, and the figures are:

* ``<backend>_<kind>_p50_ms`` / ``_p99_ms``: the writer's ``commit()`` returned -> the listener
  called with that message the first time (the same process, one clock), over every message of
  the kind's rounds.  Goal p99 <= 100 ms on the embedded broker, both backends, both kinds.
* ``<backend>_<kind>_stored_p99_ms``: commit -> the relay's send answered by the broker (the relay
  and the broker's put), so the rest of the delivery p99 is the broker's hand-off to the consumer
  and the consumer's own path.
* ``<backend>_<kind>_handoff_p99_ms``: stored -> delivered, that rest (the broker's answer to the
  relay and the delivery race, so it is clipped at 0).
* ``<backend>_<kind>_cpu_us`` / ``_broker_cpu_us``: CPU time per message of this process (writer,
  relay, clients, listeners) and of the broker's process, median of the rounds: what the path
  needs of the machine, which the load disturbs far less than the latencies.  At 200 messages/s
  a path of 5 ms per message needs a whole core; on a shared 2-core machine above a load average
  of a few, the latencies measure the wait for CPU.

``--name-server`` (and ``--endpoints`` for rocketmq5) measures a real cluster instead (for a
report, never a test); ``broker_cpu_us`` is then 0.  The listeners run in the writer's process (one clock for both ends; a consumer service of its own
would take their CPU elsewhere but not off this 2-core machine).  Each round prints how many
messages were due, committed and delivered, and its longest business transaction (a writer that
stalls stalls its relay too); ``--timeline FILE`` appends every message's commit time, stored and
delivered ms.  The machine's load average is printed beside the figures (``load=``).  Final line::

    RESULT delivery rocketmq_plain_p50_ms=... rocketmq_plain_p99_ms=...
        rocketmq_plain_stored_p99_ms=... rocketmq_plain_handoff_p99_ms=...
        rocketmq_plain_cpu_us=... rocketmq_plain_broker_cpu_us=...
        (the same for rocketmq_ordered, rocketmq5_plain, rocketmq5_ordered) worst_p99_ms=...
        load=<1-min load average at the end> ratio=<100 ms / worst p99>
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import create_group, create_topic, unique

from benchmarks._answered import AnsweredSender
from benchmarks._orders import BenchOrder, OrderBase
from benchmarks._rmq_bench import ensure_client_log_dir, process_cpu, reached
from txmsg import Message, Producer, TxMsg, TxMsgConfig
from txmsg.message import DEDUP_KEY
from txmsg.sqla import create_engine, create_tables, make_session_factory

BODY = "x" * 128
QUEUES = 8
THREADS = 4
KINDS = ("plain", "ordered")
BACKENDS = ("rocketmq", "rocketmq5")
GOAL_P99_MS = 100.0


@dataclass(frozen=True)
class Target:
    """Where the backends connect: the embedded broker (and its process, for its CPU) or a real
    cluster given on the command line (``--name-server`` / ``--endpoints``)."""

    namesrv: str
    endpoint: str | None
    broker: BrokerProcess | None = None


class Clock:
    """First time each message key was seen (commit, stored, delivered), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}

    def note(self, key: str, when: float | None = None) -> None:
        now = time.perf_counter() if when is None else when
        with self.lock:
            self.at.setdefault(key, now)

    def get(self, key: str) -> float | None:
        with self.lock:
            return self.at.get(key)

    def has_all(self, keys: Sequence[str]) -> bool:
        with self.lock:
            return all(k in self.at for k in keys)


def stored_sender(producer: Producer, stored: Clock) -> AnsweredSender:
    """The relay's sender: the app's producer, noting when the broker answered each row's send."""
    return AnsweredSender(producer, stored.note)


@dataclass
class Figures:
    """Latencies (ms) of one backend and kind, over its rounds."""

    delivered: list[float] = field(default_factory=list)
    stored: list[float] = field(default_factory=list)
    handoff: list[float] = field(default_factory=list)
    """Stored -> delivered (ms): the broker's hand-off and the consumer's own path."""
    missing: int = 0
    cpu_us: list[float] = field(default_factory=list)
    """Per round: this process's CPU per message (µs)."""
    broker_cpu_us: list[float] = field(default_factory=list)
    """Per round: the broker process's CPU per message (µs)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class Service:
    """One backend: the producing service (outbox + in-process relay) and the consuming one."""

    def __init__(
        self,
        backend: str,
        target: Target,
        workdir: Path,
        keys: int,
        poll_interval: float,
        threads: int = THREADS,
    ) -> None:
        self.backend = backend
        self.keys = keys
        namesrv = target.namesrv
        fifo = backend == "rocketmq5"
        self.topics = {
            "plain": unique(f"Lat{backend}Plain"),
            "ordered": unique(f"Lat{backend}Ordered"),
        }
        create_topic(namesrv, self.topics["plain"], queues=QUEUES, message_type="NORMAL")
        create_topic(
            namesrv, self.topics["ordered"], queues=QUEUES, message_type="FIFO" if fifo else None
        )
        groups = {"plain": unique("cg_lat_plain"), "ordered": unique("cg_lat_ordered")}
        create_group(namesrv, groups["plain"])
        create_group(namesrv, groups["ordered"], orderly=True)

        self.engines: list[Engine] = []
        self.writer_db = self._database(workdir / f"{backend}-writer.db")
        self.writer_db_tables()
        consumer_db = self._database(workdir / f"{backend}-consumer.db")

        self.committed = Clock()
        self.stored = Clock()
        self.delivered = Clock()
        if fifo:
            endpoint = target.endpoint
            if endpoint is None:
                raise RuntimeError("no gRPC endpoint for the rocketmq5 backend (--endpoints)")
            config = TxMsgConfig(backend="rocketmq5", endpoints=endpoint, name_server=namesrv)
        else:
            config = TxMsgConfig(
                name_server=namesrv,
                client_log_dir=os.environ["ROCKETMQ_CLIENT_LOG_DIR"],
                instance_prefix=unique("lat"),
            )
        self.app = TxMsg(config, backend=backend)
        self.outbox = self.app.add_outbox(
            group=unique("lat_outbox"),
            session_factory=self.writer_db,
            relay=False,
            poll_interval=poll_interval,
        )
        self.app.add_producer(group=self.outbox.group)

        def listener(message: Message) -> None:
            key = message.properties.get(DEDUP_KEY)
            if key:
                self.delivered.note(key)

        self.app.add_message_listener(
            listener, topic=self.topics["plain"], group=groups["plain"], concurrency=threads
        )
        self.app.add_message_listener(
            listener,
            topic=self.topics["ordered"],
            group=groups["ordered"],
            concurrency=threads,
            orderly=True,
            session_factory=consumer_db,
        )
        self.app.start()
        self.outbox.start_relay(stored_sender(self.app.producer(self.outbox.group), self.stored))
        self.serial = 0
        self.longest = 0.0
        """The longest business transaction since the last round began (s)."""

    def _database(self, path: Path) -> sessionmaker[Session]:
        engine = create_engine(f"sqlite:///{path}")
        create_tables(engine)
        self.engines.append(engine)
        return make_session_factory(engine)

    def writer_db_tables(self) -> None:
        OrderBase.metadata.create_all(self.engines[-1])

    def transaction(self, kind: str) -> str:
        """One business transaction: an order row and one outbox row; its message key."""
        n = self.serial
        self.serial += 1
        began = time.perf_counter()
        with self.writer_db() as session, session.begin():
            session.add(BenchOrder(ref=f"o-{n}"))
            sharding_key = f"k{n % self.keys}" if kind == "ordered" else None
            receipt = self.outbox.send(session, self.topics[kind], BODY, sharding_key=sharding_key)
        committed = time.perf_counter()
        self.committed.note(receipt.message_key, committed)
        self.longest = max(self.longest, committed - began)
        return receipt.message_key

    def warm_up(self, kind: str, timeout: float = 90.0) -> bool:
        """Rows of every key until one whole round reached the listener within 5 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = [self.transaction(kind) for _ in range(self.keys)]
            if reached(functools.partial(self.delivered.has_all, batch), 5.0):
                return True
        return False

    def paced(self, kind: str, rate: float, seconds: float) -> list[str]:
        """Transactions at ``rate``/s for ``seconds`` (the schedule is kept: a late commit is
        followed at once by the next due one); their message keys."""
        interval = 1.0 / rate
        keys: list[str] = []
        began = time.perf_counter()
        n = 0
        while time.perf_counter() - began < seconds:
            pause = began + n * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            keys.append(self.transaction(kind))
            n += 1
        return keys

    def timeline(self, keys: Sequence[str]) -> list[tuple[float, float, float]]:
        """Per message of a round: (commit s from the round's first, stored ms, delivered ms);
        NaN where not seen."""
        first = self.committed.get(keys[0]) if keys else None
        rows = []
        for key in keys:
            commit = self.committed.get(key)
            if commit is None or first is None:
                continue
            stored, delivered = self.stored.get(key), self.delivered.get(key)
            rows.append(
                (
                    commit - first,
                    (stored - commit) * 1000 if stored is not None else float("nan"),
                    (delivered - commit) * 1000 if delivered is not None else float("nan"),
                )
            )
        return rows

    def figures(self, keys: Sequence[str], into: Figures) -> None:
        for key in keys:
            commit = self.committed.get(key)
            delivered, stored = self.delivered.get(key), self.stored.get(key)
            if commit is None or delivered is None:
                into.missing += 1
                continue
            into.delivered.append((delivered - commit) * 1000)
            if stored is not None:
                into.stored.append((stored - commit) * 1000)
                into.handoff.append(max(0.0, delivered - stored) * 1000)

    def close(self) -> None:
        self.outbox.stop_relay()
        self.app.close(timeout=20)
        for engine in self.engines:
            engine.dispose()


def broker_cpu(target: Target) -> float:
    """CPU seconds of the embedded broker's process so far (0.0 for a real cluster)."""
    proc = target.broker.proc if target.broker is not None else None
    return process_cpu(proc.pid) if proc is not None else 0.0


def run_backend(
    backend: str,
    target: Target,
    workdir: Path,
    args: argparse.Namespace,
    kinds: Sequence[str],
) -> dict[str, Figures]:
    service = Service(backend, target, workdir, args.keys, args.poll_interval, args.threads)
    out: dict[str, Figures] = {}
    try:
        for kind in kinds:
            began = time.monotonic()
            if not service.warm_up(kind):
                print(f"  {backend} {kind}: warm-up never completed", flush=True)
            print(f"  {backend} {kind}: warm in {time.monotonic() - began:.1f} s", flush=True)
            figures = out.setdefault(kind, Figures())
            for number in range(1, args.rounds + 1):
                cpu0, broker0 = time.process_time(), broker_cpu(target)
                service.longest = 0.0
                keys = service.paced(kind, args.rate, args.seconds)
                reached(functools.partial(service.delivered.has_all, keys), 60.0)
                cpu = (time.process_time() - cpu0) / max(len(keys), 1) * 1e6
                broker_us = (broker_cpu(target) - broker0) / max(len(keys), 1) * 1e6
                got = Figures()
                service.figures(keys, got)
                service.figures(keys, figures)
                figures.cpu_us.append(cpu)
                figures.broker_cpu_us.append(broker_us)
                if args.timeline:
                    with open(args.timeline, "a") as dump:
                        for at, stored, delivered in service.timeline(keys):
                            dump.write(
                                f"{backend} {kind} {number} {at:.4f} {stored:.2f} {delivered:.2f}\n"
                            )
                print(
                    f"  {backend} {kind} round {number}: {len(keys)} committed of "
                    f"{args.rate * args.seconds:.0f} due, {len(got.delivered)} delivered; "
                    f"commit->delivered p50 {percentile(got.delivered, 0.5):.1f} ms p99 "
                    f"{percentile(got.delivered, 0.99):.1f} ms max "
                    f"{max(got.delivered, default=float('nan')):.1f} ms; commit->stored p50 "
                    f"{percentile(got.stored, 0.5):.1f} ms p99 "
                    f"{percentile(got.stored, 0.99):.1f} ms; stored->delivered p50 "
                    f"{percentile(got.handoff, 0.5):.1f} ms p99 {percentile(got.handoff, 0.99):.1f} "
                    f"ms; longest transaction "
                    f"{service.longest * 1000:.0f} ms; CPU per message {cpu:.0f} us here "
                    f"(writer, relay, clients, listeners), {broker_us:.0f} us in the broker",
                    flush=True,
                )
    finally:
        service.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="transactions/s (200)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per round (5)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per backend and kind (1)")
    parser.add_argument("--keys", type=int, default=64, help="sharding keys (64)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="rocketmq,rocketmq5")
    parser.add_argument("--kinds", default=",".join(KINDS), help="plain,ordered")
    parser.add_argument(
        "--poll-interval", type=float, default=1.0, help="the relay's poll_interval (1.0)"
    )
    parser.add_argument(
        "--threads", type=int, default=THREADS, help=f"consumer threads ({THREADS})"
    )
    parser.add_argument(
        "--timeline", help="append each message's commit time, stored and delivered ms to FILE"
    )
    parser.add_argument(
        "--name-server",
        help="a real cluster's name server instead of the embedded broker (figures for a report; "
        "the topics and groups are created there)",
    )
    parser.add_argument("--endpoints", help="with --name-server: the 5.x proxy for rocketmq5")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    kinds = [k for k in args.kinds.split(",") if k]
    for name in backends:
        if name not in BACKENDS:
            parser.error(f"unknown backend {name!r}")
    if args.name_server and "rocketmq5" in backends and not args.endpoints:
        parser.error("--name-server with the rocketmq5 backend needs --endpoints (the proxy)")
    for name in kinds:
        if name not in KINDS:
            parser.error(f"unknown kind {name!r}")
    ensure_client_log_dir()
    workdir = Path(tempfile.mkdtemp(prefix="delivery-latency-"))
    logging.basicConfig(level=logging.WARNING, filename=str(workdir / "txmsg.log"))
    broker: BrokerProcess | None = None
    if args.name_server:
        target = Target(args.name_server, args.endpoints)
    else:
        broker = BrokerProcess(str(workdir / "data"), str(workdir / "logs"), grpc_port=0).start()
        target = Target(broker.namesrv_addr, broker.grpc_endpoint, broker)
    print(
        f"broker {target.namesrv} (gRPC {target.endpoint}), {QUEUES} queues per topic, "
        f"{args.rate:.0f} tx/s for {args.seconds:.0f} s x {args.rounds} round(s), {args.keys} "
        f"sharding keys, {args.threads} consumer threads; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores; logs in {workdir}",
        flush=True,
    )
    results: dict[str, Figures] = {}
    try:
        for backend in backends:
            for kind, figures in run_backend(backend, target, workdir, args, kinds).items():
                results[f"{backend}_{kind}"] = figures
    finally:
        if broker is not None:
            broker.stop()
    load = os.getloadavg()[0]
    parts: list[str] = []
    worst = 0.0
    for name, figures in results.items():
        p99 = percentile(figures.delivered, 0.99)
        worst = max(worst, p99) if figures.delivered else float("inf")
        parts += [
            f"{name}_p50_ms={percentile(figures.delivered, 0.5):.1f}",
            f"{name}_p99_ms={p99:.1f}",
            f"{name}_stored_p99_ms={percentile(figures.stored, 0.99):.1f}",
            f"{name}_handoff_p99_ms={percentile(figures.handoff, 0.99):.1f}",
            f"{name}_cpu_us={statistics.median(figures.cpu_us or [0.0]):.0f}",
            f"{name}_broker_cpu_us={statistics.median(figures.broker_cpu_us or [0.0]):.0f}",
        ]
        if figures.missing:
            parts.append(f"{name}_missing={figures.missing}")
    ratio = GOAL_P99_MS / worst if worst > 0 else float("nan")
    print(
        f"RESULT delivery {' '.join(parts)} worst_p99_ms={worst:.1f} load={load:.1f} "
        f"ratio={ratio:.3f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
