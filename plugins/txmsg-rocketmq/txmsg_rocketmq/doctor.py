"""``txmsg doctor`` hook: is the real client usable here?

Checks, each as ``(label, detail, ok)``: where librocketmq is, its sha256, whether that is the
2.1.0 build (2.0.0 silently drops every check-back), where the client writes its logs, whether
the name server accepts a TCP connection, and whether a transaction producer can be created
and started (then shut down), and each master broker's transaction settings (GET_BROKER_CONFIG):
a 5.x broker whose ``transactionTimeOut`` is below its ``transactionOpBatchInterval`` checks back
transactions that already ended (see :mod:`.broker_config`).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from . import broker_config
from . import native as native_mod
from .settings import RocketMQSettings
from .timers import when_quiet

Check = tuple[str, str, bool]


def report(config: Any = None) -> list[Check]:
    checks: list[Check] = []
    if not native_mod.client_installed():  # an optional dependency (extra `rocketmq`)
        return [
            (
                f"{native_mod.CLIENT_DIST} (rocketmq backend)",
                f"not installed: `{native_mod.INSTALL_HINT}`, then `"
                "txmsg install-librocketmq` (librocketmq 2.1.0, Linux x86-64); or "
                'configure backend = "rocketmq5"',
                False,
            )
        ]
    path = native_mod.library_path()
    if path is None:
        checks.append(
            (
                "librocketmq path",
                "not found; run `txmsg install-librocketmq`",
                False,
            )
        )
        return checks
    checks.append(("librocketmq path", str(path), path.exists()))
    digest = native_mod.sha256_of(path)
    checks.append(("librocketmq sha256", digest, True))
    is_210 = digest == native_mod.LIB_SHA256_2_1_0
    checks.append(
        (
            "librocketmq is 2.1.0",
            "yes"
            if is_210
            else "no: unknown build (2.0.0 drops every check-back); reinstall with "
            "`txmsg install-librocketmq`",
            is_210,
        )
    )
    settings = RocketMQSettings.of(config)
    log_dir = settings.client_log_dir
    effective = os.environ.get(native_mod.LOG_DIR_ENV) or str(Path(log_dir).expanduser().resolve())
    writable = _writable(Path(effective))
    checks.append(
        (
            "client log dir",
            effective
            + (
                "" if writable else " (not writable: set client_log_dir or ROCKETMQ_CLIENT_LOG_DIR)"
            ),
            writable,
        )
    )
    name_server = settings.name_server
    reachable = _name_server(name_server)
    checks.append(reachable)
    if reachable[2]:
        checks.extend(broker_transaction_settings(name_server))
    checks.append(_producer_starts(log_dir, name_server))
    return checks


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def _name_server(address: str) -> Check:
    first = address.split(";", maxsplit=1)[0].strip()
    host, _, port = first.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2.0):
            pass
    except (OSError, ValueError) as exc:
        return ("name server reachable", f"{first}: {exc}; start it or fix name_server", False)
    return ("name server reachable", first, True)


def broker_transaction_settings(name_server: str, *, born_slack_ms: int = 0) -> list[Check]:
    """One row per master broker: its transaction settings, failing when it checks finished ones
    (``born_slack_ms``: :data:`.broker_config.WHOLE_SECOND_BIRTHS_MS` for the 5.x client)."""
    try:
        masters = broker_config.master_brokers(name_server)
    except (OSError, ValueError) as exc:
        return [("broker transaction settings", f"cannot list the brokers: {exc}", False)]
    if not masters:
        return [("broker transaction settings", "no broker is registered yet", False)]
    rows: list[Check] = []
    for name, addr in sorted(masters.items()):
        label = f"broker {name} ({addr}) transaction settings"
        try:
            props = broker_config.broker_config(addr)
        except (OSError, ValueError) as exc:
            rows.append((label, f"GET_BROKER_CONFIG failed: {exc}", False))
            continue
        found = broker_config.transaction_settings(name, addr, props)
        detail = broker_config.advice(found, born_slack_ms=born_slack_ms)
        rows.append((label, detail, not found.checks_finished_transactions))
    return rows


def _producer_starts(log_dir: str, name_server: str) -> Check:
    """Create, start and shut down one transaction producer (no message is sent)."""
    try:
        lib = native_mod.load(log_dir)
        dll = lib.dll
        noop = native_mod.CHECK_CALLBACK(lambda *_: native_mod.E_UNKNOWN_TRANSACTION)
        with native_mod.NATIVE_LOCK:
            handle = dll.CreateTransactionProducer(b"TXMSG_DOCTOR", noop, None)
            if not handle:
                return ("transaction producer starts", f"create failed: {lib.last_error()}", False)
            dll.SetProducerInstanceName(handle, f"txmsg-doctor-{os.getpid()}".encode())
            dll.SetProducerNameServerAddress(handle, name_server.encode())
            status = int(dll.StartProducer(handle))
            started = time.monotonic()
            if status != native_mod.OK:
                dll.DestroyProducer(handle)
                return ("transaction producer starts", f"start failed: {lib.last_error()}", False)
            version = dll.ShowProducerVersion(handle)
        # its shutdown ends the client factory it started: not during the factory's first timers,
        # which fire right after the start (hazard #9: that aborts the process)
        when_quiet(
            started,
            native_mod.NATIVE_LOCK,
            lambda: (dll.ShutdownProducer(handle), dll.DestroyProducer(handle)),
        )
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        return ("transaction producer starts", f"{type(exc).__name__}: {exc}", False)
    text = version.decode("utf-8", "replace") if version else "started"
    return ("transaction producer starts", f"started and shut down ({text})", True)
