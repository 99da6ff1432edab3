"""``@transactional_listener``: declare the local transaction and the check-back of a group.

::

    @transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message, arg):    # runs in the sending thread
            ...
            return LocalTransactionState.COMMIT
        def check_local(self, message):           # runs when the broker asks again
            return LocalTransactionState.COMMIT

The decorator validates the class at once (so a mistake fails at import, not at the first
check-back hours later), stores a :class:`ListenerSpec` on it as ``__txmsg_listener__`` and
records it in a registry.  It returns the class unchanged.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from txmsg.errors import ListenerDefinitionError
from txmsg.executor import ExecutorConfig
from txmsg.registry import ListenerRegistry, default_registry
from txmsg.states import LocalTransactionState

T = TypeVar("T")

NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")
"""RocketMQ's rule for group and topic names (``Validators`` in the Java client)."""

SPEC_ATTRIBUTE = "__txmsg_listener__"


@dataclass(frozen=True)
class ListenerSpec:
    """Everything the core needs to run one group's transactional listener.

    ``target`` is the decorated class (instantiated at ``TxMsg.start()`` through the app's
    listener factory) or an instance given to ``add_transactional_listener``.
    ``execute_exception_state`` is what an exception in ``execute_local``, or an invalid
    return from it, answers.
    """

    group: str
    target: Any
    topics: tuple[str, ...] = ()
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    execute_exception_state: LocalTransactionState = LocalTransactionState.UNKNOW

    @property
    def name(self) -> str:
        cls = self.target if isinstance(self.target, type) else type(self.target)
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def is_instance(self) -> bool:
        return not isinstance(self.target, type)


def validate_name(kind: str, value: object, owner: str) -> str:
    """Check a group or topic name against RocketMQ's rule; return it."""
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise ListenerDefinitionError(
            f"{owner}: {kind} {value!r} is not a valid RocketMQ name; use 1-255 characters "
            "from letters, digits, '-', '_', '%' and '|' (e.g. group=\"order-tx\")"
        )
    return value


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
    execute_exception_state: LocalTransactionState = LocalTransactionState.UNKNOW,
) -> ListenerSpec:
    """Validate ``target`` (a class, or an instance of one) and return its spec."""
    cls = target if isinstance(target, type) else type(target)
    owner = cls.__qualname__
    validate_name("group", group, owner)
    if isinstance(topics, str):
        raise ListenerDefinitionError(
            f"{owner}: topics must be a list of names, got the string {topics!r}; "
            f"write topics=[{topics!r}]"
        )
    checked_topics = tuple(validate_name("topic", t, owner) for t in topics)
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
    state = LocalTransactionState.coerce(execute_exception_state)
    if state not in (LocalTransactionState.UNKNOW, LocalTransactionState.ROLLBACK):
        raise ListenerDefinitionError(
            f"{owner}: execute_exception_state must be LocalTransactionState.UNKNOW or ROLLBACK, "
            f"got {execute_exception_state!r}; committing after a failure would publish a "
            "message for work that did not happen"
        )
    assert state is not None
    return ListenerSpec(
        group=group,
        target=target,
        topics=checked_topics,
        executor=executor or ExecutorConfig(),
        execute_exception_state=state,
    )


def transactional_listener(
    group: str,
    topics: Sequence[str] = (),
    executor: ExecutorConfig | Mapping[str, Any] | None = None,
    execute_exception_state: LocalTransactionState = LocalTransactionState.UNKNOW,
    registry: ListenerRegistry | None = None,
) -> Callable[[type[T]], type[T]]:
    """Class decorator: the class is the transactional listener of producer ``group``.

    Parameters:
        group: the producer group; one listener per group per registry.
        topics: topics this group sends to (lets the backend reach their brokers before the
            first send, so check-backs of transactions left over from a previous run arrive).
        executor: sizing of the executor that runs check-backs and async sends
            (``ExecutorConfig`` or a dict of its fields); defaults to ``ExecutorConfig()``.
        execute_exception_state: answer when ``execute_local`` raises or returns something
            that is not a ``LocalTransactionState``: UNKNOW (default) or ROLLBACK.
        registry: where to record it; the process-wide ``default_registry`` by default.

    Raises:
        ListenerDefinitionError: at decoration time, saying what to fix.
    """
    if isinstance(group, type):
        raise ListenerDefinitionError(
            "@transactional_listener needs arguments: write "
            '@transactional_listener(group="my-producer-group")'
        )

    def decorate(cls: type[T]) -> type[T]:
        if not isinstance(cls, type):
            raise ListenerDefinitionError(
                f"@transactional_listener decorates a class with execute_local/check_local "
                f"methods, not {cls!r}"
            )
        spec = build_spec(
            cls,
            group=group,
            topics=topics,
            executor=executor,
            execute_exception_state=execute_exception_state,
        )
        (registry if registry is not None else default_registry).add_listener(spec)
        setattr(cls, SPEC_ATTRIBUTE, spec)
        return cls

    return decorate


def spec_of(target: Any) -> ListenerSpec | None:
    """The spec ``@transactional_listener`` stored on a class (or an instance's class)."""
    cls = target if isinstance(target, type) else type(target)
    spec = cls.__dict__.get(SPEC_ATTRIBUTE)
    return spec if isinstance(spec, ListenerSpec) else None
