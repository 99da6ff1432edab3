"""@app.transactional_listener / @registry.transactional_listener validate at decoration time
and say what to fix."""

from __future__ import annotations

from typing import Any

import pytest

from txmsg import (
    ExecutorConfig,
    InvalidNameError,
    LifecycleError,
    ListenerDefinitionError,
    ListenerRegistry,
    LocalTransactionState,
    TxMsg,
)
from txmsg.listener import spec_of


def test_valid_listener_is_recorded_and_returned_unchanged(
    app: TxMsg, registry: ListenerRegistry
) -> None:
    class Pay:
        def execute_local(self, message: object, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

        def check_local(self, message: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    decorated = app.transactional_listener(
        group="pay-tx", topics=["payments"], executor={"concurrency": 3}
    )(Pay)
    assert decorated is Pay
    spec = spec_of(Pay)
    assert spec is not None
    assert registry.listener("pay-tx") is spec
    assert spec.topics == ("payments",)
    assert spec.executor == ExecutorConfig(concurrency=3)
    assert spec.on_exception is LocalTransactionState.UNKNOW
    assert spec.name.endswith("Pay")


def _listener(**methods: object) -> type:
    return type("Broken", (), dict(methods))


def ok_execute(self: object, message: object, arg: object) -> None: ...
def ok_check(self: object, message: object) -> None: ...


@pytest.mark.parametrize(
    ("methods", "expected"),
    [
        (
            {"check_local": ok_check},
            r"has no execute_local\(\); .*def execute_local\(self, message, arg\)",
        ),
        (
            {"execute_local": ok_execute},
            r"has no check_local\(\); .*def check_local\(self, message\)",
        ),
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
    app: TxMsg, registry: ListenerRegistry, methods: dict[str, object], expected: str
) -> None:
    with pytest.raises(ListenerDefinitionError, match=expected):
        app.transactional_listener(group="g")(_listener(**methods))
    assert registry.listeners == {}


def test_async_methods_are_accepted_async_generators_refused(app: TxMsg) -> None:
    """``async def`` methods run on the app's loop (issue 27); an async generator never
    returns a state, so it is refused at declaration."""

    async def execute_local(self: object, message: object, arg: object) -> None: ...

    app.transactional_listener(group="g")(
        _listener(execute_local=execute_local, check_local=ok_check)
    )

    async def check_local(self: object, message: object) -> Any:
        yield None

    with pytest.raises(ListenerDefinitionError, match=r"async generator"):
        app.transactional_listener(group="g2")(
            _listener(execute_local=execute_local, check_local=check_local)
        )


def test_static_and_extra_default_parameters_are_accepted(app: TxMsg) -> None:
    class Flexible:
        @staticmethod
        def execute_local(message: object, arg: object, retries: int = 3) -> None: ...

        def check_local(self, message: object, *rest: object) -> None: ...

    app.transactional_listener(group="flex")(Flexible)
    assert spec_of(Flexible) is not None


def test_a_group_can_be_bound_once(app: TxMsg) -> None:
    app.transactional_listener(group="order-tx")(
        _listener(execute_local=ok_execute, check_local=ok_check)
    )
    with pytest.raises(
        ListenerDefinitionError, match=r"'order-tx' is already bound to .*Broken.*own group"
    ):
        app.transactional_listener(group="order-tx")(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


@pytest.mark.parametrize("group", ["", "order tx", "orders/1", "x" * 256])
def test_group_names_follow_rocketmq_rules(app: TxMsg, group: str) -> None:
    with pytest.raises(InvalidNameError, match="is not accepted: RocketMQ names are") as info:
        app.transactional_listener(group=group)(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )
    assert (info.value.kind, info.value.name) == ("producer_group", group)
    assert isinstance(info.value, ValueError)


def test_topic_names_follow_rocketmq_rules(app: TxMsg) -> None:
    with pytest.raises(InvalidNameError, match="topic 'or ders' is not accepted"):
        app.transactional_listener(group="g", topics=["or ders"])(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


def test_topics_must_be_a_list(app: TxMsg) -> None:
    with pytest.raises(ListenerDefinitionError, match=r"write topics=\['orders'\]"):
        app.transactional_listener(group="g", topics="orders")(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


def test_commit_on_failure_is_refused(app: TxMsg) -> None:
    with pytest.raises(ListenerDefinitionError, match="UNKNOW or ROLLBACK"):
        app.transactional_listener(group="g", execute_exception_state=LocalTransactionState.COMMIT)(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


def test_execute_exception_state_is_recorded(app: TxMsg) -> None:
    cls = _listener(execute_local=ok_execute, check_local=ok_check)
    app.transactional_listener(group="g", execute_exception_state=LocalTransactionState.ROLLBACK)(
        cls
    )
    spec = spec_of(cls)
    assert spec is not None
    assert spec.on_exception is LocalTransactionState.ROLLBACK


def test_bad_executor_settings_name_the_listener(app: TxMsg) -> None:
    with pytest.raises(
        ListenerDefinitionError, match=r"Broken: invalid executor settings.*concurrency"
    ):
        app.transactional_listener(group="g", executor={"concurrency": 0})(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )


def test_options_are_keyword_only_and_functions_are_explained(app: TxMsg) -> None:
    with pytest.raises(TypeError):
        app.transactional_listener(_listener(execute_local=ok_execute, check_local=ok_check))  # type: ignore[call-arg, arg-type]
    with pytest.raises(TypeError):
        ListenerRegistry().transactional_listener("g")  # type: ignore[call-arg]
    with pytest.raises(ListenerDefinitionError, match="decorates a class"):
        ListenerRegistry().transactional_listener(group="g")(ok_check)  # type: ignore[arg-type]


def test_a_module_level_registry_is_included_and_then_frozen(
    app: TxMsg, registry: ListenerRegistry
) -> None:
    module_registry = ListenerRegistry()
    cls = _listener(execute_local=ok_execute, check_local=ok_check)
    module_registry.transactional_listener(group="pay-tx", topics=["payments"])(cls)
    app.include(module_registry)
    assert registry.listener("pay-tx") is spec_of(cls)
    with pytest.raises(LifecycleError, match="frozen because it was included"):
        module_registry.transactional_listener(group="late-tx")(
            _listener(execute_local=ok_execute, check_local=ok_check)
        )
