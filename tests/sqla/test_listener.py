"""The decorator and the base class users write listeners with."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from sqlalchemy.orm import Session

from txmsg import ListenerDefinitionError, ListenerRegistry
from txmsg.listener import bind_spec
from txmsg.message import Message
from txmsg.sqla import RecordBackedListener, RecordState, get_record, transactional
from txmsg.states import LocalTransactionState as S

from .business import balance, credit, message
from .conftest import Db


class Transfer(RecordBackedListener):
    producer_group = "transfer-tx"

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        credit(session, str(arg["to"]), int(arg["amount"]))
        if arg.get("fail"):
            raise RuntimeError("limit exceeded")


def test_record_backed_listener_commits_and_checks(db: Db) -> None:
    listener = Transfer(db.sessions)
    msg = message("l-1")
    assert listener.execute_local(msg, {"to": "zoe", "amount": 4}) is S.COMMIT
    assert listener.check_local(msg) is S.COMMIT
    assert balance(db.sessions, "zoe") == 4
    record = get_record(db.sessions, "l-1")
    assert record is not None
    assert record.producer_group == "transfer-tx"


def test_record_backed_listener_rolls_back(db: Db) -> None:
    """A business exception answers ROLLBACK (the database transaction was rolled back) unless
    the decorator says execute_exception_state=...; the check-back then agrees: ROLLBACK."""
    assert Transfer(db.sessions).execute_exception_state is S.ROLLBACK
    assert (
        Transfer(db.sessions).execute_local(
            message("l-2a"), {"to": "yan", "amount": 4, "fail": True}
        )
        is S.ROLLBACK
    )

    registry = ListenerRegistry()

    @registry.transactional_listener(group="transfer-unknow-tx", execute_exception_state=S.UNKNOW)
    class UnknowTransfer(Transfer):
        pass

    listener = UnknowTransfer(db.sessions)
    assert listener.execute_exception_state is S.ROLLBACK  # declared, but no app started it yet
    spec = registry.listener("transfer-unknow-tx")
    assert spec is not None
    assert bind_spec(listener, spec)  # what the app that starts it does
    assert listener.execute_exception_state is S.UNKNOW
    msg = message("l-2")
    assert listener.execute_local(msg, {"to": "yan", "amount": 4, "fail": True}) is S.UNKNOW
    assert listener.check_local(msg) is S.ROLLBACK
    assert balance(db.sessions, "yan") is None


def test_base_class_requires_the_business_method(db: Db) -> None:
    class Empty(RecordBackedListener):
        producer_group = "empty"

    # NotImplementedError inside the transaction is an ordinary failure: rolled back.
    assert Empty(db.sessions).execute_local(message("l-3"), None) is S.ROLLBACK
    record = get_record(db.sessions, "l-3")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK


def test_group_is_required() -> None:
    class NoGroup(RecordBackedListener):
        pass

    with pytest.raises(ListenerDefinitionError, match="producer group"):
        NoGroup(lambda: None).execute_local(message("l-4"), None)  # type: ignore[arg-type,return-value]


class Decorated:
    producer_group = "decorated-tx"

    def __init__(self, sessions: Any) -> None:
        self.session_factory = sessions

    @transactional(on_error=S.UNKNOW)
    def execute_local(self, message: Message, arg: Any, session: Session) -> None:
        credit(session, "xia", int(arg))
        if int(arg) < 0:
            raise ValueError("negative")

    def check_local(self, message: Message) -> S:
        return S.UNKNOW


def test_transactional_decorator_keeps_the_listener_signature(db: Db) -> None:
    params = list(inspect.signature(Decorated.execute_local).parameters)
    assert params == ["self", "message", "arg"]
    listener = Decorated(db.sessions)
    assert listener.execute_local(message("d-1"), 3) is S.COMMIT
    assert listener.execute_local(message("d-2"), -1) is S.UNKNOW
    assert balance(db.sessions, "xia") == 3
    record = get_record(db.sessions, "d-2")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK
    assert record.producer_group == "decorated-tx"


def test_transactional_decorator_needs_sessions() -> None:
    class NoSessions:
        producer_group = "g"

        @transactional()
        def execute_local(self, message: Message, arg: Any, session: Session) -> None:
            pass

    with pytest.raises(ListenerDefinitionError, match="session_factory"):
        NoSessions().execute_local(message("d-3"), None)


def test_base_class_and_decorator_pass_the_core_listener_validation(db: Db) -> None:
    """txmsg's @registry.transactional_listener checks execute_local/check_local signatures at
    decoration; both styles must pass it, and the group then comes from the spec the app binds
    to the instance at start (here bound by hand, as the app does)."""
    registry = ListenerRegistry()

    @registry.transactional_listener(group="spec-group")
    class ViaSpec(RecordBackedListener):
        def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
            credit(session, "spec", 1)

    @registry.transactional_listener(group="decorated-group")
    class ViaDecorator(Decorated):
        pass

    listener = ViaSpec(db.sessions)
    with pytest.raises(ListenerDefinitionError, match="producer group"):
        _ = listener.group  # the class alone says nothing: several apps may declare it
    bind_spec(listener, registry.listeners["spec-group"])
    assert listener.group == "spec-group"
    assert listener.execute_local(message("s-1"), None) is S.COMMIT
    record = get_record(db.sessions, "s-1")
    assert record is not None
    assert record.producer_group == "spec-group"
    decorated = ViaDecorator(db.sessions)
    bind_spec(decorated, registry.listeners["decorated-group"])
    assert decorated.execute_local(message("s-2"), 1) is S.COMMIT
    record = get_record(db.sessions, "s-2")
    assert record is not None
    assert record.producer_group == "decorated-group"  # the app's group beats producer_group
    assert set(registry.listeners) == {"spec-group", "decorated-group"}
