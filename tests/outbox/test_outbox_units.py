"""Issue 25, step 3: the retry policy's back-off and the time wheel that wakes the relay when a
row's back-off ends (no database, no broker)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from txmsg.errors import ConfigError, InvalidMessageError, InvalidNameError, SendError
from txmsg.sqla.outbox import RetryPolicy, TimeWheel, is_permanent
from txmsg.sqla.outbox.relay import LINGER, LINGER_FULL, linger_after


def test_back_off_doubles_up_to_its_cap_and_the_defaults_span_about_an_hour() -> None:
    policy = RetryPolicy(max_attempts=6, first_delay=0.5, max_delay=3.0)
    assert [policy.delay(n) for n in range(0, 7)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert [policy.exhausted(n) for n in (5, 6, 7)] == [False, True, True]
    assert policy.window == 0.5 + 1 + 2 + 3 + 3
    default = RetryPolicy()
    assert default.max_attempts == 16
    assert 3600 <= default.window <= 4200  # a broker down for minutes leaves no dead rows
    assert default.delay(10_000) == default.max_delay


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"first_delay": -1},
        {"first_delay": float("nan")},
        {"max_delay": "1"},
        {"first_delay": 5, "max_delay": 1},
    ],
)
def test_an_invalid_policy_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**options)  # type: ignore[arg-type]


def test_only_what_the_backend_refused_before_sending_is_final() -> None:
    assert is_permanent(InvalidMessageError("oversize"))
    assert is_permanent(InvalidNameError("bad", kind="topic", name="a b"))
    assert not is_permanent(SendError("no route"))
    assert not is_permanent(TimeoutError())
    assert not is_permanent(RuntimeError("?"))


@pytest.mark.parametrize("seed", range(40))
def test_the_wheel_hands_out_each_entry_at_its_deadline_never_before(seed: int) -> None:
    rng = random.Random(seed)
    now = [1000.0]
    wheel = TimeWheel(tick=0.05, slots=rng.choice([1, 2, 8, 64, 512]), clock=lambda: now[0])
    deadlines: dict[int, float] = {}
    out: list[int] = []
    for step in range(300):
        if rng.random() < 0.5:  # some deadlines already passed, some turns away
            at = now[0] + rng.random() * rng.choice([0.01, 1, 5, 50]) - rng.random() * 0.1
            deadlines[step] = at
            wheel.schedule(step, at)
        waiting = [at for item, at in deadlines.items() if item not in out]
        assert wheel.next_deadline() == (min(waiting) if waiting else None)
        now[0] += rng.random() * rng.choice([0.01, 0.3, 3, 30])
        due = wheel.due(now[0])
        assert all(deadlines[item] <= now[0] for item in due)  # never early
        assert [deadlines[i] for i in due] == sorted(deadlines[i] for i in due)
        out += due
        assert not [i for i, at in deadlines.items() if at <= now[0] and i not in out]  # never late
        assert len(wheel) == len(deadlines) - len(out)


def test_the_wheel_refuses_a_nonsense_shape_and_clears() -> None:
    with pytest.raises(ConfigError):
        TimeWheel(tick=0)
    with pytest.raises(ConfigError):
        TimeWheel(slots=0)
    wheel = TimeWheel(clock=lambda: 0.0)
    wheel.schedule("x", 1.0)
    wheel.clear()
    assert (len(wheel), wheel.next_deadline(), wheel.due(5.0)) == (0, None, [])


def test_the_relay_pauses_after_a_cycle_in_proportion_to_the_rows_it_took() -> None:
    """A cycle of one row pauses a sixteenth of LINGER (a lightly loaded relay sends the next
    commit about at once); from LINGER_FULL rows on, the whole LINGER (a busy relay batches)."""
    assert linger_after(0) == 0.0
    assert linger_after(1) == pytest.approx(LINGER / LINGER_FULL)
    assert linger_after(LINGER_FULL // 2) == pytest.approx(LINGER / 2)
    assert linger_after(LINGER_FULL) == linger_after(10 * LINGER_FULL) == LINGER
    assert [linger_after(n) for n in range(LINGER_FULL + 1)] == sorted(
        linger_after(n) for n in range(LINGER_FULL + 1)
    )


def test_the_sqlite_driver_insert_stores_what_sqlalchemys_own_insert_stores(tmp_path: Any) -> None:
    """writer._DriverInsert (SQLite's INSERT as the driver's SQL with the columns' bind
    processors) against SQLAlchemy's compiled INSERT of the same row: the same SQL, and the same
    stored values for every column type of the table (text, integers, JSON, bytes, UTC datetimes,
    NULLs), with and without a sharding key."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from sqlalchemy import bindparam, insert  # noqa: PLC0415

    from txmsg.sqla import create_engine, create_tables  # noqa: PLC0415
    from txmsg.sqla.outbox import writer  # noqa: PLC0415

    engine = create_engine(f"sqlite:///{tmp_path}/pin.db")
    create_tables(engine)
    table = writer._MESSAGES
    columns = [c.name for c in table.c if c.name not in ("id", "message_key")]
    when = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

    def row(key: str, sharding_key: str | None) -> dict[str, Any]:
        return {
            "outbox": "pin",
            "message_key": key,
            "topic": "order-events",
            "tags": "paid",
            "keys": "order-1 order-2",
            "properties": {"tenant": "ä", "n": "1"},
            "body": bytes(range(256)),
            "sharding_key": sharding_key,
            "seq": None,
            "delay_level": 3,
            "deliver_at_ms": 1_893_553_445_678,
            "state": "PENDING",
            "attempts": 2,
            "next_attempt_at": when,
            "last_error": "SendError: x",
            "created_at": when - timedelta(seconds=1),
            "dead_at": when + timedelta(hours=1),
        }

    stored: dict[str, list[tuple[Any, ...]]] = {}
    for way in ("driver", "core"):
        with engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM txmsg_outbox_message")
            for key, sharding_key in ((f"{way}-1", None), (f"{way}-2", "k"), (f"{way}-3", "k")):
                values = row(key, sharding_key)
                if way == "driver":
                    writer._driver_insert(connection.dialect).insert(connection, values)
                elif sharding_key is None:
                    connection.execute(insert(table), values)
                else:
                    keyed = {k: v for k, v in values.items() if k != "seq"}
                    keyed |= {"seq_outbox": "pin", "seq_key": sharding_key}
                    connection.execute(writer._INSERT_KEYED_ROW, keyed)
            raw = connection.exec_driver_sql(  # the stored values, no result processing
                f"SELECT {', '.join(columns)} FROM txmsg_outbox_message ORDER BY id"  # noqa: S608
            )
            stored[way] = [tuple(r) for r in raw]
    assert stored["driver"] == stored["core"]
    assert [r[columns.index("seq")] for r in stored["driver"]] == [None, 1, 2]
    compiled = writer._driver_insert(engine.dialect)
    assert compiled.sql == str(
        insert(table)
        .values({c.name: bindparam(c.name) for c in table.c if c.name not in ("id", "seq")})
        .returning(table.c.id, table.c.seq)
        .compile(dialect=engine.dialect)
    )
    engine.dispose()
