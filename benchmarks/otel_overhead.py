"""What OpenTelemetry costs txmsg, in the set-ups services run (issue 38.4): transactional sends
and check-backs with the SDK configured for production, always on, and the API alone, each divided
by the same with txmsg's telemetry absent.

    python -m benchmarks.otel_overhead [--backend rocketmq|rocketmq5] [--rounds 6] [--seconds 2]
                                       [--check-rounds 3] [--threads 4] [--transactions 200]
                                       [--n 16] [--sleep 0.05] [--simple]
                                       [--database-url postgresql+psycopg://...]

One embedded broker (child process; transactionTimeOut 0.2 s, check interval 3 s, as
``benchmarks.check_scaling``).  The global tracer and meter providers can be set once per process,
so each side is a child process of its own:

* **none**: txmsg without OpenTelemetry (its loader answers "not installed", as without
  ``opentelemetry-api``): the baseline every ratio divides by;
* **api**: the API installed, no SDK configured (what ``pip install 'txmsg[otel]'`` alone gives);
* **sampled**: the production set-up: a ``TracerProvider`` with
  ``ParentBased(TraceIdRatioBased(0.1))`` and a ``BatchSpanProcessor``, a ``MeterProvider`` with a
  ``PeriodicExportingMetricReader`` (every 5 s); the exporters take what they get and keep nothing
  (an OTLP exporter sends it; the network is not what is measured);
* **on**: the same with the default sampler, always on: every send and check-back recorded;
* **simple** (with ``--simple``): what this benchmark measured until 2026-11-29: always on, a
  ``SimpleSpanProcessor`` (each span exported on the sending thread), the in-memory metric reader.

All children run for the whole benchmark and take turns, one measuring while the others wait
(the first side rotating from round to round), with the machinery of the existing benchmarks:

* **send**: ``send_in_transaction`` throughput, ``--threads`` threads for ``--seconds``
  (:func:`benchmarks.send_overhead.measure`), on a group with the default ``ExecutorConfig``
  whose ``execute_local`` does what a transactional send is for: it writes the business row (one
  ORM ``INSERT`` of an order row in its own transaction through ``txmsg.sqla``: a SQLite file,
  WAL, ``BEGIN IMMEDIATE``, or the ``--database-url`` database) and answers COMMIT;
* **noop**: the same with an ``execute_local`` that answers COMMIT and does nothing: a send that
  is nothing but the client's own work, where telemetry weighs the most (printed, no goal);
* **check**: the check-back bound ratio of :func:`benchmarks.check_scaling.run_txmsg`
  (``--transactions`` UNKNOW transactions checked back on ``--n`` executor threads, ``check_local``
  taking ``--sleep`` s, the burst aligned with one broker check pass) of none, sampled and on.

Each child warms both senders up (50 sends each) before the first measurement.  A send ratio is
the median over the rounds of side/none, both measured in the same round seconds apart (the
machine's load drifts by more than the difference measured); each measurement also reports the
CPU time its process spent per send (all threads, the client's native ones included):
``send_added_us`` is what the production set-up adds to a writing send's CPU (sampled - none,
median of the rounds), ``*_cpu_ratio*`` none/side CPU per send, what the throughput ratio tends to
when sending is CPU-bound, and steadier.  Each send measurement is also split by thread kind
(:mod:`benchmarks._thread_cpu`: the sending threads, the SDK's export threads, txmsg's, the
client's native ones), printed as the added CPU per kind over ``none``'s (medians of the rounds):
where the telemetry's cost lands.  The SDK children check at the end that their exporter
got spans (a run that recorded nothing would measure nothing).

Final line::

    RESULT otel_overhead send_ratio_sampled=<x> send_ratio=<on> send_ratio_api=<api>
        check_ratio=<sampled> check_ratio_on=<on> send_added_us=<us> send_added_us_on=<us>
        send_added_us_api=<us> send_cpu_ratio_sampled=... send_cpu_ratio=... send_cpu_ratio_api=...
        [send_ratio_simple=...] send_noop_ratio_sampled=... send_noop_ratio=...
        send_noop_ratio_api=... noop_added_us=<us> ratio=<min of send_ratio_sampled, check_ratio>

Goals (issue 38.4): ``send_ratio_sampled`` >= 0.95, ``send_ratio`` (always on, batch) >= 0.85,
``check_ratio`` >= 0.95, ``send_ratio_api`` >= 0.99.
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

from benchmarks import _thread_cpu
from benchmarks._orders import BenchOrder, OrderBase
from txmsg import ExecutorConfig, LocalTransactionState, Message
from txmsg.listener import ListenerSpec
from txmsg.producer import TransactionalProducer
from txmsg.sqla import create_engine, make_session_factory

CHECK_INTERVAL_MS = 3000
METRICS_INTERVAL_MS = 5000
"""The periodic metric reader's interval (the SDK's default is 60 s: a run would see none)."""
MODES = ("none", "api", "sampled", "on", "simple")
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


def _install_sdk(mode: str) -> tuple[Any, Any]:
    """The child's telemetry as ``mode`` says (the module docstring); returns the span
    exporter (None without an SDK) and the tracer provider (to flush at the end)."""
    if mode == "none":  # txmsg as if opentelemetry-api were not installed
        from txmsg.otel import _runtime  # noqa: PLC0415

        _runtime._tried = True  # what otel() finds without the package
        _runtime._loaded = None
        return None, None
    if mode == "api":
        return None, None
    from opentelemetry import metrics, trace  # noqa: PLC0415 - only in an SDK child
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
        InMemoryMetricReader,
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415
        ALWAYS_ON,
        ParentBased,
        TraceIdRatioBased,
    )

    class Metrics(MetricExporter):
        """Takes each periodic export and drops it (as an OTLP exporter would, sent)."""

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            return None

    class CountingSpans(SpanExporter):
        """Counts the spans it gets and keeps none (a service's exporter hands them on and lets
        them go; the in-memory one keeps them for the life of the process)."""

        def __init__(self) -> None:
            self.spans = 0
            self.checks = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.spans += len(spans)
            self.checks += sum(s.name.startswith("check ") for s in spans)
            return SpanExportResult.SUCCESS

    exporter = CountingSpans()
    sampler = ParentBased(TraceIdRatioBased(0.1)) if mode == "sampled" else ALWAYS_ON
    provider = TracerProvider(sampler=sampler)
    if mode == "simple":  # what this benchmark measured before 2026-11-29: every span exported
        provider.add_span_processor(SimpleSpanProcessor(exporter))  # synchronously
        reader: Any = InMemoryMetricReader()
    else:
        provider.add_span_processor(BatchSpanProcessor(exporter))
        reader = PeriodicExportingMetricReader(
            Metrics(), export_interval_millis=METRICS_INTERVAL_MS
        )
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return exporter, provider


def _reply(out: dict[str, Any]) -> None:
    print("CHILD " + json.dumps(out), flush=True)


_KINDS = {"ended": "senders"}
"""The sending threads of :func:`benchmarks.send_overhead.measure` end with the measurement, so
:func:`benchmarks._thread_cpu.split` counts them as ``ended``: named ``senders`` here."""


def _kind(thread: threading.Thread) -> str:
    """The thread kinds of a child's CPU split: the SDK's export threads, txmsg's own, the rest
    (threads Python does not know, librocketmq's, are ``native``)."""
    name = thread.name
    if name.startswith("Otel"):
        return "otel-export"
    if name.startswith("txmsg"):
        return "txmsg"
    return "other"


def child(args: argparse.Namespace) -> int:
    """One side (``--child on|off``), kept running for the whole run: it sets up its senders,
    answers ``CHILD {"ready": true}``, then measures what each line of its stdin asks
    (``send <send|noop> <seconds>``, ``check``) and answers ``CHILD {json}``; ``done`` ends it
    (its last answer counts the spans its exporter got)."""
    exporter, provider = _install_sdk(args.child)
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
                    command = line.split()
                    if command[0] == "send":
                        send = senders[command[1]][0]
                        threads = _thread_cpu.snapshot()
                        cpu = time.process_time()
                        sent = send_overhead.measure(send, args.threads, float(command[2]))
                        cpu_us = (time.process_time() - cpu) / sent["count"] * 1e6
                        by_kind = _thread_cpu.split(threads, _thread_cpu.snapshot(), _kind)
                        _reply(
                            {
                                "rate": sent["rate"],
                                "cpu_us": cpu_us,
                                "by_thread": {
                                    _KINDS.get(k, k): v / sent["count"] * 1e6
                                    for k, v in by_kind.items()
                                },
                            }
                        )
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
    if provider is not None:
        provider.force_flush()
    _reply(
        {
            "spans": exporter.spans if exporter else 0,
            "check_spans": exporter.checks if exporter else 0,
        }
    )
    return 0


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
        "--rounds", type=int, default=6, help="rounds of each send measurement (every side once)"
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one send measurement")
    parser.add_argument("--check-rounds", type=int, default=3, help="rounds of check runs")
    parser.add_argument("--threads", type=int, default=4, help="sending threads")
    parser.add_argument("--transactions", type=int, default=200, help="checked back per run")
    parser.add_argument("--n", type=int, default=16, help="check-backs at once (concurrency)")
    parser.add_argument("--sleep", type=float, default=0.05, help="check_local duration (s)")
    parser.add_argument(
        "--database-url", default=None, help="where execute_local writes (default: a SQLite file)"
    )
    parser.add_argument(
        "--simple",
        action="store_true",
        help="also run the set-up this benchmark measured before 2026-11-29 (always on, a "
        "SimpleSpanProcessor, the in-memory metric reader) as a side: send_ratio_simple",
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
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
    modes = [m for m in MODES if args.simple or m != "simple"]
    checked = [m for m in ("none", "sampled", "on")]
    print(
        f"backend {args.backend}; children {', '.join(modes)} taking turns: {args.rounds} rounds "
        f"of send_in_transaction {args.threads} threads x {args.seconds:g} s, execute_local "
        f"writing an order row to {database} (send) and doing nothing (noop); "
        f"{args.check_rounds} rounds of {args.transactions} check-backs ({', '.join(checked)}) "
        f"on {args.n} threads, check_local {args.sleep:g} s",
        flush=True,
    )
    # per side and kind: each round's throughput and CPU per send, and the ratios to "none"
    got: dict[str, dict[str, list[dict[str, float]]]] = {
        label: {m: [] for m in modes} for label in ("send", "noop")
    }
    ratio: dict[str, list[float]] = {}
    # label -> mode -> thread kind -> each round's CPU µs a send over "none"'s of that kind
    added_by: dict[str, dict[str, dict[str, list[float]]]] = {"send": {}, "noop": {}}
    checks: dict[str, list[float]] = {m: [] for m in checked}
    children: dict[str, Child] = {}
    spans: dict[str, Any] = {}
    try:
        for mode in modes:
            children[mode] = Child(mode, args, broker, topic)
        for pair in range(args.rounds):
            order = modes[pair % len(modes) :] + modes[: pair % len(modes)]
            for label in ("send", "noop"):
                this = {mode: children[mode].ask(f"send {label} {args.seconds}") for mode in order}
                for mode in modes:
                    got[label][mode].append(this[mode])
                    if mode != "none":
                        ratio.setdefault(f"{label}_{mode}", []).append(
                            this[mode]["rate"] / this["none"]["rate"]
                        )
                        ratio.setdefault(f"{label}_cpu_{mode}", []).append(
                            this["none"]["cpu_us"] / this[mode]["cpu_us"]
                        )
                        ratio.setdefault(f"{label}_added_{mode}", []).append(
                            this[mode]["cpu_us"] - this["none"]["cpu_us"]
                        )
                        base = this["none"]["by_thread"]
                        for kind, us in this[mode]["by_thread"].items():
                            added_by[label].setdefault(mode, {}).setdefault(kind, []).append(
                                us - base.get(kind, 0.0)
                            )
                print(
                    f"round {pair + 1} {label:>4}: "
                    + ", ".join(
                        f"{mode} {this[mode]['rate']:.0f} tx/s {this[mode]['cpu_us']:.0f} us"
                        + (
                            ""
                            if mode == "none"
                            else f" ({ratio[f'{label}_{mode}'][-1]:.3f}, "
                            f"+{ratio[f'{label}_added_{mode}'][-1]:.0f} us)"
                        )
                        for mode in modes
                    ),
                    flush=True,
                )
        for pair in range(args.check_rounds):
            order = checked[pair % len(checked) :] + checked[: pair % len(checked)]
            this = {mode: children[mode].ask("check") for mode in order}
            for mode in checked:
                checks[mode].append(this[mode]["bound_ratio"])
            print(
                f"check round {pair + 1}: "
                + ", ".join(
                    f"{mode} {this[mode]['rate']:.1f}/s (bound ratio "
                    f"{this[mode]['bound_ratio']:.3f}"
                    f"{'' if this[mode]['complete'] else ', INCOMPLETE'})"
                    for mode in checked
                ),
                flush=True,
            )
        for mode in modes:
            spans[mode] = children.pop(mode).close()
    finally:
        for left in children.values():
            left.kill()
        broker.stop()
    for mode in ("sampled", "on"):
        if not spans[mode]["spans"] or not spans[mode]["check_spans"]:
            raise RuntimeError(f"the {mode} child exported no spans: {spans[mode]}")
    print(
        "spans exported: "
        + ", ".join(
            f"{mode} {spans[mode]['spans']} ({spans[mode]['check_spans']} check)"
            for mode in modes
            if mode not in ("none", "api")
        )
    )
    median = {label: statistics.median(values) for label, values in ratio.items()}
    check_ratio = {
        mode: statistics.median(
            [
                c / base if base else 0.0
                for c, base in zip(checks[mode], checks["none"], strict=True)
            ]
        )
        for mode in checked
    }
    for label in ("send", "noop"):
        print(
            f"medians, {label}: "
            + "; ".join(
                f"{mode} {median[f'{label}_{mode}']:.3f} "
                f"({', '.join(f'{r:.2f}' for r in ratio[f'{label}_{mode}'])}), CPU "
                f"{median[f'{label}_cpu_{mode}']:.3f}, +{median[f'{label}_added_{mode}']:.0f} us"
                for mode in modes
                if mode != "none"
            )
        )
    for label in ("send", "noop"):
        print(
            f"added CPU by thread, {label} (µs a send over none's, medians of the rounds): "
            + "; ".join(
                f"{mode} "
                + " ".join(
                    f"{kind} {statistics.median(values):+.0f}"
                    for kind, values in sorted(
                        added_by[label][mode].items(), key=lambda kv: -statistics.median(kv[1])
                    )
                )
                for mode in modes
                if mode in added_by[label]
            )
        )
    print(
        "check bound ratios: "
        + "; ".join(f"{mode} {', '.join(f'{c:.3f}' for c in checks[mode])}" for mode in checked)
    )
    simple = f"send_ratio_simple={median['send_simple']:.3f} " if args.simple else ""
    print(
        f"RESULT otel_overhead send_ratio_sampled={median['send_sampled']:.3f} "
        f"send_ratio={median['send_on']:.3f} send_ratio_api={median['send_api']:.3f} "
        f"check_ratio={check_ratio['sampled']:.3f} check_ratio_on={check_ratio['on']:.3f} "
        f"send_added_us={median['send_added_sampled']:.0f} "
        f"send_added_us_on={median['send_added_on']:.0f} "
        f"send_added_us_api={median['send_added_api']:.0f} "
        f"send_cpu_ratio_sampled={median['send_cpu_sampled']:.3f} "
        f"send_cpu_ratio={median['send_cpu_on']:.3f} "
        f"send_cpu_ratio_api={median['send_cpu_api']:.3f} {simple}"
        f"send_noop_ratio_sampled={median['noop_sampled']:.3f} "
        f"send_noop_ratio={median['noop_on']:.3f} send_noop_ratio_api={median['noop_api']:.3f} "
        f"noop_added_us={median['noop_added_sampled']:.0f} "
        f"ratio={min(median['send_sampled'], check_ratio['sampled']):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
