"""Shared pieces of the RocketMQ backend benchmarks (check_scaling, send_overhead).

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

from txmsg_broker.testing import wait_until


def ensure_client_log_dir() -> str:
    """librocketmq writes to /logs/... unless told otherwise: point it at a temp dir."""
    path = os.environ.get("ROCKETMQ_CLIENT_LOG_DIR") or tempfile.mkdtemp(prefix="rmq-bench-client-")
    os.environ["ROCKETMQ_CLIENT_LOG_DIR"] = path
    return path


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
