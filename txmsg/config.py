"""Configuration: Spring-like keys from a TOML file and ``TXMSG_*`` environment variables.

Precedence, lowest first: defaults, the TOML file, environment variables.  The file is the
``path`` argument, else ``$TXMSG_CONFIG``, else ``./txmsg.toml`` when it exists.

Environment variables map onto keys with ``__`` as the nesting separator, case-insensitively::

    TXMSG_NAME_SERVER=10.0.0.5:9876               -> name_server
    TXMSG_PRODUCER__GROUP=order-tx                -> producer.group
    TXMSG_LISTENERS__ORDER_TX__CONCURRENCY=16     -> listeners.order_tx.concurrency

(In environment variable names a group's ``-`` is written ``_``; the override is matched to the
group either way.)  The ``TXMSG_`` prefix is shared with tooling (``TXMSG_ARTIFACTS``,
``TXMSG_TEST_PG_URL``...), so a flat variable that is no configuration key is ignored unless it
looks like a misspelt key (``TXMSG_NAMESERVER``), which is an error.  Every unknown key in the
file, every unknown key below a section in the environment, and every bad value raises
:class:`~txmsg.errors.ConfigError` naming the key and where it came from.

The core declares only its own keys (:class:`TxMsgConfig`).  A backend's keys (``name_server``,
``endpoints``...) are declared by the backend's distribution in a settings model
(:mod:`txmsg.settings`, entry-point group ``txmsg.settings``); they are read from the same file
and variables, validated through that model, and a backend reads them typed with
``RocketMQSettings.of(config)``.  A key that no installed backend declares is refused like any
unknown key.
"""

from __future__ import annotations

import contextvars
import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from txmsg.defaults import MAX_CHECK_CONCURRENCY
from txmsg.errors import ConfigError
from txmsg.executor import ExecutorConfig, RejectionPolicy, parse_rejection
from txmsg.settings import BackendSettings, Settings, raw_errors, settings_models

ConsumeFrom = Literal["first", "last"]
"""Consume-from policy of a push consumer (see :class:`ConsumerSettings`)."""

ENV_PREFIX = "TXMSG_"
CONFIG_ENV = "TXMSG_CONFIG"
DEFAULT_FILE = "txmsg.toml"


class _Section(Settings):
    """A section of the configuration: unknown keys and bad values raise ConfigError."""


class ProducerSettings(_Section):
    """``[producer]``: ``group`` is the default group of ``TxMsg.producer()``."""

    group: str | None = None


class ListenerSettings(_Section):
    """``[listeners.<group>]``: executor settings that override the decorator's ``executor=``
    (meanings in :class:`~txmsg.executor.ExecutorConfig`)."""

    concurrency: int | None = Field(default=None, ge=1, le=MAX_CHECK_CONCURRENCY)
    """Check-backs of the group that run at once = executor threads = client instances."""
    queue_capacity: int | None = Field(default=None, ge=0)
    rejection: RejectionPolicy | None = None

    @field_validator("rejection", mode="before")
    @classmethod
    def _policy_spelling(cls, value: object) -> object:
        return parse_rejection(value)

    def apply(self, base: ExecutorConfig) -> ExecutorConfig:
        """``base`` with the fields set here replaced (validated again as a whole)."""
        merged = base.model_dump() | self.model_dump(exclude_none=True)
        return ExecutorConfig(**merged)


class ConsumerSettings(_Section):
    """``[consumers.<group>]``: overrides of a ``@message_listener``'s settings."""

    concurrency: int | None = Field(default=None, ge=1)
    max_reconsume: int | None = Field(default=None, ge=0)
    consume_from: ConsumeFrom | None = None
    """Where a queue without a usable stored offset starts: ``first`` (default, replays what the
    broker still holds; nothing is skipped) or ``last`` (RocketMQ's default: the queue's end).
    See docs/librocketmq-hazards.md #6 for why txmsg does not default to ``last``."""


class SqlAlchemySettings(_Section):
    """``[sqlalchemy]``: the business database (used by the samples and ``txmsg.sqla``)."""

    url: str | None = None


class TxMsgConfig(_Section):
    """Typed, validated configuration of a :class:`txmsg.TxMsg` application."""

    model_config = ConfigDict(extra="allow", frozen=True)

    backend: str = Field(default="rocketmq", min_length=1)
    """Entry point name in group ``txmsg.backends``, or ``module:attribute``."""
    check_wait_timeout: float = Field(default=60.0, gt=0)
    """Seconds a check-back waits for ``check_local`` before answering UNKNOW."""
    close_timeout: float = Field(default=30.0, ge=0)
    producer: ProducerSettings = Field(default_factory=ProducerSettings)
    listeners: dict[str, ListenerSettings] = Field(default_factory=dict)
    consumers: dict[str, ConsumerSettings] = Field(default_factory=dict)
    sqlalchemy: SqlAlchemySettings = Field(default_factory=SqlAlchemySettings)

    def __init__(self, /, **data: Any) -> None:
        super().__init__(**data)
        # The keys beyond the core's belong to backends: validated through their models, stored
        # typed (defaults of every installed backend included, so config.name_server reads as
        # before); the chosen backend's model goes last, so its defaults win a shared key.
        extra = self.__pydantic_extra__
        if extra is not None:
            values = _backend_values(extra, self.backend, _SOURCES.get())
            extra.clear()
            extra.update(values)

    @classmethod
    def _config_error(cls, exc: ValidationError) -> ConfigError:
        return _error_from(exc, _SOURCES.get())

    def backend_settings(self, model: type[BackendSettings]) -> BackendSettings:
        """This configuration's values for ``model`` (prefer ``model.of(config)``, typed)."""
        return model.of(self)

    def listener_settings(self, group: str) -> ListenerSettings | None:
        """Overrides for ``group``, matching ``-`` and ``_`` alike (environment names)."""
        found: ListenerSettings | None = _by_group(self.listeners, group)
        return found

    def consumer_settings(self, group: str) -> ConsumerSettings | None:
        found: ConsumerSettings | None = _by_group(self.consumers, group)
        return found


_SOURCES: contextvars.ContextVar[ConfigSources | None] = contextvars.ContextVar(
    "txmsg_config_sources", default=None
)
"""Where the keys being validated came from (set by :func:`resolve_config`, for the messages)."""


def _backend_keys() -> dict[str, list[type[BackendSettings]]]:
    """Every key an installed backend declares -> the models that declare it."""
    keys: dict[str, list[type[BackendSettings]]] = {}
    for model in settings_models().values():
        for key in model.model_fields:
            keys.setdefault(key, []).append(model)
    return keys


def _backend_values(
    extra: Mapping[str, Any], backend: str, sources: ConfigSources | None
) -> dict[str, Any]:
    """``extra`` validated through the installed backends' models, with their defaults."""
    sources = sources or ConfigSources()
    declared = _backend_keys()
    for key in extra:
        if key not in declared:
            installed = ", ".join(settings_models()) or "none"
            origin = sources.keys.get(key)
            where = f" (from {origin})" if origin else ""
            hint = difflib.get_close_matches(key, _known_keys([]), n=1)
            suggestion = (
                f"; did you mean {hint[0]!r}?"
                if hint
                else f"; no installed backend reads it (installed backends: {installed}): install the "
                "backend that does, or remove the key"
            )
            raise ConfigError(f"unknown config key {key!r}{where}{suggestion}", key=key)
    models = settings_models()
    chosen = models.get(backend)
    ordered = [m for name, m in models.items() if name != backend] + ([chosen] if chosen else [])
    values: dict[str, Any] = {}
    for model in ordered:
        mine = {k: v for k, v in extra.items() if k in model.model_fields}
        try:
            with raw_errors():
                validated = model(**mine)
        except ValidationError as exc:
            raise _error_from(exc, sources) from None
        values |= validated.model_dump()
    return values


def _norm(group: str) -> str:
    return group.lower().replace("-", "_")


def _by_group(table: Mapping[str, Any], group: str) -> Any:
    if group in table:
        return table[group]
    for key, value in table.items():
        if _norm(key) == _norm(group):
            return value
    return None


@dataclass
class ConfigSources:
    """Where each setting came from (shown by ``txmsg doctor``)."""

    file: Path | None = None
    keys: dict[str, str] = field(default_factory=dict)
    """dotted key -> ``file <path>`` or the environment variable name."""


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= _flatten(value, dotted + ".")
        else:
            out[dotted] = value
    return out


def _set(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist; create it or unset {CONFIG_ENV}", key=CONFIG_ENV
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}", key=str(path)) from exc


_MAPPED_SECTIONS = ("listeners", "consumers")


def _env_overrides(
    env: Mapping[str, str], sources: ConfigSources, file_data: Mapping[str, Any]
) -> dict[str, Any]:
    fields = [*TxMsgConfig.model_fields, *_backend_keys()]
    flat_names = [n.upper() for n in fields]
    data: dict[str, Any] = {}
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() == CONFIG_ENV:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if path[0] not in fields:
            close = difflib.get_close_matches(path[0].upper(), flat_names, n=1, cutoff=0.85)
            if close:
                raise ConfigError(
                    f"environment variable {name} is not a txmsg setting; did you mean "
                    f"{ENV_PREFIX}{close[0]}?",
                    key=name,
                )
            continue  # tooling variable sharing the prefix
        if path[0] in _MAPPED_SECTIONS and len(path) != 3:
            raise ConfigError(
                f"environment variable {name}: write {ENV_PREFIX}{path[0].upper()}__<GROUP>__<KEY>",
                key=name,
            )
        if path[0] in _MAPPED_SECTIONS:  # ORDER_TX in env is the file's "order-tx"
            section = file_data.get(path[0])
            if isinstance(section, Mapping):
                path[1] = next((k for k in section if _norm(k) == _norm(path[1])), path[1])
        _set(data, path, env[name])
        sources.keys[".".join(path)] = name
    return data


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _error_from(exc: ValidationError, sources: ConfigSources | None) -> ConfigError:
    sources = sources or ConfigSources()
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    origin = sources.keys.get(key)
    where = f" (from {origin})" if origin else ""
    if first["type"] == "extra_forbidden":
        section, _, leaf = key.rpartition(".")
        known = _known_keys(section.split(".") if section else [])
        hint = difflib.get_close_matches(leaf, known, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; known keys: {', '.join(known)}"
        return ConfigError(f"unknown config key {key!r}{where}{suggestion}", key=key)
    total = exc.error_count()
    more = f" (and {total - 1} more problem(s))" if total > 1 else ""
    return ConfigError(
        f"bad value for config key {key!r}{where}: {first['msg']} (got {first.get('input')!r}){more}",
        key=key,
    )


def _known_keys(parts: list[str]) -> list[str]:
    """The keys allowed below the dotted section ``parts`` (for "did you mean")."""
    model: Any = TxMsgConfig
    skip_group = False
    for part in parts:
        if skip_group:  # a group name inside listeners/consumers
            skip_group = False
            continue
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return []
        annotation = info.annotation
        args = getattr(annotation, "__args__", None)
        if getattr(annotation, "__origin__", None) is dict and args:
            model, skip_group = args[1], True
        else:
            model = annotation
    known = set(getattr(model, "model_fields", {}))
    if not parts:  # the top level: the installed backends' keys too
        known |= set(_backend_keys())
    return sorted(known)


def resolve_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[TxMsgConfig, ConfigSources]:
    """Like :func:`load_config`, and also report where each setting came from."""
    env = os.environ if env is None else env
    sources = ConfigSources()
    if path is None and env.get(CONFIG_ENV):
        path = env[CONFIG_ENV]
    if path is None and Path(DEFAULT_FILE).is_file():
        path = DEFAULT_FILE
    data: dict[str, Any] = {}
    if path is not None:
        sources.file = Path(path)
        data = _read_file(sources.file)
        for key in _flatten(data):
            sources.keys[key] = f"file {sources.file}"
    data = _merge(data, _env_overrides(env, sources, data))
    token = _SOURCES.set(sources)
    try:
        return TxMsgConfig(**data), sources
    finally:
        _SOURCES.reset(token)


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> TxMsgConfig:
    """Read the configuration (see the module docstring); raise :class:`ConfigError` naming the
    key on an unknown key or a bad value."""
    return resolve_config(path, env)[0]
