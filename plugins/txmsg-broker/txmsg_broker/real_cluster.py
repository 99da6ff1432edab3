"""A handle on an external, real RocketMQ cluster for tests (``--real-remoting`` / ``--real-grpc``).

The pytest plugin's ``txmsg_cluster`` fixture yields either the embedded broker or this handle; both
offer what a test needs to reach a cluster: ``namesrv_addr``, ``grpc_endpoint`` (None when no 5.x
proxy was given), ``log_dir`` (the broker's RocketMQ log directory when the user named it with
``--real-log-dir``, else None: a real broker's logs are usually on another host) and the broker's
transaction timings.  Topics and groups are created through the cluster's own admin protocol
(``txmsg_broker.testing.create_topic`` / ``create_group``: remoting requests 17 and 200 to every
master), as on the embedded broker, so a test does not care which one it got.

Why a handle and not a process: the cluster belongs to the user.  Nothing here starts, stops,
restarts or kills it; tests that need to (broker-kill faults, restarts) must not take this handle.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .codec import GET_BROKER_CLUSTER_INFO, SUCCESS

#: remoting request code of GET_BROKER_CONFIG (``RequestCode.GET_BROKER_CONFIG`` in 4.9.8 and 5.3.3)
GET_BROKER_CONFIG = 26

#: RocketMQ's defaults for what the handle reports when the broker's config lacks a key (4.9.8 and
#: 5.3.3 ``BrokerConfig``: transactionTimeOut 6000, transactionCheckInterval 60000 in 4.9.8 and
#: 30000 in 5.x, transactionCheckMax 15; 5.x transactionOpBatchInterval 3000)
_DEFAULTS = {
    "transactionTimeOut": 6000,
    "transactionCheckInterval": 60000,
    "transactionCheckMax": 15,
}


class ClusterUnreachable(RuntimeError):
    """The address given on the command line does not lead to a usable cluster."""


def _parse_properties(text: str) -> dict[str, str]:
    """``key=value`` lines (``MixAll.properties2String``, what GET_BROKER_CONFIG returns)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            out[key.strip()] = value.strip()
    return out


def _masters(namesrv_addr: str) -> list[str]:
    from . import fastjson  # noqa: PLC0415 - light at import
    from .rawclient import call  # noqa: PLC0415

    try:
        response = call(namesrv_addr, GET_BROKER_CLUSTER_INFO)
    except OSError as exc:
        raise ClusterUnreachable(
            f"cannot reach the name server at {namesrv_addr} ({exc}): is the cluster running, "
            "and is HOST:PORT its name server (default port 9876)?"
        ) from exc
    if response.code != SUCCESS:
        raise ClusterUnreachable(
            f"name server {namesrv_addr} refused cluster info: {response.code} {response.remark}"
        )
    info = fastjson.loads(response.body)
    masters = [
        b["brokerAddrs"].get("0") or b["brokerAddrs"].get(0)
        for b in info.get("brokerAddrTable", {}).values()
    ]
    found = sorted(m for m in masters if m)
    if not found:
        raise ClusterUnreachable(
            f"no master broker is registered at {namesrv_addr} yet: a broker registers with its "
            "name server some seconds after it starts; wait and run again"
        )
    return found


def _broker_config(addr: str) -> dict[str, str]:
    from .rawclient import call  # noqa: PLC0415

    try:
        response = call(addr, GET_BROKER_CONFIG)
    except OSError as exc:
        raise ClusterUnreachable(f"cannot reach the broker at {addr}: {exc}") from exc
    if response.code != SUCCESS:  # e.g. ACL: the handle still works, timings are the defaults
        return {}
    return _parse_properties(response.body.decode("utf-8", "replace"))


def _check_port(endpoint: str, what: str) -> None:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachable(f"{what} must be HOST:PORT, got {endpoint!r}")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ClusterUnreachable(f"cannot reach {what} at {endpoint}: {exc}") from exc


@dataclass(frozen=True)
class RealCluster:
    """An external RocketMQ cluster the tests may use but never stop (see the module doc)."""

    namesrv_addr: str
    grpc_endpoint: str | None = None
    log_dir: Path | None = None
    masters: tuple[str, ...] = ()
    #: the first master's configuration as GET_BROKER_CONFIG returned it (empty if refused)
    broker_config: Mapping[str, str] = field(default_factory=dict)
    is_real: ClassVar[bool] = True

    @classmethod
    def connect(
        cls, namesrv_addr: str, grpc_endpoint: str | None = None, log_dir: str | None = None
    ) -> RealCluster:
        """Check that the cluster answers (name server, a master, the proxy) and read the first
        master's configuration; :class:`ClusterUnreachable` says what is wrong."""
        _check_port(namesrv_addr, "the name server (--real-remoting)")
        masters = _masters(namesrv_addr)
        if grpc_endpoint is not None:
            _check_port(grpc_endpoint, "the 5.x proxy (--real-grpc)")
        path = Path(log_dir) if log_dir else None
        if path is not None and not path.is_dir():
            raise ClusterUnreachable(f"--real-log-dir {log_dir}: no such directory")
        return cls(namesrv_addr, grpc_endpoint, path, tuple(masters), _broker_config(masters[0]))

    def _int(self, key: str) -> int:
        value = self.broker_config.get(key, "")
        return int(value) if value.lstrip("-").isdigit() else _DEFAULTS[key]

    @property
    def transaction_timeout_ms(self) -> int:
        return self._int("transactionTimeOut")

    @property
    def check_interval_ms(self) -> int:
        return self._int("transactionCheckInterval")

    @property
    def check_max(self) -> int:
        return self._int("transactionCheckMax")

    @property
    def is_5x(self) -> bool:
        """A 5.x broker (its configuration has 5.x-only keys such as transactionOpBatchInterval)."""
        return "transactionOpBatchInterval" in self.broker_config

    def describe(self) -> str:
        """One line for the pytest header."""
        parts = [f"name server {self.namesrv_addr}", f"masters {', '.join(self.masters)}"]
        if self.grpc_endpoint:
            parts.append(f"proxy {self.grpc_endpoint}")
        parts.append(
            f"transactionTimeOut={self.transaction_timeout_ms} "
            f"transactionCheckInterval={self.check_interval_ms} "
            f"transactionCheckMax={self.check_max}"
        )
        if self.is_5x:
            parts.append(
                f"transactionOpBatchInterval={self.broker_config['transactionOpBatchInterval']}"
            )
        return "; ".join(parts)


__all__ = ["GET_BROKER_CONFIG", "ClusterUnreachable", "RealCluster"]
