"""The package's layering, checked from its import statements (static, no imports run).

Rules (docs/DESIGN.md, "Layers"):
- no import cycles between modules of `dlfs`, counting imports inside
  functions and under TYPE_CHECKING too: a cycle hidden behind a late
  import is still two modules that cannot be understood apart;
- no module imports another module's underscore names;
- the daemon's storage core never imports grpc or the generated messages:
  only the modules that face the network (service, daemon, interceptor,
  convert, main) do;
- nothing outside `dlfs.server` imports `dlfs.server`: the client, the
  mount and the training adapters share formats through `dlfs.layout`,
  `dlfs.errors`, `dlfs.limits` and the other top-level modules.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = "dlfs"
# dlfs.server modules that translate between the network and the storage core.
SERVER_NETWORK_MODULES = {"dlfs.server.service", "dlfs.server.daemon", "dlfs.server.interceptor",
                          "dlfs.server.convert", "dlfs.server.main",
                          "dlfs.server.decisions"}
NETWORK_PACKAGES = ("grpc", "grpc_health", "google.protobuf", "dlfs.proto")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))
           if "_pb2" not in p.name}


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import statement of `name`."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            taken = []
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.append((f"{base}.{alias.name}", [], node.lineno))
                else:
                    taken.append(alias.name)
            if taken:
                found.append((base, taken, node.lineno))
    return found


GRAPH = {name: sorted({target for target, _, _ in _imports(name) if target in MODULES})
         for name in MODULES}


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                result.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return result


def test_the_package_has_modules_to_check():
    assert {"dlfs.client.client", "dlfs.server.store", "dlfs.fuse.fs"} <= set(MODULES)


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_underscore_names_of_other_modules(name):
    private = [f"{target}.{taken} (line {line})"
               for target, names, line in _imports(name) if target.startswith(PACKAGE)
               for taken in names if taken.startswith("_") and not taken.startswith("__")]
    assert private == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("dlfs.server.")
                                        and n not in SERVER_NETWORK_MODULES))
def test_the_storage_core_does_not_import_the_network(name):
    network = [f"{target} (line {line})" for target, _, line in _imports(name)
               if target.startswith(NETWORK_PACKAGES)]
    assert network == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith("dlfs.server")))
def test_nothing_outside_the_server_imports_it(name):
    server = [f"{target} (line {line})" for target, _, line in _imports(name)
              if target == "dlfs.server" or target.startswith("dlfs.server.")]
    assert server == []
