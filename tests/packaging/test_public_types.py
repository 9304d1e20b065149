"""src/dlfs/__init__.pyi (what type checkers see of `dlfs`) names exactly the package's
public names, each from the module that defines it."""

from __future__ import annotations

import ast
import importlib
import pathlib

import dlfs

STUB = pathlib.Path(dlfs.__file__).with_suffix(".pyi")


def stub_imports() -> dict[str, str]:
    """name -> module, for every `from MODULE import NAME as NAME` of the stub."""
    found = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
                found[alias.name] = node.module
    return found


def test_the_stub_names_every_public_name_and_nothing_else():
    assert set(stub_imports()) == set(dlfs.__all__) | {"__version__"}


def test_each_name_comes_from_where_the_stub_says():
    for name, module in stub_imports().items():
        assert getattr(dlfs, name) is getattr(importlib.import_module(module), name), name
