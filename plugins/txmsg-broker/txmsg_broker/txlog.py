"""``transaction.log`` and ``broker.log`` in the real RocketMQ 4.9 broker's line format.

Logback pattern ``%d{yyy-MM-dd HH:mm:ss,GMT+8} %p %t - %m%n``: no milliseconds, timestamps always in
UTC+8 whatever the host's zone, then level, a Java-style thread name, `` - `` and the message. Keeping
the exact format (and the real message texts, see ``transaction_service``) lets one log analyser read
logs from our broker and from a real one.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TextIO

LEVELS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "WARN": 30, "WARNING": 30, "ERROR": 40, "OFF": 100}
_GMT8 = timezone(timedelta(hours=8))


def level_value(name: str) -> int:
    try:
        return LEVELS[name.upper()]
    except KeyError:
        raise ValueError(
            f"unknown log level {name!r}; use one of DEBUG, INFO, WARN, ERROR"
        ) from None


class RocketLog:
    """One log file. Lines are flushed as they are written so tests and tail -f see them at once."""

    def __init__(self, path: str | Path, level: str = "INFO") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.level = level_value(level)
        self._fh: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self._stamp_second = -1
        self._stamp = ""

    def enabled(self, level: str) -> bool:
        return LEVELS[level] >= self.level

    def _timestamp(self) -> str:
        second = int(time.time())
        if second != self._stamp_second:
            self._stamp_second = second
            self._stamp = datetime.fromtimestamp(second, _GMT8).strftime("%Y-%m-%d %H:%M:%S")
        return self._stamp

    def log(self, level: str, thread: str, message: str) -> None:
        if LEVELS[level] < self.level:
            return
        with self._lock:
            if self._fh is None:
                return
            try:
                self._fh.write(f"{self._timestamp()} {level} {thread} - {message}\n")
                self._fh.flush()
            except OSError:  # the log's own disk is full: lose the line, never the request
                pass

    def debug(self, thread: str, message: str) -> None:
        self.log("DEBUG", thread, message)

    def info(self, thread: str, message: str) -> None:
        self.log("INFO", thread, message)

    def warn(self, thread: str, message: str) -> None:
        self.log("WARN", thread, message)

    def error(self, thread: str, message: str) -> None:
        self.log("ERROR", thread, message)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


class ThreadNames:
    """Cycles Java pool thread names (``EndTransactionThread_1`` .. ``_N``) like a worker pool would."""

    def __init__(self, prefix: str, size: int) -> None:
        self.prefix = prefix
        self.size = size
        self._next = 0

    def next(self) -> str:
        self._next = self._next % self.size + 1
        return f"{self.prefix}{self._next}"


class BrokerLogs:
    """The two log files of one broker."""

    def __init__(self, log_dir: str | Path, transaction_level: str = "INFO") -> None:
        self.log_dir = Path(log_dir)
        self.transaction = RocketLog(self.log_dir / "transaction.log", transaction_level)
        self.broker = RocketLog(self.log_dir / "broker.log", "INFO")

    def close(self) -> None:
        self.transaction.close()
        self.broker.close()
