"""``RocketMQ5Settings``: the keys the ``rocketmq5`` backend reads (entry point ``txmsg.settings: rocketmq5``).

Top-level keys of ``txmsg.toml`` / ``TXMSG_*`` (``endpoints = "proxy:8081"``,
``TXMSG_ENDPOINTS``), validated when the configuration loads, read typed by the backend with
``RocketMQ5Settings.of(config)``.  Light on purpose (pydantic only): the configuration loads it
without the 5.x client.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from txmsg.settings import BackendSettings, check_addresses

ENDPOINTS_FORM = (
    "host:port[;host:port] of RocketMQ 5 gRPC endpoints (proxies), e.g. 127.0.0.1:8081 or "
    "proxy1:8081;proxy2:8081, port 1..65535"
)
NAME_SERVER_FORM = "host:port[;host:port] (e.g. 127.0.0.1:9876 or ns1:9876;ns2:9876), port 1..65535"
"""The ``rocketmq`` backend's form of ``name_server`` (the same key, the same words)."""
NAMESPACE_PATTERN = r"^[%|a-zA-Z0-9_-]{0,64}$"
DEFAULT_ENDPOINTS = "127.0.0.1:8081"


def check_endpoints(value: str) -> str:
    """``value`` normalised if it is ``host:port[;host:port]``, else ValueError with the form."""
    return check_addresses(value, what="endpoints", form=ENDPOINTS_FORM)


class RocketMQ5Settings(BackendSettings):
    """Settings of the ``rocketmq5`` backend (official 5.x client, gRPC)."""

    backend: ClassVar[str] = "rocketmq5"

    endpoints: str = Field(default=DEFAULT_ENDPOINTS, min_length=1)
    """gRPC endpoint(s) of RocketMQ 5 proxies, ``host:port[;host:port]``."""
    namespace: str = Field(default="", pattern=NAMESPACE_PATTERN)
    """The RocketMQ 5 namespace of topics and groups ("" = none)."""
    tls: bool = False
    """Connect to the endpoints over TLS."""
    send_timeout_ms: int = Field(default=3000, gt=0)
    """Request timeout, milliseconds (the client rounds it up to whole seconds)."""
    access_key: str | None = None
    """Credentials of the proxy's ACL; with ``secret_key``."""
    secret_key: str | None = None
    name_server: str | None = None
    """The name server of the cluster behind the proxy (remoting, ``host:port[;host:port]``);
    None: not known.  A 5.x proxy serves no system topic over gRPC, so the rescue of discarded
    half messages (:mod:`txmsg.rescue`) reads ``TRANS_CHECK_MAX_TIME_TOPIC`` and sends the
    rescued messages through it, with the ``rocketmq`` backend's client (``txmsg[rocketmq]``);
    ``txmsg doctor`` reads the brokers' transaction settings through it too."""

    @field_validator("name_server")
    @classmethod
    def _valid_name_server(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_addresses(value, what="name server", form=NAME_SERVER_FORM)

    @field_validator("endpoints")
    @classmethod
    def _valid_endpoints(cls, value: str) -> str:
        return check_endpoints(value)
