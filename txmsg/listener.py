"""Transactional listeners: the local transaction and the check-back of one producer group.

::

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message, arg):    # runs in the sending thread
            ...
            return LocalTransactionState.COMMIT
        def check_local(self, message):           # runs when the broker asks again
            return LocalTransactionState.COMMIT

Either method may be ``async def``: it then runs on the app's event loop (``async with app:``, or
a loop thread of the app's own with ``with app:``), see :mod:`txmsg.aio.loop`.

:func:`build_spec` validates the class at once (so a mistake fails at import, not at the first
check-back hours later); the registry keeps the :class:`ListenerSpec` (see
:class:`txmsg.ListenerRegistry`).

A spec belongs to the app that declared it, never to the class: one class may be declared by
several apps under several groups (tests, two services in one process).  At ``start()`` the app
binds its spec to the listener *instance* it uses (:func:`bind_spec`), which is how
:mod:`txmsg.sqla` learns the group its records carry and the answer to an exception.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from txmsg import defaults
from txmsg.errors import ConfigError, ListenerDefinitionError
from txmsg.executor import ExecutorConfig
from txmsg.names import check_name
from txmsg.states import LocalTransactionState

SPEC_ATTRIBUTE = "__txmsg_listener__"
"""The instance attribute holding the spec an app bound to a listener (never set on a class)."""


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
    rescue_discarded: bool = defaults.RESCUE_DISCARDED
    """Whether the app rescues this group's half messages the broker discarded
    (:mod:`txmsg.rescue`)."""
    rescue_attempts: int = defaults.RESCUE_ATTEMPTS
    """Rounds of ``check_local`` (each one more check horizon of the broker) per discarded half
    message before it is given up (a dead row)."""

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
    """``cls.name`` must be a callable accepting ``params`` after self; ``async def`` or plain
    (an ``async def`` one runs on the app's event loop: :mod:`txmsg.aio.loop`)."""
    wanted = f"def {name}(self, {', '.join(params)})"
    raw = inspect.getattr_static(cls, name, None)
    if raw is None:
        raise ListenerDefinitionError(
            f"{owner} has no {name}(); a transactional listener must define `{wanted}`"
        )
    fn = getattr(cls, name)
    if not callable(fn):
        raise ListenerDefinitionError(f"{owner}.{name} is not callable; define `{wanted}`")
    if inspect.isasyncgenfunction(getattr(raw, "__func__", raw)):
        raise ListenerDefinitionError(
            f"{owner}.{name} is an async generator (`async def` with `yield`); define "
            f"`{wanted}` or `async {wanted}` returning a LocalTransactionState"
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
    rescue_discarded: bool = defaults.RESCUE_DISCARDED,
    rescue_attempts: int = defaults.RESCUE_ATTEMPTS,
) -> ListenerSpec:
    """Validate ``target`` (a class, or an instance of one) and return its spec.

    Names are checked against RocketMQ's rule here; the app adds its backend's rules when the
    spec reaches it (:mod:`txmsg.names`).

    ``rescue_discarded=False`` turns off the rescue of half messages the broker discarded after
    its last check-back (:mod:`txmsg.rescue`, on by default); ``rescue_attempts`` bounds how
    often the rescuer asks ``check_local`` about one of them before it gives up.
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
        except (ValidationError, ConfigError) as exc:
            # ExecutorConfig raises ConfigError (txmsg.settings); a declaration's mistake is
            # the listener's, so it names the listener.  (ValidationError: older models.)
            detail = validation_summary(exc) if isinstance(exc, ValidationError) else str(exc)
            raise ListenerDefinitionError(f"{owner}: invalid executor settings: {detail}") from None
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
    if not isinstance(rescue_discarded, bool):
        raise ListenerDefinitionError(
            f"{owner}: rescue_discarded must be True or False, got {rescue_discarded!r}"
        )
    if isinstance(rescue_attempts, bool) or not isinstance(rescue_attempts, int):
        raise ListenerDefinitionError(
            f"{owner}: rescue_attempts must be an int >= 1, got {rescue_attempts!r}"
        )
    if rescue_attempts < 1:
        raise ListenerDefinitionError(
            f"{owner}: rescue_attempts must be an int >= 1, got {rescue_attempts!r}"
        )
    return ListenerSpec(
        group=group,
        target=target,
        topics=checked_topics,
        executor=executor or ExecutorConfig(),
        execute_exception_state=state,
        rescue_discarded=rescue_discarded,
        rescue_attempts=rescue_attempts,
    )


def bound_spec(listener: Any) -> ListenerSpec | None:
    """The spec an app bound to the listener instance ``listener`` (:func:`bind_spec`), if any.

    Only the instance's own attributes count: a spec is never inherited from a class, where it
    would be shared by every app that declares the class.
    """
    if isinstance(listener, type):
        return None
    spec = getattr(listener, "__dict__", {}).get(SPEC_ATTRIBUTE)
    return spec if isinstance(spec, ListenerSpec) else None


def bind_spec(listener: Any, spec: ListenerSpec) -> bool:
    """Tell the instance ``listener`` the spec it answers for: what ``TxMsg.start()`` does for
    each listener it uses, and what a test of a listener without an app may do itself.

    Returns False when the object cannot take an attribute (``__slots__`` without
    ``__dict__``); such a listener must name its group itself (``producer_group``).

    Raises:
        ListenerDefinitionError: ``listener`` already answers for another producer group (or
            with another exception state), bound by another app.  A listener instance caches
            what it derives from its group (:class:`txmsg.sqla.RecordBackedListener` its local
            transaction), so sharing one between two groups would mix their records: give each
            app its own instance.
    """
    if isinstance(listener, type):
        raise ListenerDefinitionError(
            f"bind_spec() binds a spec to a listener instance, not to the class {listener!r}: a "
            "class may be declared by several apps"
        )
    bound = bound_spec(listener)
    if (
        bound is not None
        and bound is not spec
        and (bound.group, bound.on_exception)
        != (
            spec.group,
            spec.on_exception,
        )
    ):
        raise ListenerDefinitionError(
            f"this {type(listener).__qualname__} instance already answers for producer group "
            f"{bound.group!r} (execute_exception_state {bound.on_exception.name}), so it cannot "
            f"also answer for {spec.group!r} (execute_exception_state {spec.on_exception.name}); "
            "give each app and group its own instance (declare the class, and the app creates "
            "one at start)"
        )
    attributes = getattr(listener, "__dict__", None)
    if not isinstance(attributes, dict):
        return False
    attributes[SPEC_ATTRIBUTE] = spec  # the instance's own dict: a frozen object takes it too
    return True


def spec_of(target: Any) -> ListenerSpec | None:
    """The spec of a listener instance or class, for inspection (txmsg itself never needs it).

    An instance an app started: the spec that app bound to it.  Otherwise (a class, or an
    instance no app bound yet): its one declaration among the registries alive, and None if
    there is none.

    Raises:
        ListenerDefinitionError: several registries (apps) declare ``target`` with different
            specs, so only the app can say which one it means (``app.registry.listener(group)``).
    """
    spec = bound_spec(target)
    if spec is not None:
        return spec
    from txmsg.registry import declarations_of  # noqa: PLC0415 - the registry imports this module

    found = declarations_of(target)
    if len(found) > 1:
        groups = ", ".join(repr(s.group) for s in found)
        raise ListenerDefinitionError(
            f"{_name_of(target)} is declared by several registries (groups {groups}); its spec "
            "depends on the app: ask that app, app.registry.listener(group)"
        )
    return found[0] if found else None


def _name_of(target: Any) -> str:
    cls = target if isinstance(target, type) else type(target)
    return cls.__qualname__
