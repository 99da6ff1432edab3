"""``txmsg install-librocketmq``: put librocketmq 2.1.0 where rocketmq-client-python 2.0.0 loads it.

Why: the wrapper on PyPI (``rocketmq-client-python==2.0.0``) ships no native library, and
librocketmq 2.0.0 silently drops every transaction check-back.  The PyPI sdist
``rocketmq-python-cvs==2.1.0.3`` carries a ``librocketmq.so`` built from rocketmq-client-cpp
2.1.0.  The command downloads that sdist with pip, verifies both sha256 values, and copies the
library next to the wrapper's ``ffi.py`` (which loads it from its own folder first).

Idempotent: when the installed library already has the expected hash, nothing is downloaded.
Part of the installed package (not a script of the source checkout), so a pip user of
``txmsg[rocketmq]`` runs the same step ``make setup`` runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import click

SDIST = "rocketmq-python-cvs==2.1.0.3"
SDIST_SHA256 = "99e4ce8008554a74193a3ad94b60f939a4666c48ffabbf4c4417a109daf1419d"
LIB_SHA256 = "ed3fce39f2b926637637a2b8b9122799f207b0cdf98dbd9110505bf43170fa30"
COMMAND = "txmsg install-librocketmq"
"""What every message about a missing or wrong librocketmq tells the user to run."""


class InstallError(click.ClickException):
    """The library could not be put in place; the message says why and what to do."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def wrapper_dir() -> Path:
    """The folder of rocketmq-client-python's ``ffi.py`` (found without importing it)."""
    spec = importlib.util.find_spec("rocketmq")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for location in locations:
        if (Path(location) / "ffi.py").is_file():
            return Path(location)
    raise InstallError(
        "rocketmq-client-python 2.0.0 is not installed in this interpreter "
        f"({sys.executable}); run `pip install 'txmsg[rocketmq]'` first"
    )


def _extract(archive: Path, staged: Path) -> None:
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.endswith("rocketmq/librocketmq.so")]
        if len(members) != 1:
            raise InstallError(f"{archive.name} does not contain rocketmq/librocketmq.so")
        extracted = tar.extractfile(members[0])
        if extracted is None:
            raise InstallError(f"{members[0].name} in {archive.name} is not a regular file")
        with staged.open("wb") as out:
            shutil.copyfileobj(extracted, out)


def install(target_dir: Path | None = None) -> tuple[Path, bool]:
    """Put the verified library into ``target_dir`` (default: the wrapper's folder).

    Returns the library's path and whether it was downloaded (False: already in place).
    Raises :class:`InstallError` on a failed download or a hash mismatch (nothing is replaced).
    """
    target = (target_dir or wrapper_dir()) / "librocketmq.so"
    if target.exists() and sha256(target) == LIB_SHA256:
        return target, False
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(  # noqa: S603 - this interpreter's pip with fixed arguments
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--quiet",
                "-d",
                tmp,
                SDIST,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise InstallError(
                f"`pip download {SDIST}` failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()[-800:]}. Check that this machine reaches the package index "
                f"(or set PIP_INDEX_URL), then run `{COMMAND}` again"
            )
        archives = list(Path(tmp).glob("rocketmq*python*cvs*2.1.0.3*.tar.gz"))
        if len(archives) != 1:
            raise InstallError(f"expected one sdist of {SDIST}, pip left {sorted(archives)}")
        got = sha256(archives[0])
        if got != SDIST_SHA256:
            raise InstallError(
                f"sha256 mismatch for {archives[0].name}: got {got}, expected {SDIST_SHA256}; "
                "the package index served a different file: nothing was installed"
            )
        staged = Path(tmp) / "librocketmq.so"
        _extract(archives[0], staged)
        got = sha256(staged)
        if got != LIB_SHA256:
            raise InstallError(
                f"sha256 mismatch for librocketmq.so: got {got}, expected {LIB_SHA256}"
            )
        shutil.copy2(staged, target)
        target.chmod(0o755)
    return target, True


@click.command("install-librocketmq")
def install_librocketmq() -> None:
    """Download librocketmq 2.1.0, verify its sha256 and put it next to rocketmq-client-python."""
    target, downloaded = install()
    if downloaded:
        click.echo(f"installed librocketmq 2.1.0 (sha256 verified) at {target}")
    else:
        click.echo(f"librocketmq 2.1.0 already in place: {target}")
