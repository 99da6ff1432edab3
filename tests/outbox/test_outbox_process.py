"""Issue 25, step 5: relays as processes, with both backends' real clients on the embedded broker,
on SQLite and PostgreSQL.

* a relay SIGKILLed after the broker stored a row and before the row was marked: the next relay
  sends it again, the idempotent consumer absorbs the copy, the key's order holds;
* ``txmsg outbox relay --app MODULE:ATTR`` as its own process, twice at once: every row applied
  once, each key in order (PostgreSQL: the two share the rows; SQLite: one relays, the other
  stands by), SIGTERM stops them cleanly; ``--drain`` sends what is due and exits;
* a row that died while the broker was down, replayed by ``txmsg outbox retry``.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner
from outbox_kit import Side, applied, apply, outbox_rows
from txmsg_broker.testing import unique, wait_until

from conftest import Db
from txmsg import Producer, TxMsg, TxMsgError
from txmsg.cli import main
from txmsg.sqla import duplicates_absorbed
from txmsg.sqla.outbox import Outbox

HERE = Path(__file__).resolve().parent
TXMSG = str(Path(sys.executable).parent / "txmsg")


class Proc:
    """A child process whose output goes to a log file (shown when a wait fails)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                args, env=env, cwd=HERE, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop(signal.SIGKILL)


@pytest.fixture
def apps() -> Iterator[list[TxMsg]]:
    made: list[TxMsg] = []
    yield made
    for app in made:
        app.close(timeout=20)


def app_env(side: Side, db: Db, group: str, **extra: str) -> dict[str, str]:
    """The environment of ``outbox_app`` (in a child process, or in this one)."""
    env = {
        **side.settings(),
        "OUTBOX_APP_DB": db.url,
        "OUTBOX_APP_GROUP": group,
        "TXMSG_INSTANCE_PREFIX": unique("obp"),
        **extra,
    }
    if db.schema is not None:
        env["OUTBOX_APP_SCHEMA"] = db.schema
    return env


def child_env(side: Side, db: Db, group: str, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, **app_env(side, db, group, **extra), "PYTHONPATH": path}


def consumer(
    side: Side, db: Db, apps: list[TxMsg], topic: str, group: str | None = None, relay: bool = False
) -> tuple[TxMsg, str]:
    """An app consuming ``topic`` in order, idempotently (:class:`Applied` rows); with ``relay``
    also the relay of outbox ``group``.  Returns it and its consumer group."""
    app = TxMsg(side.config())
    apps.append(app)
    cgroup = side.orderly_group()
    app.add_message_listener(
        apply,
        topic=topic,
        group=cgroup,
        orderly=True,
        idempotent=True,
        session_factory=db.sessions,
        orderly_retry_delay=0.2,
    )
    if relay and group is not None:
        app.add_outbox(group=group, session_factory=db.sessions, poll_interval=0.2)
    return app, cgroup


def write(db: Db, group: str, topic: str, *bodies_by_key: tuple[str, str]) -> None:
    outbox = Outbox(group=group, session_factory=db.sessions)
    for key, body in bodies_by_key:
        with db.sessions() as session, session.begin():
            outbox.send(session, topic, body, sharding_key=key)


def test_a_relay_killed_between_send_and_mark_loses_nothing_and_applies_nothing_twice(
    side: Side, db: Db, tmp_path: Path, procs: list[Proc], apps: list[TxMsg]
) -> None:
    topic, group = side.ordered_topic(), unique("outbox_pg")
    write(db, group, topic, ("k", "k/1"), ("k", "k/2"), ("k", "k/3"))
    hold = tmp_path / "holding"
    env = child_env(side, db, group, OUTBOX_HOLD=str(hold), OUTBOX_HOLD_BODY="k/1")
    relay = Proc([sys.executable, str(HERE / "outbox_relay_child.py")], env, tmp_path / "relay.log")
    procs.append(relay)
    wait_until(
        lambda: hold.exists() and hold.read_text(),
        timeout=90,
        message=lambda: f"the relay to hold k/1 after its send; its output:\n{relay.output()}",
    )
    assert [r.body for r in outbox_rows(db.sessions, group)] == [b"k/1", b"k/2", b"k/3"]
    assert relay.stop(signal.SIGKILL) == -signal.SIGKILL
    # the next relay (with the consumer) finds k/1 unmarked and sends it again
    app, cgroup = consumer(side, db, apps, topic, group, relay=True)
    with app:
        wait_until(
            lambda: len(applied(db.sessions)) >= 3 and not outbox_rows(db.sessions, group),
            timeout=120,
            message=lambda: f"k/1..3 applied and the outbox empty: {applied(db.sessions)}",
        )
        wait_until(
            lambda: duplicates_absorbed(db.sessions, cgroup) >= 1,
            timeout=60,
            message="the copy of k/1 the killed relay had sent, absorbed",
        )
    assert applied(db.sessions) == [("k", "k/1"), ("k", "k/2"), ("k", "k/3")]


def test_two_relay_processes_send_every_row_once_each_key_in_order(
    side: Side, db: Db, tmp_path: Path, procs: list[Proc], apps: list[TxMsg]
) -> None:
    topic, group = side.ordered_topic(), unique("outbox_pg")
    keys = [f"order-{k}" for k in range(5)]
    rows = [(key, f"{key}/{n}") for n in range(4) for key in keys]
    app, cgroup = consumer(side, db, apps, topic)
    app.start()
    env = child_env(side, db, group)
    command = [TXMSG, "outbox", "relay", "--app", "outbox_app:app"]
    procs.extend(Proc(command, env, tmp_path / f"relay-{n}.log") for n in range(2))
    # both relays up before the rows exist (a relay sends them all in one cycle: one still
    # starting would neither compete nor have its SIGTERM handler yet)
    wait_until(
        lambda: all("relaying" in p.output() for p in procs),
        timeout=120,
        message=lambda: "both relays to start:\n" + "\n".join(p.output() for p in procs),
    )
    write(db, group, topic, *rows)
    wait_until(
        lambda: len(applied(db.sessions)) >= len(rows),
        timeout=150,
        message=lambda: (
            f"{len(rows)} applied, got {len(applied(db.sessions))}; relay outputs:\n"
            + "\n".join(p.output() for p in procs)
        ),
    )
    got = applied(db.sessions)
    for key in keys:
        assert [body for k, body in got if k == key] == [f"{key}/{n}" for n in range(4)]
    assert len(got) == len(rows)
    assert duplicates_absorbed(db.sessions, cgroup) == 0  # no row was sent twice
    if db.name == "sqlite":  # one relay sends, the other stands by
        wait_until(
            lambda: sum("stands by" in p.output() for p in procs) == 1,
            timeout=60,
            message=lambda: "one relay to stand by:\n" + "\n".join(p.output() for p in procs),
        )
    for proc in procs:
        assert proc.stop() == 0, proc.output()
    assert outbox_rows(db.sessions, group) == []


def test_relay_drain_sends_what_is_due_and_exits(
    side: Side, db: Db, tmp_path: Path, apps: list[TxMsg]
) -> None:
    topic, group = side.ordered_topic(), unique("outbox_pg")
    write(db, group, topic, ("a", "a/1"), ("a", "a/2"), ("b", "b/1"))
    done = subprocess.run(
        [TXMSG, "outbox", "relay", "--app", "outbox_app:app", "--drain"],
        env=child_env(side, db, group),
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{group}: sent 3; unsent 0" in done.stdout
    app, _ = consumer(side, db, apps, topic)
    with app:
        wait_until(lambda: len(applied(db.sessions)) >= 3, timeout=90, message="3 applied")
    assert [b for k, b in applied(db.sessions) if k == "a"] == ["a/1", "a/2"]


def _can_send(producer: Producer, topic: str) -> bool:
    try:
        producer.send_orderly(topic, "probe", sharding_key="probe")
    except TxMsgError:
        return False
    return True


@pytest.fixture
def outbox_app(
    side: Side, db: Db, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ModuleType, str]]:
    """``outbox_app`` imported in this process with its relay in process, two attempts per row."""
    group = unique("outbox_pg")
    for name, value in app_env(
        side, db, group, OUTBOX_APP_RELAY="1", OUTBOX_APP_ATTEMPTS="2"
    ).items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("outbox_app", None)
    module = importlib.import_module("outbox_app")
    yield module, group
    module.app.close(timeout=20)
    module.engine.dispose()
    sys.modules.pop("outbox_app", None)


def test_a_row_dead_while_the_broker_was_down_is_replayed_by_txmsg_outbox_retry(
    side: Side, db: Db, outbox_app: tuple[ModuleType, str]
) -> None:
    module, group = outbox_app
    topic = side.ordered_topic()
    app: TxMsg = module.app
    cgroup = side.orderly_group()
    app.add_message_listener(
        apply,
        topic=topic,
        group=cgroup,
        orderly=True,
        idempotent=True,
        session_factory=db.sessions,
        orderly_retry_delay=0.2,
    )
    with app:
        write(db, group, topic, ("k", "k/0"))
        wait_until(lambda: applied(db.sessions), timeout=90, message="k/0 applied")
        side.broker.stop()
        write(db, group, topic, ("k", "k/1"), ("k", "k/2"))
        wait_until(lambda: module.dead, timeout=120, message="k/1 dead after its two attempts")
        (event,) = module.dead
        assert (event.sharding_key, event.attempts, event.permanent) == ("k", 2, False)
        stats = module.outbox.stats()
        assert (stats.dead, stats.unsent) == (1, 1)  # k/2 waits behind the dead k/1
        side.broker.start()
        # the cause is fixed once the clients reach the broker again (a gRPC channel reconnects
        # with a back-off of its own): the operator checks, then retries
        wait_until(
            lambda: _can_send(app.producer(group), topic),
            timeout=180,
            message="the producer to reach the restarted broker",
        )
        out = CliRunner().invoke(
            main, ["outbox", "retry", "--app", "outbox_app:app", "--id", str(event.id)]
        )
        assert out.exit_code == 0, out.output
        wait_until(
            lambda: len([k for k, _ in applied(db.sessions) if k == "k"]) >= 3,
            timeout=180,
            message=lambda: f"k/1 and k/2 applied after the retry: {applied(db.sessions)}",
        )
    assert [body for key, body in applied(db.sessions) if key == "k"] == ["k/0", "k/1", "k/2"]
    assert module.outbox.stats().dead == 0
