"""A listener's spec belongs to the app that declared it, never to its class.

One class declared in two apps under two groups must answer for each app's own group: the spec
used to be stored on the class, so the app declared last decided the group (and the exception
state) of every app's instances, and app A's transaction records carried app B's group.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from txmsg import (
    ListenerDefinitionError,
    ListenerRegistry,
    LocalTransactionState,
    Message,
    TxMsg,
    TxMsgConfig,
)
from txmsg.listener import spec_of
from txmsg.sqla import (
    RecordBackedListener,
    create_engine,
    create_tables,
    get_record,
    make_session_factory,
    transactional,
)

from .doubles import DoubleBackend

S = LocalTransactionState


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'records.db'}")
    create_tables(engine)
    yield make_session_factory(engine)
    engine.dispose()


class Pay(RecordBackedListener):
    """Declared in two apps below; fails when the arg says so."""

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        if arg == "fail":
            raise RuntimeError("card declined")


class Charge:
    """The ``@transactional`` style: the group comes from the spec the app binds too."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.session_factory = sessions

    @transactional()
    def execute_local(self, message: Message, arg: Any, session: Session) -> None:
        pass

    def check_local(self, message: Message) -> S:
        return S.UNKNOW


def two_apps(
    cls: type, sessions: sessionmaker[Session]
) -> tuple[tuple[TxMsg, DoubleBackend], tuple[TxMsg, DoubleBackend]]:
    factory: Callable[[type[Any]], Any] = lambda c: c(sessions)  # noqa: E731
    made = []
    for group, state in (("pay-a", None), ("pay-b", S.UNKNOW)):
        backend = DoubleBackend()
        app = TxMsg(TxMsgConfig(), backend=backend, listener_factory=factory)
        app.add_transactional_listener(
            cls, group=group, topics=["orders"], execute_exception_state=state
        )
        made.append((app, backend))
    return made[0], made[1]


@pytest.mark.parametrize("cls", [Pay, Charge])
def test_one_class_in_two_apps_writes_each_apps_own_group(
    cls: type, sessions: sessionmaker[Session]
) -> None:
    (a, a_backend), (b, b_backend) = two_apps(cls, sessions)
    with a, b:
        for app, backend, group in ((a, a_backend, "pay-a"), (b, b_backend, "pay-b")):
            result = app.producer(group).send_in_transaction("orders", b"x")
            assert result.local_state is S.COMMIT
            record = get_record(sessions, result.transaction_key)
            assert record is not None
            assert record.producer_group == group
            if cls is Pay:  # the check-back reads the record of its own group
                assert backend.senders[group].check(result.transaction_key) is S.COMMIT


def test_the_exception_state_of_one_app_does_not_reach_the_other(
    sessions: sessionmaker[Session],
) -> None:
    (a, _), (b, _) = two_apps(Pay, sessions)
    with a, b:
        # app A chose nothing: RecordBackedListener's ROLLBACK; app B chose UNKNOW
        assert (
            a.producer("pay-a").send_in_transaction("orders", b"x", arg="fail").local_state
            is S.ROLLBACK
        )
        assert (
            b.producer("pay-b").send_in_transaction("orders", b"x", arg="fail").local_state
            is S.UNKNOW
        )


def test_the_class_carries_nothing(sessions: sessionmaker[Session]) -> None:
    # spec_of reads the registries alive: an earlier test's app in a reference cycle (a started
    # app's threads and rescuers refer back to it) lives until the cycle collector runs, and its
    # declaration of Pay would be listed too; collect first so "alive" means these two apps
    gc.collect()
    (a, _), (b, _) = two_apps(Pay, sessions)
    assert "__txmsg_listener__" not in vars(Pay)
    with pytest.raises(ListenerDefinitionError, match=r"groups .pay-a., .pay-b."):
        spec_of(Pay)  # declared twice: only each app can say which spec it means
    with a:
        listener = a.producer("pay-a").listener
        assert listener.group == "pay-a"
        assert spec_of(listener) is a.registry.listener("pay-a")
    a.close()
    b.close()


def test_one_instance_cannot_answer_for_two_groups(sessions: sessionmaker[Session]) -> None:
    """An instance caches its group's local transaction: sharing it between two groups would
    mix their records, so the second app's start refuses it and says what to do."""
    shared = Pay(sessions)
    a = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    b = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    a.add_transactional_listener(shared, group="pay-a")
    b.add_transactional_listener(shared, group="pay-b")
    with a:
        with pytest.raises(ListenerDefinitionError, match=r"already answers for .*'pay-a'"):
            b.start()
        assert not b.started
    same = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    same.add_transactional_listener(shared, group="pay-a")  # the same group again is fine
    with same:
        assert same.producer("pay-a").listener is shared


def test_use_listener_finds_the_spec_in_the_app(sessions: sessionmaker[Session]) -> None:
    """``use_listener`` looks the class up in the app's own declarations, so a class declared
    by several apps (or registries) is still accepted by each of them."""
    registry = ListenerRegistry()
    registry.add_transactional_listener(Pay, group="pay-a")
    other = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    other.add_transactional_listener(Pay, group="pay-b")
    app = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    app.include(registry)
    chosen = Pay(sessions)
    app.use_listener(chosen)
    with app:
        assert app.producer("pay-a").listener is chosen
        assert chosen.group == "pay-a"
    with pytest.raises(ListenerDefinitionError, match="not a transactional listener of this app"):
        TxMsg(TxMsgConfig(), backend=DoubleBackend()).use_listener(Pay(sessions))
