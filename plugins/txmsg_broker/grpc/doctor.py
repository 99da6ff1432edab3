"""``txmsg doctor`` check (entry point ``txmsg.doctor_checks: rocketmq5``): do both RocketMQ clients import?

Why: ``rocketmq-client-python`` 2.0.0 (librocketmq, remoting) and ``rocketmq-python-client`` 5.x
(pure Python, gRPC) both install a top-level ``rocketmq`` package and overwrite each other's
``rocketmq/__init__.py``. With 2.0.0's file on top the 5.x client cannot import itself; with the 5.x
file on top both work. Imports run in a child interpreter so a broken combination cannot leave
half-imported modules (or librocketmq) behind in the doctor process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

Check = tuple[str, str, bool]

STUBS = "rocketmq.grpc_protocol.service_pb2_grpc"
CLIENT5 = "rocketmq-python-client"


def fix(version: str) -> str:
    return (
        f"run `pip install --no-deps --force-reinstall {CLIENT5}=={version}` in this environment "
        "(scripts/setup.sh does it) so the 5.x rocketmq/__init__.py wins; then both clients import"
    )


def _imports(module: str) -> str | None:
    """None if ``module`` imports in a fresh interpreter, else the last line of the error."""
    proc = subprocess.run(  # noqa: S603 - this interpreter importing one of our fixed module names
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60
    )
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def report(config: Any = None) -> list[Check]:
    try:
        version = importlib.metadata.version(CLIENT5)
    except importlib.metadata.PackageNotFoundError:
        return [
            (
                f"{CLIENT5} (gRPC)",
                "not installed (optional: `pip install 'txmsg[grpc]'` for `txmsg broker --grpc-port`)",
                True,
            )
        ]
    checks: list[Check] = [(f"{CLIENT5} (gRPC)", version, True)]
    spec = importlib.util.find_spec("rocketmq")
    init = Path(spec.origin) if spec is not None and spec.origin else None
    owner_5x = init is not None and init.exists() and "from .v5" in init.read_text(errors="replace")
    checks.append(
        (
            "rocketmq/__init__.py",
            f"{init} is the 5.x client's" if owner_5x else f"{init} is not the 5.x client's: {fix(version)}",
            owner_5x,
        )
    )
    error = _imports(STUBS)
    checks.append(
        (
            "rocketmq 5.x gRPC stubs import",
            "ok" if error is None else f"{error}; {fix(version)}",
            error is None,
        )
    )
    try:
        importlib.metadata.version("rocketmq-client-python")
    except importlib.metadata.PackageNotFoundError:  # a 5.x-only install: nothing to collide with
        checks.append(("rocketmq.client (2.0.0)", "not installed (optional: txmsg[rocketmq])", True))
        return checks
    error = _imports("rocketmq.client")
    checks.append(
        (
            "rocketmq.client (2.0.0) imports",
            "ok"
            if error is None
            else f"{error}; reinstall rocketmq-client-python==2.0.0 and librocketmq "
            f"(`bash scripts/setup.sh`), then {fix(version)}",
            error is None,
        )
    )
    return checks
