"""The fuzz harness lives with the broker (txmsg_broker.fuzz) and uses only public names: the tests
import nothing from benchmarks/ and no ``_private`` name of the broker (issue 11 point 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(
    [
        *(REPO / "tests" / "fuzz").glob("*.py"),
        *(REPO / "plugins" / "txmsg-broker" / "txmsg_broker" / "fuzz").glob("*.py"),
    ]
)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_benchmarks_and_no_private_broker_names(path: Path) -> None:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "benchmarks"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "benchmarks":
                found.append(node.module)
            elif node.module.split(".")[0] == "txmsg_broker":
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not found, f"{path.name} imports {found}"
