"""What ``pip install .`` puts into site-packages (issue 11 points 6 and 7).

The wheel is built from a copy of the checkout (so no build/ or egg-info appears in the working
tree) without build isolation (no download: the dev extra installs setuptools>=77), installed with
``pip install --target`` into a throw-away directory, and its top-level entries are listed.
samples/ and benchmarks/ must not be among them: they run from the checkout.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALLED = {"txmsg", "txmsg_broker", "txmsg_rocketmq", "txmsg_rocketmq5", "txmsg_health"}
CHECKOUT_ONLY = {"samples", "benchmarks"}


def _checkout_copy(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a file deleted in the working tree is still in the index
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    base = tmp_path_factory.mktemp("packaging")
    source = _checkout_copy(base / "src")
    out = base / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("txmsg-*.whl")
    return built, proc.stdout + proc.stderr


def test_the_wheel_has_no_samples_or_benchmarks(wheel: tuple[Path, str]) -> None:
    built, _ = wheel
    with zipfile.ZipFile(built) as zf:
        top = {name.split("/")[0] for name in zf.namelist() if not name.split("/")[0].endswith(".dist-info")}
    assert top == INSTALLED, f"top-level entries of {built.name}: {sorted(top)}"


def test_pip_install_puts_no_samples_or_benchmarks_into_site_packages(
    wheel: tuple[Path, str], tmp_path: Path
) -> None:
    built, _ = wheel
    site = tmp_path / "site-packages"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(site), str(built)],
        check=True, capture_output=True, timeout=300,
    )
    entries = {p.name for p in site.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")}
    assert not entries & CHECKOUT_ONLY, sorted(entries)
    assert entries >= INSTALLED
    # the fuzz harness is installed with the broker it fuzzes
    assert (site / "txmsg_broker" / "fuzz" / "__init__.py").is_file()


def test_the_wheel_carries_the_license_without_a_deprecation_warning(wheel: tuple[Path, str]) -> None:
    built, log = wheel
    with zipfile.ZipFile(built) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        text = zf.read(license_file).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "license" not in " ".join(
        line for line in log.splitlines() if "Deprecat" in line
    ).lower(), log


def test_the_core_never_imports_samples_or_benchmarks() -> None:
    offenders = []
    for path in sorted((REPO / "txmsg").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in CHECKOUT_ONLY]
    assert not offenders
