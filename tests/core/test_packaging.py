"""What each distribution puts into site-packages (issue 24.1; before it, issue 11 points 6-7).

Every distribution's wheel is built from a copy of the checkout (so no build/ or egg-info appears
in the working tree) without build isolation (no download: the dev extra installs setuptools>=77),
and its contents and metadata are read.  Two tests install wheels into a clean virtual environment
(dependencies from the package index, through pip's cache) and run what a pip user runs there.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_topic

REPO = Path(__file__).resolve().parents[2]
DISTS: dict[str, tuple[str, str]] = {
    # project directory: (distribution, its one top-level import package)
    ".": ("txmsg", "txmsg"),
    "plugins/txmsg-rocketmq": ("txmsg-rocketmq", "txmsg_rocketmq"),
    "plugins/txmsg-rocketmq5": ("txmsg-rocketmq5", "txmsg_rocketmq5"),
    "plugins/txmsg-broker": ("txmsg-broker", "txmsg_broker"),
    "spark": ("txmsg-health", "txmsg_health"),
    "samples": ("txmsg-samples", "txmsg_samples"),
}
PRIVATE = "benchmarks"
"""The checkout's benchmarks: a distribution for the dev venv only, never built here."""


def _checkout_copy(dest: Path) -> Path:
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a file deleted in the working tree is still in the index
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)  # follows the LICENSE symlinks
    return dest


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """distribution -> (its wheel, the build log)."""
    base = tmp_path_factory.mktemp("packaging")
    source = _checkout_copy(base / "src")
    out = base / "dist"
    built: dict[str, tuple[Path, str]] = {}
    for directory, (dist, _package) in DISTS.items():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-w",
                str(out),
                str(source / directory),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (wheel,) = out.glob(f"{dist.replace('-', '_')}-*.whl")
        built[dist] = (wheel, proc.stdout + proc.stderr)
    return built


def _metadata(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode())


def _entry_points(wheel: Path) -> list[tuple[str, str, str]]:
    """(group, name, value) of every entry point the wheel declares."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(names[0]).decode() if names else ""
    found, group = [], ""
    for line in text.splitlines():
        if line.startswith("["):
            group = line.strip("[]")
        elif "=" in line:
            name, _, value = line.partition("=")
            found.append((group, name.strip(), value.strip()))
    return found


@pytest.mark.parametrize(("directory", "dist", "package"), [(d, *v) for d, v in DISTS.items()])
def test_each_wheel_holds_only_its_own_top_level_package(
    wheels: dict[str, tuple[Path, str]], directory: str, dist: str, package: str
) -> None:
    wheel, _ = wheels[dist]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {package}, f"{wheel.name}: {sorted(top)}"
    assert not [n for n in names if "/tests/" in n], "tests are not shipped"


@pytest.mark.parametrize("dist", [v[0] for v in DISTS.values()])
def test_every_installed_command_and_plugin_points_into_its_own_wheel(
    wheels: dict[str, tuple[Path, str]], dist: str
) -> None:
    wheel, _ = wheels[dist]
    with zipfile.ZipFile(wheel) as zf:
        modules = {
            n[:-3].replace("/", ".").removesuffix(".__init__")
            for n in zf.namelist()
            if n.endswith(".py")
        }
    for group, name, value in _entry_points(wheel):
        module = value.split(":")[0].strip()
        assert module in modules, (
            f"{dist}: entry point {group}:{name} = {value} names a module it does not ship"
        )


@pytest.mark.parametrize("dist", [v[0] for v in DISTS.values()])
def test_every_wheel_carries_the_license_without_a_deprecation_warning(
    wheels: dict[str, tuple[Path, str]], dist: str
) -> None:
    wheel, log = wheels[dist]
    with zipfile.ZipFile(wheel) as zf:
        license_file = next(n for n in zf.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
        text = zf.read(license_file).decode()
    assert _metadata(wheel)["License-Expression"] == "Apache-2.0"
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert (
        "license" not in " ".join(line for line in log.splitlines() if "Deprecat" in line).lower()
    ), log


def _requirements(wheel: Path) -> list[str]:
    return list(_metadata(wheel).get_all("Requires-Dist") or [])


def test_the_core_requires_no_part_but_through_an_extra(
    wheels: dict[str, tuple[Path, str]],
) -> None:
    wheel, _ = wheels["txmsg"]
    plain = [r for r in _requirements(wheel) if "extra ==" not in r]
    assert not [
        r for r in plain if r.lower().startswith(("txmsg", "rocketmq", "pyspark", "grpc"))
    ], plain
    extras = set(_metadata(wheel).get_all("Provides-Extra") or [])
    assert {"rocketmq", "rocketmq5", "broker", "health", "demo"} <= extras


def test_a_rocketmq5_user_gets_neither_the_broker_nor_spark(
    wheels: dict[str, tuple[Path, str]],
) -> None:
    """The closure of ``txmsg[rocketmq5]`` over our own distributions."""
    by_name = {dist: wheel for dist, (wheel, _log) in wheels.items()}
    core_extra = [r for r in _requirements(by_name["txmsg"]) if 'extra == "rocketmq5"' in r]
    todo = [re.split(r"[=<>\[; ]", r)[0] for r in core_extra]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in by_name:
            todo += [
                re.split(r"[=<>\[; ]", r)[0]
                for r in _requirements(by_name[name])
                if "extra ==" not in r
            ]
    assert "txmsg-rocketmq5" in seen
    assert not seen & {
        "txmsg-broker",
        "txmsg-health",
        "txmsg-rocketmq",
        "pyspark",
        "rocketmq-client-python",
    }, seen


def _version(pyproject: Path) -> str:
    version: str = tomllib.loads(pyproject.read_text())["project"]["version"]
    return version


def test_one_version_everywhere() -> None:
    version = _version(REPO / "pyproject.toml")
    for directory in [*DISTS, PRIVATE]:
        project = tomllib.loads((REPO / directory / "pyproject.toml").read_text())["project"]
        assert project["version"] == version, directory
        deps = [
            *project.get("dependencies", []),
            *(d for ds in project.get("optional-dependencies", {}).values() for d in ds),
        ]
        for dep in deps:
            if dep.startswith("txmsg") and not dep.startswith(
                f"{project['name']}["
            ):  # not a self-reference
                assert dep.endswith(f"=={version}"), (
                    f"{directory}: {dep} (our parts pin the one version)"
                )
    top = re.search(r"^## \[?([0-9][^\] \n]*)", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert top is not None
    assert top.group(1) == version


def test_the_core_never_imports_a_part() -> None:
    parts = {package for _dist, package in DISTS.values()} - {"txmsg"} | {
        "samples",
        PRIVATE,
        "rocketmq",
    }
    offenders = []
    for path in sorted((REPO / "txmsg").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in parts
            ]
    assert not offenders


# ---- clean virtual environments -------------------------------------------------------------------


def _clean_venv(where: Path, wheels: dict[str, tuple[Path, str]], *requirements: str) -> Path:
    """A venv without system site-packages holding ``requirements`` from our wheels (and their
    dependencies from the package index)."""
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    links = sorted({str(wheel.parent) for wheel, _log in wheels.values()})
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            *(f"--find-links={d}" for d in links),
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_FIND_LINKS",
        "PIP_CONFIG_FILE",
    )
    return {**{k: v for k, v in os.environ.items() if k in keep}, **extra}


@pytest.mark.slow
def test_core_plus_rocketmq5_run_the_readme_example_on_a_grpc_endpoint(
    wheels: dict[str, tuple[Path, str]], txmsg_grpc_broker: Any, tmp_path: Path
) -> None:
    python = _clean_venv(tmp_path / "venv", wheels, "txmsg", "txmsg-rocketmq5")
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert "txmsg-rocketmq5==" in listed
    assert not [
        p
        for p in ("txmsg-broker", "txmsg-health", "pyspark", "rocketmq-client-python")
        if f"{p}==" in listed
    ]
    create_topic(txmsg_grpc_broker.namesrv_addr, "orders", message_type="TRANSACTION")
    text = (REPO / "README.md").read_text()
    found = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S)
    assert found is not None
    (tmp_path / "example.py").write_text(found.group(1))
    done = subprocess.run(
        [str(python), "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=_clean_env(
            tmp_path, TXMSG_BACKEND="rocketmq5", TXMSG_ENDPOINTS=txmsg_grpc_broker.grpc_endpoint
        ),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"(?:LocalTransactionState\.)?COMMIT [0-9A-Za-z]+", done.stdout)) == 1, (
        done.stdout
    )


@pytest.mark.slow
def test_txmsg_demo_runs_for_a_pip_user(
    wheels: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    """The demo's distributions: txmsg[demo] = txmsg + txmsg-samples + txmsg-broker + txmsg-rocketmq,
    then the installed command that puts librocketmq in place."""
    python = _clean_venv(tmp_path / "venv", wheels, "txmsg[demo]")
    txmsg = str(python.parent / "txmsg")
    env = _clean_env(tmp_path, ROCKETMQ_CLIENT_LOG_DIR=str(tmp_path / "client-logs"))
    installed = subprocess.run(
        [txmsg, "install-librocketmq"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    helped = subprocess.run(
        [txmsg, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    )
    assert "unavailable" not in helped.stdout
    assert {"chaos", "bench"}.isdisjoint(re.findall(r"^  (\w[\w-]*)", helped.stdout, re.M)), (
        helped.stdout
    )
    done = subprocess.run(
        [txmsg, "demo", "--orders", "20"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "CONSISTENT" in done.stdout
