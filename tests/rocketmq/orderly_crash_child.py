"""The orderly consumer of ``test_orderly_crash`` as a child process:
``PYTHONPATH=tests python tests/rocketmq/orderly_crash_child.py`` (settings from the environment,
below).

:func:`crash_kit.consume` on the ``rocketmq`` backend: one orderly, idempotent listener that adds a
row to ``crash_applied`` (key, seq, queue offset, pid) with each message it applies.

Environment (besides ``crash_kit``'s ``CRASH_DB``, ``CRASH_TOPIC``, ``CRASH_GROUP``,
``CRASH_HOLD``, ``CRASH_HOLD_SECONDS``):

* ``CRASH_NAMESRV``, ``CRASH_LOG_DIR`` (librocketmq's client log): required.
* with ``CRASH_HOLD``, the note written on ``k/1`` is its queue offset.
* ``CRASH_NO_JOURNAL=1`` (diagnostics only; the test passes it on from its own environment):
  declare the backend orderly-crash-safe so txmsg skips the in-flight journal - the state before
  the fix, where the kill loses ``k/1``.
"""

from __future__ import annotations

import dataclasses
import os

from crash_kit import AppliedColumns, Base, consume
from sqlalchemy import Integer
from sqlalchemy.orm import Mapped, mapped_column
from txmsg_rocketmq.backend import RocketMQBackend

from txmsg import Message, TxMsgConfig


class Applied(AppliedColumns, Base):
    """One row per message the listener applied (committed with its dedup row)."""

    __tablename__ = "crash_applied"
    queue_offset: Mapped[int | None] = mapped_column(Integer, nullable=True)


def main() -> None:
    env = os.environ
    if env.get("CRASH_NO_JOURNAL") == "1":
        RocketMQBackend.capabilities = dataclasses.replace(
            RocketMQBackend.capabilities, orderly_crash_safe=True
        )

    def row(message: Message, key: str, seq: int) -> Applied:
        return Applied(key=key, seq=seq, queue_offset=message.queue_offset, pid=os.getpid())

    consume(
        TxMsgConfig(
            backend="rocketmq",
            name_server=env["CRASH_NAMESRV"],
            client_log_dir=env["CRASH_LOG_DIR"],
            instance_prefix="crash",
        ),
        row=row,
        describe=lambda message: f"at offset {message.queue_offset}",
        note=lambda message: str(message.queue_offset),
    )


if __name__ == "__main__":
    main()
