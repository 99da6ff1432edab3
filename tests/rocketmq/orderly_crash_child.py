"""The orderly consumer of ``test_orderly_crash`` as a child process:
``python tests/rocketmq/orderly_crash_child.py`` (settings from the environment, below).

A txmsg app on the ``rocketmq`` backend with one orderly, idempotent listener.  Each message body
is ``"<key>/<seq>"``; the listener adds a row to ``crash_applied`` (key, seq, queue offset, pid)
in the same transaction as txmsg's dedup row, so the table's ids are the order in which messages
were applied, and a message applied twice would show as two rows.

Environment:

* ``CRASH_NAMESRV``, ``CRASH_DB`` (an SQLAlchemy URL), ``CRASH_TOPIC``, ``CRASH_GROUP``,
  ``CRASH_LOG_DIR`` (librocketmq's client log): required.
* ``CRASH_HOLD=<file>``: on message ``k/1`` the listener writes its queue offset to ``<file>``
  and then sleeps ``CRASH_HOLD_SECONDS`` (default 120) - the callback stays in flight until the
  test kills the process.
* ``CRASH_NO_JOURNAL=1`` (diagnostics only; the test passes it on from its own environment):
  declare the backend orderly-crash-safe so txmsg skips the in-flight journal - the state before
  the fix, where the kill loses ``k/1``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from txmsg_rocketmq.backend import RocketMQBackend

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
    queue_offset: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int] = mapped_column(Integer)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
    )
    env = os.environ
    hold = env.get("CRASH_HOLD")
    hold_seconds = float(env.get("CRASH_HOLD_SECONDS", "120"))
    if env.get("CRASH_NO_JOURNAL") == "1":
        RocketMQBackend.capabilities = dataclasses.replace(
            RocketMQBackend.capabilities, orderly_crash_safe=True
        )
    engine = create_engine(env["CRASH_DB"])
    Base.metadata.create_all(engine)
    create_tables(engine)
    sessions = make_session_factory(engine)

    def apply(message: Message, session: Session) -> None:
        key, seq = message.text().split("/")
        print(f"applying {key}/{seq} at offset {message.queue_offset}", flush=True)
        if hold and (key, int(seq)) == (HELD_KEY, HELD_SEQ):
            Path(hold).write_text(str(message.queue_offset))
            print(f"holding {key}/{seq} for {hold_seconds} s", flush=True)
            time.sleep(hold_seconds)  # in flight: the test SIGKILLs the process here
        session.add(
            Applied(key=key, seq=int(seq), queue_offset=message.queue_offset, pid=os.getpid())
        )

    config = TxMsgConfig(
        name_server=env["CRASH_NAMESRV"],
        client_log_dir=env["CRASH_LOG_DIR"],
        instance_prefix="crash",
    )
    app = TxMsg(config, backend="rocketmq")
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
