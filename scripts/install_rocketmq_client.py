"""Place librocketmq 2.1.0 where rocketmq-client-python 2.0.0 loads it.

Why: the wrapper on PyPI (``rocketmq-client-python==2.0.0``) ships no native library, and
librocketmq 2.0.0 silently drops every transaction check-back.  The PyPI sdist
``rocketmq-python-cvs==2.1.0.3`` carries a ``librocketmq.so`` built from rocketmq-client-cpp
2.1.0.  We download that sdist from the package index with pip, verify both sha256 values, and
copy the library next to the wrapper's ``ffi.py`` (which loads it from its own folder first).

Idempotent: when the installed library already has the expected hash, nothing is downloaded.
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

SDIST = "rocketmq-python-cvs==2.1.0.3"
SDIST_SHA256 = "99e4ce8008554a74193a3ad94b60f939a4666c48ffabbf4c4417a109daf1419d"
LIB_SHA256 = "ed3fce39f2b926637637a2b8b9122799f207b0cdf98dbd9110505bf43170fa30"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def wrapper_dir() -> Path:
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "rocketmq-client-python is not installed in this interpreter; "
            "run `make setup` (it installs it with the project's dependencies)."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def main() -> int:
    target = wrapper_dir() / "librocketmq.so"
    if target.exists() and sha256(target) == LIB_SHA256:
        print(f"librocketmq 2.1.0 already in place: {target}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--quiet", "-d", tmp, SDIST],
            check=True,
        )
        archives = list(Path(tmp).glob("rocketmq*python*cvs*2.1.0.3*.tar.gz"))
        if len(archives) != 1:
            sys.exit(f"expected one sdist of {SDIST} in {tmp}, found {archives}")
        archive = archives[0]
        got = sha256(archive)
        if got != SDIST_SHA256:
            sys.exit(f"sha256 mismatch for {archive.name}: got {got}, expected {SDIST_SHA256}")
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith("rocketmq/librocketmq.so")]
            if len(members) != 1:
                sys.exit(f"{archive.name} does not contain rocketmq/librocketmq.so")
            extracted = tar.extractfile(members[0])
            assert extracted is not None
            staged = Path(tmp) / "librocketmq.so"
            with staged.open("wb") as out:
                shutil.copyfileobj(extracted, out)
        got = sha256(staged)
        if got != LIB_SHA256:
            sys.exit(f"sha256 mismatch for librocketmq.so: got {got}, expected {LIB_SHA256}")
        shutil.copy2(staged, target)
        target.chmod(0o755)
    print(f"installed librocketmq 2.1.0 (sha256 verified) at {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
