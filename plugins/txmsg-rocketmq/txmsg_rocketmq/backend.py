"""``RocketMQBackend``: txmsg's :class:`~txmsg.backend.Backend` over the real RocketMQ client.

Entry point ``txmsg.backends: rocketmq``.  Each producer group becomes a
:class:`~txmsg_rocketmq.pool.ProducerPool` of exactly ``check_concurrency`` real transaction
producers (the listener's ``ExecutorConfig.concurrency``), because librocketmq checks one
instance's transactions on one thread: N instances = N check-backs at once, no idle instance.
See pool.py and docs/backend-design.md.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from txmsg.backend import (
    Capabilities,
    CheckHandler,
    ConsumeHandler,
    StopConsumer,
    check_sender_arguments,
    check_subscription_arguments,
)
from txmsg.errors import BackendUnavailableError, ListenerDefinitionError
from txmsg.names import check_name, rocketmq_rule
from txmsg.rescue import DISCARD_TOPIC

from . import native as native_mod
from .announce import Announcer
from .consumer import PushConsumer
from .names import name_rule
from .pool import ClientSettings, ProducerPool
from .sender import PlainSender
from .settings import RocketMQSettings

log = logging.getLogger("txmsg.rocketmq")

_pool_seq = itertools.count()
_SAFE = re.compile(r"[^A-Za-z0-9_-]")


_RULES = (rocketmq_rule, name_rule)
DISCARD_PULL_THREADS = 4
"""Pull threads of a rescue consumer (:mod:`txmsg.rescue`): the discard topic has one queue per
broker, its retry topic one more; the default 16 per consumer would idle for every group."""


class RocketMQBackend:
    """Producers and consumers on librocketmq 2.1.0 for one name server."""

    name = "rocketmq"
    capabilities = Capabilities(batch=False)
    """Everything remoting gives: check-backs routed by producer group (topics may be shared),
    ``%DLQ%<group>`` readable by a message listener, topics up to 255 characters.  Not ``batch``:
    librocketmq 2.1.0's batch request is stored as one message by a real broker (its ``m=1`` flag
    reads as false in Java), so ``send_batch`` sends one by one."""
    name_rule = staticmethod(name_rule)
    """Names librocketmq 2.1.0 can live with (also the ``txmsg.name_rules`` entry point)."""

    def __init__(
        self,
        config: Any = None,
        *,
        announce: bool = True,
    ) -> None:
        self.config = config
        self.settings_values = settings = RocketMQSettings.of(config)
        """This backend's typed settings (``name_server``... validated by the configuration)."""
        self.name_server: str = settings.name_server
        self.send_timeout_ms: int = settings.send_timeout_ms
        self.pull_threads: int = settings.pull_threads
        self.sync_pull: bool = settings.sync_pull
        self.max_message_size: int = settings.max_message_size
        self.instance_prefix: str = _SAFE.sub("_", settings.instance_prefix or "txmsg")
        try:
            self.native = native_mod.load(settings.client_log_dir)
        except ImportError as exc:  # an optional dependency: txmsg[rocketmq]
            raise BackendUnavailableError(str(exc)) from exc
        self.settings = ClientSettings(
            name_server=self.name_server,
            send_timeout_ms=self.send_timeout_ms,
            access_key=settings.access_key,
            secret_key=settings.secret_key,
        )
        self.announcer: Announcer | None = (
            Announcer(self.native, self.name_server, credentials=self.settings.credentials)
            if announce
            else None
        )
        self._lock = threading.Lock()
        self._pools: list[ProducerPool] = []
        self._senders: list[PlainSender] = []
        self._consumers: dict[str, PushConsumer] = {}
        self._closed = False

    # ---- producers -----------------------------------------------------------------------------
    def create_transactional_sender(
        self,
        group: str,
        check_handler: CheckHandler,
        *,
        check_concurrency: int,
        topics: Sequence[str] = (),
    ) -> ProducerPool:
        """Start exactly ``check_concurrency`` transaction producers for ``group``.

        Each instance has its own native check thread and the broker spreads check-backs over
        the group's channels, so ``check_concurrency`` check-backs run at once.

        ``topics`` (optional, the listener's declared topics) lets every instance heartbeat to
        the brokers of those topics before the first send, so check-backs of transactions left
        pending by a previous run reach this process at once.
        """
        self._ensure_open()
        check_sender_arguments(
            group, topics, check_concurrency, owner="RocketMQ backend", rules=_RULES
        )
        prefix = f"{self.instance_prefix}-{os.getpid()}-{_SAFE.sub('_', group)}-{next(_pool_seq)}"
        pool = ProducerPool(
            self.native,
            group,
            check_handler,
            instances=check_concurrency,
            settings=self.settings,
            instance_prefix=prefix,
            announcer=self.announcer,
            warmup_topics=tuple(topics),
        )
        with self._lock:
            self._pools.append(pool)
        return pool

    def create_sender(self, group: str) -> PlainSender:
        """Start a plain producer for ``group`` (sync, async, one-way, batch, ordered, delayed
        sends; see sender.py).  Its own instance name, so it shares no client factory with the
        group's transaction producers: closing one never disturbs the other's check-backs."""
        self._ensure_open()
        check_name("producer_group", group, owner="RocketMQ backend", rules=_RULES)
        sender = PlainSender(
            self.native,
            group,
            instance_name=f"{self.instance_prefix}-{os.getpid()}-s-{_SAFE.sub('_', group)}-{next(_pool_seq)}",
            name_server=self.name_server,
            send_timeout_ms=self.send_timeout_ms,
            max_message_size=self.max_message_size,
            credentials=self.settings.credentials,
        )
        with self._lock:
            self._senders.append(sender)
        return sender

    # ---- consumers -----------------------------------------------------------------------------
    def subscribe(
        self,
        topic: str,
        group: str,
        handler: ConsumeHandler,
        *,
        tags: str = "*",
        concurrency: int = 4,
        max_reconsume: int = 16,
        consume_from: str = "first",
        orderly: bool = False,
    ) -> StopConsumer:
        """Start a push consumer.  ``orderly``: librocketmq's orderly service - the client locks
        each queue on the broker (LOCK_BATCH_MQ) and hands its messages one at a time, in
        order, to ``handler``; ``concurrency`` threads serve different queues.  ``False`` from
        the handler suspends that queue for 1 s and hands the same message again (2.1.0 never
        sends an orderly message back to the broker, so ``max_reconsume`` does not apply)."""
        self._ensure_open()
        check_subscription_arguments(topic, group, owner="RocketMQ backend", rules=_RULES)
        with self._lock:
            if group in self._consumers:
                raise ListenerDefinitionError(
                    f"consumer group {group!r} already subscribes to "
                    f"{self._consumers[group].topic!r}; RocketMQ needs every consumer of a group "
                    "to subscribe identically - give this listener its own group"
                )
        consumer = PushConsumer(
            self.native,
            group=group,
            topic=topic,
            tags=tags,
            handler=handler,
            name_server=self.name_server,
            instance_name=f"{self.instance_prefix}-{os.getpid()}-c-{_SAFE.sub('_', group)}-{next(_pool_seq)}",
            concurrency=concurrency,
            max_reconsume=max_reconsume,
            consume_from=consume_from,
            pull_threads=(
                min(self.pull_threads, DISCARD_PULL_THREADS)
                if topic == DISCARD_TOPIC
                else self.pull_threads
            ),
            credentials=self.settings.credentials,
            orderly=orderly,
            sync_pull=self.sync_pull,
        )
        with self._lock:
            self._consumers[group] = consumer

        def stop(timeout: float = 30.0) -> None:
            consumer.stop(timeout)
            with self._lock:
                if self._consumers.get(group) is consumer:
                    del self._consumers[group]

        return stop

    # ---- lifecycle -----------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if self._closed:
            raise BackendUnavailableError("this RocketMQBackend is closed; create a new one")

    def close(self, timeout: float = 30.0) -> None:
        """Stop consumers, then close plain senders and producer pools (each bounded by ``timeout``)."""
        with self._lock:
            self._closed = True
            consumers = list(self._consumers.values())
            self._consumers.clear()
            pools = list(self._pools)
            self._pools.clear()
            senders = list(self._senders)
            self._senders.clear()
        for consumer in consumers:
            consumer.stop(timeout)
        for sender in senders:
            sender.close(timeout)
        for pool in pools:
            pool.close(timeout)
        if self.announcer is not None:
            self.announcer.stop()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "producers": {p.group: p.stats() for p in self._pools},
                "senders": {s.group: s.stats() for s in self._senders},
                "consumers": {
                    g: {
                        "consumed": c.consumed,
                        "failed": c.failed,
                        "dead_lettered": c.dead_lettered,
                        "orderly": c.orderly,
                    }
                    for g, c in self._consumers.items()
                },
            }
