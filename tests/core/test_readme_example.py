"""The README's example runs as written (issue 11, "Done when"): against the embedded broker, in a
fresh interpreter, with nothing but TXMSG_NAME_SERVER pointing at it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_topic

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("txmsg_rocketmq")


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S)
    assert found, "README.md has no ## Example python block"
    return found.group(1)


def test_the_readme_example_runs_as_written(txmsg_broker: Any, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    # The consumer starts before the first send: on a real cluster the topic must exist then.
    create_topic(txmsg_broker.namesrv_addr, "orders")
    env = {
        **os.environ,
        "TXMSG_NAME_SERVER": txmsg_broker.namesrv_addr,
        "TXMSG_CLIENT_LOG_DIR": str(tmp_path / "client-logs"),
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,  # no txmsg.toml here: configuration from the environment only
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the consumer thread prints too: its words may land inside the main thread's line, even
    # right after the id ("...C80000paid: {...}" in a CI run), so no \b after the id
    sent = re.findall(r"(?:LocalTransactionState\.)?COMMIT [0-9A-F]{32}(?![0-9A-F])", done.stdout)
    assert len(sent) == 1, done.stdout


def test_the_guides_first_listener_runs_as_written(tmp_path: Path) -> None:
    """docs/guide/examples/first_listener.py is pulled into the guide verbatim; it must run."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "guide" / "examples" / "first_listener.py")],
        cwd=ROOT,
        env={**os.environ, "TXMSG_CLIENT_LOG_DIR": str(tmp_path / "client-logs")},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "COMMIT" in done.stdout, done.stdout
