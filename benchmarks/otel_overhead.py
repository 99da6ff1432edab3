"""What OpenTelemetry costs txmsg: transactional sends and check-backs with the SDK recording
every span and metric, divided by the same without an SDK.

    python -m benchmarks.otel_overhead [--backend rocketmq|rocketmq5] [--rounds 8] [--seconds 2]
                                       [--check-rounds 3] [--threads 4] [--transactions 200]
                                       [--n 16] [--sleep 0.05]
                                       [--database-url postgresql+psycopg://...]

One embedded broker (child process; transactionTimeOut 0.2 s, check interval 3 s, as
``benchmarks.check_scaling``).  The global tracer and meter providers can be set once per process,
so each side is a child process of its own: **on** sets the SDK up first (a ``TracerProvider``
with the default sampler, always on, and a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter``; a ``MeterProvider`` with an ``InMemoryMetricReader``), **off** leaves the
API without an SDK (what an application that installs ``txmsg[otel]`` but configures nothing
gets).  Both children run for the whole benchmark and take turns, one measuring while the other
waits, with the machinery of the existing benchmarks:

* **send**: ``send_in_transaction`` throughput, ``--threads`` threads for ``--seconds``
  (:func:`benchmarks.send_overhead.measure`), on a group with the default ``ExecutorConfig``
  whose ``execute_local`` does what a transactional send is for: it writes the business row (one
  ORM ``INSERT`` of an order row in its own transaction through ``txmsg.sqla``: a SQLite file,
  WAL, ``BEGIN IMMEDIATE``, or the ``--database-url`` database) and answers COMMIT (the workload
  of ``benchmarks.outbox_throughput``'s ``vs_half``);
* **noop**: the same with an ``execute_local`` that answers COMMIT and does nothing: a send that
  is nothing but the client's own work, where telemetry weighs the most (what this benchmark
  measured alone before; kept and printed so the worst case stays visible);
* **check**: the check-back bound ratio of :func:`benchmarks.check_scaling.run_txmsg`
  (``--transactions`` UNKNOW transactions checked back on ``--n`` executor threads, ``check_local``
  taking ``--sleep`` s, the burst aligned with one broker check pass): check-backs/s over the
  best whole rounds of ``n`` checks allow.

Each child warms both senders up (50 sends each) before the first measurement.  A send ratio is
the median of ``--rounds`` on/off pairs of measurements taken back to back (alternating which side
goes first), a check ratio the median of ``--check-rounds`` pairs: pairs a few seconds apart see
nearly the same load on the shared machine, which drifts by more than the difference measured.
Each measurement also reports the CPU time its process spent per send (all threads, the client's
native ones included): ``send_cpu_ratio`` = off/on CPU per send, what the throughput ratio tends
to when sending is CPU-bound, and steadier.  The on child checks at the end that its exporter got
the spans (a run that recorded nothing would measure nothing); it drops them between
measurements, as :class:`_Counted` explains.
Final line: ``RESULT otel_overhead send_ratio=<x> check_ratio=<y> send_cpu_ratio=<z>
send_noop_ratio=<a> send_noop_cpu_ratio=<b> ratio=<min of x, y>`` (goal >= 0.95 for x and y).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from benchmarks._orders import BenchOrder, OrderBase
from txmsg import ExecutorConfig, LocalTransactionState, Message
from txmsg.listener import ListenerSpec
from txmsg.producer import TransactionalProducer
from txmsg.sqla import create_engine, make_session_factory

CHECK_INTERVAL_MS = 3000
TRANSACTION_TIMEOUT_MS = 200


@contextmanager
def orders_database(url: str | None, mode: str) -> Iterator[sessionmaker[Session]]:
    """A database of this child's own holding the order table: a SQLite file in a temporary
    folder, or with ``url`` a schema of its own, dropped at the end."""
    if url is None:
        with tempfile.TemporaryDirectory(prefix=f"otel-overhead-{mode}-") as folder:
            engine = create_engine(f"sqlite:///{Path(folder) / 'orders.db'}")
            try:
                OrderBase.metadata.create_all(engine)
                yield make_session_factory(engine)
            finally:
                engine.dispose()
        return
    schema = f"otel_bench_{mode}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = create_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    try:
        OrderBase.metadata.create_all(engine)
        yield make_session_factory(engine)
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def _sender(
    backend: Any, topic: str, sessions: sessionmaker[Session] | None
) -> tuple[Callable[[int], None], Callable[[], None]]:
    """``send_in_transaction`` on a group of its own (default ``ExecutorConfig``, as
    :func:`benchmarks.send_overhead.txmsg_sender`) whose ``execute_local`` writes an order row
    through ``sessions`` and commits, or with None does nothing and commits."""
    from benchmarks.send_overhead import BODY  # noqa: PLC0415 - after the SDK, as in child()

    class Orders:
        def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
            if sessions is not None:
                with sessions() as session, session.begin():
                    session.add(BenchOrder(ref=f"o-{arg}"))
            return LocalTransactionState.COMMIT

        def check_local(self, message: Message) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    kind = "noop" if sessions is None else "db"
    spec = ListenerSpec(
        group=f"otel_{kind}_{os.getpid()}",
        target=Orders,
        topics=(topic,),
        executor=ExecutorConfig(),
    )
    producer = TransactionalProducer.create(backend, spec, Orders())

    def send(i: int) -> None:
        producer.send_in_transaction(topic, BODY, arg=i, keys=f"k{i}")

    return send, lambda: producer.close(timeout=30)


def _install_sdk() -> Any:
    """The SDK as the global providers, recording everything in memory; returns the exporter."""
    from opentelemetry import metrics, trace  # noqa: PLC0415 - only in an `on` child
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return exporter


def _reply(out: dict[str, Any]) -> None:
    print("CHILD " + json.dumps(out), flush=True)


def child(args: argparse.Namespace) -> int:
    """One side (``--child on|off``), kept running for the whole run: it sets up its senders,
    answers ``CHILD {"ready": true}``, then measures what each line of its stdin asks
    (``send <send|noop> <seconds>``, ``check``) and answers ``CHILD {json}``; ``done`` ends it
    (its last answer counts the spans its exporter got)."""
    counted = _Counted(_install_sdk() if args.child == "on" else None)
    from benchmarks import check_scaling, send_overhead  # noqa: PLC0415 - after the SDK

    logging.basicConfig(level=logging.WARNING)

    class Config:
        name_server = args.namesrv
        endpoints = args.endpoints
        instance_prefix = f"otel{args.child}"

    if args.backend == "rocketmq5":
        from txmsg_rocketmq5.backend import RocketMQ5Backend  # noqa: PLC0415

        backend: Any = RocketMQ5Backend(Config())
    else:
        from txmsg_rocketmq.backend import RocketMQBackend  # noqa: PLC0415

        backend = RocketMQBackend(Config())
    consumers: Any = backend
    if args.backend == "rocketmq5":  # deliveries are counted over remoting, as check_scaling
        from txmsg_rocketmq.backend import RocketMQBackend  # noqa: PLC0415

        consumers = RocketMQBackend(Config())
    args.passes = check_scaling.CheckPasses(Path(args.log_dir) / "transaction.log")
    args.check_interval_ms = CHECK_INTERVAL_MS
    args.transaction_timeout_ms = TRANSACTION_TIMEOUT_MS
    args.max_wait = 180.0
    args.attempts = 3
    try:
        with orders_database(args.database_url, args.child) as sessions:
            senders = {
                "send": _sender(backend, args.topic, sessions),
                "noop": _sender(backend, args.topic, None),
            }
            try:
                for send, _ in senders.values():
                    for i in range(50):
                        send(i)
                _reply({"ready": True})
                for line in sys.stdin:
                    counted.take()  # between measurements, outside what is timed
                    command = line.split()
                    if command[0] == "send":
                        send = senders[command[1]][0]
                        cpu = time.process_time()
                        sent = send_overhead.measure(send, args.threads, float(command[2]))
                        cpu_us = (time.process_time() - cpu) / sent["count"] * 1e6
                        _reply({"rate": sent["rate"], "cpu_us": cpu_us})
                    elif command[0] == "check":
                        row = check_scaling.run_txmsg(
                            backend, args.namesrv, args.n, args, consumers=consumers
                        )
                        _reply({k: row[k] for k in ("bound_ratio", "rate", "complete")})
                    else:
                        break
            finally:
                for _, close in senders.values():
                    close()
    finally:
        if consumers is not backend:
            consumers.close(timeout=60)
        backend.close(timeout=60)
    counted.take()
    _reply({"spans": counted.spans, "check_spans": counted.checks})
    return 0


class _Counted:
    """What the in-memory exporter got, counted and dropped after each measurement.

    Why dropped: the in-memory exporter keeps every span for the life of the process, which no
    exporter of a service does (a batch processor hands them on and lets them go); tens of
    thousands of spans kept alive over a whole run make every full garbage collection of the on
    side slower and slower, a cost of the benchmark's length rather than of telemetry.  Each
    measurement still exports every span into the list synchronously."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.spans = 0
        self.checks = 0

    def take(self) -> None:
        if self.exporter is None:
            return
        spans = self.exporter.get_finished_spans()
        self.exporter.clear()
        self.spans += len(spans)
        self.checks += sum(s.name.startswith("check ") for s in spans)


class Child:
    """The parent's end of one :func:`child` process."""

    def __init__(self, mode: str, args: argparse.Namespace, broker: Any, topic: str) -> None:
        self.mode = mode
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.otel_overhead",
            "--child",
            mode,
            "--backend",
            args.backend,
            "--namesrv",
            broker.namesrv_addr,
            "--log-dir",
            str(broker.log_dir),
            "--topic",
            topic,
            "--threads",
            str(args.threads),
            "--transactions",
            str(args.transactions),
            "--n",
            str(args.n),
            "--sleep",
            str(args.sleep),
        ]
        if broker.grpc_endpoint:
            cmd += ["--endpoints", str(broker.grpc_endpoint)]
        if args.database_url:
            cmd += ["--database-url", args.database_url]
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        if self.proc.stdin is None or self.proc.stdout is None:  # pipes were asked for
            raise RuntimeError("the child has no pipes")
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.read()

    def _pump(self) -> None:
        """Hand the child's output lines to :meth:`read` (None at its end)."""
        for line in self._stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read(self, timeout: float = 900.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                break
            if line.startswith("CHILD "):
                result: dict[str, Any] = json.loads(line.removeprefix("CHILD "))
                return result
        self.stderr.seek(0)
        raise RuntimeError(
            f"the {self.mode} child stopped answering ({self.proc.poll()}):\n"
            f"{self.stderr.read()[-3000:]}"
        )

    def ask(self, command: str) -> dict[str, Any]:
        self._stdin.write(command + "\n")
        self._stdin.flush()
        return self.read()

    def close(self) -> dict[str, Any]:
        """End the child; its span counts."""
        try:
            return self.ask("done")
        finally:
            self.proc.wait(timeout=120)
            self.stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.stderr.close()


def start_broker(backend: str) -> Any:
    """The benchmark's embedded broker (child process; its timings: the module docstring)."""
    from txmsg_broker.app import BrokerProcess  # noqa: PLC0415

    # with gRPC the broker runs as 5.3.3: commit records batched well inside the 0.2 s timeout
    grpc: dict[str, Any] = (
        {"grpc_port": 0, "transaction_op_batch_interval_ms": 50} if backend == "rocketmq5" else {}
    )
    return BrokerProcess(
        transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        check_interval_ms=CHECK_INTERVAL_MS,
        check_max=15,
        delay_scale=0.001,
        **grpc,
    ).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("rocketmq", "rocketmq5"), default="rocketmq")
    parser.add_argument(
        "--rounds", type=int, default=8, help="off/on pairs of each send measurement"
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one send measurement")
    parser.add_argument("--check-rounds", type=int, default=3, help="off/on pairs of check runs")
    parser.add_argument("--threads", type=int, default=4, help="sending threads")
    parser.add_argument("--transactions", type=int, default=200, help="checked back per run")
    parser.add_argument("--n", type=int, default=16, help="check-backs at once (concurrency)")
    parser.add_argument("--sleep", type=float, default=0.05, help="check_local duration (s)")
    parser.add_argument(
        "--database-url", default=None, help="where execute_local writes (default: a SQLite file)"
    )
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--namesrv", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    from benchmarks._rmq_bench import create_topic, ensure_client_log_dir  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    ensure_client_log_dir()
    broker = start_broker(args.backend)
    topic = f"otel_overhead_{broker.namesrv_addr.rsplit(':', 1)[-1]}"
    create_topic(broker.namesrv_addr, topic)
    database = "PostgreSQL" if args.database_url else "a SQLite file"
    print(
        f"backend {args.backend}; an off and an on child taking turns: {args.rounds} pairs of "
        f"send_in_transaction {args.threads} threads x {args.seconds:g} s, execute_local writing "
        f"an order row to {database} (send) and doing nothing (noop); {args.check_rounds} pairs "
        f"of {args.transactions} check-backs on {args.n} threads, check_local {args.sleep:g} s",
        flush=True,
    )
    ratios: dict[str, list[float]] = {k: [] for k in ("send", "send_cpu", "noop", "noop_cpu")}
    ratios["check"] = []
    children: dict[str, Child] = {}
    spans: dict[str, Any] = {}
    try:
        for mode in ("off", "on"):
            children[mode] = Child(mode, args, broker, topic)
        for pair in range(args.rounds):
            order = ("off", "on") if pair % 2 == 0 else ("on", "off")
            for label in ("send", "noop"):
                got = {mode: children[mode].ask(f"send {label} {args.seconds}") for mode in order}
                ratios[label].append(got["on"]["rate"] / got["off"]["rate"])
                ratios[f"{label}_cpu"].append(got["off"]["cpu_us"] / got["on"]["cpu_us"])
                print(
                    f"pair {pair + 1} {label:>4}: off {got['off']['rate']:6.0f} tx/s "
                    f"({got['off']['cpu_us']:.0f} us CPU each), on {got['on']['rate']:6.0f} tx/s "
                    f"({got['on']['cpu_us']:.0f} us): on/off {ratios[label][-1]:.3f}, CPU per "
                    f"send off/on {ratios[f'{label}_cpu'][-1]:.3f}",
                    flush=True,
                )
        for pair in range(args.check_rounds):
            order = ("off", "on") if pair % 2 == 0 else ("on", "off")
            got = {mode: children[mode].ask("check") for mode in order}
            ratios["check"].append(got["on"]["bound_ratio"] / got["off"]["bound_ratio"])
            print(
                f"check pair {pair + 1}: "
                + ", ".join(
                    f"{mode} {got[mode]['rate']:.1f}/s (bound ratio "
                    f"{got[mode]['bound_ratio']:.3f}"
                    f"{'' if got[mode]['complete'] else ', INCOMPLETE'})"
                    for mode in ("off", "on")
                )
                + f": on/off {ratios['check'][-1]:.3f}",
                flush=True,
            )
        for mode in ("off", "on"):
            spans[mode] = children.pop(mode).close()
    finally:
        for left in children.values():
            left.kill()
        broker.stop()
    if not spans["on"]["spans"] or not spans["on"]["check_spans"]:
        raise RuntimeError(f"the on child recorded no spans: {spans['on']}")
    print(
        f"the on child's exporter got {spans['on']['spans']} spans ({spans['on']['check_spans']} check)"
    )
    median = {label: statistics.median(values) for label, values in ratios.items()}

    def listed(label: str) -> str:
        return f"{median[label]:.3f} ({', '.join(f'{r:.2f}' for r in ratios[label])})"

    print(
        f"medians: send {listed('send')}, CPU per send off/on {listed('send_cpu')}; "
        f"noop {listed('noop')}, CPU {listed('noop_cpu')}; check {listed('check')}"
    )
    print(
        f"RESULT otel_overhead send_ratio={median['send']:.3f} check_ratio={median['check']:.3f} "
        f"send_cpu_ratio={median['send_cpu']:.3f} send_noop_ratio={median['noop']:.3f} "
        f"send_noop_cpu_ratio={median['noop_cpu']:.3f} "
        f"ratio={min(median['send'], median['check']):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
