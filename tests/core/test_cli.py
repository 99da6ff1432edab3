"""The ``txmsg`` command line finds its subcommands through entry points (issue 11 point 6)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from txmsg import cli

REPO = Path(__file__).resolve().parents[2]
CHECKOUT_PACKAGES = ("samples", "benchmarks")
PLUGIN_PACKAGES = ("txmsg_broker", "txmsg_rocketmq", "txmsg_health", "txmsg_samples")


def test_every_command_is_an_entry_point() -> None:
    found = cli.command_entry_points()
    assert {"doctor", "broker", "topic", "health", "demo", "chaos", "bench"} <= set(found)
    assert all(ep.group == cli.COMMANDS_GROUP for ep in found.values())


@pytest.mark.parametrize("module", ["txmsg/cli.py", "txmsg/doctor.py"])
def test_cli_and_doctor_name_no_sample_benchmark_or_plugin_module(module: str) -> None:
    source = (REPO / module).read_text()
    for name in (*CHECKOUT_PACKAGES, *PLUGIN_PACKAGES):
        assert name not in source, f"{module} names {name}"


def test_help_imports_no_command_module() -> None:
    """Summaries come from source: listing the commands imports none of them (fast --help)."""
    code = (
        "import sys\n"
        "from txmsg.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{CHECKOUT_PACKAGES + PLUGIN_PACKAGES!r} or m == 'txmsg.doctor')\n"
        "print('LOADED', loaded)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "LOADED []" in proc.stdout, proc.stdout
    for name in ("bench", "broker", "chaos", "demo", "doctor", "health", "topic"):
        assert f"  {name} " in proc.stdout
    assert "Show versions, the resolved configuration" in proc.stdout


def test_a_command_that_cannot_be_imported_says_why_and_how_to_fix_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = importlib.metadata.EntryPoint(
        "ghost", "no_such_pkg_xyz.cmd:ghost", cli.COMMANDS_GROUP
    )
    monkeypatch.setattr(cli, "command_entry_points", lambda: {"ghost": missing})
    runner = CliRunner()
    listing = runner.invoke(cli.main, ["--help"])
    assert listing.exit_code == 0
    assert "ghost" in listing.output
    assert "unavailable" in listing.output
    result = runner.invoke(cli.main, ["ghost"])
    assert result.exit_code == 1
    assert "`txmsg ghost` is unavailable" in result.output
    assert "no_such_pkg_xyz.cmd:ghost cannot be imported" in result.output
    assert "No module named 'no_such_pkg_xyz'" in result.output
    assert "Fix:" in result.output
    assert "pip install" in result.output
    assert "make setup" not in result.output


def test_an_entry_point_that_is_no_click_command_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong = importlib.metadata.EntryPoint("wrong", "txmsg.cli:summary", cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "command_entry_points", lambda: {"wrong": wrong})
    result = CliRunner().invoke(cli.main, ["wrong"])
    assert result.exit_code == 1
    assert "is not a click command" in result.output


@pytest.mark.parametrize("name", ["demo", "chaos", "bench"])
def test_checkout_commands_work_in_the_dev_venv(name: str) -> None:
    """In the dev venv (scripts/setup.sh installs every distribution of the checkout), the commands of
    txmsg-samples and of the private txmsg-benchmarks import from any directory."""
    result = subprocess.run(
        [sys.executable, "-c", f"from txmsg.cli import main; main(['{name}', '--help'])"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "unavailable" not in result.stdout
    assert "Usage: " in result.stdout
