"""``txmsg doctor``: what is installed, which configuration applies, which backends load.

Exit status 1 when the configuration is invalid or an installed backend cannot be imported;
checks of a backend's own hook (e.g. "is the name server reachable") are reported, and fail
the run only with ``--strict``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import sys
from typing import Any

import click

from txmsg.app import backend_entry_points
from txmsg.config import ConfigSources, TxMsgConfig, resolve_config
from txmsg.errors import ConfigError

Check = tuple[str, str, bool]

PACKAGES = ("txmsg", "rocketmq-client-python", "pydantic", "injector", "click", "sqlalchemy")
SECRET_KEYS = {"secret_key", "access_key"}
BACKEND_HOOKS = {"rocketmq": "txmsg_rocketmq.doctor"}


def versions() -> list[Check]:
    rows: list[Check] = [("python", f"{platform.python_version()} ({sys.executable})", True)]
    for name in PACKAGES:
        try:
            rows.append((name, importlib.metadata.version(name), True))
        except importlib.metadata.PackageNotFoundError:
            rows.append((name, "not installed; run `make setup`", False))
    return rows


def config_rows(config: TxMsgConfig, sources: ConfigSources) -> list[Check]:
    rows: list[Check] = [("config file", str(sources.file) if sources.file else "none", True)]
    flat = _flat(config.model_dump(mode="json"))
    for key, value in flat.items():
        shown = "***" if key in SECRET_KEYS and value else repr(value)
        origin = sources.keys.get(key, "default")
        rows.append((key, f"{shown}  [{origin}]", True))
    return rows


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def backend_rows() -> list[Check]:
    rows: list[Check] = []
    for ep in backend_entry_points():
        try:
            ep.load()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            rows.append((f"backend {ep.name}", f"{ep.value}: {type(exc).__name__}: {exc}", False))
        else:
            rows.append((f"backend {ep.name}", ep.value, True))
    if not rows:
        rows.append(("backends", "none installed; run `make setup`", False))
    return rows


def hook_rows(name: str, config: TxMsgConfig) -> list[Check]:
    """Run a backend's own doctor hook (``<module>.report(config)``) if it is importable."""
    module_name = BACKEND_HOOKS.get(name)
    if module_name is None:
        return []
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return [(f"{name} doctor", f"{module_name} not importable: {exc}", False)]
    try:
        return [(str(a), str(b), bool(c)) for a, b, c in module.report(config)]
    except Exception as exc:  # noqa: BLE001 - a broken hook is a finding
        return [(f"{name} doctor", f"{module_name}.report failed: {type(exc).__name__}: {exc}", False)]


def _print(title: str, rows: list[Check]) -> None:
    click.secho(title, bold=True)
    width = max((len(label) for label, _, _ in rows), default=0)
    for label, detail, ok in rows:
        mark = click.style(" ok ", fg="green") if ok else click.style("FAIL", fg="red")
        click.echo(f"  [{mark}] {label.ljust(width)}  {detail}")


@click.command("doctor")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file (default: $TXMSG_CONFIG, else ./txmsg.toml if present).",
)
@click.option("--strict", is_flag=True, help="Also fail when a backend's own check fails.")
def doctor(config_path: str | None, strict: bool) -> None:
    """Show versions, the resolved configuration and whether each backend can load."""
    _print("versions", versions())
    try:
        config, sources = resolve_config(config_path)
    except ConfigError as exc:
        _print("configuration", [("config", str(exc), False)])
        raise SystemExit(1) from None
    _print("configuration", config_rows(config, sources))
    backends = backend_rows()
    _print("backends", backends)
    failed = not all(ok for _, _, ok in backends)
    hook = hook_rows(config.backend, config)
    advisory = not all(ok for _, _, ok in hook)
    if hook:
        _print(f"backend {config.backend!r} checks", hook)
    if failed or (strict and advisory):
        raise SystemExit(1)
    note = " (FAIL lines above are advisory; --strict makes them fail)" if advisory else ""
    click.secho(f"txmsg doctor: done{note}", fg="green")
