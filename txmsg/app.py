"""``TxMsg``: the application object that owns a backend, its producers and consumers.

::

    app = TxMsg(load_config())

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder: ...

    app.add_producer(group="notify")            # plain sends only: no listener

    with app:                                   # start(), then close() at the end
        app.transactional_producer("order-tx").send_in_transaction("orders", {"id": 1}, arg=order)
        app.producer("notify").send_orderly("events", {"id": 1}, sharding_key="order-1")

Each app has its own listeners (``app.registry``); listeners declared in other modules come in
through ``app.include(registry)``.  Registration is frozen once ``start()`` succeeds.

In an asyncio service, ``async with app:`` binds the app to the running event loop (``async def``
listeners run there) and ``app.async_producer(group)`` sends without blocking it; see
:mod:`txmsg.aio` and ``docs/guide/async.md``.

Backends are found lazily, on ``start()``, through the entry-point group ``txmsg.backends``
(``rocketmq`` is ``txmsg_rocketmq.backend:RocketMQBackend``), so importing txmsg never loads a
native library.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import importlib.metadata
import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from txmsg import defaults
from txmsg.aio.loop import LoopBridge, warn_start_on_running_loop
from txmsg.aio.sends import AwaitableSends
from txmsg.backend import Backend
from txmsg.config import TxMsgConfig, load_config
from txmsg.consumer import ConsumerSpec, build_consumer_spec
from txmsg.errors import (
    BackendUnavailableError,
    ClosedError,
    LifecycleError,
    NotStartedError,
    TxMsgError,
)
from txmsg.listener import ListenerSpec, build_spec
from txmsg.names import NameRule, rules_for_backend
from txmsg.outbox_options import build_outbox_options
from txmsg.producer import Producer, ProducerStats, TransactionalProducer
from txmsg.registry import (
    ClassDecorator,
    FunctionDecorator,
    ListenerRegistry,
    adds_with,
    class_decorator,
    declares_with,
    function_decorator,
)
from txmsg.running import Running, needs_loop, quietly

if TYPE_CHECKING:
    from txmsg.aio.producer import AsyncProducer, AsyncTransactionalProducer
    from txmsg.orderly import ParkedEvent
    from txmsg.rescue import DiscardedEvent, Rescuer
    from txmsg.sqla.outbox import Outbox, OutboxDeadEvent

log = logging.getLogger("txmsg.app")

BACKEND_GROUP = "txmsg.backends"

H = TypeVar("H", bound="Callable[[ParkedEvent], Any]")
D = TypeVar("D", bound="Callable[[OutboxDeadEvent], Any]")
X = TypeVar("X", bound="Callable[[DiscardedEvent], Any]")


def backend_entry_points() -> list[importlib.metadata.EntryPoint]:
    """Installed backends (entry-point group ``txmsg.backends``)."""
    return sorted(importlib.metadata.entry_points(group=BACKEND_GROUP), key=lambda ep: ep.name)


CHECKOUT_HINT = "(in a txmsg checkout: make setup)"
"""The secondary hint: ``make setup`` exists only in a clone of the txmsg repository."""


def install_hint(name: str) -> str:
    """How a pip user installs backend ``name`` (an entry-point name or ``module:attribute``).

    Backend errors are read by people who installed txmsg with pip and have no Makefile, so they
    name the distribution to install, from the packages' metadata (the core names no backend):
    the ``txmsg`` extra that requires the distribution whose entry point is ``name``, or, for a
    backend not installed, the extra of that name; else whatever distribution provides it.
    """
    if ":" in name:
        package = name.partition(":")[0].partition(".")[0]
        return f"install the distribution that provides {package!r}"
    found = [ep.dist.name for ep in backend_entry_points() if ep.name == name and ep.dist]
    distribution = found[0] if found else None
    extra = _extra_installing(name, distribution)
    if extra is not None:
        return f"`pip install 'txmsg[{extra}]'`"
    if distribution is not None:
        return f"`pip install {distribution}`"
    return f"install the distribution that provides the backend {name!r}"


def _extra_installing(name: str, distribution: str | None) -> str | None:
    """The extra of txmsg's own metadata (``Requires-Dist: ...; extra == "x"``) that installs
    ``distribution``, or when it is not installed (None) the extra called ``name``."""
    try:
        requires = importlib.metadata.requires("txmsg") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra is None:
            continue
        required = re.split(r"[\s\[<>=!~(]", requirement.strip(), maxsplit=1)[0]
        if distribution is None and extra.group(1) == name:
            return name
        if distribution is not None and _canonical(required) == _canonical(distribution):
            return extra.group(1)
    return None


def _canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def load_backend_factory(name: str) -> Callable[..., Backend]:
    """The factory of backend ``name`` (an entry-point name or ``module:attribute``)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        target = f"{module_name}:{attr}"
        try:
            factory: Any = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise BackendUnavailableError(
                f"backend {target!r} cannot be imported: {exc}. Check the name, or "
                f"{install_hint(name)}, then run `txmsg doctor` {CHECKOUT_HINT}"
            ) from exc
        return factory  # type: ignore[no-any-return]
    found = [ep for ep in backend_entry_points() if ep.name == name]
    if not found:
        names = ", ".join(ep.name for ep in backend_entry_points()) or "none"
        raise BackendUnavailableError(
            f"no txmsg backend named {name!r} is installed (installed: {names}). To get it, "
            f"{install_hint(name)}, then run `txmsg doctor` {CHECKOUT_HINT}; or set `backend` "
            "to an installed name"
        )
    try:
        return found[0].load()  # type: ignore[no-any-return]
    except Exception as exc:
        raise BackendUnavailableError(
            f"backend {name!r} ({found[0].value}) failed to load: {type(exc).__name__}: {exc}. "
            f"Reinstall it, {install_hint(name)}, then run `txmsg doctor` to check its native "
            f"client {CHECKOUT_HINT}"
        ) from exc


def load_backend(name: str, config: TxMsgConfig) -> Backend:
    """Create backend ``name`` for ``config``; every failure is a BackendUnavailableError."""
    factory = load_backend_factory(name)
    try:
        return factory(config)
    except TxMsgError:
        raise
    except Exception as exc:
        raise BackendUnavailableError(
            f"backend {name!r} could not start: {type(exc).__name__}: {exc}. Run `txmsg doctor` "
            f"to see what is missing; to (re)install the backend, {install_hint(name)} "
            f"{CHECKOUT_HINT}"
        ) from exc


class TxMsg:
    """The application: listeners and consumers in, producers out.

    Parameters:
        config: settings; ``None`` reads them with :func:`txmsg.load_config`.
        backend: a backend object, an installed backend's name, or ``module:attribute``;
            ``None`` uses ``config.backend``.  Loaded lazily on :meth:`start`; its name rules
            (:mod:`txmsg.names`) apply at once, to every listener registered with this app.
        listener_factory: makes a listener instance from its class at start (default: call the
            class with no arguments; pass e.g. ``injector.get`` to build them with DI).
        async_send_threads: threads of the pool the awaitable sends of
            :meth:`async_producer` wait on (:data:`txmsg.defaults.ASYNC_SEND_THREADS`).

    Lifecycle: *new* (declare listeners) -> :meth:`start` -> *started* (send) -> :meth:`close`
    -> *closed* (final; make a new app to start again).  In a coroutine: ``async with app:``,
    or :meth:`astart` and :meth:`aclose`.
    """

    def __init__(
        self,
        config: TxMsgConfig | None = None,
        *,
        backend: Backend | str | None = None,
        listener_factory: Callable[[type[Any]], Any] | None = None,
        async_send_threads: int = defaults.ASYNC_SEND_THREADS,
    ) -> None:
        self._sends = AwaitableSends(async_send_threads)  # raises for a bad count
        self.config = config if config is not None else load_config()
        self.listener_factory: Callable[[type[Any]], Any] = listener_factory or (lambda cls: cls())
        self._backend_arg = backend
        self.name_rules: tuple[NameRule, ...] = rules_for_backend(
            backend if backend is not None else self.config.backend
        )
        self.registry = ListenerRegistry(name_rules=self.name_rules)
        """This app's declarations: listeners, consumers, producer groups, outboxes and hooks
        (frozen once :meth:`start` succeeds)."""
        self._backend: Backend | None = None
        self._owns_backend = False
        self._chosen: dict[str, Any] = {}  # use_listener(): group -> the user's instance
        self._running: Running | None = None  # what start() started
        self._lock = threading.RLock()
        self._state = "new"  # new -> started -> closed
        self._bridge: LoopBridge | None = None  # the event loop async listeners run on

    # ---- registration (before start) ------------------------------------------------------------
    def _setup(self, what: str) -> None:
        if self._state != "new":
            raise LifecycleError(
                f"cannot {what}: this TxMsg is already {self._state}. Declare every listener "
                "before app.start() (import the modules that declare them first)"
            )

    # The options of the four declaring methods are declared once, by the builders
    # (txmsg.listener.build_spec, txmsg.consumer.build_consumer_spec): see txmsg.registry.
    @declares_with(build_spec)
    def transactional_listener(self, **options: Any) -> ClassDecorator:
        """Class decorator: the transactional listener of producer ``group`` in this app.

        The same keyword-only options as :meth:`txmsg.ListenerRegistry.transactional_listener`
        (``group``, ``topics``, ``executor``, ``execute_exception_state``); names are also
        checked against this app's backend rules.
        """
        return class_decorator(
            lambda cls: self.add_transactional_listener(cls, **options),
            decorator="@app.transactional_listener",
            imperative="app.add_transactional_listener()",
        )

    @adds_with(build_spec)
    def add_transactional_listener(self, target: Any, **options: Any) -> ListenerSpec:
        """The decorator's imperative twin; ``target`` is a listener class or a ready instance.

        Refused once the app has started (:class:`~txmsg.LifecycleError`): a listener added
        later would never run.
        """
        self._setup(f"add the transactional listener of group {options.get('group')!r}")
        return self.registry.add_transactional_listener(target, **options)

    @declares_with(build_consumer_spec)
    def message_listener(self, **options: Any) -> FunctionDecorator:
        """Function decorator: consume ``topic`` as consumer ``group`` in this app.

        The same keyword-only options as :meth:`txmsg.ListenerRegistry.message_listener`;
        names are also checked against this app's backend rules.
        """
        return function_decorator(lambda fn: self.add_message_listener(fn, **options))

    @adds_with(build_consumer_spec)
    def add_message_listener(self, fn: Callable[..., Any], **options: Any) -> ConsumerSpec:
        """The consumer decorator's imperative twin (refused once the app has started)."""
        self._setup(f"add the message listener of group {options.get('group')!r}")
        return self.registry.add_message_listener(fn, **options)

    def add_producer(self, *, group: str) -> None:
        """Declare producer ``group`` for plain sends without a transactional listener; its
        client starts with the app and ``app.producer(group)`` returns its :class:`Producer`.
        See :meth:`txmsg.ListenerRegistry.add_producer`."""
        self._setup(f"add the producer group {group!r}")
        self.registry.add_producer(group=group)

    def on_parked(self, fn: H) -> H:
        """Decorator: an alert hook called with a :class:`txmsg.orderly.ParkedEvent` each time
        an orderly listener of this app parks a sharding key.  See
        :meth:`txmsg.ListenerRegistry.on_parked`."""
        self._setup("add an on_parked hook")
        return self.registry.on_parked(fn)

    @declares_with(build_outbox_options)
    def add_outbox(self, **options: Any) -> Outbox:
        """Declare a transactional outbox whose relay sends with producer ``group``; returns it.
        Its relay runs in this process from :meth:`start` to :meth:`close` unless
        ``relay=False``.  See :meth:`txmsg.ListenerRegistry.add_outbox` (options, errors)."""
        self._setup(f"add the outbox {options.get('group')!r}")
        return self.registry.add_outbox(**options)

    def on_outbox_dead(self, fn: D) -> D:
        """Decorator: an alert hook called with a :class:`txmsg.sqla.outbox.OutboxDeadEvent`
        each time a relay of this app gives up on an outbox row.  See
        :meth:`txmsg.ListenerRegistry.on_outbox_dead`."""
        self._setup("add an on_outbox_dead hook")
        return self.registry.on_outbox_dead(fn)

    def on_transaction_discarded(self, fn: X) -> X:
        """Decorator: an alert hook called with a :class:`txmsg.rescue.DiscardedEvent` each time
        this app's rescuer gives up on a half message the broker discarded.  See
        :meth:`txmsg.ListenerRegistry.on_transaction_discarded`, ``docs/guide/discards.md``."""
        self._setup("add an on_transaction_discarded hook")
        return self.registry.on_transaction_discarded(fn)

    @property
    def transaction_discarded_hooks(self) -> tuple[Callable[[DiscardedEvent], Any], ...]:
        """Hooks registered with :meth:`on_transaction_discarded`, in registration order."""
        return self.registry.transaction_discarded_hooks

    @property
    def rescuers(self) -> dict[str, Rescuer]:
        """A copy: producer group -> its running :class:`~txmsg.rescue.Rescuer` (empty before
        start; a group without one: ``rescue_discarded=False``, or the backend cannot reach the
        discard topic, logged at start)."""
        return dict(self._running.rescuers) if self._running is not None else {}

    @property
    def outboxes(self) -> dict[str, Outbox]:
        """A copy: outbox group -> :class:`~txmsg.sqla.outbox.Outbox`."""
        return self.registry.outboxes

    @property
    def outbox_dead_hooks(self) -> tuple[Callable[[OutboxDeadEvent], Any], ...]:
        """Hooks registered with :meth:`on_outbox_dead`, in registration order."""
        return self.registry.outbox_dead_hooks

    def include(self, registry: ListenerRegistry) -> None:
        """Take every declaration of ``registry`` (a module-level one): listeners, consumers,
        plain producer groups, outboxes and hooks.

        The registry is frozen afterwards: declaring into it later raises
        :class:`~txmsg.LifecycleError` instead of being silently ignored.

        Raises:
            InvalidNameError: a name this app's backend refuses (nothing is taken then).
            ListenerDefinitionError: a group this app already has.
        """
        self._setup("include a registry")
        self.registry.include(registry, into=repr(self))

    def use_listener(self, instance: Any, *, group: str | None = None) -> None:
        """Use ``instance`` (of a class declared as a transactional listener of this app)
        instead of letting the app create one at start.

        The class is looked up in this app's declarations, not on the class, since other apps
        may declare it too; ``group`` says which declaration when this app has the class under
        several groups.

        Raises:
            ListenerDefinitionError: the class is not declared in this app (or, without
                ``group``, declared several times).
        """
        self._setup("set a listener instance")
        self._chosen[self.registry.group_of_instance(instance, group)] = instance

    # ---- lifecycle ------------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The backend (loaded on first use)."""
        with self._lock:
            if self._backend is None:
                arg = self._backend_arg
                if arg is None or isinstance(arg, str):
                    self._backend = load_backend(arg or self.config.backend, self.config)
                    self._owns_backend = True
                else:
                    self._backend = arg
            return self._backend

    @property
    def started(self) -> bool:
        """True between start() and close()."""
        return self._state == "started"

    def start(self) -> Self:
        """Freeze registration, create one producer per listener and per plain producer group
        (:meth:`add_producer`), subscribe every consumer, and start the outboxes' relays and the
        rescue consumers (:mod:`txmsg.running`).

        Idempotent while started.  On failure everything started so far is closed again, the app
        stays *new* and its registration open (fix the cause, declare what was missing, and call
        start() again; listeners the app created are created afresh) and the error propagates.

        Raises:
            ClosedError: the app was closed; make a new one.
            ListenerDefinitionError: an ``orderly=True`` listener on a backend without orderly
                consumers (``Capabilities.orderly_consumer``).
        """
        with self._lock:
            if self._state == "started":
                return self
            if self._state == "closed":
                raise ClosedError("this TxMsg is closed and cannot start again; create a new TxMsg")
            # Frozen while starting (a listener declared meanwhile would never run) and for
            # good once started; a failed start thaws it, so the fix its error asks for (a
            # missing add_producer, a listener_factory) can still be declared before the retry.
            with self.registry.freezing(f"{self!r} started"):
                try:
                    self._start_all()
                except BaseException:
                    self._close_all(self.config.close_timeout)
                    self._running = None  # closed; a retry creates fresh listeners
                    if self._owns_backend:
                        self._backend = None  # closed; a retry loads a fresh one
                    raise
            self._state = "started"
        return self

    def _start_all(self) -> None:
        if self._bridge is None and needs_loop(self.registry, self._chosen):
            # `with app:` and async listeners: a loop of the app's own, on its own thread
            warn_start_on_running_loop()
            self._bridge = LoopBridge.on_own_thread("txmsg-loop")
            log.info("async listeners run on the app's own event loop thread (txmsg-loop)")
        self._running = Running(
            self.config,
            self.registry,
            self.backend,
            name_rules=self.name_rules,
            bridge=self._bridge,
            chosen=self._chosen,
            listener_factory=self.listener_factory,
        )
        self._running.start()

    @property
    def bridge(self) -> LoopBridge | None:
        """The event loop the app's ``async def`` listeners run on (None: not started, or no
        loop: neither ``async with app:`` nor an async listener)."""
        return self._bridge

    # ---- asyncio lifecycle ----------------------------------------------------------------------
    async def astart(self) -> Self:
        """:meth:`start` from a coroutine: binds the app to the running event loop (``async
        def`` listeners run on it) and starts the clients on a thread, so the loop keeps running
        meanwhile.  ``async with app:`` calls it.

        Cancelled while the clients start (a server stopped during its startup), it closes
        what that start started once it ends (the app is then *closed*).

        Raises: as :meth:`start`; :class:`~txmsg.LifecycleError` when the app is already bound
        to another loop.
        """
        with self._lock:
            if self._state == "started":
                if self._bridge is not None and self._bridge.in_loop_thread():
                    return self
                raise LifecycleError(
                    "this TxMsg was started without this event loop (`with app:` or on another "
                    "loop); start it once, with `async with app:` on the loop that serves it"
                )
            self._setup("start on an event loop")
            self._bridge = LoopBridge.of_running_loop()
        # a future, not a task (asyncio.run's shutdown cancels tasks, and this one's end must
        # still be seen), in the caller's context as asyncio.to_thread would
        starting = asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, self.start
        )
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # the start cannot stop midway on its thread: undo it once it ends, or the app would
            # run on with nobody to close it (the caller saw the cancellation, not the start)
            starting.add_done_callback(self._undo_cancelled_start)
            raise
        except BaseException:
            self._forget_bridge()
            raise
        return self

    def _forget_bridge(self) -> None:
        """After a start that failed (or never ran): the app stays *new*, unbound."""
        with self._lock:
            if self._state != "started":
                self._bridge = None

    def _undo_cancelled_start(self, starting: asyncio.Future[Any]) -> None:
        """The start of a cancelled :meth:`astart` ended: close what it started (on a thread,
        as this runs on the loop), or unbind the app it left *new*."""
        failed = None if starting.cancelled() else starting.exception()
        if starting.cancelled() or failed is not None:
            if failed is not None:  # nobody else will see it: the caller saw the cancellation
                log.warning("astart() was cancelled, and the start failed meanwhile: %s", failed)
            self._forget_bridge()
            return
        log.warning(
            "astart() was cancelled while the clients started; closing the app it started "
            "(create a new TxMsg to start again)"
        )
        threading.Thread(target=quietly, args=("close", self.close), name="txmsg-close").start()

    async def aclose(self, timeout: float | None = None) -> None:
        """:meth:`close` from a coroutine: the clients close on a thread while the loop keeps
        running the listener coroutines still in flight (the drain).  ``async with app:``
        calls it.  Idempotent."""
        await asyncio.to_thread(self.close, timeout)

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def async_producer(self, group: str | None = None) -> AsyncProducer:
        """The awaitable producer of ``group`` (:class:`~txmsg.aio.producer.AsyncProducer`):
        the sends of :meth:`producer`, as coroutines that never block the loop.  ``None`` picks
        the group as :meth:`producer` does.  A listener group's is an
        :class:`~txmsg.aio.producer.AsyncTransactionalProducer`;
        :meth:`async_transactional_producer` returns it with that type.

        Raises:
            NotStartedError / ClosedError: outside start() .. close().
            UnknownGroupError: no producer of that group.
        """
        return self._sends.of(self.producer(group), self._bridge)

    def async_transactional_producer(self, group: str | None = None) -> AsyncTransactionalProducer:
        """The awaitable producer of transactional listener group ``group``
        (:class:`~txmsg.aio.producer.AsyncTransactionalProducer`): the sends of
        :meth:`transactional_producer`, awaited.  ``None`` picks the group as
        :meth:`transactional_producer` does.

        Raises:
            NotStartedError / ClosedError: outside start() .. close().
            UnknownGroupError: ``group`` is a plain producer group or unknown.
        """
        found = self._sends.of(self.transactional_producer(group), self._bridge)
        return cast("AsyncTransactionalProducer", found)  # of() makes one for a transactional

    def close(self, timeout: float | None = None) -> None:
        """Stop consumers, close producers, then close listeners, each bounded by ``timeout``
        (default ``config.close_timeout``); close an owned backend.  Idempotent.

        A listener instance with a ``close()`` method (e.g. :class:`txmsg.sqla.RecordBackedListener`,
        whose background workers finish slow local transactions) is closed after its group's
        producer, so no check-back is running when it goes.
        """
        bridge = self._bridge
        if bridge is not None and self._state == "started" and bridge.in_loop_thread():
            raise LifecycleError(
                "close() was called on the event loop the app's async listeners run on, so the "
                "coroutines it must wait for could never finish; use `await app.aclose()` (or "
                "`async with app:`)"
            )
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            self.registry.freeze(f"{self!r} is closed")
            self._close_all(self.config.close_timeout if timeout is None else timeout)

    def _close_all(self, timeout: float) -> None:
        # consumers first, then the awaited sends in flight finish before their producers close
        running = self._running
        if running is not None:
            running.stop(timeout)
        self._sends.finish(self._bridge, timeout)
        if running is not None:
            running.close(timeout)
        if self._backend is not None and self._owns_backend:
            quietly("close the backend", self._backend.close, timeout)
        bridge, self._bridge = self._bridge, None
        if bridge is not None:  # last: producers and consumers waited for their coroutines
            quietly("drain the listener coroutines", bridge.close, timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- use ------------------------------------------------------------------------------------
    def producer(self, group: str | None = None) -> Producer:
        """The producer of ``group``; ``None`` means ``config.producer.group``, else the only one.

        Transactional listener groups and plain groups (:meth:`add_producer`) alike, typed as
        what every group can do: plain sends.  A listener group's producer is a
        :class:`~txmsg.TransactionalProducer` (so ``app.producer(g).send_in_transaction(...)``
        runs as before); :meth:`transactional_producer` returns it with that type, for the type
        checker.

        Raises:
            NotStartedError / ClosedError: outside start() .. close().
            UnknownGroupError: no producer of that group (or several and none named).
        """
        return self._running_for("producer()").producer(group)

    def transactional_producer(self, group: str | None = None) -> TransactionalProducer:
        """The producer of transactional listener group ``group``, typed to send in
        transactions; ``None`` means ``config.producer.group``, else the only listener group.

        The same object as ``app.producer(group)``; the type is what this method adds: it
        fails here, at the lookup, for a plain group, instead of at a send.

        Raises:
            NotStartedError / ClosedError: outside start() .. close().
            UnknownGroupError: ``group`` is a plain producer group (:meth:`add_producer`) or
                unknown, or there are several listener groups and none is named.
        """
        return self._running_for("transactional_producer()").transactional_producer(group)

    def _running_for(self, what: str) -> Running:
        if self._state == "closed":
            raise ClosedError("TxMsg is closed: producers are gone; create and start a new TxMsg")
        if self._state == "new" or self._running is None:
            raise NotStartedError(
                f"TxMsg is not started: call app.start() (or use `with app:`) before {what}"
            )
        return self._running

    @property
    def producers(self) -> dict[str, Producer]:
        """A copy: producer group -> producer (empty before start)."""
        return dict(self._running.producers) if self._running is not None else {}

    def stats(self) -> dict[str, ProducerStats]:
        """Figures of every producer group."""
        return {group: p.stats() for group, p in self.producers.items()}

    def __repr__(self) -> str:
        groups = set(self.registry.listeners) | set(self.registry.producer_groups)
        return f"<TxMsg {self._state} groups={sorted(groups)}>"
