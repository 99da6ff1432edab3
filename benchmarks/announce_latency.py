"""How soon the broker can deliver a check-back to a new producer group (issue 12).

    python -m benchmarks.announce_latency [--concurrency 4] [--runs 3] [--baseline]

A broker sends a check-back only to a channel it learned from a HEART_BEAT listing the group
(Apache RocketMQ 4.9.8; the embedded broker does the same).  This measures, against an embedded
broker in this process (so its channel table can be read directly, polled every 2 ms), the time
until the group's channels are registered (``app.start()`` announces synchronously, so the
start figures are in practice the duration of ``start()``):

* ``start_new``: ``app.start()`` of a transactional listener whose declared topic does not exist
  yet (its first send will create it through TBW102's route) -> first channel / all channels.
* ``start_existing``: the same with the topic created beforehand.
* ``first_send``: a listener that declares no topic (no start-up announcement), topic not
  existing: from the return of the first ``send_in_transaction`` to the sending instance's channel.
* ``baseline`` (``--baseline``, ~30 s): the start-up and after-send announcements switched off
  (``RocketMQBackend(announce=False)``): librocketmq's own heartbeat timer.

Each figure is the median over ``--runs`` fresh groups/topics.  Final line:
``RESULT announce_latency start_new_ms=<first>/<all> start_existing_ms=<first>/<all>
first_send_ms=<ms> [baseline_s=<s>] ratio=<1000 ms / worst median, capped at 1>``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from txmsg_broker import EmbeddedBroker
from txmsg_broker.testing import create_topic
from txmsg_rocketmq.backend import RocketMQBackend

from txmsg import ExecutorConfig, LocalTransactionState, TxMsg
from txmsg.config import TxMsgConfig

GOAL_MS = 1000.0


def _unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def _channels(broker: Any, group: str) -> int:
    return int(broker.call(lambda b: len(b.clients.producer_channels(group))))


def _wait_channels(
    broker: Any, group: str, count: int, since: float, timeout: float
) -> tuple[float, float]:
    """(ms until the first channel, ms until ``count`` channels) after ``since``; inf on timeout."""
    first = float("inf")
    deadline = since + timeout
    while time.monotonic() < deadline:
        n = _channels(broker, group)
        now = time.monotonic()
        if n and first == float("inf"):
            first = (now - since) * 1000
        if n >= count:
            return first, (now - since) * 1000
        time.sleep(0.002)
    return first, float("inf")


def _app(broker: Any, log_dir: str, *, announce: bool = True) -> Any:
    config = TxMsgConfig(
        name_server=broker.namesrv_addr, client_log_dir=log_dir, instance_prefix="al"
    )
    return TxMsg(config, backend=RocketMQBackend(config, announce=announce))


def _listener(app: Any, group: str, topics: list[str], concurrency: int) -> None:
    @app.transactional_listener(
        group=group, topics=topics, executor=ExecutorConfig(concurrency=concurrency)
    )
    class Later:
        def execute_local(self, message: Any, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

        def check_local(self, message: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT


def measure_start(
    broker: Any, log_dir: str, concurrency: int, *, existing: bool
) -> tuple[float, float]:
    topic, group = _unique("al_topic"), _unique("al_pg")
    if existing:
        with contextlib.redirect_stdout(io.StringIO()):  # the admin command's echo
            create_topic(broker.namesrv_addr, topic)
    app = _app(broker, log_dir)
    _listener(app, group, [topic], concurrency)
    begin = time.monotonic()
    try:
        app.start()
        return _wait_channels(broker, group, concurrency, begin, timeout=40)
    finally:
        app.close(timeout=20)


def measure_first_send(
    broker: Any, log_dir: str, *, announce: bool = True, timeout: float = 10
) -> float:
    topic, group = _unique("al_send"), _unique("al_spg")
    app = _app(broker, log_dir, announce=announce)
    _listener(app, group, [], 1)
    try:
        app.start()
        time.sleep(
            0.1
        )  # past librocketmq's own start-up heartbeat (10 ms after start, to no broker)
        app.transactional_producer(group).send_in_transaction(topic, b"x")
        sent = time.monotonic()
        return _wait_channels(broker, group, 1, sent, timeout=timeout)[1]
    finally:
        app.close(timeout=20)


def _fmt(ms: float) -> str:
    return "inf" if ms == float("inf") else f"{ms:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=4, help="client instances of the group")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--baseline", action="store_true", help="also measure with announcing off (~30 s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    base = tempfile.mkdtemp(prefix="announce-latency-")
    os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", os.path.join(base, "rocketmq-client"))
    log_dir = os.path.join(base, "client-logs")
    with EmbeddedBroker(os.path.join(base, "data"), os.path.join(base, "logs")) as broker:
        new = [
            measure_start(broker, log_dir, args.concurrency, existing=False)
            for _ in range(args.runs)
        ]
        old = [
            measure_start(broker, log_dir, args.concurrency, existing=True)
            for _ in range(args.runs)
        ]
        sends = [measure_first_send(broker, log_dir) for _ in range(args.runs)]
        baseline = (
            measure_first_send(broker, log_dir, announce=False, timeout=40)
            if args.baseline
            else None
        )
    med = {
        "start_new": (statistics.median(f for f, _ in new), statistics.median(a for _, a in new)),
        "start_existing": (
            statistics.median(f for f, _ in old),
            statistics.median(a for _, a in old),
        ),
    }
    first_send = statistics.median(sends)
    for name, runs in (("start_new", new), ("start_existing", old)):
        print(
            f"{name:15s} first/all channels ms: "
            + ", ".join(f"{_fmt(f)}/{_fmt(a)}" for f, a in runs)
        )
    print(f"{'first_send':15s} channel ms: " + ", ".join(_fmt(s) for s in sends))
    worst = max(med["start_new"][1], med["start_existing"][1], first_send)
    ratio = min(1.0, GOAL_MS / worst) if worst > 0 else 1.0
    result = (
        f"RESULT announce_latency start_new_ms={_fmt(med['start_new'][0])}/{_fmt(med['start_new'][1])} "
        f"start_existing_ms={_fmt(med['start_existing'][0])}/{_fmt(med['start_existing'][1])} "
        f"first_send_ms={_fmt(first_send)}"
    )
    if baseline is not None:
        result += f" baseline_s={'inf' if baseline == float('inf') else f'{baseline / 1000:.1f}'}"
    print(f"{result} ratio={ratio:.2f}")
    return 0 if worst < float("inf") else 1


if __name__ == "__main__":
    sys.exit(main())
