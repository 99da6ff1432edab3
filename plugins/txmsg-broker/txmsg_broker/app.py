"""Embedding API: run the broker in a background thread (``EmbeddedBroker``) or as a child process
(``EmbeddedBroker.spawn`` → ``BrokerProcess``, for ``kill -9`` tests).

Both expose ``namesrv_addr`` ("127.0.0.1:port"), ``broker_addr``, ``log_dir``, ``data_dir`` and
``start()/stop()/restart()``. Ports chosen on the first start (0 = any free port) are kept for restarts,
so connected clients find the broker again.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import time_control
from .broker import Broker
from .childproc import ChildProcess
from .clock import ManualClock
from .config import BrokerConfig
from .time_control import ClockReport

T = TypeVar("T")
READY_PATTERN = re.compile(r"accepting connections: namesrv (\S+):(\d+) broker (\S+):(\d+)")
#: the optional part of the ready line when the gRPC endpoint is on
GRPC_READY_PATTERN = re.compile(r"accepting connections: .*? grpc (\S+):(\d+)")


def _dirs(
    data_dir: str | os.PathLike[str] | None, log_dir: str | os.PathLike[str] | None
) -> tuple[Path, Path]:
    """The data and log directories; the ones not given go under one fresh temporary directory."""
    if data_dir is not None and log_dir is not None:
        return Path(data_dir), Path(log_dir)
    base = Path(tempfile.mkdtemp(prefix="txmsg-broker-"))
    return (
        Path(data_dir) if data_dir is not None else base / "data",
        Path(log_dir) if log_dir is not None else base / "logs",
    )


def ready_line(broker: Broker) -> str:
    """The one line printed when the broker accepts connections (parsed by ``BrokerProcess``)."""
    grpc = getattr(broker, "grpc", None)
    return (
        f"txmsg broker accepting connections: namesrv {broker.namesrv_addr} broker {broker.broker_addr} "
        + (f"grpc {grpc.endpoint} " if grpc is not None else "")
        + f"(data {broker.config.data_dir}, logs {broker.config.log_dir}, flush {broker.config.flush})"
    )


class EmbeddedBroker:
    """A broker on its own event loop in a daemon thread of this process."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        namesrv_port: int = 0,
        broker_port: int = 0,
        **settings: Any,
    ) -> None:
        data_path, log_path = _dirs(data_dir, log_dir)
        self.config = BrokerConfig(
            data_dir=data_path,
            log_dir=log_path,
            host=host,
            namesrv_port=namesrv_port,
            broker_port=broker_port,
            **settings,
        )
        self.broker: Broker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- addresses ------------------------------------------------------------------------------
    @property
    def namesrv_addr(self) -> str:
        return f"{self.config.bind_ip}:{self.config.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"{self.config.advertised_ip}:{self.config.broker_port}"

    @property
    def grpc_endpoint(self) -> str | None:
        """``host:port`` of the RocketMQ 5 gRPC endpoint (``grpc_port=`` setting), None when off."""
        grpc = getattr(self.broker, "grpc", None)
        return grpc.endpoint if grpc is not None else None

    @property
    def log_dir(self) -> Path:
        return self.config.log_dir

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        if self.running:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []
        self._stopped.clear()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            broker: Broker | None = None
            try:
                broker = Broker(self.config)
                loop.run_until_complete(broker.start())
                self.broker = broker
            except BaseException as exc:  # noqa: BLE001 - reported to the caller of start()
                if broker is not None:  # built but not started: close its files
                    broker.release()
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                try:
                    loop.run_until_complete(broker.stop())
                finally:  # a failed stop still closes the loop (else it leaks its sockets)
                    loop.close()
                    self._stopped.set()

        self._thread = threading.Thread(target=run, name="txmsg-broker", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"embedded broker did not start within {timeout} s")
        if failure:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"embedded broker failed to start: {failure[0]}") from failure[0]
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if not self.running or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:  # always: running means the thread is alive
            self._thread.join(timeout)
        self._thread = None
        self.broker = None

    def restart(self) -> EmbeddedBroker:
        self.stop()
        return self.start()

    def call(self, fn: Callable[[Broker], T], timeout: float = 10.0) -> T:
        """Run ``fn(broker)`` on the broker's loop thread and return its result (for inspection)."""
        if self._loop is None or self.broker is None:
            raise RuntimeError("broker is not running; call start() first")
        broker = self.broker

        async def invoke() -> T:
            return fn(broker)

        return asyncio.run_coroutine_threadsafe(invoke(), self._loop).result(timeout)

    def _time_control(self, action: str, seconds: float, answer_timeout: float) -> ClockReport:
        if self._loop is None or self.broker is None:
            raise RuntimeError("broker is not running; call start() first")
        broker = self.broker
        if not isinstance(broker.clock, ManualClock):
            raise RuntimeError("the broker runs on the wall clock: start it with manual_clock=True")
        work = time_control.run_action(broker, broker.clock, action, seconds, answer_timeout)
        data = asyncio.run_coroutine_threadsafe(work, self._loop).result()
        return ClockReport.from_json(data)

    def advance(
        self, seconds: float, *, answer_timeout: float = time_control.DEFAULT_ANSWER_TIMEOUT
    ) -> ClockReport:
        """Manual clock: move the broker's time ``seconds`` on and run what fell due (see
        :mod:`txmsg_broker.time_control`)."""
        return self._time_control("advance", seconds, answer_timeout)

    def check_now(
        self, *, answer_timeout: float = time_control.DEFAULT_ANSWER_TIMEOUT
    ) -> ClockReport:
        """Manual clock: run the next transaction check pass now and wait for its answers."""
        return self._time_control("check_now", 0.0, answer_timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- child process --------------------------------------------------------------------------
    @classmethod
    def spawn(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        **settings: Any,
    ) -> BrokerProcess:
        """Start the broker as a child process (``python -m txmsg_broker broker ...``)."""
        return BrokerProcess(data_dir, log_dir, **settings).start()


class BrokerProcess(ChildProcess):
    """The broker CLI in a subprocess; ``kill()`` is a real SIGKILL.

    Ports left to "any free port" (0) are chosen by the broker itself (``--restartable-ports``:
    each listener binds a free port below the kernel's ephemeral range, see ``ports.py``) and read
    back from its ready line, then kept for :meth:`restart`.  Why in the child: a port probed here
    and handed over could be taken by another process (a parallel test's broker) before the
    child bound it; a bind is atomic."""

    what = "broker process"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        namesrv_port: int = 0,
        broker_port: int = 0,
        **settings: Any,
    ) -> None:
        self.data_dir, log_path = _dirs(data_dir, log_dir)
        super().__init__(log_path)
        self.host = host
        self.namesrv_port = namesrv_port
        self.broker_port = broker_port
        self.settings = settings
        #: ``host:port`` of the gRPC endpoint once started with ``grpc_port=`` (None when off)
        self.grpc_endpoint: str | None = None

    @property
    def namesrv_addr(self) -> str:
        return f"{'127.0.0.1' if self.host in ('0.0.0.0', '') else self.host}:{self.namesrv_port}"  # noqa: S104 - a comparison, not a bind

    @property
    def broker_addr(self) -> str:
        return f"{'127.0.0.1' if self.host in ('0.0.0.0', '') else self.host}:{self.broker_port}"  # noqa: S104 - a comparison, not a bind

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "txmsg_broker",
            "broker",
            "--host",
            self.host,
            "--namesrv-port",
            str(self.namesrv_port),
            "--broker-port",
            str(self.broker_port),
            "--data-dir",
            str(self.data_dir),
            "--log-dir",
            str(self.log_dir),
        ]
        if 0 in (self.namesrv_port, self.broker_port, self.settings.get("grpc_port")):
            # the broker binds them itself, race-free, where a restart can bind them again
            cmd.append("--restartable-ports")
        for key, value in self.settings.items():
            option = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                cmd.append(option if value else "--no-" + key.replace("_", "-"))
            else:
                cmd += [option, str(value)]
        return cmd

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        match, text = self._spawn(READY_PATTERN, timeout)
        self.namesrv_port = int(match.group(2))
        self.broker_port = int(match.group(4))
        grpc_match = GRPC_READY_PATTERN.search(text)
        if grpc_match:
            # keep the port for restarts, as for the other two
            self.settings["grpc_port"] = int(grpc_match.group(2))
            self.grpc_endpoint = f"{grpc_match.group(1)}:{grpc_match.group(2)}"
        return self

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

    # -- manual clock (``manual_clock=True``; txmsg_broker.time_control) ---------------------------
    def advance(
        self, seconds: float, *, answer_timeout: float = time_control.DEFAULT_ANSWER_TIMEOUT
    ) -> ClockReport:
        """Move the broker's manual clock ``seconds`` on: every check pass, op batch, delay level
        and lock expiry that falls due runs, in order, at its own time; returns once all of it ran
        (check-backs answered, deliveries handed to consumers)."""
        return time_control.request(
            self.broker_addr, "advance", seconds=seconds, answer_timeout=answer_timeout
        )

    def check_now(
        self, *, answer_timeout: float = time_control.DEFAULT_ANSWER_TIMEOUT
    ) -> ClockReport:
        """Run the transaction check service's next pass now (the clock moves only through the
        pass's own 5.x pause); returns once its check-backs were answered."""
        return time_control.request(self.broker_addr, "check_now", answer_timeout=answer_timeout)

    def clock_ms(self) -> int:
        """The broker's manual clock now (ms since the epoch)."""
        return time_control.request(self.broker_addr, "now").now_ms

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
