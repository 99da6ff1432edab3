"""Transactional listeners: the local transaction and the check-back of one producer group.

::

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message, arg):    # runs in the sending thread
            ...
            return LocalTransactionState.COMMIT
        def check_local(self, message):           # runs when the broker asks again
            return LocalTransactionState.COMMIT

:func:`build_spec` validates the class at once (so a mistake fails at import, not at the first
check-back hours later); the registry stores the :class:`ListenerSpec` on the class as
``__txmsg_listener__`` (see :class:`txmsg.ListenerRegistry`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from txmsg import defaults
from txmsg.errors import ListenerDefinitionError
from txmsg.executor import ExecutorConfig
from txmsg.names import check_name
from txmsg.states import LocalTransactionState

SPEC_ATTRIBUTE = "__txmsg_listener__"


@dataclass(frozen=True)
class ListenerSpec:
    """Everything the core needs to run one group's transactional listener.

    ``target`` is the decorated class (instantiated at ``TxMsg.start()`` through the app's
    listener factory) or an instance given to ``add_transactional_listener``.
    ``execute_exception_state`` is what the user asked an exception in ``execute_local``, or
    an invalid return from it, to answer (None: the default rule, see :attr:`on_exception`).
    """

    group: str
    target: Any
    topics: tuple[str, ...] = ()
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    execute_exception_state: LocalTransactionState | None = None

    @property
    def on_exception(self) -> LocalTransactionState:
        """The answer when ``execute_local`` raises: the configured state, else UNKNOW."""
        return self.execute_exception_state or defaults.EXECUTE_EXCEPTION_STATE

    @property
    def name(self) -> str:
        cls = self.target if isinstance(self.target, type) else type(self.target)
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def is_instance(self) -> bool:
        return not isinstance(self.target, type)




def validation_summary(exc: ValidationError) -> str:
    """One line per problem: ``key: message`` (pydantic's text spans several lines)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def _signature_text(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _check_method(cls: type, name: str, params: tuple[str, ...], owner: str) -> None:
    """``cls.name`` must be a plain (not async) callable accepting ``params`` after self."""
    wanted = f"def {name}(self, {', '.join(params)})"
    raw = inspect.getattr_static(cls, name, None)
    if raw is None:
        raise ListenerDefinitionError(
            f"{owner} has no {name}(); a transactional listener must define `{wanted}`"
        )
    fn = getattr(cls, name)
    if not callable(fn):
        raise ListenerDefinitionError(f"{owner}.{name} is not callable; define `{wanted}`")
    func = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
    if inspect.iscoroutinefunction(func):
        raise ListenerDefinitionError(
            f"{owner}.{name} is `async def`; txmsg calls it from the sending thread and from "
            f"the client's native check threads, so define a plain `{wanted}`"
        )
    needs_self = not isinstance(raw, staticmethod | classmethod) and inspect.isfunction(raw)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and odd callables: trust them
    placeholders = ([None] if needs_self else []) + [None] * len(params)
    try:
        sig.bind(*placeholders)
    except TypeError:
        raise ListenerDefinitionError(
            f"{owner}.{name}{_signature_text(fn)} has the wrong parameters; txmsg calls it as "
            f"`{name}({', '.join(params)})`, so define `{wanted}`"
        ) from None


def build_spec(
    target: Any,
    *,
    group: str,
    topics: Sequence[str] = (),
    executor: ExecutorConfig | Mapping[str, Any] | None = None,
    execute_exception_state: LocalTransactionState | None = None,
) -> ListenerSpec:
    """Validate ``target`` (a class, or an instance of one) and return its spec.

    Names are checked against RocketMQ's rule here; the app adds its backend's rules when the
    spec reaches it (:mod:`txmsg.names`).
    """
    cls = target if isinstance(target, type) else type(target)
    owner = cls.__qualname__
    check_name("producer_group", group, owner=owner)
    if isinstance(topics, str):
        raise ListenerDefinitionError(
            f"{owner}: topics must be a list of names, got the string {topics!r}; "
            f"write topics=[{topics!r}]"
        )
    checked_topics = tuple(check_name("topic", t, owner=owner) for t in topics)
    _check_method(cls, "execute_local", ("message", "arg"), owner)
    _check_method(cls, "check_local", ("message",), owner)
    if isinstance(executor, Mapping):
        try:
            executor = ExecutorConfig(**executor)
        except ValidationError as exc:
            raise ListenerDefinitionError(
                f"{owner}: invalid executor settings: {validation_summary(exc)}"
            ) from None
    elif executor is not None and not isinstance(executor, ExecutorConfig):
        raise ListenerDefinitionError(
            f"{owner}: executor must be ExecutorConfig(...) or a dict of its fields, "
            f"got {type(executor).__name__}"
        )
    state = (
        None
        if execute_exception_state is None
        else LocalTransactionState.coerce(execute_exception_state)
    )
    if execute_exception_state is not None and state not in (
        LocalTransactionState.UNKNOW,
        LocalTransactionState.ROLLBACK,
    ):
        raise ListenerDefinitionError(
            f"{owner}: execute_exception_state must be LocalTransactionState.UNKNOW or ROLLBACK, "
            f"got {execute_exception_state!r}; committing after a failure would publish a "
            "message for work that did not happen"
        )
    return ListenerSpec(
        group=group,
        target=target,
        topics=checked_topics,
        executor=executor or ExecutorConfig(),
        execute_exception_state=state,
    )




def spec_of(target: Any) -> ListenerSpec | None:
    """The spec a registry stored on a listener class, or on an instance (or its class)."""
    spec = getattr(target, "__dict__", {}).get(SPEC_ATTRIBUTE)
    if spec is None and not isinstance(target, type):
        spec = type(target).__dict__.get(SPEC_ATTRIBUTE)
    return spec if isinstance(spec, ListenerSpec) else None
