"""The public API: every exported name exists and is documented."""

from __future__ import annotations

import inspect

import pytest

import txmsg


@pytest.mark.parametrize("name", txmsg.__all__)
def test_exported_names_exist_and_have_docstrings(name: str) -> None:
    obj = getattr(txmsg, name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert inspect.getdoc(obj), f"txmsg.{name} needs a docstring"


def test_public_methods_are_documented() -> None:
    missing = [
        f"{cls.__name__}.{name}"
        for cls in (
            txmsg.TxMsg,
            txmsg.TransactionalProducer,
            txmsg.TxExecutor,
            txmsg.CheckDispatcher,
        )
        for name, member in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(member) and not inspect.getdoc(member)
    ]
    assert missing == []


def test_unknown_alias_spellings() -> None:
    assert txmsg.LocalTransactionState.UNKNOWN is txmsg.LocalTransactionState.UNKNOW
