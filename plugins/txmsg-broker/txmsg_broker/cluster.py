"""Several brokers behind one name server, each broker its own OS process (``txmsg broker --brokers N``).

Layout: one stand-alone name server process (``nameserver.py``) and N broker processes
(``broker-a``, ``broker-b``, ...) started with ``--namesrv-addr``, each with its own store, half
queue, check loop and logs under ``<data_dir>/<broker name>`` and ``<log_dir>/<broker name>``
(the name server logs to ``<log_dir>/namesrv``).  Why processes: a test or the chaos monkey can
``kill -9`` one broker and restart it while the other keeps serving and the name server drops the
dead one from the routes - what a real cluster does.  The name server is not inside broker-a for
the same reason: killing broker-a must not take every route down with it.

Ports: the name server on ``namesrv_port``; broker-a on ``broker_port``, each next broker on the
first free port after the previous one (all ``0`` = any free port).  Ports are kept for restarts.
The gRPC endpoint (``grpc_port``), when asked for, runs on broker-a only.
"""

from __future__ import annotations

import os
import re
import socket
import string
import sys
from typing import Any

from .app import BrokerProcess, _dirs
from .childproc import ChildProcess

NAMESRV_READY = re.compile(r"txmsg namesrv accepting connections: (\S+):(\d+)")


def broker_names(count: int) -> list[str]:
    """``broker-a``, ``broker-b``, ... (the names RocketMQ's sample configurations use)."""
    if not 1 <= count <= len(string.ascii_lowercase):
        raise ValueError(
            f"brokers must be between 1 and {len(string.ascii_lowercase)}, got {count}"
        )
    return [f"broker-{letter}" for letter in string.ascii_lowercase[:count]]


def next_free_port(host: str, after: int) -> int:
    """The first port above ``after`` that ``host`` can bind now."""
    for port in range(after + 1, 65536):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port above {after} on {host}")


class NamesrvProcess(ChildProcess):
    """The stand-alone name server in a subprocess (``python -m txmsg_broker namesrv``)."""

    what = "name server"

    def __init__(
        self, log_dir: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(log_dir)
        self.host = host
        self.port = port

    @property
    def addr(self) -> str:
        return f"{'127.0.0.1' if self.host in ('0.0.0.0', '') else self.host}:{self.port}"  # noqa: S104 - a comparison, not a bind

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "txmsg_broker",
            "namesrv",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-dir",
            str(self.log_dir),
            # port 0: bound by the name server itself, where a restart can bind it again
            *(["--restartable-ports"] if self.port == 0 else []),
        ]

    def start(self, timeout: float = 30.0) -> NamesrvProcess:
        if self.running:
            return self
        match, _text = self._spawn(NAMESRV_READY, timeout)
        self.port = int(match.group(2))
        return self


class BrokerCluster:
    """A name server process and ``brokers`` broker processes (:class:`BrokerProcess` each).

    ``cluster.brokers[i]`` / ``cluster.broker("broker-b")`` are ordinary :class:`BrokerProcess`
    objects: ``kill()`` (SIGKILL), ``start()``, ``restart()``, ``log_dir``, ``data_dir``,
    ``broker_addr`` of that broker alone.  ``namesrv_addr`` is what clients use.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        brokers: int = 2,
        host: str = "127.0.0.1",
        namesrv_port: int = 0,
        broker_port: int = 0,
        **settings: Any,
    ) -> None:
        self.data_dir, self.log_dir = _dirs(data_dir, log_dir)
        self.host = host
        self.first_broker_port = broker_port
        grpc_port = settings.pop("grpc_port", None)
        if grpc_port is not None and settings.get("broker_version") is None:
            # the gRPC endpoint makes broker-a a 5.x broker: its peers must run as the same version
            settings["broker_version"] = "5.3.3"
        self.namesrv = NamesrvProcess(self.log_dir / "namesrv", host=host, port=namesrv_port)
        self.brokers: list[BrokerProcess] = []
        for index, name in enumerate(broker_names(brokers)):
            extra: dict[str, Any] = {"broker_name": name}
            if index == 0 and grpc_port is not None:
                extra["grpc_port"] = grpc_port
            port = broker_port if index == 0 else 0  # the others: chosen by start()
            self.brokers.append(
                BrokerProcess(
                    self.data_dir / name,
                    self.log_dir / name,
                    host=host,
                    broker_port=port,
                    **settings,
                    **extra,
                )
            )

    # -- addresses ------------------------------------------------------------------------------
    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    @property
    def broker_addrs(self) -> dict[str, str]:
        return {str(b.settings["broker_name"]): b.broker_addr for b in self.brokers}

    @property
    def grpc_endpoint(self) -> str | None:
        """broker-a's gRPC endpoint (the only one), None when off."""
        return self.brokers[0].grpc_endpoint

    @property
    def running(self) -> bool:
        return self.namesrv.running and all(b.running for b in self.brokers)

    def broker(self, name: str) -> BrokerProcess:
        for b in self.brokers:
            if b.settings["broker_name"] == name:
                return b
        raise KeyError(f"no broker named {name!r}; this cluster has {', '.join(self.broker_addrs)}")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> BrokerCluster:
        """Start the name server, then every broker not running (each is routed once it is ready)."""
        self.namesrv.start(timeout)
        previous: int | None = None
        for b in self.brokers:
            b.settings["namesrv_addr"] = self.namesrv.addr
            b.namesrv_port = self.namesrv.port
            if b.broker_port == 0 and previous is not None and self.first_broker_port != 0:
                b.broker_port = next_free_port(self.host, previous)
            b.start(timeout)
            previous = b.broker_port
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every broker (each unregisters), then the name server."""
        for b in self.brokers:
            b.stop(timeout)
        self.namesrv.stop(timeout)

    def kill(self) -> None:
        for b in self.brokers:
            b.kill()
        self.namesrv.kill()

    def restart(self) -> BrokerCluster:
        self.stop()
        return self.start()

    def ready_line(self) -> str:
        """``txmsg broker --brokers N``'s ready line: every address (broker-a's also as ``broker``)."""
        first = self.brokers[0]
        listing = ",".join(f"{name}={addr}" for name, addr in self.broker_addrs.items())
        grpc = f"grpc {self.grpc_endpoint} " if self.grpc_endpoint else ""
        return (
            f"txmsg broker accepting connections: namesrv {self.namesrv_addr} broker {first.broker_addr} "
            f"brokers {listing} {grpc}(data {self.data_dir}, logs {self.log_dir}, "
            f"flush {first.settings.get('flush', 'async')})"
        )

    def __enter__(self) -> BrokerCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
