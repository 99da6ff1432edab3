"""The relay's sender in the outbox benchmarks: the app's producer, telling the benchmark when
the broker answered each row's send (by the row's ``TXMSG_DEDUP_KEY``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import Any

from txmsg import Producer
from txmsg.message import DEDUP_KEY, SendResult


class AnsweredSender:
    """Sends through ``producer``; ``on_answer(dedup_key)`` runs once a send succeeded."""

    def __init__(self, producer: Producer, on_answer: Callable[[str], None]) -> None:
        self.producer = producer
        self.on_answer = on_answer

    def _note(self, properties: Mapping[str, Any] | None, future: Future[SendResult]) -> None:
        key = str((properties or {}).get(DEDUP_KEY, ""))

        def done(f: Future[SendResult]) -> None:
            if f.exception() is None:
                self.on_answer(key)

        future.add_done_callback(done)

    def send_async(
        self,
        topic: str,
        payload: Any,
        *,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
        delay_level: int | None = None,
        deliver_at: datetime | float | None = None,
    ) -> Future[SendResult]:
        future = self.producer.send_async(
            topic,
            payload,
            keys=keys,
            tags=tags,
            properties=properties,
            delay_level=delay_level,
            deliver_at=deliver_at,
        )
        self._note(properties, future)
        return future

    def send_orderly_async(
        self,
        topic: str,
        payload: Any,
        *,
        sharding_key: str,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> Future[SendResult]:
        future = self.producer.send_orderly_async(
            topic, payload, sharding_key=sharding_key, keys=keys, tags=tags, properties=properties
        )
        self._note(properties, future)
        return future
