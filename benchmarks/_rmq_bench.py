"""Shared pieces of the RocketMQ backend benchmarks (check_scaling, send_overhead, broker_throughput,
grpc_throughput).

Both run the embedded broker as a child process (``txmsg_broker.app.BrokerProcess``) so the
broker's event loop never competes with librocketmq's callbacks for this interpreter's GIL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txmsg_broker.testing import set_producer_instance_name, unique, wait_until


def ensure_client_log_dir() -> str:
    """librocketmq writes to /logs/... unless told otherwise: point it at a temp dir."""
    path = os.environ.get("ROCKETMQ_CLIENT_LOG_DIR") or tempfile.mkdtemp(prefix="rmq-bench-client-")
    os.environ["ROCKETMQ_CLIENT_LOG_DIR"] = path
    return path


def remoting_sender(
    mode: str, namesrv: str, topic: str, body: bytes
) -> tuple[Callable[[], bool], Any]:
    """The raw C++ client's send of one message (``plain``: ``send_sync``; ``tx``:
    ``send_message_in_transaction`` whose local transaction commits), and its started producer.

    ``send_one()`` returns whether the broker answered SEND_OK; the caller shuts the producer down
    (or leaves with ``os._exit``, docs/librocketmq-hazards.md).
    """
    from rocketmq.client import (  # noqa: PLC0415 - loads librocketmq (native)
        Message,
        Producer,
        SendStatus,
        TransactionMQProducer,
        TransactionStatus,
    )

    producer: Any
    if mode == "tx":
        producer = TransactionMQProducer(unique("BenchTxPG"), lambda msg: TransactionStatus.COMMIT)
    else:
        producer = Producer(unique("BenchPG"))
    set_producer_instance_name(producer, unique("bench"))
    producer.set_name_server_address(namesrv)
    producer.start()

    def commit(msg: object, arg: object) -> Any:
        return TransactionStatus.COMMIT

    def send_one() -> bool:
        msg = Message(topic)
        msg.set_body(body)
        if mode == "tx":
            result = producer.send_message_in_transaction(msg, commit)
        else:
            result = producer.send_sync(msg)
        return bool(result.status == SendStatus.OK)

    return send_one, producer


@dataclass
class Window:
    """What :func:`drive` measured: latencies (ms) of successful sends, failures, wall seconds and
    the CPU seconds of this process and of ``cpu_pid`` (0 when not asked)."""

    latencies: list[float]
    failed: int
    elapsed: float
    client_cpu: float = 0.0
    broker_cpu: float = 0.0


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all threads), from /proc; 0.0 where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def drive(
    threads: int,
    seconds: float,
    send_one: Callable[[], bool],
    *,
    warmup: int = 50,
    cpu_pid: int = 0,
) -> Window:
    """``threads`` threads calling ``send_one()`` back to back for ``seconds`` after ``warmup`` sends
    (route, connection, broker caches); an exception counts as a failed send."""
    for _ in range(warmup):
        send_one()
    stop = threading.Event()
    per_thread: list[list[float]] = [[] for _ in range(threads)]
    failures = [0] * threads

    def worker(index: int) -> None:
        lat = per_thread[index]
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = send_one()
            except Exception:  # noqa: BLE001 - any failed send counts as an error in the figures
                ok = False
            if ok:
                lat.append((time.perf_counter() - t0) * 1000.0)
            else:
                failures[index] += 1

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    cpu0, other0 = time.process_time(), process_cpu(cpu_pid) if cpu_pid else 0.0
    start = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join(30)
    elapsed = time.perf_counter() - start
    cpu1, other1 = time.process_time(), process_cpu(cpu_pid) if cpu_pid else 0.0
    return Window(
        [x for lat in per_thread for x in lat], sum(failures), elapsed, cpu1 - cpu0, other1 - other0
    )


def create_topic(namesrv: str, name: str, message_type: str | None = "TRANSACTION") -> None:
    cmd = [sys.executable, "-m", "txmsg_broker", "topic", "create", name, "--namesrv", namesrv]
    if message_type:
        cmd += ["--type", message_type]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def reached(predicate: Callable[[], object], timeout: float) -> bool:
    """Whether ``predicate`` came true within ``timeout``: a benchmark reports a timeout as an
    incomplete run instead of failing, so this wraps the tests' one polling helper."""
    try:
        wait_until(predicate, timeout=timeout)
    except AssertionError:
        return False
    return True


@dataclass
class CheckRecorder:
    """What a check_local implementation saw: per call (key, start, end, thread)."""

    sleep: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[tuple[str, float, float, int]] = field(default_factory=list)
    first_answer: dict[str, float] = field(default_factory=dict)

    def check(self, key: str) -> None:
        start = time.monotonic()
        time.sleep(self.sleep)
        end = time.monotonic()
        with self.lock:
            self.calls.append((key, start, end, threading.get_ident()))
            self.first_answer.setdefault(key, end)

    def answered(self, keys: Sequence[str]) -> bool:
        with self.lock:
            return all(k in self.first_answer for k in keys)

    def summary(self, keys: Sequence[str]) -> dict[str, Any]:
        with self.lock:
            calls = list(self.calls)
            answers = {k: self.first_answer[k] for k in keys if k in self.first_answer}
        if not calls or not answers:
            return {"rate": 0.0, "calls": len(calls), "threads": 0, "overlap": 0, "answered": 0}
        begin = min(c[1] for c in calls)
        end = max(answers.values())
        events = sorted([(c[1], 1) for c in calls] + [(c[2], -1) for c in calls])
        current = overlap = 0
        for _, delta in events:
            current += delta
            overlap = max(overlap, current)
        return {
            "rate": len(answers) / max(end - begin, 1e-9),
            "calls": len(calls),
            "threads": len({c[3] for c in calls}),
            "overlap": overlap,
            "answered": len(answers),
        }


@dataclass
class DeliveryCounter:
    """Deliveries per transaction key, from a consumer on the benchmark topic."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[str] = field(default_factory=Counter)
    last: float = 0.0

    def add(self, key: str | None) -> bool:
        with self.lock:
            self.counts[key or "?"] += 1
            self.last = time.monotonic()
        return True

    def settled(self, keys: Sequence[str], quiet: float) -> bool:
        with self.lock:
            return all(k in self.counts for k in keys) and time.monotonic() - self.last > quiet

    def summary(self, keys: Sequence[str]) -> dict[str, Any]:
        with self.lock:
            per_key = [self.counts.get(k, 0) for k in keys]
        delivered = sum(1 for n in per_key if n)
        return {
            "delivered": delivered,
            "deliveries": sum(per_key),
            "per_message": (sum(per_key) / delivered) if delivered else 0.0,
            "duplicated": sum(1 for n in per_key if n > 1),
        }
