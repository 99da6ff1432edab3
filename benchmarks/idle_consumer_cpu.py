"""What an idle message listener costs the machine, per backend (issue 36's CPU finding).

    python -m benchmarks.idle_consumer_cpu [--seconds 10] [--queues 4]
        [--backends rocketmq,rocketmq_sync,rocketmq5]

One embedded broker (child process) with its gRPC endpoint; per backend one ``TxMsg`` app with one
``@message_listener`` on a topic of ``--queues`` queues that nobody sends to. After the listener
has its queues (8 s), the CPU time of this process (the app: client threads, pulls, callbacks)
and of the broker's process is read over ``--seconds``, as percent of one core:

* ``rocketmq``: librocketmq 2.1.0 push consumer as txmsg runs it: asynchronous pulls, which the
  broker holds while nothing arrives, and the stall watcher (docs/librocketmq-hazards.md #5);
* ``rocketmq_sync``: the same with ``sync_pull = true``: 2.1.0's synchronous pull never asks the
  broker to hold it, so an idle queue is pulled again as soon as the "nothing new" answer
  arrives - on a real broker as on the embedded one;
* ``rocketmq5``: the official 5.x client's long-polling receive through the gRPC endpoint.

The machine must be otherwise idle: the spinning path takes whatever CPU is free, so on a loaded
machine it shows less, and what it takes is missing from everything else.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import create_topic, unique

from txmsg import Message, TxMsg, TxMsgConfig

SETTLE_SECONDS = 8.0
"""Start-up, the first rebalance and its first pulls: not measured."""


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    broker: BrokerProcess, backend: str, queues: int, seconds: float
) -> tuple[float, float]:
    """Percent of a core of this process and of the broker while one listener idles."""
    topic, group = unique("IdleCpu"), unique("idle_cpu")
    create_topic(broker.namesrv_addr, topic, queues=queues)
    if backend == "rocketmq5":
        config = TxMsgConfig(
            backend="rocketmq5", endpoints=broker.grpc_endpoint, name_server=broker.namesrv_addr
        )
    else:
        config = TxMsgConfig(name_server=broker.namesrv_addr, sync_pull=backend == "rocketmq_sync")
    app = TxMsg(config)

    @app.message_listener(topic=topic, group=group)
    def idle(message: Message) -> None:  # never called: nobody sends
        return None

    if broker.proc is None:
        raise SystemExit("the embedded broker did not start")
    broker_pid = broker.proc.pid
    with app:
        time.sleep(SETTLE_SECONDS)
        ours, theirs, t0 = _cpu_seconds(os.getpid()), _cpu_seconds(broker_pid), time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        ours = _cpu_seconds(os.getpid()) - ours
        theirs = _cpu_seconds(broker_pid) - theirs
    return 100 * ours / elapsed, 100 * theirs / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--backends", default="rocketmq,rocketmq_sync,rocketmq5")
    a = ap.parse_args()
    os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", tempfile.mkdtemp(prefix="idle-cpu-logs-"))
    base = Path(tempfile.mkdtemp(prefix="idle-cpu-"))
    broker = BrokerProcess(base / "data", base / "logs", grpc_port=0).start()
    fields: list[str] = []
    try:
        for backend in a.backends.split(","):
            app_pct, broker_pct = measure(broker, backend, a.queues, a.seconds)
            print(
                f"{backend}: one idle listener, {a.queues} queues: this process {app_pct:.0f} % "
                f"of a core, the broker {broker_pct:.0f} %",
                flush=True,
            )
            fields += [f"{backend}_app_pct={app_pct:.0f}", f"{backend}_broker_pct={broker_pct:.0f}"]
    finally:
        broker.stop()
    print(
        f"RESULT idle_consumer_cpu queues={a.queues} {' '.join(fields)} load={os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
