"""Issue 24: the txmsg_broker pytest plugin loads wherever txmsg-broker is installed and does
nothing to a user's pytest run (no environment variable set) unless its fixtures are used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

USER_TESTS = """
import os

def test_environment_untouched():
    assert "ROCKETMQ_CLIENT_LOG_DIR" not in os.environ

def test_fixture_sets_it_for_its_users(txmsg_client_log_dir):
    assert os.environ["ROCKETMQ_CLIENT_LOG_DIR"] == txmsg_client_log_dir
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "ROCKETMQ_CLIENT_LOG_DIR" and not k.startswith("PYTEST")
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_user_run_without_the_fixtures_keeps_its_environment(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    proc = _pytest(tmp_path, "test_user.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_the_plugin_is_loaded_by_its_entry_point(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "--fixtures")
    assert "txmsg_broker_factory" in proc.stdout, proc.stdout
    assert "txmsg_client_log_dir" in proc.stdout, proc.stdout
