"""What the two orderly-consumer crash tests share: ``tests/rocketmq/test_orderly_crash.py``
(``rocketmq``) and ``tests/rocketmq5/test_fifo_crash.py`` (``rocketmq5``), and their child
processes (``orderly_crash_child.py``, ``fifo_crash_child.py``).

Each test runs its backend's consumer as a child process on a one-queue topic, lets the child's
listener hold message ``k/1`` in its callback, SIGKILLs the child there and starts a new one; every
check reads the child's database (table ``crash_applied``: one row per message applied, in the
order applied).

The test side: :class:`Child` (a consumer process), :class:`CrashScene` (topic, group, database and
children of one test; each test subclasses it with its backend's checks) and :func:`key_sender`.
The child side: :class:`Base` / :class:`AppliedColumns` (the ``crash_applied`` table) and
:func:`consume` (the listener and the process's life until SIGTERM).

Not a package module: ``tests/rocketmq/conftest.py`` and ``tests/rocketmq5/conftest.py`` put
``tests/`` on ``sys.path`` (``from crash_kit import ...``), and :class:`Child` puts it on the
child's ``PYTHONPATH``.

The child's environment:

* ``CRASH_DB`` (an SQLAlchemy URL), ``CRASH_TOPIC``, ``CRASH_GROUP``: required, and the backend's
  own settings (:attr:`CrashScene.settings`).
* ``CRASH_HOLD=<file>``: on message ``k/1`` the listener writes a note on it (the child's choice)
  to ``<file>`` and then sleeps ``CRASH_HOLD_SECONDS`` (default 120) - the callback stays in flight
  until the test kills the process.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TypeVar

from sqlalchemy import Integer, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from txmsg_broker.testing import wait_until

from txmsg import Message, SendResult, TxMsg, TxMsgConfig
from txmsg.sqla import create_engine, create_tables, make_session_factory

TESTS = Path(__file__).resolve().parent
KEY = "k"
"""The one key (sharding key) of every message; bodies are ``"<key>/<seq>"``."""
HELD_SEQ = 1
"""The message the first consumer holds in its callback: ``k/1``."""

T = TypeVar("T")


# ---- the test side --------------------------------------------------------------------------------


class Child:
    """A consumer process running ``script``; its output goes to a log file shown on failures."""

    def __init__(self, script: Path, env: dict[str, str], log: Path) -> None:
        # the script imports this module
        path = [str(TESTS), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(script)],
                env={**env, "PYTHONPATH": os.pathsep.join(path)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the process (its callback in flight) and check it died of that."""
        self.stop(signal.SIGKILL)
        assert self.proc.returncode == -signal.SIGKILL

    def finish(self) -> None:
        """SIGTERM: the consumer stops on its own and exits 0."""
        self.stop()
        assert self.proc.returncode == 0, self.output()


def key_sender(
    app: TxMsg, topic: str, producer_group: str, receipt: Callable[[SendResult], T]
) -> Callable[[int], T]:
    """``send(seq)``: ``KEY/seq`` with ``send_orderly(sharding_key=KEY)`` from a producer of
    ``app`` (started here); ``receipt`` checks the broker's answer and picks what the test needs."""
    app.add_producer(group=producer_group)
    app.start()
    producer = app.producer(producer_group)

    def send(seq: int) -> T:
        return receipt(producer.send_orderly(topic, f"{KEY}/{seq}", sharding_key=KEY))

    return send


@dataclass
class CrashScene(Generic[T]):
    """One test's topic, consumer group, child database and consumer processes."""

    broker: Any
    topic: str
    group: str
    db_url: str
    tmp: Path
    send: Callable[[int], T]
    """``send(seq)``: see :func:`key_sender`."""
    script: Path
    """The child process's script."""
    settings: dict[str, str]
    """The backend's own ``CRASH_*`` settings of every child (where the broker is, ...)."""
    children: list[Child] = field(default_factory=list)

    def start(self, hold: Path | None = None) -> Child:
        """Start a consumer; with ``hold``, one that holds ``k/1`` (see the module's docstring)."""
        env = {
            **os.environ,
            **self.settings,
            "CRASH_DB": self.db_url,
            "CRASH_TOPIC": self.topic,
            "CRASH_GROUP": self.group,
        }
        # the tests' diagnostic switches (CRASH_NO_JOURNAL, CRASH_JOURNAL) pass: see the tests
        for name in ("CRASH_HOLD", "CRASH_HOLD_SECONDS"):
            env.pop(name, None)
        if hold is not None:
            env["CRASH_HOLD"] = str(hold)
        child = Child(self.script, env, self.tmp / f"consumer-{len(self.children)}.log")
        self.children.append(child)
        return child

    def hold_first(self) -> tuple[Child, T, str]:
        """Start the first consumer, send ``k/1`` and wait until the consumer holds it in its
        callback: the consumer, what :attr:`send` answered and the consumer's note on ``k/1``."""
        hold = self.tmp / "holding"
        first = self.start(hold)
        sent = self.send(HELD_SEQ)
        wait_until(
            hold.exists,
            timeout=40,
            message=lambda: f"the consumer to hold {KEY}/{HELD_SEQ}; its output:\n{first.output()}",
        )
        wait_until(lambda: hold.read_text(), timeout=5, message="the hold file's content")
        return first, sent, hold.read_text()

    def stop_children(self) -> None:
        for child in self.children:
            child.stop(signal.SIGKILL)

    def rows(self, table: str, query: str) -> list[tuple[Any, ...]]:
        """The rows of ``query`` on the child's database; none before the child created ``table``."""
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                exists = text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :t")
                if not conn.execute(exists, {"t": table}).first():
                    return []  # the child has not created it yet
                return [tuple(row) for row in conn.execute(text(query))]
        finally:
            engine.dispose()

    def applied(self) -> list[tuple[str, int]]:
        """(key, seq) of every applied message, in the order they were applied."""
        rows = self.rows("crash_applied", "SELECT key, seq FROM crash_applied ORDER BY id")
        return [(str(key), int(seq)) for key, seq in rows]

    def wait_applied(self, seq: int, child: Child, timeout: float) -> None:
        """Wait until ``k/<seq>`` is applied (by ``child``, the consumer whose output a timeout
        shows)."""
        wait_until(
            lambda: (KEY, seq) in self.applied(),
            timeout=timeout,
            message=lambda: (
                f"{KEY}/{seq} to be applied ({self.applied()}); the new consumer's "
                f"output:\n{child.output()}"
            ),
        )


# ---- the child side -------------------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class AppliedColumns:
    """The columns of ``crash_applied`` every child writes; a child's model adds its own."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)


def consume(
    config: TxMsgConfig,
    *,
    row: Callable[[Message, str, int], Base],
    describe: Callable[[Message], str],
    note: Callable[[Message], str],
) -> None:
    """The child process: a txmsg app of ``config`` with one orderly, idempotent listener on
    ``CRASH_TOPIC`` / ``CRASH_GROUP`` that adds ``row(message, key, seq)`` (a ``crash_applied``
    row) in the same transaction as txmsg's dedup row, so the table's ids are the order in which
    messages were applied, and a message applied twice would show as two rows.  Consumes until
    SIGTERM or SIGINT.  ``describe(message)``: printed with each message; ``note(message)``:
    written to the ``CRASH_HOLD`` file."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
    )
    env = os.environ
    hold = env.get("CRASH_HOLD")
    hold_seconds = float(env.get("CRASH_HOLD_SECONDS", "120"))
    engine = create_engine(env["CRASH_DB"])
    Base.metadata.create_all(engine)
    create_tables(engine)
    sessions = make_session_factory(engine)

    def apply(message: Message, session: Session) -> None:
        key, seq = message.text().split("/")
        print(f"applying {key}/{seq} {describe(message)}", flush=True)
        if hold and (key, int(seq)) == (KEY, HELD_SEQ):
            Path(hold).write_text(note(message))
            print(f"holding {key}/{seq} for {hold_seconds} s", flush=True)
            time.sleep(hold_seconds)  # in flight: the test SIGKILLs the process here
        session.add(row(message, key, int(seq)))

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
