"""``rocketmq-client-python`` is an optional dependency (extra ``rocketmq``): without it the
``rocketmq`` backend does not load, and both the error and ``txmsg doctor`` say what to install."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

SCRIPT = Path(__file__).with_name("no_client_script.py")


def test_rocketmq_backend_without_its_client_says_what_to_install(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "ROCKETMQ_CLIENT_LOG_DIR": str(tmp_path / "logs")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] == "BackendUnavailableError", result
    message = result["message"]
    assert "pip install 'txmsg[rocketmq]'" in message
    assert "rocketmq-client-python 2.0.0 and librocketmq 2.1.0" in message
    assert 'backend = "rocketmq5"' in message  # the alternative that needs neither
    ((label, detail, ok),) = result["doctor"]
    assert label == "rocketmq-client-python (rocketmq backend)"
    assert ok is False
    assert "pip install 'txmsg[rocketmq]'" in detail


def test_the_wrapper_is_an_optional_dependency() -> None:
    """pyproject: not in the base dependencies, in extra `rocketmq`; dev keeps both backends."""
    project = tomllib.loads(
        (Path(__file__).parents[2] / "pyproject.toml").read_text()
    )["project"]
    assert not [d for d in project["dependencies"] if d.startswith("rocketmq")]
    extras = project["optional-dependencies"]
    assert extras["rocketmq"] == ["rocketmq-client-python==2.0.0"]
    assert any(d.startswith("rocketmq-python-client") for d in extras["rocketmq5"])
    dev_self = next(d for d in extras["dev"] if d.startswith("txmsg["))
    assert {"rocketmq", "rocketmq5"} <= set(dev_self[len("txmsg[") : -1].split(","))
