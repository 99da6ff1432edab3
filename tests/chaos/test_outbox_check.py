"""The outbox stream's checker (benchmarks/chaos/outbox_stream.py) must catch each violation it
claims to, else a green ``txmsg chaos --streams outbox`` proves nothing.  A consistent world is
built with the stream's real code (real outbox rows written by :func:`transfer`, applied by the
real listener), then broken one way at a time."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from benchmarks.chaos import outbox_stream as ob
from benchmarks.chaos.databases import close_all, open_all, prepare
from txmsg.message import Message
from txmsg.sqla.outbox import Outbox, OutboxMessage

SEED = 7


@dataclass
class World:
    bank: sessionmaker[Session]
    ledger: sessionmaker[Session]
    outbox: Outbox

    def transfers(self, n: int) -> list[str]:
        """``n`` transfers attempted (some roll back as planned); the committed ids."""
        rng = random.Random(1)
        committed = []
        for i in range(n):
            tx = f"w-{i:03d}"
            try:
                ob.transfer(self.bank, self.outbox, rng, tx, "writer-0", SEED)
                committed.append(tx)
            except ob.InjectedRollback:
                pass
        return committed

    def pending(self) -> list[Message]:
        """The outbox rows as the relay would send them, in a valid send order (by id: one
        writer, so commit order)."""
        with self.bank() as s:
            rows = s.scalars(select(OutboxMessage).order_by(OutboxMessage.id)).all()
            return [
                Message(
                    topic=r.topic, body=r.body, sharding_key=r.sharding_key, message_id=str(r.id)
                )
                for r in rows
            ]

    def apply(self, message: Message) -> None:
        with self.ledger() as s, s.begin():
            ob.on_ledger_event(message, s)

    def sent(self, message: Message) -> None:
        with self.bank() as s, s.begin():
            s.execute(delete(OutboxMessage).where(OutboxMessage.id == int(message.message_id or 0)))

    def deliver_all(self) -> list[Message]:
        messages = self.pending()
        for m in messages:
            self.apply(m)
            self.sent(m)
        return messages

    def violations(self) -> list[str]:
        return ob.verify(ob.read(self.bank, self.ledger))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    dbs = open_all(prepare(tmp_path, None))
    ob.seed(dbs["bank"], dbs["ledger"])
    outbox = Outbox(group=ob.OUTBOX_GROUP, session_factory=dbs["bank"], relay=False)
    try:
        yield World(dbs["bank"], dbs["ledger"], outbox)
    finally:
        close_all(dbs)


def test_a_consistent_world_has_no_violation(world: World) -> None:
    committed = world.transfers(40)
    world.deliver_all()
    snap = ob.read(world.bank, world.ledger)
    assert ob.verify(snap) == []
    assert set(snap.committed) == set(committed)
    assert 0 < snap.rolled_back < 40  # the planned rollbacks happened and left no message
    assert snap.applied_count == snap.messages == 3 * len(committed)


def test_a_lost_message_is_caught(world: World) -> None:
    world.transfers(10)
    messages = world.pending()
    for m in messages[1:]:
        world.apply(m)
    for m in messages:
        world.sent(m)
    found = world.violations()
    assert any("never applied (lost)" in v for v in found), found
    assert any("ledger balance" in v for v in found), found


def test_a_message_applied_twice_is_caught(world: World) -> None:
    world.transfers(10)
    messages = world.deliver_all()
    world.apply(messages[0])
    found = world.violations()
    assert any("applied 2 times" in v for v in found), found
    assert any("ledger balance" in v for v in found), found


def test_messages_out_of_commit_order_are_caught(world: World) -> None:
    world.transfers(10)
    messages = world.pending()
    key = messages[0].sharding_key
    of_key = [m for m in messages if m.sharding_key == key]
    assert len(of_key) >= 2
    swapped = [of_key[1], of_key[0]]
    for m in swapped + [m for m in messages if m not in swapped]:
        world.apply(m)
        world.sent(m)
    found = world.violations()
    assert any("out of commit order" in v for v in found), found


def test_a_message_of_a_rolled_back_transfer_is_caught(world: World) -> None:
    world.transfers(10)
    world.deliver_all()
    rolled_back = next(f"w-{i:03d}" for i in range(10) if ob.planned_rollback(SEED, f"w-{i:03d}"))
    ghost = Message(
        topic=ob.TOPIC,
        body=(
            f'{{"tx": "{rolled_back}", "key": "acct-00", "version": 99, "part": 0, "delta": 5}}'
        ).encode(),
        sharding_key="acct-00",
    )
    world.apply(ghost)
    found = world.violations()
    assert any("that transfer rolled back" in v for v in found), found


def test_unsent_rows_and_a_wrong_sharding_key_are_caught(world: World) -> None:
    world.transfers(10)
    messages = world.pending()
    first = messages[0]
    world.apply(
        Message(topic=first.topic, body=first.body, sharding_key="elsewhere", message_id="x")
    )
    for m in messages[1:]:
        world.apply(m)
    found = world.violations()
    assert any("still unsent" in v for v in found), found
    assert any("saw sharding key(s)" in v for v in found), found
