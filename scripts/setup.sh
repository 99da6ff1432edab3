#!/usr/bin/env bash
# One idempotent set-up step shared by `make demo` and `make test`.
# Installs system packages (Java for Spark, PostgreSQL, Chromium for the dashboard test),
# a virtual environment in .venv with every Python dependency, and librocketmq 2.1.0.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
STAMP=.venv/.txmsg-setup-stamp

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] apt-get install ${need_apt[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "[setup] missing system packages: ${need_apt[*]} (run as root or install them with sudo apt-get install)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "[setup] installing Python dependencies into .venv"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  touch "$STAMP"
fi

# samples/ and benchmarks/ are not installed packages (pip install . leaves them out); they run
# from this checkout. A .pth file installs a finder that maps exactly these two names to the
# checkout, so `txmsg demo`, `txmsg chaos` and `txmsg bench` (entry points in group
# txmsg.commands) import from any directory. A finder, not a plain path entry: a path entry comes
# after site-packages, where rocketmq-client-python 2.0.0 installs a top-level `samples` of its own.
site_packages=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
finder=$(cat <<PY
"""Written by scripts/setup.sh of the txmsg checkout $PWD: maps its samples and benchmarks
packages (not installed; they run from the checkout) for this virtual environment."""

import importlib.machinery
import sys

CHECKOUT = "$PWD"
NAMES = frozenset({"samples", "benchmarks"})


class CheckoutFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in NAMES:
            return importlib.machinery.PathFinder.find_spec(fullname, [CHECKOUT])
        return None


def install():
    if CheckoutFinder not in sys.meta_path:
        sys.meta_path.insert(0, CheckoutFinder)
PY
)
if [ "$(cat "$site_packages/_txmsg_checkout.py" 2>/dev/null)" != "$finder" ]; then
  echo "[setup] $site_packages/txmsg-checkout.pth: samples and benchmarks from $PWD"
  printf '%s\n' "$finder" >"$site_packages/_txmsg_checkout.py"
  echo "import _txmsg_checkout; _txmsg_checkout.install()" >"$site_packages/txmsg-checkout.pth"
fi

# rocketmq-python-client 5.x (the gRPC client, extra `grpc`) and rocketmq-client-python 2.0.0 both
# install a top-level `rocketmq` package; whichever pip wrote last owns rocketmq/__init__.py. With
# 2.0.0's on top the 5.x client cannot import itself; with the 5.x one on top both import. So
# reinstall the 5.x client (the version pip resolved from pyproject, from pip's cache) whenever its
# __init__.py is not the one on disk: after a fresh install, or after anything reinstalled 2.0.0.
# The librocketmq.so put next to 2.0.0's ffi.py below is in neither package's file list: it stays.
rocketmq_init="$site_packages/rocketmq/__init__.py"
rocketmq5=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("rocketmq-python-client"))' 2>/dev/null || true)
if [ -n "$rocketmq5" ] && ! grep -qs "from .v5" "$rocketmq_init"; then
  echo "[setup] rocketmq-python-client $rocketmq5 reinstalled last (its rocketmq/__init__.py must win over 2.0.0's)"
  .venv/bin/python -m pip install --quiet --no-deps --force-reinstall "rocketmq-python-client==$rocketmq5"
fi

.venv/bin/python scripts/install_rocketmq_client.py
