"""Where listeners and consumers are declared until an application starts them.

Each :class:`txmsg.TxMsg` owns one registry (``app.registry``); ``@app.transactional_listener``
and ``@app.message_listener`` write into it.  To declare listeners in a module that must not
import the app (Flask's blueprints), make a registry there and hand it to the app::

    # orders/listeners.py
    registry = ListenerRegistry()

    @registry.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder: ...

    # main.py
    app = TxMsg(load_config())
    app.include(registry)

Decorators only record (pluggy's "mark, then an explicit object collects"); nothing connects to
a broker at import time.  A registry is frozen when it is included into an app and when that app
has started (a failed start leaves the app's registry open for the fix, and the retry), so a
listener declared too late fails loudly instead of silently never running.  A frozen
registry can still be included into further apps (each takes a copy of the declarations), which
is how tests and several apps in one process share one module's listeners.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from txmsg.aio.callables import is_async
from txmsg.consumer import ConsumerSpec, build_consumer_spec
from txmsg.errors import ListenerDefinitionError
from txmsg.freezer import Freezer
from txmsg.listener import ListenerSpec, build_spec
from txmsg.names import NameKind, NameRule, check_name, rocketmq_rule
from txmsg.outbox_options import build_outbox_options

if TYPE_CHECKING:
    from txmsg.orderly import ParkedEvent
    from txmsg.rescue import DiscardedEvent
    from txmsg.sqla.outbox import Outbox, OutboxDeadEvent

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H", bound="Callable[[ParkedEvent], Any]")
D = TypeVar("D", bound="Callable[[OutboxDeadEvent], Any]")
X = TypeVar("X", bound="Callable[[DiscardedEvent], Any]")
P = ParamSpec("P")
A = TypeVar("A")
R = TypeVar("R")
S = TypeVar("S")


class ClassDecorator(Protocol):
    """What ``@transactional_listener(...)`` returns: records the class, returns it unchanged."""

    def __call__(self, cls: type[T], /) -> type[T]: ...


class FunctionDecorator(Protocol):
    """What ``@message_listener(...)`` returns: records the function, returns it unchanged."""

    def __call__(self, fn: F, /) -> F: ...


# ---- one declaration of the options ---------------------------------------------------------------
# The options of a transactional listener are the keyword-only parameters of
# txmsg.listener.build_spec, those of a message listener the ones of
# txmsg.consumer.build_consumer_spec: the functions that validate them and hold their defaults.
# The decorators and their imperative twins, here and on TxMsg, take **options and get the
# builder's signature from these two helpers: for mypy (ParamSpec), for inspect.signature and
# help(), and for the TypeError of a wrong call.  An option is added in its builder only.


def _options_signature(
    fn: Callable[..., Any], build: Callable[..., Any], *, leading: int
) -> inspect.Signature:
    """``fn``'s first ``leading`` parameters, then the builder's keyword-only options."""
    own = list(inspect.signature(fn).parameters.values())[:leading]
    options = [
        p
        for p in inspect.signature(build).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return inspect.signature(fn).replace(parameters=[*own, *options])


def _with_signature(fn: Callable[..., R], signature: inspect.Signature) -> Callable[..., R]:
    """``fn`` checked against ``signature`` before it runs, so a wrong call is a TypeError
    naming ``fn`` (not the builder it hands the options to), and reporting ``signature``."""

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> R:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            exc.args = (f"{fn.__qualname__}() {exc}",)
            raise
        return fn(*args, **kwargs)

    checked.__signature__ = signature  # type: ignore[attr-defined]
    return checked


def adds_with(
    build: Callable[Concatenate[A, P], object],
) -> Callable[[Callable[Concatenate[S, ...], R]], Callable[Concatenate[S, A, P], R]]:
    """Method decorator: ``fn(self, target, **options)`` takes the options of ``build(target,
    *, options...)``, with their names, types and defaults."""

    def decorate(fn: Callable[Concatenate[S, ...], R]) -> Callable[Concatenate[S, A, P], R]:
        return _with_signature(fn, _options_signature(fn, build, leading=2))

    return decorate


def declares_with(
    build: Callable[Concatenate[Any, P], object],
) -> Callable[[Callable[Concatenate[S, ...], R]], Callable[Concatenate[S, P], R]]:
    """Method decorator: the decorator factory ``fn(self, **options)`` takes the options of
    ``build(target, *, options...)``, with their names, types and defaults."""

    def decorate(fn: Callable[Concatenate[S, ...], R]) -> Callable[Concatenate[S, P], R]:
        return _with_signature(fn, _options_signature(fn, build, leading=1))

    return decorate


def class_decorator(
    add: Callable[[type[Any]], object], *, decorator: str, imperative: str
) -> ClassDecorator:
    """``@<decorator>(...)``: hand the class to ``add`` and return it unchanged; anything but a
    class is refused with the imperative twin to use for an instance."""

    def decorate(cls: type[T]) -> type[T]:
        if not isinstance(cls, type):
            raise ListenerDefinitionError(
                f"{decorator} decorates a class with execute_local/check_local methods, not "
                f"{cls!r}; for an instance use {imperative}"
            )
        add(cls)
        return cls

    return decorate


def function_decorator(add: Callable[[Callable[..., Any]], object]) -> FunctionDecorator:
    """``@<decorator>(...)``: hand the function to ``add`` and return it unchanged."""

    def decorate(fn: F) -> F:
        add(fn)
        return fn

    return decorate


_ALIVE: weakref.WeakSet[ListenerRegistry] = weakref.WeakSet()
"""Every registry still referenced, for :func:`declarations_of` (weak: none is kept alive)."""
_ALIVE_LOCK = threading.Lock()


def declarations_of(target: Any) -> list[ListenerSpec]:
    """The distinct specs declaring ``target`` (a listener class, an instance given to
    ``add_transactional_listener``, or an instance of a declared class) in the registries
    alive, ordered by group.  An app's registry shares the specs of the registries it included,
    so a module's one declaration counts once; several mean several apps declared it."""
    with _ALIVE_LOCK:
        registries = list(_ALIVE)
    cls = None if isinstance(target, type) else type(target)
    found: dict[int, ListenerSpec] = {}
    for registry in registries:
        for spec in registry.listeners.values():
            if spec.target is target or (cls is not None and spec.target is cls):
                found.setdefault(id(spec), spec)
    return sorted(found.values(), key=lambda spec: spec.group)


class ListenerRegistry:
    """Transactional listeners by producer group, message consumers by consumer group, plain
    producer groups, outboxes by group, and the alert hooks (parked keys, dead outbox rows,
    discarded transactions)."""

    def __init__(self, *, name_rules: tuple[NameRule, ...] = (rocketmq_rule,)) -> None:
        self.name_rules = name_rules
        """Rules every group and topic name must pass (an app's registry has its backend's too)."""
        self._lock = threading.Lock()
        self._listeners: dict[str, ListenerSpec] = {}
        self._consumers: dict[str, ConsumerSpec] = {}
        self._producer_groups: dict[str, None] = {}  # insertion-ordered set
        self._parked_hooks: list[Callable[[ParkedEvent], Any]] = []
        self._outboxes: dict[str, Outbox] = {}
        self._outbox_dead_hooks: list[Callable[[OutboxDeadEvent], Any]] = []
        self._discarded_hooks: list[Callable[[DiscardedEvent], Any]] = []
        self._freezer = Freezer(self._lock)
        with _ALIVE_LOCK:
            _ALIVE.add(self)

    # ---- declaring --------------------------------------------------------------------------------
    @declares_with(build_spec)
    def transactional_listener(self, **options: Any) -> ClassDecorator:
        """Class decorator: the class is the transactional listener of producer ``group``.

        The class defines ``execute_local(self, message, arg)`` (runs in the sending thread) and
        ``check_local(self, message)`` (runs when the broker checks back); both return a
        :class:`~txmsg.LocalTransactionState`.  It is validated at once, so a mistake fails at
        import, not at the first check-back hours later.  The options are keyword-only; they
        are declared once, by :func:`txmsg.listener.build_spec`.

        Keyword Args:
            group (str): the producer group; one listener per group.
            topics (Sequence[str]): topics this group sends to; the backend reaches their
                brokers at start, so check-backs of transactions left over from a previous run
                arrive at once.
            executor (ExecutorConfig | Mapping[str, Any] | None): how many check-backs run at
                once, and the async-send queue (:class:`~txmsg.ExecutorConfig` or a dict of its
                fields).
            execute_exception_state (LocalTransactionState | None): the answer when
                ``execute_local`` raises or returns something that is not a state.  ``None``
                (default) means the rule of :data:`txmsg.defaults.EXECUTE_EXCEPTION_STATE`:
                UNKNOW, so the check-back decides; listeners that roll their own transaction
                back (``txmsg.sqla``) answer ROLLBACK.

        Raises:
            ListenerDefinitionError, InvalidNameError: at decoration time, saying what to fix.
            LifecycleError: the registry is already frozen (its app started).
        """
        return class_decorator(
            lambda cls: self.add_transactional_listener(cls, **options),
            decorator="@transactional_listener",
            imperative="add_transactional_listener()",
        )

    @adds_with(build_spec)
    def add_transactional_listener(self, target: Any, **options: Any) -> ListenerSpec:
        """The decorator's imperative twin; ``target`` is a listener class or a ready instance.

        Nothing is written on ``target``: a class may be declared by several apps under several
        groups, and each app binds its own spec to the instance it uses at start.
        """
        self._freezer.check_open(
            f"add the transactional listener of group {options.get('group')!r}"
        )
        spec = build_spec(target, **options)
        self.add_listener(spec)
        return spec

    @declares_with(build_consumer_spec)
    def message_listener(self, **options: Any) -> FunctionDecorator:
        """Function decorator: consume ``topic`` as consumer ``group`` with ``fn(message)``.

        Returning means consumed; raising means redeliver later (after ``max_reconsume``
        redeliveries RocketMQ moves the message to the group's DLQ).  The options are
        keyword-only; they are declared once, by :func:`txmsg.consumer.build_consumer_spec`.

        Keyword Args:
            topic (str): what to consume.
            group (str): as which consumer group (one function per group).
            tags (str): RocketMQ tag expression (``"*"``, ``"a || b"``).
            concurrency (int | None): consumer threads (default
                :data:`txmsg.defaults.CONSUMER_CONCURRENCY`).
            max_reconsume (int | None): redeliveries before the DLQ (default
                :data:`txmsg.defaults.MAX_RECONSUME`).
            idempotent (bool): ``fn(message, session)`` runs in one DB transaction with a dedup
                row, so a redelivered message is applied once (:mod:`txmsg.sqla.idempotent`).
            session_factory (Callable[[], Any] | None): SQLAlchemy sessions for
                ``idempotent=True`` and ``orderly=True``.
            orderly (bool): consume each queue one message at a time, in order (messages sent
                with ``send_orderly``); a message that keeps failing parks its sharding key in
                the database instead of blocking the queue (:mod:`txmsg.orderly`).  Needs
                ``session_factory``.
            max_orderly_retries (int | None): failures before the key is parked (default
                :data:`txmsg.defaults.MAX_ORDERLY_RETRIES`).
            orderly_retry_delay (float | None): seconds between those attempts (default
                :data:`txmsg.defaults.ORDERLY_RETRY_DELAY`).

        Returns the function unchanged.
        """
        return function_decorator(lambda fn: self.add_message_listener(fn, **options))

    @adds_with(build_consumer_spec)
    def add_message_listener(self, fn: Callable[..., Any], **options: Any) -> ConsumerSpec:
        """The consumer decorator's imperative twin."""
        self._freezer.check_open(f"add the message listener of group {options.get('group')!r}")
        spec = build_consumer_spec(fn, **options)
        self.add_consumer(spec)
        return spec

    def add_producer(self, *, group: str) -> None:
        """Declare producer ``group`` for plain sends (``send``, ``send_orderly``, ...) without
        a transactional listener; its client starts with the app.

        Declaring a group twice, or a group that also has a transactional listener, is harmless:
        the app makes one producer per group (a transactional group then opens its plain-send
        client at start instead of at the first plain send).

        Raises:
            InvalidNameError: RocketMQ or the backend refuses the name.
            LifecycleError: the registry is already frozen (its app started).
        """
        self._freezer.check_open(f"add the producer group {group!r}")
        check_name("producer_group", group, owner="add_producer", rules=self.name_rules)
        with self._lock:
            self._freezer.check_open_locked(f"add the producer group {group!r}")
            self._producer_groups[group] = None

    def on_parked(self, fn: H) -> H:
        """Decorator: ``fn(event)`` is called each time an orderly listener parks a sharding key
        (:class:`txmsg.orderly.ParkedEvent`), after the ERROR log line: page someone, count a
        metric.  Hooks run on the consumer's thread, so keep them short; an exception in a hook
        is logged and never stops consumption.  Returns ``fn`` unchanged.

        Raises:
            ListenerDefinitionError: ``fn`` is not callable.
            LifecycleError: the registry is already frozen (its app started).
        """
        if not callable(fn):
            raise ListenerDefinitionError(
                f"@on_parked decorates a function fn(event) (a ParkedEvent), not {fn!r}"
            )
        self._add_hook(self._parked_hooks, fn, "on_parked")
        return fn

    @declares_with(build_outbox_options)
    def add_outbox(self, **options: Any) -> Outbox:
        """Declare a transactional outbox whose relay sends with producer ``group``; returns it.

        ``outbox.send(session, topic, payload, ...)`` writes a message in your SQLAlchemy
        transaction; the relay sends it after the commit (:mod:`txmsg.sqla.outbox`).  With
        ``relay=True`` (default) the relay runs in the app's process from its ``start()`` to its
        ``close()`` (the group's plain-send producer is declared for it); with ``relay=False``
        it runs elsewhere (``txmsg outbox relay --app MODULE:app``).  The options are
        :class:`txmsg.sqla.outbox.Outbox`'s (:func:`txmsg.outbox_options.build_outbox_options`).

        Raises:
            InvalidNameError: RocketMQ or the backend refuses ``group``.
            ConfigError: an invalid option.
            ListenerDefinitionError: the registry has an outbox of that group already.
            LifecycleError: the registry is already frozen (its app started).
        """
        self._freezer.check_open(f"add the outbox {options.get('group')!r}")
        from txmsg.sqla.outbox import Outbox  # noqa: PLC0415 - SQLAlchemy only when used

        outbox = Outbox.of(build_outbox_options(self.name_rules, **options))
        self.add_outbox_of(outbox)
        return outbox

    def on_outbox_dead(self, fn: D) -> D:
        """Decorator: ``fn(event)`` is called with a :class:`txmsg.sqla.outbox.OutboxDeadEvent`
        each time a relay of the app gives up on an outbox row (after the ERROR log line): page
        someone, count a metric.  Runs on the relay's thread; an exception is logged and ignored.
        Returns ``fn`` unchanged."""
        if not callable(fn):
            raise ListenerDefinitionError(
                f"@on_outbox_dead decorates a function fn(event) (an OutboxDeadEvent), not {fn!r}"
            )
        self._add_hook(self._outbox_dead_hooks, fn, "on_outbox_dead")
        return fn

    def on_transaction_discarded(self, fn: X) -> X:
        """Decorator: ``fn(event)`` is called with a :class:`txmsg.rescue.DiscardedEvent` each
        time the app's rescuer gives up on a half message the broker discarded after its last
        check-back (``check_local`` still had no answer after ``rescue_attempts``; after the
        ERROR line and the dead row): page someone, count a metric.  Runs on the rescue
        consumer's thread; an exception is logged and ignored.  Returns ``fn`` unchanged.
        See ``docs/guide/discards.md``."""
        if not callable(fn) or is_async(fn):
            raise ListenerDefinitionError(
                "@on_transaction_discarded decorates a plain function fn(event) (a "
                f"txmsg.rescue.DiscardedEvent; not async def), not {fn!r}"
            )
        self._add_hook(self._discarded_hooks, fn, "on_transaction_discarded")
        return fn

    def _add_hook(self, hooks: list[Any], fn: Callable[..., Any], name: str) -> None:
        with self._lock:
            self._freezer.check_open_locked(f"add an {name} hook")
            hooks.append(fn)

    # ---- recording ---------------------------------------------------------------------------------
    def add_listener(self, spec: ListenerSpec) -> None:
        """Record ``spec``; one listener per producer group (RocketMQ routes a group's
        check-backs to whichever producer of the group it picks, so two listeners would each
        answer for the other's transactions)."""
        self._check_names(spec.group, spec.topics, spec.name, kind="producer_group")
        self._claim(
            self._listeners,
            spec.group,
            spec,
            f"add the transactional listener of group {spec.group!r}",
            lambda bound: (
                f"producer group {spec.group!r} is already bound to {bound.name}; "
                f"cannot also bind {spec.name}. RocketMQ allows one transaction listener per "
                "producer group: give this listener its own group=..."
            ),
        )

    def add_consumer(self, spec: ConsumerSpec) -> None:
        """Record ``spec``; one subscription per consumer group (RocketMQ requires every
        consumer of a group to subscribe identically)."""
        self._check_names(spec.group, (spec.topic,), spec.name, kind="consumer_group")
        self._claim(
            self._consumers,
            spec.group,
            spec,
            f"add the message listener of group {spec.group!r}",
            lambda bound: (
                f"consumer group {spec.group!r} is already used by {bound.name} "
                f"(topic {bound.topic!r}); cannot also use it for {spec.name}. "
                "Give each message listener its own group=..."
            ),
        )

    def _claim(
        self,
        table: dict[str, T],
        group: str,
        spec: T,
        what: str,
        taken: Callable[[T], str],
    ) -> None:
        """Put ``spec`` in ``group``'s one place in ``table`` while the registry is open.

        Listeners and consumers follow the same rule (one declaration per group, checked and
        recorded under the lock so two threads cannot both win); only the reason differs, which
        ``taken(bound)`` words for the declaration already there."""
        with self._lock:
            self._freezer.check_open_locked(what)
            bound = table.get(group)
            if bound is not None:
                raise ListenerDefinitionError(taken(bound))
            table[group] = spec

    def add_outbox_of(self, outbox: Outbox) -> None:
        """Record ``outbox`` (and, when its relay runs in process, its producer group); one
        outbox per group: its rows and relay belong to it."""
        check_name("producer_group", outbox.group, owner="add_outbox", rules=self.name_rules)
        with self._lock:
            self._freezer.check_open_locked(f"add the outbox {outbox.group!r}")
            if outbox.group in self._outboxes:
                raise ListenerDefinitionError(
                    f"this app has an outbox of group {outbox.group!r} already; use that one "
                    "(one outbox per group: its rows and relay belong to it)"
                )
            self._outboxes[outbox.group] = outbox
            if outbox.relay_in_process:
                self._producer_groups[outbox.group] = None

    def include(self, other: ListenerRegistry, *, into: str) -> None:
        """Take every declaration of ``other`` (a module-level registry), then freeze it
        (``into`` names the app, for the error of a later declaration there).

        Nothing is taken when a name is refused by this registry's rules or a group is taken.

        Raises:
            InvalidNameError: a name this registry's rules refuse.
            ListenerDefinitionError: a group this registry already has.
        """
        listeners, consumers, outboxes = other.listeners, other.consumers, other.outboxes
        for spec in listeners.values():
            self.check_spec_names(spec)
        for cspec in consumers.values():
            self.check_spec_names(cspec)
        for group in [*other.producer_groups, *outboxes]:
            check_name("producer_group", group, owner="add_producer", rules=self.name_rules)
        self._check_free(
            listeners,
            self.listeners,
            "producer",
            "one listener per producer group: rename one of them",
        )
        self._check_free(
            consumers, self.consumers, "consumer", "give each message listener its own group"
        )
        self._check_free(
            outboxes, self.outboxes, "outbox", "one outbox per group: rename one of them"
        )
        other.freeze(f"it was included into {into}")
        for spec in listeners.values():
            self.add_listener(spec)
        for cspec in consumers.values():
            self.add_consumer(cspec)
        for outbox in outboxes.values():
            self.add_outbox_of(outbox)
        for group in other.producer_groups:
            self.add_producer(group=group)
        with self._lock:
            self._freezer.check_open_locked("include a registry")
            self._parked_hooks.extend(other.parked_hooks)
            self._outbox_dead_hooks.extend(other.outbox_dead_hooks)
            self._discarded_hooks.extend(other.transaction_discarded_hooks)

    @staticmethod
    def _check_free(theirs: dict[str, Any], ours: dict[str, Any], kind: str, rule: str) -> None:
        for group, declared in theirs.items():
            if group in ours:
                name = getattr(declared, "name", repr(declared))
                raise ListenerDefinitionError(
                    f"{kind} group {group!r} of {name} is already declared in this app; {rule}"
                )

    def _check_names(
        self, group: str, topics: Sequence[str], owner: str, *, kind: NameKind
    ) -> None:
        check_name(kind, group, owner=owner, rules=self.name_rules)
        for topic in topics:
            check_name("topic", topic, owner=owner, rules=self.name_rules)

    def check_spec_names(self, spec: ListenerSpec | ConsumerSpec) -> None:
        """Raise :class:`~txmsg.InvalidNameError` if this registry's rules refuse a name of
        ``spec`` (used by :meth:`txmsg.TxMsg.include` before it takes anything)."""
        if isinstance(spec, ListenerSpec):
            self._check_names(spec.group, spec.topics, spec.name, kind="producer_group")
        else:
            self._check_names(spec.group, (spec.topic,), spec.name, kind="consumer_group")

    def group_of_instance(self, instance: Any, group: str | None = None) -> str:
        """The group whose listener declaration has ``instance``'s class (``TxMsg.use_listener``);
        ``group`` says which when the class is declared under several.

        Raises:
            ListenerDefinitionError: the class is not declared here (or, without ``group``,
                declared several times).
        """
        cls = type(instance)
        specs = [
            spec
            for spec in self.listeners.values()
            if spec.target is cls and (group is None or spec.group == group)
        ]
        if not specs:
            raise ListenerDefinitionError(
                f"{cls.__qualname__} is not a transactional listener of this app"
                + (f" for group {group!r}" if group is not None else "")
                + "; declare its class with @app.transactional_listener(group=...) (or include "
                "the registry that declares it), or use app.add_transactional_listener("
                "instance, group=...)"
            )
        if len(specs) > 1:
            groups = ", ".join(sorted(repr(spec.group) for spec in specs))
            raise ListenerDefinitionError(
                f"{cls.__qualname__} is declared for several groups of this app ({groups}); "
                "say which: app.use_listener(instance, group=...)"
            )
        return specs[0].group

    # ---- freezing ----------------------------------------------------------------------------------
    def freeze(self, reason: str) -> None:
        """Refuse further declarations; ``reason`` ends up in the error (first reason wins)."""
        self._freezer.freeze(reason)

    def freezing(self, reason: str) -> contextlib.AbstractContextManager[None]:
        """Frozen while the block runs, and for good if it succeeds; if it raises, this freeze
        is undone (an earlier one stays).

        ``TxMsg.start()`` runs in it: a listener declared by another thread while the app
        starts fails loudly instead of never running, yet a failed start leaves the registry
        open for the fix its error asks for, and the retry.
        """
        return self._freezer.freezing(reason)

    @property
    def frozen(self) -> bool:
        """True once an app included or started this registry."""
        return self._freezer.frozen

    # ---- reading -----------------------------------------------------------------------------------
    def listener(self, group: str) -> ListenerSpec | None:
        """The spec of producer ``group``, if declared."""
        with self._lock:
            return self._listeners.get(group)

    @property
    def listeners(self) -> dict[str, ListenerSpec]:
        """A copy: producer group -> spec."""
        with self._lock:
            return dict(self._listeners)

    @property
    def consumers(self) -> dict[str, ConsumerSpec]:
        """A copy: consumer group -> spec."""
        with self._lock:
            return dict(self._consumers)

    @property
    def producer_groups(self) -> tuple[str, ...]:
        """Groups declared with :meth:`add_producer` (for plain sends), in declaration order."""
        with self._lock:
            return tuple(self._producer_groups)

    @property
    def parked_hooks(self) -> tuple[Callable[[ParkedEvent], Any], ...]:
        """Hooks registered with :meth:`on_parked`, in registration order."""
        return self._snapshot(self._parked_hooks)

    @property
    def outboxes(self) -> dict[str, Outbox]:
        """A copy: outbox group -> :class:`~txmsg.sqla.outbox.Outbox`."""
        with self._lock:
            return dict(self._outboxes)

    @property
    def outbox_dead_hooks(self) -> tuple[Callable[[OutboxDeadEvent], Any], ...]:
        """Hooks registered with :meth:`on_outbox_dead`, in registration order."""
        return self._snapshot(self._outbox_dead_hooks)

    @property
    def transaction_discarded_hooks(self) -> tuple[Callable[[DiscardedEvent], Any], ...]:
        """Hooks registered with :meth:`on_transaction_discarded`, in registration order."""
        return self._snapshot(self._discarded_hooks)

    def _snapshot(self, hooks: list[T]) -> tuple[T, ...]:
        with self._lock:
            return tuple(hooks)

    def __repr__(self) -> str:
        return (
            f"<ListenerRegistry listeners={sorted(self._listeners)} "
            f"consumers={sorted(self._consumers)} producers={sorted(self._producer_groups)} "
            f"outboxes={sorted(self._outboxes)}"
            f"{' frozen' if self.frozen else ''}>"
        )
