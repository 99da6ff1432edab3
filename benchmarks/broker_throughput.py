"""Send throughput of the embedded broker with the real client, next to the real broker's figures.

    python -m benchmarks.broker_throughput [--seconds 5] [--threads 1,4] [--flush async] [--body 128]

Starts ``txmsg broker`` as a child process (so the broker's event loop and librocketmq's threads never share
this interpreter's GIL), then for each mode and thread count runs ``--seconds`` of back-to-back sends from
N Python threads sharing one producer, 128-byte bodies:

* ``plain``: ``Producer.send_sync``;
* ``tx``: ``TransactionMQProducer.send_message_in_transaction`` whose local transaction answers COMMIT.

It prints msgs/s, p50 and p99 latency per run, the real Apache RocketMQ 4.9.8 broker's figures measured on
the same kind of 2-core machine (``docs/rocketmq-facts.md``: plain 2286 / 6010, tx 2285 /
3327 msgs/s for 1 / 4 threads) and ours/real. Final line::

    RESULT broker_throughput plain1=<r> plain4=<r> tx1=<r> tx4=<r> ratio=<min ours/real>

Note both sides include the Python client wrapper (ctypes) and librocketmq; on a 2-core machine the client,
the benchmark threads and the broker compete for the same cores, exactly as in the reference run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass

from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import unique

from benchmarks._rmq_bench import drive, remoting_sender

#: Apache RocketMQ 4.9.8, same client, 2-core machine, ~10 s runs, 128-byte bodies (msgs/s, p50 ms, p99 ms)
REFERENCE: dict[tuple[str, int], tuple[float, float, float]] = {
    ("plain", 1): (2286, 0.28, 2.2),
    ("plain", 4): (6010, 0.56, 1.9),
    ("tx", 1): (2285, 0.40, 1.2),
    ("tx", 4): (3327, 1.11, 2.9),
}


@dataclass
class Run:
    mode: str
    threads: int
    sent: int
    failed: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        data = sorted(self.latencies_ms)
        return data[min(len(data) - 1, int(q * len(data)))]


def _run(mode: str, threads: int, seconds: float, body: bytes, namesrv: str, topic: str) -> Run:
    send_one, producer = remoting_sender(mode, namesrv, topic, body)
    try:
        window = drive(threads, seconds, send_one)
    finally:
        producer.shutdown()
    return Run(
        mode, threads, len(window.latencies), window.failed, window.elapsed, window.latencies
    )


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
        "--flush", choices=("async", "sync"), default="async", help="broker flush mode"
    )
    parser.add_argument("--body", type=int, default=128, help="body size in bytes (default 128)")
    args = parser.parse_args(argv)

    os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", tempfile.mkdtemp(prefix="rmq-bench-client-"))
    base = tempfile.mkdtemp(prefix="broker-throughput-")
    broker = BrokerProcess(os.path.join(base, "data"), os.path.join(base, "logs"), flush=args.flush)
    broker.start()
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    body = b"x" * args.body
    runs: list[Run] = []
    try:
        print(
            f"embedded broker {broker.namesrv_addr} (flush {args.flush}), {args.seconds:g} s per run, "
            f"{args.body}-byte bodies"
        )
        print(
            f"{'mode':<6} {'thr':>3} {'msgs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'fail':>5} | "
            f"{'real/s':>7} {'p50':>5} {'p99':>5} | {'ours/real':>9}"
        )
        for mode in modes:
            for n in threads:
                run = _run(
                    mode, n, args.seconds, body, broker.namesrv_addr, unique(f"Bench_{mode}")
                )
                runs.append(run)
                ref = REFERENCE.get((mode, n))
                ref_txt = (
                    f"{ref[0]:>7.0f} {ref[1]:>5.2f} {ref[2]:>5.1f}"
                    if ref
                    else f"{'-':>7} {'-':>5} {'-':>5}"
                )
                ratio = f"{run.rate / ref[0]:>9.2f}" if ref else f"{'-':>9}"
                print(
                    f"{mode:<6} {n:>3} {run.rate:>8.0f} {run.percentile(0.5):>7.2f} "
                    f"{run.percentile(0.99):>7.2f} {run.failed:>5} | {ref_txt} | {ratio}",
                    flush=True,
                )
    finally:
        broker.stop()
    ratios = [
        r.rate / REFERENCE[(r.mode, r.threads)][0] for r in runs if (r.mode, r.threads) in REFERENCE
    ]
    parts = " ".join(f"{r.mode}{r.threads}={r.rate:.0f}" for r in runs)
    p50s = " ".join(f"p50_{r.mode}{r.threads}={r.percentile(0.5):.2f}ms" for r in runs)
    print(
        f"RESULT broker_throughput {parts} {p50s} ratio={min(ratios) if ratios else float('nan'):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
