"""@transactional_listener validates at decoration time and says what to fix."""

from __future__ import annotations

import pytest

from txmsg import (
    ExecutorConfig,
    ListenerDefinitionError,
    ListenerRegistry,
    LocalTransactionState,
    transactional_listener,
)
from txmsg.listener import spec_of


def test_valid_listener_is_recorded_and_returned_unchanged(registry: ListenerRegistry) -> None:
    class Pay:
        def execute_local(self, message: object, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

        def check_local(self, message: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    decorated = transactional_listener(
        group="pay-tx", topics=["payments"], executor={"max_pool_size": 8}, registry=registry
    )(Pay)
    assert decorated is Pay
    spec = spec_of(Pay)
    assert spec is not None and registry.listener("pay-tx") is spec
    assert spec.topics == ("payments",) and spec.executor == ExecutorConfig(max_pool_size=8)
    assert spec.execute_exception_state is LocalTransactionState.UNKNOW
    assert spec.name.endswith("Pay")


def _listener(**methods: object) -> type:
    return type("Broken", (), dict(methods))


def ok_execute(self: object, message: object, arg: object) -> None: ...
def ok_check(self: object, message: object) -> None: ...


@pytest.mark.parametrize(
    ("methods", "expected"),
    [
        ({"check_local": ok_check}, r"has no execute_local\(\); .*def execute_local\(self, message, arg\)"),
        ({"execute_local": ok_execute}, r"has no check_local\(\); .*def check_local\(self, message\)"),
        (
            {"execute_local": lambda self, message: None, "check_local": ok_check},
            r"execute_local\(self, message\) has the wrong parameters; txmsg calls it as "
            r"`execute_local\(message, arg\)`",
        ),
        (
            {"execute_local": ok_execute, "check_local": lambda self: None},
            r"check_local\(self\) has the wrong parameters",
        ),
        ({"execute_local": 3, "check_local": ok_check}, "execute_local is not callable"),
    ],
)
def test_broken_listeners_are_rejected_with_the_fix(
    registry: ListenerRegistry, methods: dict[str, object], expected: str
) -> None:
    with pytest.raises(ListenerDefinitionError, match=expected):
        transactional_listener(group="g", registry=registry)(_listener(**methods))
    assert registry.listeners == {}


def test_async_methods_are_rejected(registry: ListenerRegistry) -> None:
    async def execute_local(self: object, message: object, arg: object) -> None: ...

    with pytest.raises(ListenerDefinitionError, match="async def.*plain"):
        transactional_listener(group="g", registry=registry)(
            _listener(execute_local=execute_local, check_local=ok_check)
        )


def test_static_and_extra_default_parameters_are_accepted(registry: ListenerRegistry) -> None:
    class Flexible:
        @staticmethod
        def execute_local(message: object, arg: object, retries: int = 3) -> None: ...

        def check_local(self, message: object, *rest: object) -> None: ...

    transactional_listener(group="flex", registry=registry)(Flexible)
    assert spec_of(Flexible) is not None


def test_a_group_can_be_bound_once(registry: ListenerRegistry) -> None:
    transactional_listener(group="order-tx", registry=registry)(
        _listener(execute_local=ok_execute, check_local=ok_check)
    )
    with pytest.raises(ListenerDefinitionError, match="'order-tx' is already bound to .*Broken.*own group"):
        transactional_listener(group="order-tx", registry=registry)(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


@pytest.mark.parametrize("group", ["", "order tx", "orders/1", "x" * 256])
def test_group_names_follow_rocketmq_rules(registry: ListenerRegistry, group: str) -> None:
    with pytest.raises(ListenerDefinitionError, match="not a valid RocketMQ name"):
        transactional_listener(group=group, registry=registry)(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


def test_topics_must_be_a_list(registry: ListenerRegistry) -> None:
    with pytest.raises(ListenerDefinitionError, match=r"write topics=\['orders'\]"):
        transactional_listener(group="g", topics="orders", registry=registry)(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


def test_commit_on_failure_is_refused(registry: ListenerRegistry) -> None:
    with pytest.raises(ListenerDefinitionError, match="UNKNOW or ROLLBACK"):
        transactional_listener(
            group="g", execute_exception_state=LocalTransactionState.COMMIT, registry=registry
        )(_listener(execute_local=ok_execute, check_local=ok_check))


def test_bad_executor_settings_name_the_listener(registry: ListenerRegistry) -> None:
    with pytest.raises(ListenerDefinitionError, match="Broken: invalid executor settings.*core_pool_size"):
        transactional_listener(
            group="g", executor={"core_pool_size": 9, "max_pool_size": 1}, registry=registry
        )(_listener(execute_local=ok_execute, check_local=ok_check))


def test_bare_decorator_and_functions_are_explained(registry: ListenerRegistry) -> None:
    with pytest.raises(ListenerDefinitionError, match=r'needs arguments: write @transactional_listener\(group='):
        transactional_listener(_listener(execute_local=ok_execute, check_local=ok_check))  # type: ignore[arg-type]
    with pytest.raises(ListenerDefinitionError, match="decorates a class"):
        transactional_listener(group="g", registry=registry)(ok_check)  # type: ignore[type-var]
