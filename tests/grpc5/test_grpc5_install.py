"""Issue 13.5: rocketmq-client-python 2.0.0 and rocketmq-python-client 5.x share the top-level
``rocketmq`` package; after ``scripts/setup.sh`` both import in .venv, and ``txmsg doctor`` says so
(or says how to fix it)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from txmsg_broker.grpc import doctor

from txmsg.app import backend_entry_points

ROOT = Path(__file__).resolve().parents[2]


def test_both_rocketmq_clients_import_in_this_environment():
    code = (
        "import rocketmq.client, rocketmq.ffi\n"  # 2.0.0 over librocketmq
        "from rocketmq.grpc_protocol import service_pb2_grpc as s\n"
        "from rocketmq import Producer, TransactionChecker, SimpleConsumer\n"  # 5.x
        "assert hasattr(s, 'MessagingServiceServicer') and hasattr(s, 'add_MessagingServiceServicer_to_server')\n"
        "print(rocketmq.client.Producer.__module__, Producer.__module__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rocketmq.client", "rocketmq.v5.producer.producer"]


def test_doctor_reports_the_combination_ok():
    rows = doctor.report()
    assert rows, rows
    assert all(ok for _label, _detail, ok in rows), rows
    assert any(label == "rocketmq.client (2.0.0) imports" for label, _d, _ok in rows)


def test_doctor_names_the_fix_for_a_broken_init(monkeypatch, tmp_path):
    fake = tmp_path / "rocketmq"
    fake.mkdir()
    (fake / "__init__.py").write_text("# rocketmq-client-python 2.0.0's __init__\n")

    class Spec:
        origin = str(fake / "__init__.py")

    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: Spec())
    rows = {label: (detail, ok) for label, detail, ok in doctor.report()}
    detail, ok = rows["rocketmq/__init__.py"]
    assert not ok
    assert "pip install --no-deps --force-reinstall rocketmq-python-client==" in detail


def test_setup_reinstalls_the_5x_client_last_and_keeps_librocketmq():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    reinstall = script.index("--force-reinstall \"rocketmq-python-client==$rocketmq5\"")
    assert script.index("pip install --quiet -e '.[dev]'") < reinstall
    assert reinstall < script.index("scripts/install_rocketmq_client.py")
    assert (Path(doctor.importlib.util.find_spec("rocketmq").origin).parent / "librocketmq.so").exists()


def test_doctor_check_is_registered_under_a_name_that_is_no_backend():
    (ep,) = [e for e in importlib.metadata.entry_points(group="txmsg.doctor_checks") if e.value == "txmsg_broker.grpc.doctor:report"]
    assert ep.name not in {b.name for b in backend_entry_points()}  # so it runs whatever the backend
