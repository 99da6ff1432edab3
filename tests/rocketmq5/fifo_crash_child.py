"""The FIFO consumer of ``test_fifo_crash`` as a child process:
``PYTHONPATH=tests python tests/rocketmq5/fifo_crash_child.py`` (settings from the environment,
below).

The rocketmq5 twin of ``tests/rocketmq/orderly_crash_child.py``: :func:`crash_kit.consume` on the
``rocketmq5`` backend, one orderly, idempotent listener that adds a row to ``crash_applied`` (key,
seq, delivery attempt, pid, time applied) with each message it applies.

Environment (besides ``crash_kit``'s ``CRASH_DB``, ``CRASH_TOPIC``, ``CRASH_GROUP``,
``CRASH_HOLD``, ``CRASH_HOLD_SECONDS``):

* ``CRASH_ENDPOINTS`` (the gRPC endpoint): required.
* ``CRASH_INVISIBLE_S``: the invisible time the FIFO consumer asks for on each receive, instead of
  ``txmsg_rocketmq5.receive.INVISIBLE_S`` (60 s, a module constant, no setting): how long a
  message handed to a consumer that died stays away before the broker hands it again.
* with ``CRASH_HOLD``, the note written on ``k/1`` is its message id, its delivery attempt and the
  ``time.time()`` it was held (JSON).
* ``CRASH_JOURNAL=1`` (diagnostics only; the test passes it on from its own environment): declare
  the backend not orderly-crash-safe so txmsg writes the in-flight journal, as on ``rocketmq`` -
  the test's checks that the journal stays unused then fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from crash_kit import AppliedColumns, Base, consume
from sqlalchemy import Integer
from sqlalchemy.orm import Mapped, mapped_column
from txmsg_rocketmq5 import receive
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg import Message, TxMsgConfig


class Applied(AppliedColumns, Base):
    """One row per message the listener applied (committed with its dedup row)."""

    __tablename__ = "crash_applied"
    attempt: Mapped[int] = mapped_column(Integer)
    """The broker's delivery attempt (1: first hand-out; 2: handed again after a dead consumer)."""
    applied_at: Mapped[float] = mapped_column()
    """``time.time()`` when applied (the test compares it with the held receive's time)."""


def attempt_of(message: Message) -> int:
    return message.reconsume_times + 1


def main() -> None:
    env = os.environ
    if env.get("CRASH_JOURNAL") == "1":
        RocketMQ5Backend.capabilities = dataclasses.replace(
            RocketMQ5Backend.capabilities, orderly_crash_safe=False
        )
    if env.get("CRASH_INVISIBLE_S"):
        # ReceiveLoop._run reads the module global on every receive
        receive.INVISIBLE_S = int(env["CRASH_INVISIBLE_S"])
    print(f"invisible time of a receive: {receive.INVISIBLE_S} s", flush=True)

    def row(message: Message, key: str, seq: int) -> Applied:
        return Applied(
            key=key, seq=seq, attempt=attempt_of(message), pid=os.getpid(), applied_at=time.time()
        )

    def note(message: Message) -> str:
        return json.dumps(
            {"message_id": message.message_id, "attempt": attempt_of(message), "at": time.time()}
        )

    consume(
        TxMsgConfig(backend="rocketmq5", endpoints=env["CRASH_ENDPOINTS"]),
        row=row,
        describe=lambda message: f"({message.message_id}, attempt {attempt_of(message)})",
        note=note,
    )


if __name__ == "__main__":
    main()
