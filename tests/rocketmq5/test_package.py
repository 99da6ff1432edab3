"""Issue 24: rocketmq-client-python 2.0.0 and rocketmq-python-client 5.x share the top-level
``rocketmq`` package and overwrite each other's ``rocketmq/__init__.py``.  Whichever pip wrote last,
both clients import beside each other: txmsg_rocketmq5.package gives the package the 5.x names when
2.0.0's empty ``__init__`` won.  Each order is rebuilt here as a copy of the installed package with
one or the other ``__init__.py``, imported by a child interpreter that finds the copy first."""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from txmsg_rocketmq5 import package

from txmsg.app import backend_entry_points

INSTALLED = Path(importlib.util.find_spec("rocketmq").origin).parent  # type: ignore[union-attr, arg-type]
# 2.0.0's rocketmq/__init__.py is the Apache licence header and nothing else
INIT_2_0_0 = (
    "# Licensed to the Apache Software Foundation (ASF) under one or more\n# (licence header)\n"
)


def _record_hash(dist: str) -> str:
    files = importlib.metadata.files(dist) or []
    (entry,) = [f for f in files if str(f) == "rocketmq/__init__.py"]
    assert entry.hash is not None
    return entry.hash.value


def _sha(text: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def init_5x(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The 5.x client's ``rocketmq/__init__.py``: the installed one if it is on top, else taken
    from the client's wheel (pip's cache holds it since setup installed it)."""
    on_disk = (INSTALLED / "__init__.py").read_bytes()
    if _sha(on_disk) == _record_hash(package.CLIENT5):
        return on_disk.decode()
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(where),
            f"{package.CLIENT5}=={package.client_version()}",
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = where.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.read("rocketmq/__init__.py").decode()


def _copy_with_init(tmp_path: Path, init: str) -> Path:
    site = tmp_path / "site"
    shutil.copytree(INSTALLED, site / "rocketmq", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "rocketmq" / "__init__.py").write_text(init)
    return site


CHILD = (
    "import importlib.util, pathlib, sys\n"
    "origin = pathlib.Path(importlib.util.find_spec('rocketmq').origin)\n"
    "assert str(origin).startswith(sys.argv[1]), origin\n"
    "import txmsg_rocketmq5.backend\n"  # the 5.x backend's modules
    "import txmsg_broker.grpc.stubs as stubs\n"  # the embedded broker's gRPC endpoint
    "assert hasattr(stubs.svc_grpc, 'add_MessagingServiceServicer_to_server')\n"
    "import rocketmq.client, rocketmq.ffi\n"  # 2.0.0 over librocketmq, beside it
    "from txmsg_rocketmq import native\n"
    "from rocketmq import Producer, SimpleConsumer\n"
    "print(rocketmq.client.Producer.__module__, Producer.__module__, SimpleConsumer.__module__)\n"
)


@pytest.mark.parametrize("last", ["rocketmq-client-python 2.0.0", "rocketmq-python-client 5.x"])
def test_both_clients_import_whichever_was_installed_last(
    last: str, tmp_path: Path, init_5x: str
) -> None:
    site = _copy_with_init(
        tmp_path, INIT_2_0_0 if last.startswith("rocketmq-client-python") else init_5x
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["rocketmq.client", "rocketmq.v5.producer.producer"]


def test_the_names_given_are_the_5x_init_s_names_in_its_order(init_5x: str) -> None:
    imported: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.parse(init_5x).body:
        if isinstance(node, ast.ImportFrom):
            module = node.module if node.level == 0 else f"rocketmq.{node.module}"
            imported.append((str(module), tuple(alias.name for alias in node.names)))
    assert imported == list(package.CLIENT_NAMES)


def test_doctor_reports_the_combination_ok() -> None:
    rows = package.report()
    assert all(ok for _label, _detail, ok in rows), rows
    labels = [label for label, _d, _ok in rows]
    assert "rocketmq 5.x client imports" in labels
    assert "rocketmq.client (2.0.0) imports beside it" in labels


def test_doctor_check_is_registered_under_a_name_that_is_no_backend() -> None:
    (ep,) = [
        e
        for e in importlib.metadata.entry_points(group="txmsg.doctor_checks")
        if e.value == "txmsg_rocketmq5.package:report"
    ]
    assert ep.name not in {
        b.name for b in backend_entry_points()
    }  # so it runs whatever the backend


def test_setup_has_no_reinstall_last_step() -> None:
    script = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    assert "--force-reinstall" not in script
