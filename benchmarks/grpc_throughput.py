"""Send throughput over RocketMQ 5's gRPC protocol next to remoting, on one embedded broker, in one run.

    python -m benchmarks.grpc_throughput [--seconds 5] [--threads 1,4] [--modes plain,tx] [--rounds 1]

Starts ``txmsg broker --grpc-port 0`` as a child process and creates two topics on it (``NORMAL`` for
plain sends, ``TRANSACTION`` for transactional ones). Then, per mode and thread count, it runs
``--seconds`` of back-to-back sends from N Python threads sharing one producer, 128-byte bodies, with
each of the two official clients in a child process of its own (so neither client's threads share a
GIL with the other's or with this script):

* ``grpc``: the official 5.x client, ``rocketmq-python-client`` (pure Python over grpcio) -
  ``Producer.send``; transactional = ``begin_transaction()``, ``send(msg, tx)``, ``tx.commit()``;
* ``remoting``: the C++-based ``rocketmq-client-python`` 2.0.0 (librocketmq) - ``Producer.send_sync``;
  transactional = ``send_message_in_transaction`` whose local transaction answers COMMIT (the same
  harness as ``benchmarks.broker_throughput``).

The two sides of a cell run back to back, in alternating order per round, so slow drift of the
machine's load hits both; with ``--rounds R`` each side's cell is the median of R runs. Final line::

    RESULT grpc_throughput plain1=<g/r> plain4=<g/r> tx1=<g/r> tx4=<g/r> worst=<min> geomean=<g> ratio=<min>

Each cell is gRPC msgs/s / remoting msgs/s. ``ratio`` is the **worst** cell (the strictest reading of
the goal, and how ``broker_throughput`` reports); the geometric mean of the four is printed next to it.

What differs by protocol, not by implementation: the 5.x client waits for the EndTransaction answer
(a unary RPC) while librocketmq sends END_TRANSACTION without waiting, so a transactional send is two
round trips over gRPC and one and a half over remoting. The machine has 2 cores shared with other
work: compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import unique

from benchmarks._rmq_bench import (
    Window,
    create_topic,
    drive,
    ensure_client_log_dir,
    remoting_sender,
)

SIDES = ("grpc", "remoting")
#: the same warm-up as benchmarks.broker_throughput: route, connection, broker caches
WARMUP_SENDS = 50


@dataclass
class Cell:
    """One side's run of one (mode, threads) cell, as a worker reports it."""

    side: str
    mode: str
    threads: int
    sent: int
    failed: int
    seconds: float
    p50: float
    p99: float
    #: CPU seconds (all threads) the client process and the broker process used in the measured window
    client_cpu: float = 0.0
    broker_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    def cpu_us(self, which: str) -> float:
        """CPU microseconds per message of the client or the broker: the load-independent cost."""
        cpu = self.client_cpu if which == "client" else self.broker_cpu
        return cpu / self.sent * 1e6 if self.sent else float("nan")


def _percentile(data: list[float], q: float) -> float:
    if not data:
        return float("nan")
    ordered = sorted(data)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- workers (child processes) --------------------------------------------------------------------
def _cell(side: str, mode: str, threads: int, window: Window) -> Cell:
    return Cell(
        side,
        mode,
        threads,
        len(window.latencies),
        window.failed,
        window.elapsed,
        _percentile(window.latencies, 0.5),
        _percentile(window.latencies, 0.99),
        window.client_cpu,
        window.broker_cpu,
    )


def _grpc_worker(args: argparse.Namespace, body: bytes) -> Cell:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker  # noqa: PLC0415 - optional: 5.x client
    from rocketmq import TransactionResolution as Resolution  # noqa: PLC0415 - optional: 5.x client

    class CommitChecker(TransactionChecker):  # type: ignore[misc]
        """Never asked here (every transaction commits at once), but a transactional producer needs one."""

        def check(self, message: Any) -> Any:
            return Resolution.COMMIT

    topic, mode = args.topic, args.mode
    producer = Producer(
        ClientConfiguration(args.target, Credentials(), request_timeout=10),
        (topic,),
        CommitChecker() if mode == "tx" else None,
    )
    producer.startup()

    def send_one() -> bool:
        message = Message()
        message.topic = topic
        message.body = body
        if mode == "tx":
            transaction = producer.begin_transaction()
            producer.send(message, transaction)
            transaction.commit()  # raises unless the answer is OK
        else:
            producer.send(message)  # raises unless the answer is OK
        return True

    return _cell(
        "grpc",
        mode,
        args.threads_n,
        drive(args.threads_n, args.seconds, send_one, warmup=WARMUP_SENDS, cpu_pid=args.broker_pid),
    )


def _remoting_worker(args: argparse.Namespace, body: bytes) -> Cell:
    """``benchmarks.broker_throughput``'s loop: one librocketmq producer shared by the threads."""
    send_one, _producer = remoting_sender(args.mode, args.target, args.topic, body)
    window = drive(
        args.threads_n, args.seconds, send_one, warmup=WARMUP_SENDS, cpu_pid=args.broker_pid
    )
    return _cell("remoting", args.mode, args.threads_n, window)


def worker_main(args: argparse.Namespace) -> int:
    """Run one side of one cell, print it, and leave without shutting the client down.

    Why ``os._exit``: librocketmq can abort the process in ``shutdown`` (``boost::thread_interrupted``,
    docs/librocketmq-hazards.md) and the 5.x client's shutdown takes seconds; neither is measured, and
    the broker treats the closed connections like any client that went away.
    """
    body = b"x" * args.body
    cell = _grpc_worker(args, body) if args.worker == "grpc" else _remoting_worker(args, body)
    print("CELL " + json.dumps(cell.__dict__), flush=True)
    sys.stderr.flush()
    os._exit(0)


def _run_worker(
    side: str,
    target: str,
    topic: str,
    mode: str,
    threads: int,
    seconds: float,
    body: int,
    broker_pid: int,
) -> Cell:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.grpc_throughput",
        "--worker",
        side,
        "--target",
        target,
        "--topic",
        topic,
        "--mode",
        mode,
        "--threads-n",
        str(threads),
        "--seconds",
        str(seconds),
        "--body",
        str(body),
        "--broker-pid",
        str(broker_pid),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CELL ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(
            f"{side} worker ({mode}, {threads} threads) failed with exit {proc.returncode}:\n{tail}"
        )
    return Cell(**json.loads(lines[-1].removeprefix("CELL ")))


def _median_cell(cells: list[Cell]) -> Cell:
    """The run with the median rate (the run itself, so its latencies stay consistent)."""
    ordered = sorted(cells, key=lambda c: c.rate)
    return ordered[(len(ordered) - 1) // 2]


# -- driver ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="duration of each run (default 5)"
    )
    parser.add_argument(
        "--threads", default="1,4", help="comma-separated client thread counts (default 1,4)"
    )
    parser.add_argument("--modes", default="plain,tx", help="plain and/or tx (default both)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs per side and cell; the median counts"
    )
    parser.add_argument(
        "--flush", choices=("async", "sync"), default="async", help="broker flush mode"
    )
    parser.add_argument("--body", type=int, default=128, help="body size in bytes (default 128)")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--threads-n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--broker-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    ensure_client_log_dir()
    if args.worker:
        return worker_main(args)

    base = tempfile.mkdtemp(prefix="grpc-throughput-")
    broker = BrokerProcess(
        os.path.join(base, "data"), os.path.join(base, "logs"), flush=args.flush, grpc_port=0
    )
    broker.start()
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[tuple[str, int], dict[str, Cell]] = {}
    try:
        if broker.grpc_endpoint is None:
            raise RuntimeError(
                "the broker started without its gRPC endpoint (grpc_port=0 was asked)"
            )
        topics = {"plain": unique("BenchGrpcPlain"), "tx": unique("BenchGrpcTx")}
        create_topic(broker.namesrv_addr, topics["plain"], "NORMAL")
        create_topic(broker.namesrv_addr, topics["tx"], "TRANSACTION")
        targets = {"grpc": broker.grpc_endpoint, "remoting": broker.namesrv_addr}
        if broker.proc is None:
            raise RuntimeError("the broker process is not running")
        broker_pid = broker.proc.pid
        print(
            f"embedded broker {broker.namesrv_addr} gRPC {broker.grpc_endpoint} (flush {args.flush}), "
            f"{args.seconds:g} s per run, {args.rounds} round(s), {args.body}-byte bodies"
        )
        print("msgs/s, latency (ms) and CPU per message (us, client and broker process) per side")
        print(
            f"{'mode':<6} {'thr':>3} | {'gRPC/s':>7} {'p50':>5} {'p99':>6} {'cli':>5} {'brk':>5} {'fail':>4} | "
            f"{'remoting/s':>10} {'p50':>5} {'p99':>6} {'cli':>5} {'brk':>5} {'fail':>4} | {'gRPC/rem':>8}"
        )
        for mode in modes:
            for n in threads:
                runs: dict[str, list[Cell]] = {side: [] for side in SIDES}
                for r in range(args.rounds):
                    order = SIDES if r % 2 == 0 else SIDES[::-1]
                    for side in order:
                        runs[side].append(
                            _run_worker(
                                side,
                                targets[side],
                                topics[mode],
                                mode,
                                n,
                                args.seconds,
                                args.body,
                                broker_pid,
                            )
                        )
                cell = {side: _median_cell(runs[side]) for side in SIDES}
                results[(mode, n)] = cell
                g, rem = cell["grpc"], cell["remoting"]
                ratio = g.rate / rem.rate if rem.rate else float("nan")
                print(
                    f"{mode:<6} {n:>3} | {g.rate:>7.0f} {g.p50:>5.2f} {g.p99:>6.1f} {g.cpu_us('client'):>5.0f} "
                    f"{g.cpu_us('broker'):>5.0f} {g.failed:>4} | {rem.rate:>10.0f} {rem.p50:>5.2f} {rem.p99:>6.1f} "
                    f"{rem.cpu_us('client'):>5.0f} {rem.cpu_us('broker'):>5.0f} {rem.failed:>4} | {ratio:>8.2f}",
                    flush=True,
                )
    finally:
        broker.stop()
    ratios = {
        f"{mode}{n}": c["grpc"].rate / c["remoting"].rate if c["remoting"].rate else 0.0
        for (mode, n), c in results.items()
    }
    worst = min(ratios.values()) if ratios else float("nan")
    positive = [r for r in ratios.values() if r > 0]
    geomean = math.exp(statistics.fmean(math.log(r) for r in positive)) if positive else 0.0
    parts = " ".join(f"{k}={v:.2f}" for k, v in ratios.items())
    rates = " ".join(
        f"{side}_{mode}{n}={c[side].rate:.0f}" for (mode, n), c in results.items() for side in SIDES
    )
    print(
        f"RESULT grpc_throughput {parts} {rates} worst={worst:.2f} geomean={geomean:.2f} ratio={worst:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
