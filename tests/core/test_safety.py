"""Nothing a listener does escapes as an exception; anything odd becomes a safe state."""

from __future__ import annotations

import logging

import pytest

from txmsg import LocalTransactionState as S
from txmsg import Message
from txmsg.listener import ListenerSpec
from txmsg.message import UNIQ_KEY
from txmsg.safety import run_check_local, run_execute_local


def make_spec(execute_exception_state: S | None = None) -> ListenerSpec:
    """The spec of group ``order-tx``; ``None`` leaves the default rule (UNKNOW)."""
    return ListenerSpec(
        group="order-tx", target=Answers, execute_exception_state=execute_exception_state
    )


MSG = Message(topic="orders", body=b"{}", properties={UNIQ_KEY: "K-42"})


class Answers:
    def __init__(self, value: object = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def execute_local(self, message: Message, arg: object) -> object:
        if self.error:
            raise self.error
        return self.value

    def check_local(self, message: Message) -> object:
        return self.execute_local(message, None)


@pytest.mark.parametrize("state", [S.COMMIT, S.ROLLBACK, S.UNKNOW, S.UNKNOWN])
def test_valid_answers_pass_through(state: S) -> None:
    assert run_execute_local(Answers(state), MSG, None, make_spec()) is state
    assert run_check_local(Answers(state), MSG, make_spec()) is state


@pytest.mark.parametrize(
    "error", [RuntimeError("db down"), KeyError("x"), KeyboardInterrupt(), SystemExit(3)]
)
@pytest.mark.parametrize("configured", [S.UNKNOW, S.ROLLBACK])
def test_exceptions_become_the_configured_state_and_are_logged(
    error: BaseException, configured: S, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="txmsg.transaction")
    spec = make_spec(execute_exception_state=configured)
    assert run_execute_local(Answers(error=error), MSG, None, spec) is configured
    record = caplog.records[-1]
    assert "group=order-tx key=K-42" in record.getMessage()
    assert type(error).__name__ in record.getMessage()
    assert record.exc_info is not None


@pytest.mark.parametrize("value", [None, True, 0, 1, "COMMIT", "commit", object()])
@pytest.mark.parametrize("configured", [S.UNKNOW, S.ROLLBACK])
def test_invalid_returns_never_commit(
    value: object, configured: S, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="txmsg.transaction")
    assert (
        run_execute_local(Answers(value), MSG, None, make_spec(execute_exception_state=configured))
        is configured
    )
    assert "not a LocalTransactionState" in caplog.text
    assert "K-42" in caplog.text


def test_without_execute_exception_state_an_exception_answers_unknow() -> None:
    """The default rule (txmsg.defaults.EXECUTE_EXCEPTION_STATE): the check-back decides."""
    assert run_execute_local(Answers(error=RuntimeError("db")), MSG, None, make_spec()) is S.UNKNOW


def test_check_failures_are_always_unknow(caplog: pytest.LogCaptureFixture) -> None:
    spec = make_spec(execute_exception_state=S.ROLLBACK)  # ROLLBACK applies to execute_local only
    assert run_check_local(Answers(error=RuntimeError("db")), MSG, spec) is S.UNKNOW
    assert run_check_local(Answers("COMMIT"), MSG, spec) is S.UNKNOW
    assert "check_local raised RuntimeError" in caplog.text


def test_arg_reaches_execute_local() -> None:
    seen: list[object] = []

    class Listener:
        def execute_local(self, message: Message, arg: object) -> S:
            seen.append(arg)
            return S.COMMIT

    payload = {"order": object()}
    run_execute_local(Listener(), MSG, payload, make_spec())
    assert seen == [payload]
    assert seen[0] is payload


def test_unknown_alias_is_the_same_member() -> None:
    assert S.UNKNOWN is S.UNKNOW
    assert S.UNKNOW.value == 2
