"""``txmsg doctor``: what is installed, which configuration applies, which backends load.

Exit status 1 when the configuration is invalid (a bad key or value, e.g. a name server that is
not ``host:port[;host:port]``) or an installed backend cannot be imported, with or without
``--strict``.  Checks contributed by plugins (e.g. "is the name server reachable") are reported,
and fail the run only with ``--strict``.

Plugins contribute checks through the entry-point group ``txmsg.doctor_checks``: each entry point
names a callable ``report(config) -> iterable of (label, detail, ok)``.  A check whose entry-point
name is also the name of a backend (``txmsg.backends``) runs only when that backend is the
configured one; every other check always runs.

Secrets are never printed: ``access_key`` / ``secret_key`` show as ``***``, passwords in URLs
are masked, and an invalid secret value is not echoed in the error message.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from collections.abc import Iterable
from typing import Any

import click

from txmsg.app import backend_entry_points
from txmsg.config import ConfigSources, TxMsgConfig, resolve_config
from txmsg.errors import ConfigError

Check = tuple[str, str, bool]

CHECKS_GROUP = "txmsg.doctor_checks"
"""Entry-point group of doctor checks (values name ``report(config)`` callables)."""

SECRET_KEYS = frozenset({"secret_key", "access_key"})
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+(?P<tail>@)")
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _requirement_names(dist: str) -> list[tuple[str, str | None]]:
    """(requirement name, extra or None) of installed distribution ``dist`` ([] if missing)."""
    try:
        requirements = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found: list[tuple[str, str | None]] = []
    for requirement in requirements:
        match = _REQUIREMENT_NAME.match(requirement)
        extra = _EXTRA.search(requirement.partition(";")[2])
        if match:
            found.append((match.group(1), extra.group(1) if extra else None))
    return found


def versions() -> list[Check]:
    """Python, txmsg, every package txmsg requires, and for each extra named like a backend
    (``txmsg[rocketmq]``, ``txmsg[rocketmq5]``) the backend's distribution and the client packages
    it requires: optional, so a missing one is shown with its install command but is not a failure
    (the configured backend's own checks say whether it is needed)."""
    rows: list[Check] = [("python", f"{platform.python_version()} ({sys.executable})", True)]
    backends = {ep.name for ep in backend_entry_points()}
    names: list[tuple[str, str | None]] = [("txmsg", None)]  # (name, what it is for)
    for name, extra in _requirement_names("txmsg"):
        if extra is None:
            names.append((name, None))
        elif extra in backends:
            names.append((name, f"backend {extra}"))
            # the backend distribution's own requirements: its client packages
            names += [
                (dep, f"backend {extra}")
                for dep, dep_extra in _requirement_names(name)
                if dep_extra is None and dep != "txmsg"
            ]
        elif name.startswith("txmsg-"):  # another part of the product (its own distribution)
            names.append((name, f"txmsg[{extra}]"))
    seen: set[str] = set()
    for name, extra_name in names:
        if name in seen:
            continue
        seen.add(name)
        label = name if extra_name is None else f"{name} ({extra_name})"
        try:
            rows.append((label, importlib.metadata.version(name), True))
        except importlib.metadata.PackageNotFoundError:
            if extra_name is None:
                rows.append((label, f"not installed; run `pip install {name}`", False))
            else:
                extra = extra_name.removeprefix("backend ").removeprefix("txmsg[").removesuffix("]")
                rows.append(
                    (label, f"not installed (optional: `pip install 'txmsg[{extra}]'`)", True)
                )
    return rows


def mask_secrets(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` URL replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\g<head>***\g<tail>", text)


def config_rows(config: TxMsgConfig, sources: ConfigSources) -> list[Check]:
    rows: list[Check] = [("config file", str(sources.file) if sources.file else "none", True)]
    flat = _flat(config.model_dump(mode="json"))
    for key, value in flat.items():
        secret = key.rpartition(".")[2] in SECRET_KEYS
        shown = "***" if secret and value else mask_secrets(repr(value))
        origin = sources.keys.get(key, "default")
        rows.append((key, f"{shown}  [{origin}]", True))
    return rows


def config_error_row(exc: ConfigError) -> Check:
    """The error as a row; the rejected value is left out when it belongs to a secret key."""
    message = str(exc)
    if exc.key and exc.key.rpartition(".")[2].lower().removeprefix("txmsg_") in SECRET_KEYS:
        message = message.split(" (got ", 1)[0] + " (value hidden)"
    return ("config", mask_secrets(message), False)


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
        rows.append(
            (
                "backends",
                "none installed; run `pip install 'txmsg[rocketmq5]'` (or `txmsg[rocketmq]`)",
                False,
            )
        )
    return rows


def check_entry_points(backend: str) -> list[importlib.metadata.EntryPoint]:
    """The ``txmsg.doctor_checks`` that apply when ``backend`` is configured (see module doc)."""
    backends = {ep.name for ep in backend_entry_points()}
    found = importlib.metadata.entry_points(group=CHECKS_GROUP)
    return sorted(
        (ep for ep in found if ep.name not in backends or ep.name == backend),
        key=lambda ep: ep.name,
    )


def run_check(ep: importlib.metadata.EntryPoint, config: TxMsgConfig) -> list[Check]:
    """Rows of one check; a check that cannot be imported or raises is itself a (FAIL) row."""
    try:
        report: Any = ep.load()
    except Exception as exc:  # noqa: BLE001 - a check that does not load is a finding
        return [
            (f"{ep.name} doctor", f"{ep.value} not importable: {type(exc).__name__}: {exc}", False)
        ]
    try:
        rows: Iterable[Any] = report(config)
        return [(str(a), mask_secrets(str(b)), bool(c)) for a, b, c in rows]
    except Exception as exc:  # noqa: BLE001 - a broken check is a finding
        return [(f"{ep.name} doctor", f"{ep.value} failed: {type(exc).__name__}: {exc}", False)]


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
@click.option("--strict", is_flag=True, help="Also fail when a plugin's own check fails.")
def doctor(config_path: str | None, strict: bool) -> None:
    """Show versions, the resolved configuration and whether each backend can load."""
    _print("versions", versions())
    try:
        config, sources = resolve_config(config_path)
    except ConfigError as exc:
        _print("configuration", [config_error_row(exc)])
        click.secho("txmsg doctor: the configuration is invalid (see above)", fg="red", err=True)
        raise SystemExit(1) from None
    _print("configuration", config_rows(config, sources))
    backends = backend_rows()
    _print("backends", backends)
    failed = not all(ok for _, _, ok in backends)
    advisory = False
    for ep in check_entry_points(config.backend):
        rows = run_check(ep, config)
        if rows:
            _print(f"{ep.name} checks", rows)
            advisory = advisory or not all(ok for _, _, ok in rows)
    if failed or (strict and advisory):
        raise SystemExit(1)
    note = " (FAIL lines above are advisory; --strict makes them fail)" if advisory else ""
    click.secho(f"txmsg doctor: done{note}", fg="green")
