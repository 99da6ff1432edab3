"""``RocketMQSettings``: the keys the ``rocketmq`` backend reads (entry point ``txmsg.settings: rocketmq``).

Top-level keys of ``txmsg.toml`` / ``TXMSG_*`` (``name_server = "ns:9876"``,
``TXMSG_NAME_SERVER``), validated when the configuration loads, read typed by the backend with
``RocketMQSettings.of(config)``.  Light on purpose (pydantic only): the configuration loads it
without librocketmq.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from txmsg.settings import BackendSettings, check_addresses

NAME_SERVER_FORM = "host:port[;host:port] (e.g. 127.0.0.1:9876 or ns1:9876;ns2:9876), port 1..65535"
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
"""A RocketMQ 4.9 broker's default ``maxMessageSize`` (4 MiB)."""
PULL_THREADS = 16
"""Default pull threads per push consumer."""


def check_name_server(value: str) -> str:
    """``value`` normalised if it is ``host:port[;host:port]``, else ValueError with the form."""
    return check_addresses(value, what="name server", form=NAME_SERVER_FORM)


class RocketMQSettings(BackendSettings):
    """Settings of the ``rocketmq`` backend (librocketmq 2.1.0, remoting)."""

    backend: ClassVar[str] = "rocketmq"

    name_server: str = Field(default="127.0.0.1:9876", min_length=1)
    """RocketMQ name server(s), ``host:port[;host:port]``."""
    send_timeout_ms: int = Field(default=3000, gt=0)
    """Send timeout of every producer, milliseconds."""
    client_log_dir: str = "var/rocketmq-client"
    """Where the native client writes its logs (instead of ``~/logs/rocketmq-cpp``)."""
    instance_prefix: str | None = None
    """Prefix of the client instance names (default ``txmsg``)."""
    access_key: str | None = None
    """ACL access key (RocketMQ 4.x plain ACL); with ``secret_key``."""
    secret_key: str | None = None
    pull_threads: int = Field(default=PULL_THREADS, ge=1, le=256)
    """Pull threads per push consumer (with ``sync_pull``, one queue at a time per thread: keep
    it at least the number of queues one consumer owns, retry queue included)."""
    sync_pull: bool = False
    """Pull synchronously (librocketmq's workaround-free path for a queue that stops being
    pulled after a rebalance) instead of asynchronous pulls the broker holds while nothing
    arrives, watched for that stall (docs/librocketmq-hazards.md #5).  Costs about a core per
    idle consumer: a synchronous pull is never held."""
    max_message_size: int = Field(default=DEFAULT_MAX_MESSAGE_SIZE, ge=1024)
    """Largest body the producers accept before sending (the broker's ``maxMessageSize``); a
    larger one fails at once with InvalidMessageError instead of a broker error."""

    @field_validator("name_server")
    @classmethod
    def _valid_name_server(cls, value: str) -> str:
        return check_name_server(value)
