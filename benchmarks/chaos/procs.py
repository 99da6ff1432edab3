"""The chaos run's OS processes: start, ``kill -9``, restart, and tell when they are up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from txmsg_broker.app import BrokerProcess


class Child(Protocol):
    kind: str
    name: str
    kills: int
    starts: int

    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def stop(self, timeout: float) -> None: ...


class ServiceProcess:
    """A producer or consumer (``python -m benchmarks.chaos.roles ...``, or ``argv``) with its own
    log; ready once ``ready_mark`` is in the log since its last start."""

    def __init__(
        self,
        kind: str,
        name: str,
        args: list[str],
        log: Path,
        *,
        argv: list[str] | None = None,
        ready_mark: bytes = b"READY ",
        env: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.argv = argv or [sys.executable, "-m", "benchmarks.chaos.roles", *args]
        self.ready_mark = ready_mark
        self.env = env or {}
        self.log = log
        self.kills = 0
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready_from = 0
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def ready(self) -> bool:
        """Printed READY since its last start (and still running)."""
        if not self.alive or not self.log.exists():
            return False
        with open(self.log, "rb") as fh:
            fh.seek(self._ready_from)
            return self.ready_mark in fh.read()

    def start(self) -> None:
        with self._lock:
            if self.alive:
                return
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self._ready_from = self.log.stat().st_size if self.log.exists() else 0
            with open(self.log, "ab") as out:
                env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
                self.proc = subprocess.Popen(
                    self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            self.starts += 1

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, no goodbye to the broker."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                self.kills += 1
            self.proc = None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (the end of the run, not a fault)."""
        with self._lock:
            if self.proc is None:
                return
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None


class BrokerChild:
    """One embedded broker process (``--flush sync``) on fixed ports across restarts.

    With several brokers (``--brokers 2``) each broker (broker-a, broker-b) is its own child, so the
    monkey kills them independently; their name server process is never a victim (what the run
    tests is a broker dying under the clients, not the loss of every route).
    """

    kind = "broker"

    def __init__(self, process: BrokerProcess, name: str = "broker") -> None:
        self.process = process
        self.name = name
        self.kills = 0
        self.starts = 0
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return bool(self.process.running)

    ready = alive  # start() returns only once the broker accepts connections

    def start(self) -> None:
        with self._lock:
            if self.process.running:
                return
            for attempt in range(5):
                try:
                    self.process.start(timeout=60)
                    break
                except RuntimeError:  # e.g. the port is still held a moment after SIGKILL
                    if attempt == 4:
                        raise
                    time.sleep(1.0)
            self.starts += 1

    def kill(self) -> None:
        with self._lock:
            if self.process.running:
                self.process.kill()
                self.kills += 1

    def stop(self, timeout: float) -> None:
        with self._lock:
            self.process.stop(timeout)
