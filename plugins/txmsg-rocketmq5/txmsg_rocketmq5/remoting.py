"""System topics of a RocketMQ 5 deployment, reached through its name server (remoting).

Why: a 5.x proxy serves no system topic over gRPC.  In apache/rocketmq 5.3.3,
``proxy/src/main/java/org/apache/rocketmq/proxy/grpc/v2/common/GrpcValidator.java`` lines 60-61
(``validateTopic``) refuse every ``TopicValidator.isSystemTopic`` name with ``ILLEGAL_TOPIC``
"cannot access system topic", and that check runs first in ``RouteActivity.queryRoute``
(``RouteActivity.java`` line 65), ``ReceiveMessageActivity`` (line 96) and ``AckMessageActivity``
(line 55): a ``SimpleConsumer`` or ``PushConsumer`` cannot even get the route of
``TRANS_CHECK_MAX_TIME_TOPIC``, where the brokers put the half messages they stopped checking.
The brokers themselves serve it to remoting consumers, so the rescue of discarded half messages
(:mod:`txmsg.rescue`) consumes it with the ``rocketmq`` backend's client at the configured
``name_server`` (what it rescues is sent by the group's own 5.x transactional producer).

Without ``name_server`` or without the ``rocketmq`` backend installed, :class:`SystemTopicRoute`
raises :class:`~txmsg.errors.SystemTopicUnavailableError` naming both fixes; the app then runs
without the rescue and says so (a WARNING at start, ``txmsg doctor``).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from txmsg import defaults
from txmsg.backend import ConsumeHandler
from txmsg.errors import BackendUnavailableError, SystemTopicUnavailableError

from .names import SYSTEM_TOPIC_PREFIX, SYSTEM_TOPICS

REMOTING_BACKEND = "rocketmq"

NOT_RESCUED = (
    "a RocketMQ 5 proxy refuses system topics over gRPC (GrpcValidator.validateTopic: 'cannot "
    "access system topic'), so the backend reads {topic} through the cluster's name server"
)


def is_system_topic(topic: str) -> bool:
    """``TopicValidator.isSystemTopic``: what a 5.x proxy refuses over gRPC."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def remoting_installed() -> bool:
    """Whether the ``rocketmq`` backend's package is importable (found without importing it)."""
    return importlib.util.find_spec("txmsg_rocketmq") is not None


class SystemTopicRoute:
    """The remoting client of one :class:`~txmsg_rocketmq5.backend.RocketMQ5Backend` for system
    topics: a ``rocketmq`` backend at ``name_server``, created on first use, closed with it."""

    def __init__(self, config: Any, name_server: str | None) -> None:
        self.config = config
        self.name_server = name_server
        self._lock = threading.Lock()
        self._backend: Any = None

    def problem(self, topic: str = "TRANS_CHECK_MAX_TIME_TOPIC") -> str | None:
        """Why system topics cannot be reached here (what to do), or None when they can."""
        why = NOT_RESCUED.format(topic=topic)
        if self.name_server is None:
            return (
                f"{why}, and none is configured: set `name_server` (TXMSG_NAME_SERVER) to the "
                "name server behind the proxy, with the rocketmq backend installed "
                "(`pip install 'txmsg[rocketmq]'`)"
            )
        if not remoting_installed():
            return (
                f"{why} ({self.name_server}) with the rocketmq backend's client, which is not "
                "installed: `pip install 'txmsg[rocketmq]'` (librocketmq 2.1.0, Linux x86-64)"
            )
        return None

    def _remoting(self, topic: str) -> Any:
        problem = self.problem(topic)
        if problem is not None:
            raise SystemTopicUnavailableError(problem)
        with self._lock:
            if self._backend is None:
                from txmsg.app import load_backend_factory  # noqa: PLC0415 - only when configured

                values: dict[str, Any] = {}
                if isinstance(self.config, BaseModel):
                    values = dict(self.config.model_extra or {})
                elif isinstance(self.config, Mapping):
                    values = dict(self.config)
                values["name_server"] = self.name_server
                try:
                    self._backend = load_backend_factory(REMOTING_BACKEND)(values)
                except BackendUnavailableError as exc:
                    raise SystemTopicUnavailableError(
                        f"{NOT_RESCUED.format(topic=topic)} ({self.name_server}), but its client "
                        f"could not start: {exc}"
                    ) from exc
            return self._backend

    def subscribe(
        self,
        topic: str,
        group: str,
        handler: ConsumeHandler,
        *,
        tags: str = "*",
        concurrency: int = defaults.CONSUMER_CONCURRENCY,
        max_reconsume: int = defaults.MAX_RECONSUME,
        consume_from: str = "first",
    ) -> Callable[[float], None]:
        """A remoting push consumer of ``topic`` (see the module docstring)."""
        stop: Callable[[float], None] = self._remoting(topic).subscribe(
            topic,
            group,
            handler,
            tags=tags,
            concurrency=concurrency,
            max_reconsume=max_reconsume,
            consume_from=consume_from,
        )
        return stop

    def close(self, timeout: float) -> None:
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close(timeout)
