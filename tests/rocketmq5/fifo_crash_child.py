"""The FIFO consumer of ``test_fifo_crash`` as a child process:
``python tests/rocketmq5/fifo_crash_child.py`` (settings from the environment, below).

The rocketmq5 twin of ``tests/rocketmq/orderly_crash_child.py``: a txmsg app on the ``rocketmq5``
backend with one orderly, idempotent listener.  Each message body is ``"<key>/<seq>"``; the
listener adds a row to ``crash_applied`` (key, seq, delivery attempt, pid) in the same transaction
as txmsg's dedup row, so the table's ids are the order in which messages were applied, and a
message applied twice would show as two rows.

Environment:

* ``CRASH_ENDPOINTS`` (the gRPC endpoint), ``CRASH_DB`` (an SQLAlchemy URL), ``CRASH_TOPIC``,
  ``CRASH_GROUP``: required.
* ``CRASH_INVISIBLE_S``: the invisible time the FIFO consumer asks for on each receive, instead of
  ``txmsg_rocketmq5.receive.INVISIBLE_S`` (60 s, a module constant, no setting): how long a
  message handed to a consumer that died stays away before the broker hands it again.
* ``CRASH_HOLD=<file>``: on message ``k/1`` the listener writes the message id and its delivery
  attempt to ``<file>`` (JSON) and then sleeps ``CRASH_HOLD_SECONDS`` (default 120) - the callback
  stays in flight until the test kills the process.
* ``CRASH_JOURNAL=1`` (diagnostics only; the test passes it on from its own environment): declare
  the backend not orderly-crash-safe so txmsg writes the in-flight journal, as on ``rocketmq`` -
  the test's checks that the journal stays unused then fail.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from txmsg_rocketmq5 import receive
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg import Message, TxMsg, TxMsgConfig
from txmsg.sqla import create_engine, create_tables, make_session_factory

HELD_KEY, HELD_SEQ = "k", 1


class Base(DeclarativeBase):
    pass


class Applied(Base):
    """One row per message the listener applied (committed with its dedup row)."""

    __tablename__ = "crash_applied"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    """The broker's delivery attempt (1: first hand-out; 2: handed again after a dead consumer)."""
    pid: Mapped[int] = mapped_column(Integer)
    applied_at: Mapped[float] = mapped_column()
    """``time.time()`` when applied (the test compares it with the held receive's time)."""


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
    )
    env = os.environ
    hold = env.get("CRASH_HOLD")
    hold_seconds = float(env.get("CRASH_HOLD_SECONDS", "120"))
    if env.get("CRASH_JOURNAL") == "1":
        RocketMQ5Backend.capabilities = dataclasses.replace(
            RocketMQ5Backend.capabilities, orderly_crash_safe=False
        )
    if env.get("CRASH_INVISIBLE_S"):
        # ReceiveLoop._run reads the module global on every receive
        receive.INVISIBLE_S = int(env["CRASH_INVISIBLE_S"])
    print(f"invisible time of a receive: {receive.INVISIBLE_S} s", flush=True)
    engine = create_engine(env["CRASH_DB"])
    Base.metadata.create_all(engine)
    create_tables(engine)
    sessions = make_session_factory(engine)

    def apply(message: Message, session: Session) -> None:
        key, seq = message.text().split("/")
        attempt = message.reconsume_times + 1
        print(f"applying {key}/{seq} ({message.message_id}, attempt {attempt})", flush=True)
        if hold and (key, int(seq)) == (HELD_KEY, HELD_SEQ):
            Path(hold).write_text(
                json.dumps({"message_id": message.message_id, "attempt": attempt, "at": time.time()})
            )
            print(f"holding {key}/{seq} for {hold_seconds} s", flush=True)
            time.sleep(hold_seconds)  # in flight: the test SIGKILLs the process here
        session.add(
            Applied(key=key, seq=int(seq), attempt=attempt, pid=os.getpid(), applied_at=time.time())
        )

    config = TxMsgConfig(backend="rocketmq5", endpoints=env["CRASH_ENDPOINTS"])
    app = TxMsg(config)
    app.add_message_listener(
        apply,
        topic=env["CRASH_TOPIC"],
        group=env["CRASH_GROUP"],
        orderly=True,
        idempotent=True,
        session_factory=sessions,
        orderly_retry_delay=0.2,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with app:
        print("consuming", flush=True)
        stop.wait()
    engine.dispose()


if __name__ == "__main__":
    main()
