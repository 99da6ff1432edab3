"""The order sample's one config file: txmsg's settings plus an ``[order_sample]`` table.

``txmsg.toml`` holds everything txmsg reads (name server, producer group, executor sizes...) at
the top level, and the sample's own settings (one database URL per service) under
``[order_sample]``.  :func:`load` splits the two and validates both; a wrong key or value raises
:class:`txmsg.ConfigError` naming it.  ``TXMSG_NAME_SERVER`` overrides the name server, so the
same file works against any cluster.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from txmsg import ConfigError, TxMsgConfig

SECTION = "order_sample"
DEFAULT_PATH = Path(__file__).with_name("txmsg.toml")


class OrderSampleSettings(BaseModel):
    """``[order_sample]``: where each service keeps its data, and listener tuning."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    orders_db: str = "sqlite:///var/order/orders.db"
    points_db: str = "sqlite:///var/order/points.db"
    logistics_db: str = "sqlite:///var/order/logistics.db"
    cart_db: str = "sqlite:///var/order/cart.db"
    answer_within: float | None = Field(default=None, gt=0)
    """Answer UNKNOW when paying takes longer than this (the check-back reads the record)."""
    grace_period: float = Field(default=10.0, ge=0)
    in_flight_timeout: float = Field(default=600.0, gt=0)


def load(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[TxMsgConfig, OrderSampleSettings]:
    """Read the sample's config file (default: the ``txmsg.toml`` next to this module)."""
    env = os.environ if env is None else env
    file = Path(path or env.get("TXMSG_CONFIG") or DEFAULT_PATH)
    try:
        raw: dict[str, Any] = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist", key=str(file)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}", key=str(file)) from exc
    sample_raw = raw.pop(SECTION, {})
    if env.get("TXMSG_NAME_SERVER"):
        raw["name_server"] = env["TXMSG_NAME_SERVER"]
    try:
        config = TxMsgConfig.model_validate(raw)  # its ConfigError names the key
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}", key=exc.key) from None
    return config, _validate(OrderSampleSettings, sample_raw, file, SECTION + ".")


def _validate(model: Any, data: Mapping[str, Any], file: Path, prefix: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = prefix + ".".join(str(p) for p in first["loc"])
        what = "unknown config key" if first["type"] == "extra_forbidden" else "bad value for"
        raise ConfigError(f"{file}: {what} {key!r}: {first['msg']}", key=key) from None
