"""``TxMsg``: the application object that owns a backend, its producers and consumers.

::

    app = TxMsg(load_config())

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder: ...

    with app:                                   # start(), then close() at the end
        app.producer("order-tx").send_in_transaction("orders", {"id": 1}, arg=order)

Backends are found lazily, on ``start()``, through the entry-point group ``txmsg.backends``
(``rocketmq`` is ``txmsg_rocketmq.backend:RocketMQBackend``), so importing txmsg never loads a
native library.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, TypeVar

from txmsg.backend import Backend
from txmsg.config import TxMsgConfig, load_config
from txmsg.consumer import message_listener
from txmsg.errors import (
    BackendUnavailableError,
    ListenerDefinitionError,
    NotStartedError,
    ProducerClosedError,
    TxMsgError,
)
from txmsg.executor import ExecutorConfig
from txmsg.listener import ListenerSpec, build_spec, spec_of, transactional_listener
from txmsg.producer import ProducerStats, TransactionalProducer
from txmsg.registry import ListenerRegistry, default_registry
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.app")

BACKEND_GROUP = "txmsg.backends"

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def backend_entry_points() -> list[importlib.metadata.EntryPoint]:
    """Installed backends (entry-point group ``txmsg.backends``)."""
    return sorted(importlib.metadata.entry_points(group=BACKEND_GROUP), key=lambda ep: ep.name)


def load_backend_factory(name: str) -> Callable[..., Backend]:
    """The factory of backend ``name`` (an entry-point name or ``module:attribute``)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        target = f"{module_name}:{attr}"
        try:
            factory: Any = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise BackendUnavailableError(
                f"backend {target!r} cannot be imported: {exc}. Check the name, or run "
                "`make setup` to install every part"
            ) from exc
        return factory  # type: ignore[no-any-return]
    found = [ep for ep in backend_entry_points() if ep.name == name]
    if not found:
        names = ", ".join(ep.name for ep in backend_entry_points()) or "none"
        raise BackendUnavailableError(
            f"no txmsg backend named {name!r} is installed (installed: {names}). Run `make setup` "
            "to install every part, or set `backend` to an installed name"
        )
    try:
        return found[0].load()  # type: ignore[no-any-return]
    except Exception as exc:
        raise BackendUnavailableError(
            f"backend {name!r} ({found[0].value}) failed to load: {type(exc).__name__}: {exc}. "
            "Run `make setup` to install it and its native client, then `txmsg doctor`"
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
            f"backend {name!r} could not start: {type(exc).__name__}: {exc}. Run `make setup`, "
            "then `txmsg doctor` to see what is missing"
        ) from exc


class TxMsg:
    """The application: listeners and consumers in, producers out.

    Parameters:
        config: settings; ``None`` reads them with :func:`txmsg.load_config`.
        registry: where decorators recorded listeners; the process-wide ``default_registry``
            by default (``@transactional_listener`` without ``registry=`` goes there).
        backend: a backend object, an installed backend's name, or ``module:attribute``;
            ``None`` uses ``config.backend``.  Loaded lazily on :meth:`start`.
        listener_factory: makes a listener instance from its class at start (default: call the
            class with no arguments; pass e.g. ``injector.get`` to build them with DI).
    """

    def __init__(
        self,
        config: TxMsgConfig | None = None,
        *,
        registry: ListenerRegistry | None = None,
        backend: Backend | str | None = None,
        listener_factory: Callable[[type[Any]], Any] | None = None,
    ) -> None:
        self.config = config if config is not None else load_config()
        self.registry = registry if registry is not None else default_registry
        self.listener_factory: Callable[[type[Any]], Any] = listener_factory or (lambda cls: cls())
        self._backend_arg = backend
        self._backend: Backend | None = None
        self._owns_backend = False
        self._instances: dict[str, Any] = {}
        self._producers: dict[str, TransactionalProducer] = {}
        self._stops: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        self._state = "new"  # new -> started -> closed

    # ---- registration (before start) ------------------------------------------------------------
    def _setup(self, what: str) -> None:
        if self._state != "new":
            raise ListenerDefinitionError(
                f"cannot {what}: this TxMsg is already {self._state}. Register every listener "
                "before start()"
            )

    def transactional_listener(
        self,
        group: str,
        topics: Sequence[str] = (),
        executor: ExecutorConfig | Mapping[str, Any] | None = None,
        execute_exception_state: LocalTransactionState = LocalTransactionState.UNKNOW,
    ) -> Callable[[type[T]], type[T]]:
        """:func:`txmsg.transactional_listener` into this app's registry."""
        self._setup("add a transactional listener")
        return transactional_listener(
            group, topics, executor, execute_exception_state, registry=self.registry
        )

    def add_transactional_listener(
        self,
        target: Any,
        *,
        group: str,
        topics: Sequence[str] = (),
        executor: ExecutorConfig | Mapping[str, Any] | None = None,
        execute_exception_state: LocalTransactionState = LocalTransactionState.UNKNOW,
    ) -> ListenerSpec:
        """The decorator's imperative twin; ``target`` is a listener class or a ready instance."""
        self._setup("add a transactional listener")
        spec = build_spec(
            target,
            group=group,
            topics=topics,
            executor=executor,
            execute_exception_state=execute_exception_state,
        )
        self.registry.add_listener(spec)
        return spec

    def use_listener(self, instance: Any) -> None:
        """Use ``instance`` (of a ``@transactional_listener`` class) instead of creating one."""
        self._setup("set a listener instance")
        spec = spec_of(instance)
        if spec is None:
            raise ListenerDefinitionError(
                f"{type(instance).__qualname__} is not decorated with @transactional_listener; "
                "use add_transactional_listener(instance, group=...) instead"
            )
        self._instances[spec.group] = instance

    def message_listener(
        self,
        topic: str,
        group: str,
        tags: str = "*",
        concurrency: int = 4,
        max_reconsume: int = 16,
        idempotent: bool = False,
        session_factory: Callable[[], Any] | None = None,
    ) -> Callable[[F], F]:
        """:func:`txmsg.message_listener` into this app's registry."""
        self._setup("add a message listener")
        return message_listener(
            topic,
            group,
            tags=tags,
            concurrency=concurrency,
            max_reconsume=max_reconsume,
            idempotent=idempotent,
            session_factory=session_factory,
            registry=self.registry,
        )

    def add_message_listener(self, fn: F, *, topic: str, group: str, **options: Any) -> F:
        """The consumer decorator's imperative twin (``options`` as in :meth:`message_listener`)."""
        return self.message_listener(topic, group, **options)(fn)

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
        """Create one producer per listener and subscribe every consumer.  Idempotent.

        On failure everything started so far is closed again and the error propagates.
        """
        with self._lock:
            if self._state == "started":
                return self
            if self._state == "closed":
                raise ProducerClosedError("this TxMsg is closed; create a new one")
            try:
                self._start_all()
            except BaseException:
                self._close_all(self.config.close_timeout)
                self._producers.clear()
                if self._owns_backend:
                    self._backend = None  # closed; a retry loads a fresh one
                raise
            self._state = "started"
        return self

    def _start_all(self) -> None:
        backend = self.backend
        for group, spec in sorted(self.registry.listeners.items()):
            listener = self._instance_for(spec)
            settings = self.config.listener_settings(group)
            executor = settings.apply(spec.executor) if settings else spec.executor
            self._producers[group] = TransactionalProducer.create(
                backend,
                spec,
                listener,
                executor,
                check_wait_timeout=self.config.check_wait_timeout,
            )
            log.info("producer group %s started (executor %s)", group, executor)
        for group, cspec in sorted(self.registry.consumers.items()):
            override = self.config.consumer_settings(group)
            concurrency = (override.concurrency if override else None) or cspec.concurrency
            max_reconsume = cspec.max_reconsume
            if override is not None and override.max_reconsume is not None:
                max_reconsume = override.max_reconsume
            consume_from = (override.consume_from if override else None) or "first"
            self._stops.append(
                backend.subscribe(
                    cspec.topic,
                    group,
                    cspec.safe_handler(),
                    tags=cspec.tags,
                    concurrency=concurrency,
                    max_reconsume=max_reconsume,
                    consume_from=consume_from,
                )
            )
            log.info("consumer group %s subscribed to %s", group, cspec.topic)

    def _instance_for(self, spec: ListenerSpec) -> Any:
        if spec.group in self._instances:
            return self._instances[spec.group]
        if spec.is_instance:
            return spec.target
        try:
            return self.listener_factory(spec.target)
        except Exception as exc:
            raise ListenerDefinitionError(
                f"could not create listener {spec.name} for group {spec.group!r}: "
                f"{type(exc).__name__}: {exc}. Give it a no-argument constructor, pass "
                "listener_factory=..., or call app.use_listener(instance)"
            ) from exc

    def close(self, timeout: float | None = None) -> None:
        """Stop consumers, close producers (bounded by ``timeout``), close an owned backend."""
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            self._close_all(self.config.close_timeout if timeout is None else timeout)

    def _close_all(self, timeout: float) -> None:
        for stop in reversed(self._stops):
            _quietly("stop a consumer", stop)
        self._stops.clear()
        for producer in self._producers.values():
            _quietly(f"close producer {producer.group}", producer.close, timeout)
        if self._backend is not None and self._owns_backend:
            _quietly("close the backend", self._backend.close, timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- use ------------------------------------------------------------------------------------
    def producer(self, group: str | None = None) -> TransactionalProducer:
        """The producer of ``group``; ``None`` means ``config.producer.group``, else the only one."""
        if self._state != "started":
            raise NotStartedError(
                f"TxMsg is {self._state}: call app.start() (or use `with app:`) before producer()"
            )
        if group is None:
            group = self.config.producer.group
        if group is None:
            if len(self._producers) == 1:
                return next(iter(self._producers.values()))
            raise ListenerDefinitionError(
                f"several producer groups exist ({', '.join(sorted(self._producers))}); "
                "say which: app.producer('group') or set producer.group in the config"
            )
        try:
            return self._producers[group]
        except KeyError:
            known = ", ".join(sorted(self._producers)) or "none"
            raise ListenerDefinitionError(
                f"no transactional listener for producer group {group!r} (registered: {known}); "
                f"decorate a class with @transactional_listener(group={group!r})"
            ) from None

    @property
    def producers(self) -> dict[str, TransactionalProducer]:
        """A copy: producer group -> producer (empty before start)."""
        return dict(self._producers)

    def stats(self) -> dict[str, ProducerStats]:
        """Figures of every producer group."""
        return {group: p.stats() for group, p in self._producers.items()}

    def __repr__(self) -> str:
        return f"<TxMsg {self._state} groups={sorted(self.registry.listeners)}>"


def _quietly(what: str, fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("could not %s during shutdown", what)
