"""What txmsg adds to a transactional send: ``send_in_transaction`` vs the raw client.

    python -m benchmarks.send_overhead [--backend rocketmq|rocketmq5] [--seconds 2]
                                       [--threads 1,4] [--rounds 6]

Same embedded broker (child process), same run.  Each variant sends 128-byte messages whose local
transaction answers COMMIT at once, from 1 and from 4 threads, for ``--seconds``:

* **raw**: rocketmq-client-python's ``TransactionMQProducer.send_message_in_transaction``
  (one producer instance, the wrapper's callbacks).
* **txmsg**: ``TransactionalProducer.send_in_transaction`` of a transactional listener
  (payload conversion, exception-safe local executor, result object, round-robin over the
  group's client instances; default ``ExecutorConfig()``, so 8 instances).

With ``--backend rocketmq5`` both go over the broker's RocketMQ 5 gRPC endpoint instead:

* **raw**: the official 5.x client's ``Producer``: ``begin_transaction()``, ``send(message,
  transaction)``, ``transaction.commit()`` (one producer, the same request timeout as txmsg's).
* **txmsg**: the same ``send_in_transaction`` on the ``rocketmq5`` backend (one 5.x ``Producer``
  per group; its ``ExecutorConfig`` sizes the check-back pool, which this load never uses).

Each round measures raw and txmsg back to back (alternating which goes first); the ratio per
thread count is the median of the rounds' txmsg/raw ratios, which other load on the machine
drifting during the run does not skew the way a best-of would.  Prints the best msgs/s and its
p50/p99 latency per variant, the per-round ratios and their median, then
``RESULT send_overhead t1=<ratio> t4=<ratio> ratio=<min>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks._rmq_bench import create_topic, ensure_client_log_dir

BODY = "x" * 128


def measure(send: Callable[[int], None], threads: int, seconds: float) -> dict[str, float]:
    """Run ``send`` in ``threads`` threads for ``seconds``; msgs/s and latency percentiles."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    stop_at = time.monotonic() + seconds
    barrier = threading.Barrier(threads + 1)

    def worker(slot: int) -> None:
        own = latencies[slot]
        barrier.wait()
        i = 0
        try:
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                send(i)
                own.append(time.perf_counter() - t0)
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    began = time.monotonic()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - began
    if errors:
        raise RuntimeError(f"send failed: {errors[0]!r}") from errors[0]
    flat = sorted(x for own in latencies for x in own)
    return {
        "rate": len(flat) / elapsed,
        "p50": statistics.median(flat) * 1000,
        "p99": flat[min(len(flat) - 1, int(len(flat) * 0.99))] * 1000,
        "count": len(flat),
    }


def raw_sender(namesrv: str, topic: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    # each variant imports only its own client: --backend rocketmq5 runs without librocketmq
    from rocketmq.client import Message, TransactionMQProducer, TransactionStatus  # noqa: PLC0415
    from txmsg_rocketmq import native  # noqa: PLC0415

    producer = TransactionMQProducer(
        f"overhead_raw_{os.getpid()}", lambda m: TransactionStatus.COMMIT
    )
    native.load().dll.SetProducerInstanceName(
        producer._handle, f"overhead-raw-{os.getpid()}".encode()
    )
    producer.set_name_server_address(namesrv)
    producer.start()

    def commit(message: Any, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def send(i: int) -> None:
        msg = Message(topic)
        msg.set_keys(f"k{i}")
        msg.set_body(BODY)
        producer.send_message_in_transaction(msg, commit)

    return send, producer.shutdown


def raw5_sender(endpoint: str, topic: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    """The official 5.x client alone, as an application would use it without txmsg."""
    from rocketmq import (  # noqa: PLC0415 - only for --backend rocketmq5
        ClientConfiguration,
        Credentials,
        Message,
        Producer,
        TransactionChecker,
    )
    from rocketmq.grpc_protocol import TransactionResolution  # noqa: PLC0415

    class Commit(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            return TransactionResolution.COMMIT

    # request_timeout 3 s: what txmsg's rocketmq5 backend derives from send_timeout_ms=3000
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=3)
    producer = Producer(config, (topic,), Commit())
    producer.startup()
    body = BODY.encode()

    def send(i: int) -> None:
        msg = Message()
        msg.topic = topic
        msg.keys = f"k{i}"
        msg.body = body
        transaction = producer.begin_transaction()
        producer.send(msg, transaction)
        transaction.commit()

    return send, producer.shutdown


def txmsg_sender(
    backend: Any, topic: str, instances: int | None = None
) -> tuple[Callable[[int], None], Callable[[], None]]:
    # lazily, like the clients: `python -m benchmarks` lists the benchmarks without importing them
    from txmsg import ExecutorConfig, LocalTransactionState  # noqa: PLC0415
    from txmsg.listener import ListenerSpec  # noqa: PLC0415
    from txmsg.producer import TransactionalProducer  # noqa: PLC0415

    executor = ExecutorConfig() if instances is None else ExecutorConfig(concurrency=instances)

    class Commit:
        def execute_local(self, message: Any, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

        def check_local(self, message: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    spec = ListenerSpec(
        group=f"overhead_tx_{os.getpid()}", target=Commit, topics=(topic,), executor=executor
    )
    producer = TransactionalProducer.create(backend, spec, Commit())

    def send(i: int) -> None:
        producer.send_in_transaction(topic, BODY, keys=f"k{i}")

    return send, lambda: producer.close(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", default="1,4")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--instances",
        type=int,
        default=None,
        help="client instances of the txmsg group (its ExecutorConfig.concurrency; default 8)",
    )
    parser.add_argument(
        "--backend",
        choices=("rocketmq", "rocketmq5"),
        default="rocketmq",
        help="rocketmq: librocketmq over remoting; rocketmq5: the official 5.x client over gRPC",
    )
    args = parser.parse_args(argv)
    thread_counts = [int(x) for x in args.threads.split(",") if x.strip()]
    logging.basicConfig(level=logging.WARNING)
    ensure_client_log_dir()

    from txmsg_broker.app import BrokerProcess  # noqa: PLC0415

    rocketmq5 = args.backend == "rocketmq5"
    grpc: dict[str, Any] = {"grpc_port": 0} if rocketmq5 else {}
    broker = BrokerProcess(**grpc).start()
    topic = f"overhead_{os.getpid()}"
    create_topic(broker.namesrv_addr, topic)

    class Config:
        name_server = broker.namesrv_addr
        endpoints = broker.grpc_endpoint
        instance_prefix = "overhead"

    backend: Any
    if rocketmq5:  # imports nothing of librocketmq
        from txmsg_rocketmq5.backend import RocketMQ5Backend  # noqa: PLC0415

        backend = RocketMQ5Backend(Config())
    else:
        from txmsg_rocketmq.backend import RocketMQBackend  # noqa: PLC0415

        backend = RocketMQBackend(Config())
    closers: list[Callable[[], None]] = []
    ratios: dict[int, float] = {}
    try:
        if rocketmq5:
            raw_send, raw_close = raw5_sender(str(broker.grpc_endpoint), topic)
        else:
            raw_send, raw_close = raw_sender(broker.namesrv_addr, topic)
        closers.append(raw_close)
        tx_send, tx_close = txmsg_sender(backend, topic, args.instances)
        closers.append(tx_close)
        for fn in (raw_send, tx_send):  # warm both: routes, connections, code paths
            for i in range(50):
                fn(i)
        where = f"gRPC {broker.grpc_endpoint}" if rocketmq5 else broker.namesrv_addr
        print(
            f"backend {args.backend}; broker {where}, {args.seconds:.0f} s per measurement, "
            f"{args.rounds} rounds"
        )
        for threads in thread_counts:
            best: dict[str, dict[str, float]] = {}
            pair_ratios: list[float] = []
            for round_no in range(args.rounds):
                order = [("raw", raw_send), ("txmsg", tx_send)]
                if round_no % 2:
                    order.reverse()
                got: dict[str, dict[str, float]] = {}
                for name, fn in order:
                    got[name] = measure(fn, threads, args.seconds)
                    if name not in best or got[name]["rate"] > best[name]["rate"]:
                        best[name] = got[name]
                pair_ratios.append(got["txmsg"]["rate"] / got["raw"]["rate"])
            # Median of back-to-back pairs: robust to other load on the machine drifting.
            ratios[threads] = statistics.median(pair_ratios)
            for name in ("raw", "txmsg"):
                r = best[name]
                print(
                    f"threads {threads}  {name:>5}: {r['rate']:8.0f} msgs/s  p50 {r['p50']:.2f} ms  "
                    f"p99 {r['p99']:.2f} ms  ({r['count']:.0f} sends)",
                    flush=True,
                )
            print(
                f"threads {threads}  ratio txmsg/raw = {ratios[threads]:.3f} (median of "
                f"{len(pair_ratios)} back-to-back pairs: {', '.join(f'{r:.2f}' for r in pair_ratios)})",
                flush=True,
            )
    finally:
        for close in reversed(closers):
            close()
        backend.close(timeout=30)
        broker.stop()
    parts = " ".join(f"t{t}={r:.3f}" for t, r in ratios.items())
    print(f"RESULT send_overhead {parts} ratio={min(ratios.values(), default=0.0):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
