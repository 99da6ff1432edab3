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
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
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
    """The core requires neither client; the extra `rocketmq` is the txmsg-rocketmq distribution,
    which requires the wrapper; `rocketmq5` is txmsg-rocketmq5 with the 5.x client; dev keeps both."""
    root = Path(__file__).parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith(("rocketmq", "txmsg"))]
    extras = project["optional-dependencies"]
    version = project["version"]
    assert extras["rocketmq"] == [f"txmsg-rocketmq=={version}"]
    assert extras["rocketmq5"] == [f"txmsg-rocketmq5=={version}"]
    backend = tomllib.loads((root / "plugins/txmsg-rocketmq/pyproject.toml").read_text())["project"]
    assert "rocketmq-client-python==2.0.0" in backend["dependencies"]
    backend5 = tomllib.loads((root / "plugins/txmsg-rocketmq5/pyproject.toml").read_text())[
        "project"
    ]
    assert any(d.startswith("rocketmq-python-client") for d in backend5["dependencies"])
    dev_self = next(d for d in extras["dev"] if d.startswith("txmsg["))
    assert {"rocketmq", "rocketmq5"} <= set(dev_self[len("txmsg[") : -1].split(","))
