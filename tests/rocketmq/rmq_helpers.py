"""Helpers for the RocketMQ backend tests (real librocketmq against the embedded broker)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field

from click.testing import CliRunner
from txmsg_broker.cli import topic as topic_cli
from txmsg_broker.testing import wait_until

#: the tests import every helper from here; the polling one is the shared txmsg_broker.testing one
__all__ = ["Calls", "create_topic", "unique", "wait_until"]

_seq = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_seq)}"


def create_topic(namesrv: str, name: str, message_type: str | None = None) -> None:
    """Create a topic through the broker's admin command (like ``mqadmin updateTopic``)."""
    args = ["create", name, "--namesrv", namesrv]
    if message_type:
        args += ["--type", message_type]
    result = CliRunner().invoke(topic_cli, args)
    assert result.exit_code == 0, result.output


@dataclass
class Calls:
    """Start/end times and threads of callback invocations (to see overlap)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[tuple[str | None, float, float, int]] = field(default_factory=list)

    def record(self, key: str | None, start: float) -> None:
        with self.lock:
            self.spans.append((key, start, time.monotonic(), threading.get_ident()))

    def keys(self) -> set[str | None]:
        with self.lock:
            return {s[0] for s in self.spans}

    def max_overlap(self) -> int:
        with self.lock:
            events = sorted([(s[1], 1) for s in self.spans] + [(s[2], -1) for s in self.spans])
        current = best = 0
        for _, delta in events:
            current += delta
            best = max(best, current)
        return best

    def threads(self) -> int:
        with self.lock:
            return len({s[3] for s in self.spans})
