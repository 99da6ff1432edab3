"""Typed settings models: the base every txmsg settings model derives from, and backends' settings.

Why a base: a pydantic model raises ``pydantic.ValidationError`` from its constructor and its
``model_validate*`` class methods, which is outside txmsg's error tree (:mod:`txmsg.errors`).
:class:`Settings` turns it into :class:`~txmsg.errors.ConfigError`, keeping pydantic's detail in
the message, so ``ExecutorConfig(concurrency=0)``, ``TxMsgConfig(name_server="garbage")`` and
``TxMsgConfig.model_validate({...})`` are caught by ``except txmsg.TxMsgError`` like every other
mistake.

Why backend settings live with the backends: the core names no backend.  Each backend
distribution declares its keys in a :class:`BackendSettings` model and registers it under the
entry-point group ``txmsg.settings`` with the backend's name::

    [project.entry-points."txmsg.settings"]
    rocketmq = "txmsg_rocketmq.settings:RocketMQSettings"

:func:`txmsg.load_config` reads the same sources for every key (``txmsg.toml``, ``TXMSG_*``) and
validates each installed backend's keys through its model; the backend then reads them typed with
``RocketMQSettings.of(config)``.  Keep such a module light (pydantic only): the config loads it
without importing the backend or its client.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from txmsg.errors import ConfigError

SETTINGS_GROUP = "txmsg.settings"
"""Entry-point group of backend settings models (``name = "module:Model"``, name = the backend's)."""


def describe(exc: ValidationError, owner: str) -> ConfigError:
    """A :class:`ConfigError` for ``exc`` raised while building ``owner``: the first problem with
    its key, pydantic's message and the value, and how many more there are."""
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or owner
    total = exc.error_count()
    more = f" (and {total - 1} more problem(s))" if total > 1 else ""
    if first["type"] == "extra_forbidden":
        return ConfigError(f"{owner}: unknown setting {key!r}{more}", key=key)
    return ConfigError(
        f"{owner}: bad value for {key!r}: {first['msg']} (got {first.get('input')!r}){more}",
        key=key,
    )


_RAW = contextvars.ContextVar("txmsg_settings_raw_errors", default=False)


@contextlib.contextmanager
def raw_errors() -> Iterator[None]:
    """Inside: settings constructors raise pydantic's ValidationError as it is.

    pydantic calls an overridden ``__init__`` for nested models and ``model_validate`` too, so
    only the outermost constructor may convert; a caller that wants the raw error (to name where
    a key came from) asks for it here.
    """
    token = _RAW.set(True)
    try:
        yield
    finally:
        _RAW.reset(token)


class Settings(BaseModel):
    """Frozen, strict-keyed settings whose constructor raises :class:`ConfigError`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, /, **data: Any) -> None:
        if _RAW.get():  # nested in another model's validation: that one converts
            super().__init__(**data)
            return
        try:
            with raw_errors():
                super().__init__(**data)
        except ValidationError as exc:
            raise self._config_error(exc) from None

    @classmethod
    def _config_error(cls, exc: ValidationError) -> ConfigError:
        """The error the constructor raises for ``exc`` (a model with sources overrides it)."""
        return describe(exc, cls.__name__)

    # pydantic's validating class methods, converted as the constructor is
    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        return cls._converted(super().model_validate, obj, options)

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **options: Any) -> Self:
        return cls._converted(super().model_validate_json, json_data, options)

    @classmethod
    def model_validate_strings(cls, obj: Any, **options: Any) -> Self:
        return cls._converted(super().model_validate_strings, obj, options)

    @classmethod
    def _converted(
        cls, validate: Callable[..., Self], data: Any, options: Mapping[str, Any]
    ) -> Self:
        if _RAW.get():  # nested in another model's validation: that one converts
            return validate(data, **options)
        try:
            with raw_errors():
                return validate(data, **options)
        except ValidationError as exc:
            raised = _raised_inside(exc)  # by an overridden __init__ pydantic called
            raise (raised or cls._config_error(exc)) from None


def _raised_inside(exc: ValidationError) -> ConfigError | None:
    """The :class:`ConfigError` a validator (or ``__init__``) raised, which pydantic wrapped."""
    for error in exc.errors():
        inner = (error.get("ctx") or {}).get("error")
        if isinstance(inner, ConfigError):
            return inner
    return None


class BackendSettings(Settings):
    """Base of a backend's settings model (see the module docstring).

    Its fields are top-level keys of the configuration (``name_server = "..."`` in
    ``txmsg.toml``, ``TXMSG_NAME_SERVER``); two backends may declare the same key (both read
    ``access_key``), with the same meaning.
    """

    backend: ClassVar[str] = ""
    """The backend's name (also its entry-point name in ``txmsg.settings`` and ``txmsg.backends``)."""

    @classmethod
    def of(cls, config: Any) -> Self:
        """This backend's settings from ``config``: a :class:`~txmsg.TxMsgConfig`, a mapping, any
        object with the keys as attributes (a ``SimpleNamespace`` in a test), or ``None`` for the
        defaults.  Keys of other backends are ignored; a ``None`` value means the default."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        values: Mapping[str, Any]
        if isinstance(config, Mapping):
            values = config
        elif isinstance(config, BaseModel):
            values = config.model_extra or {}
        else:
            values = {k: getattr(config, k) for k in cls.model_fields if hasattr(config, k)}
        return cls(**{k: v for k, v in values.items() if k in cls.model_fields and v is not None})


@functools.cache
def settings_models() -> dict[str, type[BackendSettings]]:
    """Installed backends' settings models by backend name (loaded once per process).

    A model that cannot be loaded is left out: its backend then reports itself unavailable when it
    is chosen, and its keys are refused as unknown, with the list of what is installed.
    """
    found: dict[str, type[BackendSettings]] = {}
    for ep in sorted(importlib.metadata.entry_points(group=SETTINGS_GROUP), key=lambda e: e.name):
        try:
            model = ep.load()
        except Exception:  # noqa: BLE001, S112 - a broken plugin must not break the config
            continue
        if isinstance(model, type) and issubclass(model, BackendSettings):
            found.setdefault(ep.name, model)
    return found


def check_addresses(value: str, *, what: str, form: str) -> str:
    """``value`` without blanks around its entries if it is ``host:port[;host:port]``, else
    ValueError naming ``what`` and the expected ``form``.

    Checked when the configuration is loaded so that a typo (``garbage``, ``host:98760``) is
    reported with the expected form, not later as a raw ``int()`` error or a client that never
    finds its server.
    """
    text = value.strip()
    addresses = [part.strip() for part in text.split(";")]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        problem = None
        if not address:
            problem = f"list {text!r} has an empty entry"
        elif not sep or not host:
            problem = f"{address!r} is not host:port"
        elif not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            problem = f"{address!r} has port {port!r}, not a number in 1..65535"
        elif any(ch.isspace() for ch in host):
            problem = f"{address!r} has blanks in its host"
        if problem:
            # pydantic turns a ValueError into the ConfigError the user sees
            raise ValueError(f"{what} {problem}; expected {form}")
    return ";".join(addresses)
