"""Check-back throughput of one producer group: txmsg over N client instances vs the raw client.

    python -m benchmarks.check_scaling [--transactions 200] [--ns default,1,4,16,32] [--sleep 0.1]
                                       [--backend rocketmq|rocketmq5]

What it does, in one run against one embedded broker (child process, transactionTimeOut 0.2 s,
check interval 3 s by default):

* **raw**: rocketmq-client-python's ``TransactionMQProducer`` (one instance: librocketmq checks
  on one native thread), local transaction answering UNKNOWN, checker sleeping ``--sleep`` s
  then answering COMMIT.  Ideal rate 1/sleep.
* **txmsg N**: a transactional listener with ``ExecutorConfig(concurrency=N)`` (N client
  instances, N executor threads: N checks can run at once), ``execute_local`` answering UNKNOW
  and ``check_local`` doing the same as the raw checker.  Ideal rate N/sleep.
* **txmsg default**: the same with ``ExecutorConfig()`` unchanged (``concurrency`` 8): shows that
  the defaults open exactly as many instances as checks they run at once.

Each variant sends ``--transactions`` half messages to its own topic, all left UNKNOW, in one
burst that starts right after one of the broker's check passes began (read from its
transaction.log): a pass checks the transactions older than transactionTimeOut at its start, so a
pass landing mid-burst would check only the first part and leave the rest for a whole check
interval later, which measures the broker's timer rather than the checker (rocketmq5 N = 4 once
gave bound_ratio 0.71 that way, 0.96-0.98 otherwise).  Aligned, every transaction sent before
``pass + interval - transactionTimeOut`` is checked by the next pass; a burst that overruns that
window is sent again (``--attempts``, default 3); one still split after that is flagged ``SPLIT``
in its row.  transactionTimeOut is short (0.2 s) to make that window
2.8 s: gRPC sends of 200 transactions took up to 2.6 s on the loaded 2-core machine.  Both backends and the raw baselines run the same way.  It
reports check-backs/s (distinct transactions answered / time from the first check's start to
the last transaction's first answer), the ideal N/sleep, their ratio, the bound
M / (ceil(M/N) * sleep) that whole rounds of N checks allow (200 on 32 threads = 7 rounds, so
0.89 of N/sleep at best) and the ratio to it, the check threads seen, the most
checks that overlapped, and - from a consumer on the topic - deliveries per message and how many
messages were delivered more than once (a slow checker lets the broker re-check re-put copies of
half messages still queued in the client; each COMMIT answer commits a copy).

``--backend rocketmq5`` runs the same scenario over the embedded broker's RocketMQ 5 gRPC endpoint:
txmsg on the ``rocketmq5`` backend (one 5.x producer per group, checks on ``concurrency`` threads),
and as **raw** the official 5.x client's ``Producer`` with a ``TransactionChecker`` doing the same
(its checks run on one thread: ideal 1/sleep).  Deliveries are counted by a remoting consumer.

Final line: ``RESULT check_scaling raw=<rate> n<N>=<rate> ... dup_raw=<k> dup_max=<k>
bound_ratio=<min> ratio=<min txmsg ratio to N/sleep>``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from txmsg_broker.app import BrokerProcess
from txmsg_rocketmq import native
from txmsg_rocketmq.backend import RocketMQBackend

from benchmarks._rmq_bench import (
    CheckRecorder,
    DeliveryCounter,
    create_topic,
    ensure_client_log_dir,
    reached,
)
from txmsg import ExecutorConfig, LocalTransactionState
from txmsg.listener import ListenerSpec
from txmsg.producer import TransactionalProducer

_seq = itertools.count()


def _name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_seq)}"


def run_txmsg(
    backend: Any, namesrv: str, n: int | None, args: argparse.Namespace, consumers: Any = None
) -> dict[str, Any]:
    """One txmsg variant: ``ExecutorConfig(concurrency=n)``, or the defaults when ``n`` is None.
    ``consumers``: the backend that counts deliveries (default ``backend``)."""
    config = ExecutorConfig() if n is None else ExecutorConfig(concurrency=n)
    label = "default" if n is None else f"n{n}"
    topic, group = _name(f"scale_{label}"), _name(f"pg_scale_{label}")
    create_topic(namesrv, topic)
    recorder = CheckRecorder(args.sleep)
    deliveries = DeliveryCounter()

    class Slow:
        def execute_local(self, message: Any, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

        def check_local(self, message: Any) -> LocalTransactionState:
            recorder.check(message.transaction_key)
            return LocalTransactionState.COMMIT

    stop_consumer = (consumers or backend).subscribe(
        topic,
        _name(f"cg_scale_{label}"),
        lambda m: deliveries.add(m.transaction_key),
        concurrency=4,
    )
    spec = ListenerSpec(group=group, target=Slow, topics=(topic,), executor=config)
    producer = TransactionalProducer.create(backend, spec, Slow())
    try:
        return _drive(
            lambda i: producer.send_in_transaction(topic, f"order-{i}").transaction_key,
            recorder,
            deliveries,
            ideal=config.concurrency / args.sleep,
            args=args,
            extra={"instances": len(getattr(producer.sender, "instances", ())) or 1},
        )
    finally:
        producer.close(timeout=60)
        stop_consumer()


def run_raw(backend: Any, namesrv: str, args: argparse.Namespace) -> dict[str, Any]:
    from rocketmq.client import Message, TransactionMQProducer, TransactionStatus  # noqa: PLC0415 - loads librocketmq (native)

    topic, group = _name("scale_raw"), _name("pg_scale_raw")
    create_topic(namesrv, topic)
    recorder = CheckRecorder(args.sleep)
    deliveries = DeliveryCounter()

    gate = _RawGate()

    def checker(msg: Any) -> TransactionStatus:
        with gate:
            try:
                if gate.draining:  # measurement over: answer fast so shutdown can happen
                    return TransactionStatus.COMMIT
                key = msg.get_property("UNIQ_KEY")
                recorder.check(key.decode() if isinstance(key, bytes) else str(key))
                return TransactionStatus.COMMIT
            except BaseException:  # noqa: BLE001 - never into ctypes, even in a baseline
                return TransactionStatus.UNKNOWN

    raw = TransactionMQProducer(group, checker)
    instance = _name("raw")
    # Same registration as txmsg gets (an instance name and an immediate heartbeat), so the
    # comparison measures check throughput, not who reaches the broker first.
    native.load().dll.SetProducerInstanceName(raw._handle, instance.encode())
    raw.set_name_server_address(namesrv)
    raw.start()
    if backend.announcer is None:
        raise RuntimeError("the raw run needs a RocketMQBackend with announce=True")
    _, announce_handle = backend.announcer.heartbeat_through_consumer(group, instance, [topic])
    stop_consumer = backend.subscribe(
        topic, _name("cg_scale_raw"), lambda m: deliveries.add(m.transaction_key), concurrency=4
    )

    def send(i: int) -> str:
        msg = Message(topic)
        msg.set_body(f"order-{i}")
        result = raw.send_message_in_transaction(msg, lambda m, a: TransactionStatus.UNKNOWN)
        return str(result.msg_id)

    try:
        return _drive(
            send, recorder, deliveries, ideal=1 / args.sleep, args=args, extra={"instances": 1}
        )
    finally:
        # Shutting down a raw producer with a check callback running segfaults: drain first.
        gate.drain(quiet=1.0, timeout=120)
        raw.shutdown()
        if announce_handle is not None:
            native.load().dll.DestroyPushConsumer(announce_handle)
        stop_consumer()


def run_raw5(
    consumers: Any, endpoint: str, namesrv: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The official 5.x client alone: its checker runs on the producer's one check thread."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker  # noqa: PLC0415 - optional: 5.x client
    from rocketmq.grpc_protocol import TransactionResolution  # noqa: PLC0415 - optional: 5.x client

    topic = _name("scale_raw5")
    create_topic(namesrv, topic)
    recorder = CheckRecorder(args.sleep)
    deliveries = DeliveryCounter()
    gate = _RawGate()

    class Checker(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            with gate:
                if not gate.draining:
                    recorder.check(str(message.message_id))
                return TransactionResolution.COMMIT

    raw = Producer(
        ClientConfiguration(endpoint, Credentials(), request_timeout=10), (topic,), Checker()
    )
    raw.startup()
    stop_consumer = consumers.subscribe(
        topic, _name("cg_scale_raw5"), lambda m: deliveries.add(m.transaction_key), concurrency=4
    )

    def send(i: int) -> str:
        msg = Message()
        msg.topic = topic
        msg.body = f"order-{i}".encode()
        receipt = raw.send(msg, raw.begin_transaction())  # left UNKNOW: no commit/rollback
        return str(receipt.message_id)

    try:
        return _drive(
            send, recorder, deliveries, ideal=1 / args.sleep, args=args, extra={"instances": 1}
        )
    finally:
        gate.drain(quiet=1.0, timeout=120)
        raw.shutdown()
        stop_consumer()


class _RawGate:
    """In-flight count for the raw checker (what txmsg's pool does for its instances)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.last = time.monotonic()
        self.draining = False

    def __enter__(self) -> None:
        with self.lock:
            self.inside += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.inside -= 1
            self.last = time.monotonic()

    def drain(self, quiet: float, timeout: float) -> None:
        self.draining = True

        def idle() -> bool:
            with self.lock:
                return self.inside == 0 and time.monotonic() - self.last > quiet

        reached(idle, timeout=timeout)


class CheckPasses:
    """The broker's check passes, from the ``Begin to check prepare message, begin time:<ms>``
    lines of its transaction.log (INFO, flushed per line)."""

    MARK = "Begin to check prepare message, begin time:"

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def begins(self) -> list[float]:
        """Wall-clock start (epoch seconds) of every pass so far."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        return [
            int(line.split(self.MARK, 1)[1].split()[0]) / 1000
            for line in text.splitlines()
            if self.MARK in line
        ]

    def wait_next(self, timeout: float) -> float:
        """Block until a pass begins after now; its start time (now if none came: not aligned)."""
        now = time.time()
        found: list[float] = []

        def began() -> bool:
            found[:] = [b for b in self.begins() if b > now - 0.05]
            return bool(found)

        return found[0] if reached(began, timeout=timeout) else now


def _drive(
    send: Any,
    recorder: CheckRecorder,
    deliveries: DeliveryCounter,
    *,
    ideal: float,
    args: argparse.Namespace,
    extra: dict[str, Any],
) -> dict[str, Any]:
    # Start the burst just after a check pass began, so the next pass sees all of it (docstring);
    # a burst that overran the window (a loaded machine) is measured again, up to --attempts.
    for attempt in range(1, args.attempts + 1):
        with recorder.lock:  # a new attempt: only its own checks count
            recorder.calls.clear()
            recorder.first_answer.clear()
        pass_begin = args.passes.wait_next(timeout=args.check_interval_ms / 1000 * 3 + 10)
        started = time.monotonic()
        keys = [send(i) for i in range(args.transactions)]
        send_s = time.monotonic() - started
        window_end = pass_begin + (args.check_interval_ms - args.transaction_timeout_ms) / 1000
        overrun = time.time() - window_end  # > 0: the next pass saw only part of the burst
        answered = reached(functools.partial(recorder.answered, keys), timeout=args.max_wait)
        # Let re-checks of re-put copies (if any) run and their deliveries arrive: every message
        # delivered and no delivery for two check intervals.
        quiet = args.check_interval_ms / 1000 * 2
        reached(functools.partial(deliveries.settled, keys, quiet=quiet), timeout=args.max_wait)
        if overrun <= 0 or attempt == args.attempts:
            break
        print(
            f"  (burst of {send_s:.2f}s overran the check-pass window by {overrun:.2f}s: again)",
            flush=True,
        )
    result = {**recorder.summary(keys), **deliveries.summary(keys), **extra, "send_s": send_s}
    result["overrun_s"] = overrun
    result["attempt"] = attempt
    result["ideal"] = ideal
    result["ratio"] = result["rate"] / ideal
    # M checks of `sleep` s on n serial threads need ceil(M/n) rounds at least: the best any
    # implementation can reach (200 checks on 32 threads = 7 rounds, not 6.25).
    n = round(ideal * args.sleep)
    result["bound"] = args.transactions / (math.ceil(args.transactions / n) * args.sleep)
    result["bound_ratio"] = result["rate"] / result["bound"]
    result["complete"] = answered
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument(
        "--ns",
        default="default,1,4,16,32",
        help="comma-separated ExecutorConfig.concurrency values; 'default' = ExecutorConfig()",
    )
    parser.add_argument("--sleep", type=float, default=0.1, help="check_local duration (s)")
    parser.add_argument("--check-interval-ms", type=int, default=3000)
    parser.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=200,
        help="short, so a burst has interval - timeout (2.8 s) to fit into one check pass; "
        "re-checks do not depend on it (a re-put copy keeps its birth time)",
    )
    parser.add_argument("--max-wait", type=float, default=180.0)
    parser.add_argument(
        "--attempts",
        type=int,
        default=3,
        help="bursts per variant until one fits into one check pass (the last one counts anyway)",
    )
    parser.add_argument("--no-raw", action="store_true", help="skip the raw-client baseline")
    parser.add_argument(
        "--backend",
        choices=("rocketmq", "rocketmq5"),
        default="rocketmq",
        help="rocketmq: librocketmq over remoting; rocketmq5: the official 5.x client over gRPC",
    )
    args = parser.parse_args(argv)
    ns = [None if x.strip() == "default" else int(x) for x in args.ns.split(",") if x.strip()]
    logging.basicConfig(level=logging.WARNING)
    ensure_client_log_dir()

    grpc: dict[str, Any] = {"grpc_port": 0} if args.backend == "rocketmq5" else {}
    broker = BrokerProcess(
        transaction_timeout_ms=args.transaction_timeout_ms,
        check_interval_ms=args.check_interval_ms,
        check_max=15,
        delay_scale=0.001,
        **grpc,
    ).start()
    args.passes = CheckPasses(Path(broker.log_dir) / "transaction.log")
    print(
        f"backend {args.backend}; broker {broker.namesrv_addr}: transactionTimeOut={args.transaction_timeout_ms} ms, "
        f"checkInterval={args.check_interval_ms} ms; {args.transactions} transactions per run, "
        f"check_local {args.sleep * 1000:.0f} ms",
        flush=True,
    )

    class Config:
        name_server = broker.namesrv_addr
        instance_prefix = "bench"

    backend = RocketMQBackend(Config())  # the rocketmq5 run counts deliveries with it
    tx_backend: Any = backend
    if args.backend == "rocketmq5":
        from txmsg_rocketmq5.backend import RocketMQ5Backend  # noqa: PLC0415 - optional: 5.x client

        class Config5:
            endpoints = broker.grpc_endpoint

        tx_backend = RocketMQ5Backend(Config5())
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        if not args.no_raw:
            if args.backend == "rocketmq5":
                raw_row = run_raw5(backend, str(broker.grpc_endpoint), broker.namesrv_addr, args)
            else:
                raw_row = run_raw(backend, broker.namesrv_addr, args)
            rows.append(("raw", raw_row))
            _print_row(*rows[-1])
        for n in ns:
            row = run_txmsg(tx_backend, broker.namesrv_addr, n, args, consumers=backend)
            rows.append(("default" if n is None else f"n{n}", row))
            _print_row(*rows[-1])
    finally:
        if tx_backend is not backend:
            tx_backend.close(timeout=60)
        backend.close(timeout=60)
        broker.stop()
    txmsg_rows = [r for name, r in rows if name != "raw"]
    ratio = min((r["ratio"] for r in txmsg_rows), default=0.0)
    bound_ratio = min((r["bound_ratio"] for r in txmsg_rows), default=0.0)
    parts = [f"{name}={r['rate']:.1f}" for name, r in rows]
    raw_dup = next((r["duplicated"] for name, r in rows if name == "raw"), None)
    dup_max = max((r["duplicated"] for r in txmsg_rows), default=0)
    print(
        "RESULT check_scaling "
        + " ".join(parts)
        + (f" dup_raw={raw_dup}" if raw_dup is not None else "")
        + f" dup_max={dup_max} bound_ratio={bound_ratio:.3f} ratio={ratio:.3f}"
    )
    return 0


def _print_row(name: str, r: dict[str, Any]) -> None:
    print(
        f"{name:>7}: {r['rate']:7.1f} check-backs/s  ideal {r['ideal']:6.1f}  ratio {r['ratio']:.3f}  "
        f"(bound {r['bound']:.1f}: {r['bound_ratio']:.3f})  "
        f"instances {r['instances']:>2}  threads {r['threads']:>2}  overlap {r['overlap']:>2}  "
        f"check calls {r['calls']:>4} for {r['answered']} tx  "
        f"deliveries/msg {r['per_message']:.2f} ({r['duplicated']} duplicated, "
        f"{r['delivered']} delivered)  sends {r['send_s']:.2f}s {_alignment(r)}"
        f"{'' if r['complete'] else '  INCOMPLETE'}",
        flush=True,
    )


def _alignment(r: dict[str, Any]) -> str:
    if r["overrun_s"] <= 0:
        return "(one check pass)" + (f", attempt {r['attempt']}" if r["attempt"] > 1 else "")
    return f"SPLIT (the burst overran the pass window by {r['overrun_s']:.2f}s)"


if __name__ == "__main__":
    sys.exit(main())
