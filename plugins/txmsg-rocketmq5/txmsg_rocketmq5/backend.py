"""``RocketMQ5Backend``: txmsg's :class:`~txmsg.backend.Backend` over the official RocketMQ 5 client.

Entry point ``txmsg.backends: rocketmq5``; chosen with ``backend = "rocketmq5"`` (or
``TXMSG_BACKEND=rocketmq5``), connecting to ``endpoints`` (``TXMSG_ENDPOINTS``, gRPC
``host:port[;host:port]``) with ``access_key``/``secret_key``, ``namespace`` and ``tls``.

Differences from the ``rocketmq`` backend, and why:

* One 5.x ``Producer`` per group, its check-backs run ``check_concurrency`` at once on the
  sender's own pool (:mod:`.sender`): the 5.x client delivers commands on one stream, so more
  client instances would not help; more threads do.
* A RocketMQ 5 proxy routes check-backs **by topic** (the topic is the producer group of gRPC
  producers), so two producer groups of one app must not send to the same topic: a check-back
  could reach the other group's ``check_local``.  Declared topics are checked here
  (``ValueError`` at start); listeners should declare every topic they send to, so check-backs
  reach the producer from its start.
* Plain sends (:mod:`.plain`): ordered sends are FIFO messages (``message_group``), delays are
  delivery timestamps, one-way sends are asynchronous sends whose answer is only logged, batches
  are sent one by one (``capabilities`` below).
* Orderly listeners (:mod:`.fifo`) need a FIFO consumer group (``consumeMessageOrderly``) on a
  FIFO topic; ``subscribe(orderly=True)`` refuses to start otherwise.
* System topics (:mod:`.remoting`): a 5.x proxy refuses every one over gRPC (``GrpcValidator.
  validateTopic``: "cannot access system topic"), so the rescue of discarded half messages
  (``TRANS_CHECK_MAX_TIME_TOPIC``) goes through the name server, with the ``rocketmq`` backend's
  client, when ``name_server`` is configured; else ``subscribe`` raises
  :class:`~txmsg.errors.SystemTopicUnavailableError` and the app runs on without the rescue.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from txmsg import defaults
from txmsg.backend import (
    Capabilities,
    CheckHandler,
    ConsumeHandler,
    check_sender_arguments,
    check_subscription_arguments,
)
from txmsg.errors import BackendUnavailableError, ListenerDefinitionError
from txmsg.names import check_name, rocketmq_rule

from ._client import ClientConfiguration, Credentials
from .consumer import LoopConsumer
from .fifo import FifoConsumer
from .names import name_rule
from .plain import PlainSender
from .remoting import SystemTopicRoute, is_system_topic
from .sender import Rocketmq5Sender
from .settings import RocketMQ5Settings

log = logging.getLogger("txmsg.rocketmq5")

_RULES = (rocketmq_rule, name_rule)


class RocketMQ5Backend:
    """Producers (and consumers) on ``rocketmq-python-client`` 5.x for one set of endpoints."""

    name = "rocketmq5"
    capabilities = Capabilities(
        shared_topics=False,
        dlq_listener=False,
        max_topic_length=127,
        oneway=False,
        batch=False,
        delay_levels=True,
        delivery_timestamps=True,
        orderly_consumer=True,
        orderly_crash_safe=True,
    )
    """What a 5.x proxy allows less of: check-backs routed by topic (no topic shared by two
    groups), no subscription to ``%DLQ%`` topics, topics of at most 127 characters, no one-way
    RPC and no batch send (emulated, :mod:`.plain`); and what it has more of: delivery timestamps
    (delay levels map onto them)."""
    name_rule = staticmethod(name_rule)
    """Names a RocketMQ 5 proxy accepts (also the ``txmsg.name_rules`` entry point)."""

    def __init__(self, config: Any = None) -> None:
        self.config = config
        settings = RocketMQ5Settings.of(config)
        self.endpoints: str = settings.endpoints
        self.namespace: str = settings.namespace
        self.tls: bool = settings.tls
        # the client puts it into an int64 protobuf field: whole seconds
        self.request_timeout: int = max(1, math.ceil(settings.send_timeout_ms / 1000))
        self.credentials = Credentials(settings.access_key or "", settings.secret_key or "")
        self._lock = threading.Lock()
        self._senders: list[Rocketmq5Sender] = []
        self._plain: list[PlainSender] = []
        self._topic_owner: dict[str, str] = {}
        self._consumers: dict[str, Any] = {}
        self._closed = False
        self.system_topics = SystemTopicRoute(config, settings.name_server)
        """Where system topics are read: remoting, when a name server is known."""

    def client_configuration(self) -> Any:
        """A fresh ``ClientConfiguration`` (the client keeps per-instance state in it)."""
        return ClientConfiguration(
            self.endpoints,
            self.credentials,
            namespace=self.namespace,
            request_timeout=self.request_timeout,
        )

    # ---- producers -----------------------------------------------------------------------------
    def create_transactional_sender(
        self,
        group: str,
        check_handler: CheckHandler,
        *,
        check_concurrency: int,
        topics: Sequence[str] = (),
    ) -> Rocketmq5Sender:
        """Start one 5.x transactional ``Producer`` for ``group`` publishing ``topics``, its
        check-backs running ``check_concurrency`` at once."""
        self._ensure_open()
        check_sender_arguments(
            group, topics, check_concurrency, owner="RocketMQ 5 backend", rules=_RULES
        )
        with self._lock:
            for topic in topics:
                owner = self._topic_owner.get(topic)
                if owner is not None and owner != group:
                    raise ListenerDefinitionError(
                        f"topic {topic!r} is declared by producer groups {owner!r} and {group!r}; "
                        "a RocketMQ 5 proxy routes check-backs by topic (the topic is the producer "
                        "group of gRPC producers), so one group's check_local could answer the "
                        "other's transactions. Give each listener its own topics"
                    )
            for topic in topics:
                self._topic_owner[topic] = group
        sender = Rocketmq5Sender(
            group,
            check_handler,
            configuration=self.client_configuration(),
            topics=tuple(topics),
            check_concurrency=int(check_concurrency),
            tls=self.tls,
        )
        with self._lock:
            self._senders.append(sender)
        return sender

    def create_sender(self, group: str) -> PlainSender:
        """Start a 5.x ``Producer`` for plain sends of ``group`` (its own client instance)."""
        self._ensure_open()
        check_name("producer_group", group, owner="RocketMQ 5 backend", rules=_RULES)
        sender = PlainSender(group, configuration=self.client_configuration(), tls=self.tls)
        with self._lock:
            if self._closed:  # closed while the client started
                closing = True
            else:
                closing = False
                self._plain.append(sender)
        if closing:
            sender.close(0)
            self._ensure_open()
        return sender

    # ---- consumers -----------------------------------------------------------------------------
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
        orderly: bool = False,
    ) -> Callable[[float], None]:
        """Start a :class:`~.consumer.LoopConsumer` (``SimpleConsumer`` + txmsg's loop; see
        there for why not the 5.x ``PushConsumer``), or with ``orderly`` a
        :class:`~.fifo.FifoConsumer` (raises ``ListenerDefinitionError`` when the proxy does not
        treat the group as a FIFO group).  ``consume_from`` has no 5.x equivalent: a new group
        starts where the proxy decides (a 5.x proxy: the queue's end)."""
        self._ensure_open()
        if is_system_topic(topic):  # the proxy refuses it: remoting, or SystemTopicUnavailableError
            return self.system_topics.subscribe(
                topic,
                group,
                handler,
                tags=tags,
                concurrency=concurrency,
                max_reconsume=max_reconsume,
                consume_from=consume_from,
            )
        check_subscription_arguments(topic, group, owner="RocketMQ 5 backend", rules=_RULES)
        with self._lock:
            if group in self._consumers:
                raise ListenerDefinitionError(
                    f"consumer group {group!r} already subscribes here; RocketMQ needs every "
                    "consumer of a group to subscribe identically - give this listener its own group"
                )
        consumer: LoopConsumer | FifoConsumer
        if orderly:
            consumer = FifoConsumer(
                self.client_configuration(),
                group=group,
                topic=topic,
                tags=tags,
                handler=handler,
                concurrency=int(concurrency),
                tls=self.tls,
            )
        else:
            consumer = LoopConsumer(
                self.client_configuration(),
                group=group,
                topic=topic,
                tags=tags,
                handler=handler,
                concurrency=int(concurrency),
                max_reconsume=int(max_reconsume),
                tls=self.tls,
            )

        def stop(timeout: float = defaults.CLOSE_TIMEOUT) -> None:
            consumer.stop(timeout)
            with self._lock:
                if self._consumers.get(group) is stop:
                    del self._consumers[group]

        with self._lock:
            self._consumers[group] = stop
        return stop

    # ---- lifecycle -----------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if self._closed:
            raise BackendUnavailableError("this RocketMQ5Backend is closed; create a new one")

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Stop consumers, then close every sender (each bounded by ``timeout``)."""
        with self._lock:
            self._closed = True
            consumers = list(self._consumers.values())
            self._consumers.clear()
            senders = list(self._senders)
            self._senders.clear()
            plain = list(self._plain)
            self._plain.clear()
        for stop in consumers:
            stop(timeout)
        for sender in senders:
            sender.close(timeout)
        for plain_sender in plain:
            plain_sender.close(timeout)
        self.system_topics.close(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "producers": {s.group: s.stats() for s in self._senders},
                "plain_producers": {p.group: p.stats() for p in self._plain},
            }
