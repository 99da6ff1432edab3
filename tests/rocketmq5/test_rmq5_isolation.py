"""Issue 14 point 1: the rocketmq5 backend imports and works where librocketmq and
``rocketmq-client-python`` are absent (a child interpreter where they cannot be imported or loaded)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import txmsg_rocketmq5
from txmsg_broker.testing import create_topic, unique

SCRIPT = Path(__file__).with_name("no_librocketmq_script.py")


def test_works_without_librocketmq_and_the_remoting_client(txmsg_grpc_broker: Any) -> None:
    topic = unique("Tx5Isolated")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), txmsg_grpc_broker.grpc_endpoint, topic],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # The configuration reads the settings declarations of every installed backend (entry points
    # txmsg.settings), so it may look for txmsg_rocketmq's package (for .settings) and go on without
    # it; nothing tried the remoting client, librocketmq or the rocketmq backend itself.
    attempts = result.pop("attempts")
    assert set(attempts) <= {"txmsg_rocketmq"}, attempts
    assert result == {
        "backend": "txmsg_rocketmq5.backend",
        "states": ["COMMIT", "UNKNOW"],
        "checked": True,
        "imported": [],
        "librocketmq_mapped": False,
    }


def test_package_imports_no_remoting_client() -> None:
    """Every import statement of the package, read from its source (not only the paths a run takes)."""
    root = Path(txmsg_rocketmq5.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                assert name.split(".")[0] != "txmsg_rocketmq", f"{path.name} imports {name}"
                assert not name.startswith(("rocketmq.client", "rocketmq.ffi")), (
                    f"{path.name} imports {name}"
                )
