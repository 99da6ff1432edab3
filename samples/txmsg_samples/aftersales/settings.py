"""The sample's one config file: txmsg's settings plus an ``[aftersales]`` table.

``txmsg.toml`` holds everything txmsg reads at the top level and the sample's own settings under
``[aftersales]``; :func:`load` splits and validates both (a wrong key raises
:class:`txmsg.ConfigError` naming it).  ``TXMSG_CONFIG`` points at another file;
``TXMSG_NAME_SERVER``, ``TXMSG_BACKEND`` and ``TXMSG_ENDPOINTS`` override the file, so the same
file runs against any cluster and either backend.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from txmsg import ConfigError, TxMsgConfig

SECTION = "aftersales"
DEFAULT_PATH = Path(__file__).with_name("txmsg.toml")
ENV_OVERRIDES = {
    "TXMSG_NAME_SERVER": "name_server",
    "TXMSG_BACKEND": "backend",
    "TXMSG_ENDPOINTS": "endpoints",
}


class AfterSalesSettings(BaseModel):
    """``[aftersales]``: each service's database, where alerts go, the orderly listener's retries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cases_db: str = "sqlite:///var/aftersales/cases.db"
    """The after-sales service's database (cases + outbox)."""
    settlement_db: str = "sqlite:///var/aftersales/settlement.db"
    """The settlement service's database (ledger, dedup rows, parked messages)."""
    alerts_file: str | None = None
    """Append one JSON line per parked order here (a stand-in for paging someone)."""
    max_orderly_retries: int = Field(default=3, ge=1)
    """Failures of one event before its order is parked."""
    orderly_retry_delay: float = Field(default=1.0, ge=0)
    """Seconds between those attempts."""


def load(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[TxMsgConfig, AfterSalesSettings]:
    """Read the config file (default: ``$TXMSG_CONFIG``, else the ``txmsg.toml`` next to this
    module)."""
    env = os.environ if env is None else env
    file = Path(path or env.get("TXMSG_CONFIG") or DEFAULT_PATH)
    try:
        raw: dict[str, Any] = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist", key=str(file)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}", key=str(file)) from exc
    sample_raw = raw.pop(SECTION, {})
    for variable, key in ENV_OVERRIDES.items():
        if env.get(variable):
            raw[key] = env[variable]
    try:
        config = TxMsgConfig.model_validate(raw)  # its ConfigError names the key
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}", key=exc.key) from None
    return config, _validate(AfterSalesSettings, sample_raw, file, SECTION + ".")


def _validate(model: Any, data: Mapping[str, Any], file: Path, prefix: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = prefix + ".".join(str(p) for p in first["loc"])
        what = "unknown config key" if first["type"] == "extra_forbidden" else "bad value for"
        raise ConfigError(f"{file}: {what} {key!r}: {first['msg']}", key=key) from None
