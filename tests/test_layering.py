"""The package's layering, checked from its import statements (static, no imports run).

Every import counts: at the top of a module, inside functions and under
TYPE_CHECKING (a late import is still an arrow between two modules).  The
rules are the floor plan of docs/DESIGN.md ("Components"):

- no import cycles between modules, and no module imports another
  module's underscore names;
- no two modules share a base name (`ls` tells them apart), and no two
  public classes share a name (one name, one meaning);
- floors, from the bottom: the shared vocabulary (`errors`, `limits`,
  `batch_limits`, `types`, `paths`, `logs`, `crc`, `sockio`, `version`,
  `units`, `proto`), the byte formats (`formats/`), the cluster's control
  plane in etcd (`coord/`: the etcd client and the key schema, which the
  daemon and the client both speak), then the server, the client and
  staging side by side, then training (`training/`), then the adapters
  (`torch/`, `ring/`,
  `dlio/`, `fuse/`, `cli`), then tooling (`tools/`).  Nothing imports a
  floor above its own;
- the server never imports the client or staging, the client never the
  server, staging neither of them;
- inside the server: the core (`server/core/`) imports nothing else of the
  server; the read layer (`server/read/`) only the core; ingest
  (`server/ingest/`) only the core; the two front doors (`server/grpc/`,
  `server/datapath/`) never import each other;
- only the gRPC front door, the daemon that starts it, the client's
  gRPC transport (`client/transport/grpc_*`) and the etcd client
  (`coord/etcd_grpc`) import grpc or the generated messages;
- training and the adapters use the client's public API only: the
  `dlfs.client` package itself, never a module inside it.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = "dlfs"
NETWORK_PACKAGES = ("grpc", "grpc_health", "google.protobuf", "dlfs.proto")

VOCABULARY = {"dlfs", "dlfs.errors", "dlfs.limits", "dlfs.batch_limits", "dlfs.types",
              "dlfs.paths", "dlfs.logs", "dlfs.crc", "dlfs.sockio", "dlfs.version", "dlfs.units",
              "dlfs.native"}
# Floors, bottom first: (floor, module-name prefixes on it).
FLOORS = [
    ("vocabulary", tuple(VOCABULARY) + ("dlfs.proto",)),
    ("formats", ("dlfs.formats",)),
    ("coordination", ("dlfs.coord",)),
    ("server, client, staging", ("dlfs.server", "dlfs.client", "dlfs.staging")),
    ("training", ("dlfs.training",)),
    ("adapters", ("dlfs.torch", "dlfs.ring", "dlfs.dlio", "dlfs.fuse", "dlfs.cli")),
    ("tooling", ("dlfs.tools",)),
]
# Modules allowed to speak gRPC / protobuf.
GRPC_MODULES = ("dlfs.server.grpc", "dlfs.server.daemon", "dlfs.client.transport.grpc_",
                "dlfs.formats.grpc_chunks", "dlfs.proto", "dlfs.coord.etcd_grpc")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))
           if "_pb2" not in p.name}


def _in(name: str, *prefixes: str) -> bool:
    """`name` is one of `prefixes`, or a module below one (a prefix ending in `_` matches
    module names that start with it)."""
    return any(name == p or (p != PACKAGE and name.startswith(p if p.endswith("_") else p + "."))
               for p in prefixes)


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


def _arrows(name: str) -> list[tuple[str, int]]:
    """(module of dlfs imported, line) for every import of `name` inside the package."""
    return [(target, line) for target, _, line in _imports(name) if target in MODULES]


def _floor(name: str) -> int:
    for number, (_, prefixes) in enumerate(FLOORS):
        if _in(name, *prefixes):
            return number
    raise AssertionError(f"{name} is on no floor: add it to FLOORS")


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
    assert {"dlfs.client.client", "dlfs.server.store", "dlfs.fuse.fs",
            "dlfs.server.core.catalog", "dlfs.formats.datapath_frames"} <= set(MODULES)


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


def test_no_two_modules_share_a_name():
    names = collections.defaultdict(list)
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            names[path.stem].append(name)
    assert {stem: found for stem, found in names.items() if len(found) > 1} == {}


def test_no_two_public_classes_share_a_name():
    """Generated protobuf modules aside: their message names are the contract's."""
    defined = collections.defaultdict(list)
    for name, path in MODULES.items():
        if path.stem.endswith(("_pb2", "_pb2_grpc")):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined[node.name].append(name)
    assert {cls: found for cls, found in defined.items() if len(found) > 1} == {}


def test_every_module_is_on_a_floor():
    for name in MODULES:
        _floor(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_underscore_names_of_other_modules(name):
    private = [f"{target}.{taken} (line {line})"
               for target, names, line in _imports(name) if target.startswith(PACKAGE)
               for taken in names if taken.startswith("_") and not taken.startswith("__")]
    assert private == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_nothing_imports_a_floor_above_its_own(name):
    upward = [f"{target} ({FLOORS[_floor(target)][0]}, line {line})"
              for target, line in _arrows(name) if _floor(target) > _floor(name)]
    assert upward == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_server_client_and_staging_stay_apart(name):
    forbidden = {"dlfs.server": ("dlfs.client", "dlfs.staging"),
                 "dlfs.client": ("dlfs.server",),
                 "dlfs.staging": ("dlfs.server", "dlfs.client")}
    for side, others in forbidden.items():
        if _in(name, side):
            crossing = [f"{target} (line {line})" for target, line in _arrows(name)
                        if _in(target, *others)]
            assert crossing == []


def _server_layer(name: str) -> str | None:
    for layer in ("core", "read", "ingest", "grpc", "datapath"):
        if _in(name, f"dlfs.server.{layer}"):
            return layer
    return "facade" if _in(name, "dlfs.server") else None


# What each layer of the server may import of the server (besides itself).
SERVER_LAYER_MAY_IMPORT = {
    "core": set(),
    "read": {"core"},
    "ingest": {"core"},
    "grpc": {"core", "read", "ingest", "facade"},
    "datapath": {"core", "read", "ingest", "facade"},
    "facade": {"core", "read", "ingest", "grpc", "datapath", "facade"},
}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _in(n, "dlfs.server")))
def test_the_server_layers_import_only_below_them(name):
    layer = _server_layer(name)
    allowed = SERVER_LAYER_MAY_IMPORT[layer] | {layer}
    crossing = [f"{target} ({_server_layer(target)}, line {line})"
                for target, line in _arrows(name)
                if _in(target, "dlfs.server") and _server_layer(target) not in allowed]
    assert crossing == [], f"the {layer} layer may import {sorted(allowed)} of the server"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_grpc_edges_import_grpc(name):
    if _in(name, *GRPC_MODULES):
        return
    network = [f"{target} (line {line})" for target, _, line in _imports(name)
               if _in(target, *NETWORK_PACKAGES)]
    assert network == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES
                                        if _floor(n) >= _floor("dlfs.training")))
def test_training_and_adapters_use_the_public_client(name):
    inside = [f"{target} (line {line})" for target, line in _arrows(name)
              if _in(target, "dlfs.client") and target != "dlfs.client"]
    assert inside == []
