"""Child process of test_outbox_process.py: ``outbox_app``'s relay, holding after the broker
stored the row whose body is ``OUTBOX_HOLD_BODY`` and before the row is marked sent, until the
test kills it (SIGKILL).

The hold sits between the real producer's answer and the relay: the relay's send of that row
completes only after ``OUTBOX_HOLD_SECONDS`` (120 by default), and first the message id the
broker gave it is written to the file ``OUTBOX_HOLD``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import outbox_app

from txmsg import Producer
from txmsg.message import SendResult


class HoldAfterSend:
    """The relay's sender: the app's real producer, holding after the broker's answer for the
    row to hold (see the module docstring)."""

    def __init__(self, producer: Producer, body: bytes, note: Path, seconds: float) -> None:
        self.producer = producer
        self.body = body
        self.note = note
        self.seconds = seconds

    def _held(self, body: Any, inner: Future[SendResult]) -> Future[SendResult]:
        if body != self.body:
            return inner
        outer: Future[SendResult] = Future()

        def wait() -> None:
            try:
                result = inner.result(timeout=60)
            except BaseException as exc:  # noqa: BLE001 - handed to the relay
                outer.set_exception(exc)
                return
            self.note.write_text(result.message_id)
            print(f"holding {body!r} (stored as {result.message_id})", flush=True)
            time.sleep(self.seconds)  # the test SIGKILLs the process here
            outer.set_result(result)

        threading.Thread(target=wait, daemon=True).start()
        return outer

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
        inner = self.producer.send_async(
            topic,
            payload,
            keys=keys,
            tags=tags,
            properties=properties,
            delay_level=delay_level,
            deliver_at=deliver_at,
        )
        return self._held(payload, inner)

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
        inner = self.producer.send_orderly_async(
            topic, payload, sharding_key=sharding_key, keys=keys, tags=tags, properties=properties
        )
        return self._held(payload, inner)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
    )
    env = os.environ
    app, outbox = outbox_app.app, outbox_app.outbox
    app.add_producer(group=outbox.group)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    with app:
        sender = HoldAfterSend(
            app.producer(outbox.group),
            env["OUTBOX_HOLD_BODY"].encode(),
            Path(env["OUTBOX_HOLD"]),
            float(env.get("OUTBOX_HOLD_SECONDS", "120")),
        )
        outbox.start_relay(sender)
        print("relaying", flush=True)
        stop.wait()
        outbox.stop_relay()


if __name__ == "__main__":
    main()
