"""A test double of a txmsg backend, for unit tests of the core alone.

It follows the real client's threading facts: ``send_in_transaction`` runs the local executor in
the calling thread; check-backs arrive on a thread the backend owns (``check`` starts one).
It records what the core handed it so tests can assert on it.  Not shipped in the product.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from txmsg.backend import CheckHandler, ConsumeHandler, LocalExecutor
from txmsg.message import UNIQ_KEY, Message, OutgoingMessage
from txmsg.states import LocalTransactionState

_ids = itertools.count(1)


@dataclass
class Ended:
    message: Message
    state: LocalTransactionState
    from_check: bool


class DoubleSender:
    def __init__(
        self, group: str, check_handler: CheckHandler, check_concurrency: int, topics: Sequence[str]
    ) -> None:
        self.group = group
        self.check_handler = check_handler
        self.check_concurrency = check_concurrency
        self.topics = tuple(topics)
        self.ended: list[Ended] = []
        self.half: dict[str, Message] = {}
        self.closed_with: float | str | None = "open"
        self.fail_with: Exception | None = None

    def send_in_transaction(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        if self.fail_with is not None:
            raise self.fail_with
        key = f"KEY{next(_ids):08d}"
        props = dict(message.properties) | {UNIQ_KEY: key, "TRAN_MSG": "true", "PGROUP": self.group}
        half = Message(
            topic=message.topic,
            body=message.body,
            tags=message.tags,
            keys=message.keys,
            properties=props,
        )
        self.half[key] = half
        state = local_executor(half)
        self.ended.append(Ended(half, state, from_check=False))
        return key, key, "SEND_OK", 7

    def check(self, key: str) -> LocalTransactionState:
        """A check-back of ``key`` delivered on a backend-owned thread; returns the answer."""
        box: list[LocalTransactionState] = []
        t = threading.Thread(
            target=lambda: box.append(self.check_handler(self.half[key])),
            name="double-native-check",
        )
        t.start()
        t.join(30)
        self.ended.append(Ended(self.half[key], box[0], from_check=True))
        return box[0]

    def close(self, timeout: float | None = None) -> None:
        self.closed_with = timeout


@dataclass
class Subscription:
    topic: str
    group: str
    handler: ConsumeHandler
    tags: str
    concurrency: int
    max_reconsume: int
    consume_from: str = "first"
    stopped: bool = False
    stop_timeout: float | None = None


@dataclass
class DoubleBackend:
    config: object = None
    name: str = "double"
    senders: dict[str, DoubleSender] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    closed: bool = False
    fail_create: Exception | None = None

    def create_transactional_sender(
        self,
        group: str,
        check_handler: CheckHandler,
        *,
        check_concurrency: int,
        topics: Sequence[str] = (),
    ) -> DoubleSender:
        if self.fail_create is not None:
            raise self.fail_create
        sender = DoubleSender(group, check_handler, check_concurrency, topics)
        self.senders[group] = sender
        return sender

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
    ) -> Callable[[float], None]:
        sub = Subscription(topic, group, handler, tags, concurrency, max_reconsume, consume_from)
        self.subscriptions[group] = sub

        def stop(timeout: float) -> None:
            sub.stopped = True
            sub.stop_timeout = timeout

        return stop

    def close(self, timeout: float = 30.0) -> None:
        self.closed = True
