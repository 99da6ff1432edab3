"""What each OpenTelemetry SDK call costs a transactional send, measured where it runs: inside
``send_in_transaction`` on a busy sending process, not in a loop of its own.

    python -m benchmarks.otel_cost [--backend rocketmq|rocketmq5] [--rounds 7] [--seconds 1.5]
                                   [--threads 4] [--database-url postgresql+psycopg://...]

Why: ``benchmarks.otel_overhead`` says how much slower sends are with the SDK recording
everything; this says where that goes and how much of it is txmsg's.  One process with the SDK
configured as ``otel_overhead``'s **on** side (``SimpleSpanProcessor`` into an
``InMemorySpanExporter``, default sampler, ``InMemoryMetricReader``) sends through the same two
groups (``execute_local`` writing an order row, and a no-op one; 4 threads, default
``ExecutorConfig``) while the telemetry of a send is swapped, between measurements, for one of
these steps (``txmsg.otel.hooks.sending``, the one seam the producer calls):

* ``none``: no telemetry at all (as without the ``otel`` extra);
* ``bare``: a span of the SDK with nothing else: ``start_span`` without attributes and ``end``
  on a ``TracerProvider`` of its own with no span processor (nothing exported, not made
  current) - the least any tracing of a send costs;
* ``span``: ``start_span`` with the attributes txmsg gives a send span, made current for the
  send (``execute_local`` runs inside it), and ``end`` (the synchronous processor exports it);
* ``+inject``: also the W3C trace context written into the message's user properties (the client
  then carries two more properties);
* ``+record``: also the duration histogram's ``record`` (with the span's context: its exemplar);
* ``+late``: also ``set_attributes`` of the broker's answer (message id, local result): every SDK
  call txmsg makes per send, with nothing of txmsg's around them;
* ``txmsg``: txmsg's own telemetry (:func:`txmsg.otel.hooks.sending`), which makes those calls.

Each measurement reports the process's CPU time per send (all threads, the client's native ones
included); a step's figure is the median over ``--rounds`` rounds, each running every step once
in a rotating order, and its cost the difference to ``none``.  Final line: ``RESULT otel_cost
send_none_us=<cpu> send_bare_us=<bare - none> send_sdk_us=<+late - none>
send_txmsg_us=<txmsg - none> send_bare_ratio=<none / bare> send_sdk_ratio=<none / +late>
send_txmsg_ratio=<none / txmsg>`` and the same for ``noop_``: ``*_sdk_ratio`` is the CPU ratio
the SDK's own calls leave a CPU-bound sender, whatever txmsg does around them, and
``*_bare_ratio`` what a bare span alone leaves.  Then each SDK call alone in a loop of its own
(:func:`hot_loop`: its code and data stay in the CPU's caches, the least it can cost here), and
``hot_sdk_us`` (all of a send's calls in such a loop), ``hot_txmsg_us`` (txmsg's whole
``Sending`` in one) and ``send_hot_sdk_ratio`` (``send_none_us`` / (it + ``hot_sdk_us``): the
best a writing send could do if the SDK's calls cost no more in a send than in a loop).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from txmsg.message import OutgoingMessage
from txmsg.otel import hooks, names
from txmsg.states import LocalTransactionState

STEPS = ("none", "bare", "span", "+inject", "+record", "+late", "txmsg")


class _Step:
    """The telemetry of one send made of the SDK calls of :data:`STEPS` up to ``level`` (1:
    bare, 2: span, 3: +inject, 4: +record, 5: +late), called directly (no txmsg code around
    them), with the attributes txmsg uses.  The interface of :class:`txmsg.otel.hooks.Sending`."""

    def __init__(self, o: Any, bare: Any, level: int, group: str, message: OutgoingMessage) -> None:
        self._o, self._level = o, level
        route = hooks._route(group, message.topic, "transaction")
        self._metric_attributes = route.metric_attributes
        if level == 1:
            self._span = bare.start_span(route.name, kind=o.PRODUCER)
        else:
            self._span = o.tracer.start_span(
                route.name,
                kind=o.PRODUCER,
                attributes=hooks._span_attributes(route.span_attributes, message, 1),
            )
        self._context = o.trace.set_span_in_context(self._span)
        self._started = time.perf_counter()
        self.message = message
        if level >= 3:
            carrier = dict(message.properties)
            o.propagate.inject(carrier, context=self._context)
            self.message = hooks._with_properties(message, carrier)
        self._late: dict[str, Any] = {}
        self._token: Any = None

    def __enter__(self) -> _Step:
        if self._level >= 2:
            self._token = self._o.context.attach(self._context)
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()
        if self._token is not None:
            self._o.context.detach(self._token)

    def sent(self, message_id: str | None) -> None:
        if message_id:
            self._late[names.MESSAGE_ID] = message_id

    def local_state(self, state: LocalTransactionState | None) -> None:
        if state is not None:
            self._late[names.LOCAL_RESULT] = hooks.result_name(state)

    def end(self, error: BaseException | None = None) -> None:
        o = self._o
        if self._level >= 4:
            o.operation_duration.record(
                time.perf_counter() - self._started, self._metric_attributes, context=self._context
            )
        if self._level >= 5 and self._late:
            self._span.set_attributes(self._late)
        self._span.end()


@contextmanager
def telemetry(step: str) -> Iterator[None]:
    """Sends made inside use ``step``'s telemetry (:data:`STEPS`)."""
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - after the SDK

    from txmsg.otel._runtime import otel  # noqa: PLC0415

    real = hooks.sending
    bare = TracerProvider(shutdown_on_exit=False).get_tracer("txmsg")
    o = otel()
    if o is None:
        raise RuntimeError("opentelemetry-api is not installed: pip install 'txmsg[otel]'")
    level = STEPS.index(step)
    if step == "none":
        hooks.sending = lambda group, message, **_: hooks._NoSending(message)
    elif step != "txmsg":
        hooks.sending = lambda group, message, **_: _Step(o, bare, level, group, message)  # type: ignore[assignment]
    try:
        yield
    finally:
        hooks.sending = real


def _measure(send: Callable[[int], None], threads: int, seconds: float) -> float:
    """CPU time of the whole process per send (µs) over ``seconds`` of ``threads`` senders."""
    from benchmarks import send_overhead  # noqa: PLC0415 - after the SDK

    cpu = time.process_time()
    sent = send_overhead.measure(send, threads, seconds)
    return (time.process_time() - cpu) / sent["count"] * 1e6


def hot_loop(exporter: Any, *, repeat: int = 5, number: int = 3000) -> dict[str, float]:
    """Each SDK call of a send alone, in a loop of its own (µs of this thread's CPU per call,
    the best of ``repeat`` loops): what the call costs when its code and data stay in the CPU's
    caches, the least it can cost on this machine.  ``sdk`` is all of them in a send's order,
    ``txmsg`` one whole :class:`txmsg.otel.hooks.Sending` (which makes those calls)."""
    from txmsg.otel._runtime import otel  # noqa: PLC0415 - after the SDK

    o = otel()
    if o is None:
        raise RuntimeError("opentelemetry-api is not installed: pip install 'txmsg[otel]'")
    message = OutgoingMessage(topic="otel_cost_hot", body=b"x" * 64, keys="k1")
    route = hooks._route("otel_cost_hot", message.topic, "transaction")
    attributes = hooks._span_attributes(route.span_attributes, message, 1)
    late = {names.MESSAGE_ID: "7F0000010000000000000000000000AB", names.LOCAL_RESULT: "commit"}
    span = o.tracer.start_span(route.name, kind=o.PRODUCER, attributes=attributes)
    context = o.trace.set_span_in_context(span)

    def sdk() -> None:
        sending = o.tracer.start_span(route.name, kind=o.PRODUCER, attributes=attributes)
        ctx = o.trace.set_span_in_context(sending)
        carrier: dict[str, str] = {}
        o.propagate.inject(carrier, context=ctx)
        token = o.context.attach(ctx)
        o.operation_duration.record(0.001, route.metric_attributes, context=ctx)
        sending.set_attributes(late)
        sending.end()
        o.context.detach(token)

    def whole() -> None:
        with hooks.sending("otel_cost_hot", message, transactional=True) as sending:
            sending.sent(late[names.MESSAGE_ID])
            sending.local_state(LocalTransactionState.COMMIT)

    calls: dict[str, Callable[[], object]] = {
        "start_span": lambda: o.tracer.start_span(
            route.name, kind=o.PRODUCER, attributes=attributes
        ),
        "start_span+end": lambda: o.tracer.start_span(
            route.name, kind=o.PRODUCER, attributes=attributes
        ).end(),
        "inject": lambda: o.propagate.inject({}, context=context),
        "record": lambda: o.operation_duration.record(
            0.001, route.metric_attributes, context=context
        ),
        "set_attributes": lambda: span.set_attributes(late),
        "sdk": sdk,
        "txmsg": whole,
    }
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeat):
        for name, call in calls.items():
            exporter.clear()
            started = time.thread_time()
            for _ in range(number):
                call()
            best[name] = min(best[name], (time.thread_time() - started) / number * 1e6)
    exporter.clear()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("rocketmq", "rocketmq5"), default="rocketmq")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of every step")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one measurement")
    parser.add_argument("--threads", type=int, default=4, help="sending threads")
    parser.add_argument(
        "--database-url", default=None, help="where execute_local writes (default: a SQLite file)"
    )
    args = parser.parse_args(argv)

    from benchmarks import otel_overhead  # noqa: PLC0415

    exporter = otel_overhead._install_sdk()
    from benchmarks._rmq_bench import create_topic, ensure_client_log_dir  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    ensure_client_log_dir()
    broker = otel_overhead.start_broker(args.backend)

    class Config:
        name_server = broker.namesrv_addr
        endpoints = broker.grpc_endpoint
        instance_prefix = "otelcost"

    figures: dict[tuple[str, str], list[float]] = {}
    try:
        topic = f"otel_cost_{broker.namesrv_addr.rsplit(':', 1)[-1]}"
        create_topic(broker.namesrv_addr, topic)
        if args.backend == "rocketmq5":
            from txmsg_rocketmq5.backend import RocketMQ5Backend  # noqa: PLC0415

            backend: Any = RocketMQ5Backend(Config())
        else:
            from txmsg_rocketmq.backend import RocketMQBackend  # noqa: PLC0415

            backend = RocketMQBackend(Config())
        database = "PostgreSQL" if args.database_url else "a SQLite file"
        print(
            f"backend {args.backend}; one process, the SDK as otel_overhead's on side; "
            f"{args.rounds} rounds of every step, {args.threads} threads x {args.seconds:g} s of "
            f"send_in_transaction, execute_local writing an order row to {database} (send) and "
            "doing nothing (noop); CPU per send of the whole process",
            flush=True,
        )
        try:
            with otel_overhead.orders_database(args.database_url, "cost") as sessions:
                senders = {
                    "send": otel_overhead._sender(backend, topic, sessions),
                    "noop": otel_overhead._sender(backend, topic, None),
                }
                try:
                    for send, _ in senders.values():
                        for i in range(50):
                            send(i)
                    offsets = itertools.count()
                    for n in range(args.rounds):
                        for label, (send, _) in senders.items():
                            shift = next(offsets) % len(STEPS)
                            for step in STEPS[shift:] + STEPS[:shift]:
                                exporter.clear()  # as otel_overhead's on side, between measurements
                                with telemetry(step):
                                    cpu = _measure(send, args.threads, args.seconds)
                                figures.setdefault((label, step), []).append(cpu)
                        print(
                            f"round {n + 1}: "
                            + "; ".join(
                                f"{label} "
                                + " ".join(f"{s} {figures[(label, s)][-1]:.0f}" for s in STEPS)
                                for label in senders
                            )
                            + f" us (load average {os.getloadavg()[0]:.1f})",
                            flush=True,
                        )
                finally:
                    for _, close in senders.values():
                        close()
        finally:
            backend.close(timeout=60)
    finally:
        broker.stop()

    result: list[str] = []
    for label in ("send", "noop"):
        median = {s: statistics.median(figures[(label, s)]) for s in STEPS}
        none = median["none"]
        parts = ", ".join(
            f"{step} {median[step]:.0f} ({median[step] - median[before]:+.0f})"
            for before, step in itertools.pairwise(STEPS)
        )
        print(
            f"{label}: CPU per send, medians (us; change from the step before): none {none:.0f}, {parts}"
        )
        result += [
            f"{label}_none_us={none:.0f}",
            f"{label}_bare_us={median['bare'] - none:.0f}",
            f"{label}_sdk_us={median['+late'] - none:.0f}",
            f"{label}_txmsg_us={median['txmsg'] - none:.0f}",
            f"{label}_bare_ratio={none / median['bare']:.3f}",
            f"{label}_sdk_ratio={none / median['+late']:.3f}",
            f"{label}_txmsg_ratio={none / median['txmsg']:.3f}",
        ]
    hot = hot_loop(exporter)
    print(
        "each call alone in a loop of its own (us of CPU per call, best of 5 loops): "
        + ", ".join(f"{name} {us:.1f}" for name, us in hot.items())
    )
    send_none = statistics.median(figures[("send", "none")])
    result += [
        f"hot_sdk_us={hot['sdk']:.1f}",
        f"hot_txmsg_us={hot['txmsg']:.1f}",
        f"send_hot_sdk_ratio={send_none / (send_none + hot['sdk']):.3f}",
    ]
    print("RESULT otel_cost " + " ".join(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
