"""The 5.x client's ``rocketmq`` package, whichever ``rocketmq/__init__.py`` pip wrote last.

Why: ``rocketmq-client-python`` 2.0.0 (librocketmq, remoting) and ``rocketmq-python-client`` 5.x
(pure Python, gRPC) both install a top-level ``rocketmq`` package.  Their other files do not
collide, but each ships a ``rocketmq/__init__.py`` and the one pip wrote last wins:

* the 5.x file re-exports the client's names (``ClientConfiguration``, ``Producer``, ...), and the
  client's own modules import them from there (``from rocketmq import ClientConfiguration``);
* 2.0.0's file is empty (a licence header), so with it on top the 5.x client cannot import itself.

:func:`ensure_client_package` gives the imported ``rocketmq`` package the 5.x client's names when
its ``__init__`` did not, in the order the 5.x file defines them (each import may need the names
before it).  With that, installing ``txmsg[rocketmq]`` and ``txmsg[rocketmq5]`` works in either
order, with no "reinstall the 5.x client last" step.  2.0.0's modules (``rocketmq.client``,
``rocketmq.ffi``) never use their package's names, so the 5.x names do them no harm.

The names are what rocketmq-python-client 5.1.2's ``rocketmq/__init__.py`` exports
(``CLIENT_NAMES``); ``tests/rocketmq5/test_package.py`` checks the list against the installed file.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

CLIENT5 = "rocketmq-python-client"

CLIENT_NAMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rocketmq.grpc_protocol", ("TransactionResolution",)),
    ("rocketmq.v5.client", ("ClientConfiguration", "Credentials")),
    (
        "rocketmq.v5.consumer",
        (
            "ConsumeResult",
            "LitePushConsumer",
            "LiteSimpleConsumer",
            "MessageListener",
            "PushConsumer",
            "SimpleConsumer",
        ),
    ),
    ("rocketmq.v5.model", ("FilterExpression", "Message", "SendReceipt")),
    ("rocketmq.v5.producer", ("Producer", "Transaction", "TransactionChecker")),
)
"""(module, names) in the order the 5.x ``rocketmq/__init__.py`` imports them."""

_lock = threading.Lock()


def client_version() -> str | None:
    """The installed rocketmq-python-client version, or None."""
    try:
        return importlib.metadata.version(CLIENT5)
    except importlib.metadata.PackageNotFoundError:
        return None


def init_is_5x() -> bool | None:
    """Whether ``rocketmq/__init__.py`` on disk is the 5.x client's (None: no ``rocketmq``)."""
    spec = importlib.util.find_spec("rocketmq")  # a top-level name: imports nothing
    if spec is None or not spec.origin:
        return None
    init = Path(spec.origin)
    return init.is_file() and "from .v5" in init.read_text(errors="replace")


def ensure_client_package() -> Any:
    """Import ``rocketmq`` so that the 5.x client's modules and names work; return the package.

    Raises:
        ImportError: rocketmq-python-client is not installed; the message names the install.
    """
    with _lock:
        try:
            package = importlib.import_module("rocketmq")
        except ImportError as exc:
            raise ImportError(
                f"the RocketMQ 5 client is not importable ({exc}); install it with "
                "`pip install 'txmsg[rocketmq5]'`"
            ) from exc
        if all(hasattr(package, name) for _, names in CLIENT_NAMES for name in names):
            return package
        if client_version() is None or importlib.util.find_spec("rocketmq.v5") is None:
            raise ImportError(
                "the installed `rocketmq` package is rocketmq-client-python 2.0.0's only; the "
                f"RocketMQ 5 client ({CLIENT5}) is missing: `pip install 'txmsg[rocketmq5]'`"
            )
        for module_name, names in CLIENT_NAMES:
            module = importlib.import_module(module_name)
            for name in names:
                setattr(package, name, getattr(module, name))
        return package


def _child_imports(code: str) -> str | None:
    """None if ``code`` runs in a fresh interpreter, else the last line of its error."""
    proc = subprocess.run(  # noqa: S603 - this interpreter running fixed import statements
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def report(config: Any = None) -> list[tuple[str, str, bool]]:
    """``txmsg doctor`` check (entry point ``txmsg.doctor_checks: rocketmq-packages``): does the
    5.x client import through :func:`ensure_client_package`, and 2.0.0's beside it?

    Imports run in a child interpreter, so a broken combination leaves nothing half-imported (or
    librocketmq loaded) in the doctor's process.
    """
    version = client_version()
    if version is None:
        return [
            (
                f"{CLIENT5} (gRPC)",
                "not installed (optional: `pip install 'txmsg[rocketmq5]'`)",
                True,
            )
        ]
    on_top = init_is_5x()
    owner = (
        "the 5.x client's"
        if on_top
        else "rocketmq-client-python 2.0.0's (handled by txmsg_rocketmq5.package)"
    )
    checks = [(f"{CLIENT5} (gRPC)", version, True), ("rocketmq/__init__.py", owner, True)]
    error = _child_imports(
        "from txmsg_rocketmq5.package import ensure_client_package as e; e(); "
        "import rocketmq.grpc_protocol.service_pb2_grpc; from rocketmq import Producer, SimpleConsumer"
    )
    checks.append(
        (
            "rocketmq 5.x client imports",
            "ok"
            if error is None
            else f"{error}; reinstall it: `pip install --force-reinstall '{CLIENT5}=={version}'`",
            error is None,
        )
    )
    try:
        importlib.metadata.version("rocketmq-client-python")
    except importlib.metadata.PackageNotFoundError:  # a 5.x-only install: nothing to collide with
        checks.append(
            ("rocketmq.client (2.0.0)", "not installed (optional: txmsg[rocketmq])", True)
        )
        return checks
    error = _child_imports("import txmsg_rocketmq5; import rocketmq.client")
    checks.append(
        (
            "rocketmq.client (2.0.0) imports beside it",
            "ok"
            if error is None
            else f"{error}; reinstall rocketmq-client-python==2.0.0, then run "
            "`txmsg install-librocketmq`",
            error is None,
        )
    )
    return checks
