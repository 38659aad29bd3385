"""The drawing of the layers in docs/design.md is the code's: every module of gateway/ (its subpackages included),
adapters/ and surfaces/ is in it once (a module's own name in the drawing wins over a package's glob), every import
(at module level, inside a function, or for type checking only) goes to the module's own layer or one below, the
imports form no cycle, and the adapters import nothing above the wire layer (no HTTP layer, no metrics, no
pipeline)."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "adapters", "surfaces")


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_dotted(path)] = path
    return found


MODULES = _modules()
# the compiled extensions (a C source beside its stub): leaves that import nothing of the project
EXTENSIONS = {_dotted(c) for p in PACKAGES for c in (ROOT / p).rglob("*.c")}


def _imported(package: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The project modules an import statement names (a package's attribute counts as the package)."""
    found: set[str] = set()
    if isinstance(node, ast.ImportFrom):
        module = package + (f".{node.module}" if node.module else "") if node.level else (node.module or "")
        for alias in node.names:
            if f"{module}.{alias.name}" in MODULES:
                found.add(f"{module}.{alias.name}")
            elif f"{module}.{alias.name}" in EXTENSIONS or module in EXTENSIONS:
                continue
            elif module in MODULES:
                found.add(module)
    else:
        for alias in node.names:
            parts = alias.name.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in MODULES:
                    found.add(".".join(parts[:i]))
                    break
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= _imported(package, node)
        edges.discard(name)
        graph[name] = edges
    return graph


def drawn_layers() -> dict[str, tuple[int, str]]:
    """``docs/design.md``'s drawing: ``<n> <layer name>  <module or glob> ...`` lines in the ```layers block."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block is not None, "docs/design.md has no ```layers drawing"
    layers: dict[str, tuple[int, str]] = {}
    for line in block.group(1).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        number, name, *patterns = line.split()
        for pattern in patterns:
            layers[pattern] = (int(number), name)
    return layers


def layer_of(module: str, layers: dict[str, tuple[int, str]]) -> tuple[int, str]:
    if module in layers:  # named on its own: a module drawn apart from its package's glob
        return layers[module]
    matches = [layer for pattern, layer in layers.items() if fnmatch.fnmatchcase(module, pattern)]
    assert len(matches) == 1, f"{module} is in {len(matches)} layers of the drawing"
    return matches[0]


def test_every_package_is_a_folder_of_the_drawing() -> None:
    """``ls gateway/`` shows the layers: each subpackage has a docstring saying what belongs there, and at the top
    of ``gateway/`` only the modules the drawing names one by one."""
    layers = drawn_layers()
    packages = [p for p in (ROOT / "gateway").iterdir() if (p / "__init__.py").is_file()]
    assert sorted(p.name for p in packages) == ["governance", "http", "observability", "routing", "wire"]
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert doc and "may import" in doc.lower(), f"{package.name}/__init__.py does not say what it may import"
        assert f"gateway.{package.name}.*" in layers or any(
            name.startswith(f"gateway.{package.name}.") for name in layers
        ), package.name
    top = sorted(p.stem for p in (ROOT / "gateway").glob("*.py"))
    assert top == ["__init__", "cli", "context", "core", "runtime", "settings"]


def test_every_module_is_drawn_once_and_every_drawn_name_exists() -> None:
    layers = drawn_layers()
    for module in MODULES:
        layer_of(module, layers)
    for pattern in layers:
        assert any(fnmatch.fnmatchcase(m, pattern) for m in MODULES), f"the drawing names {pattern}, not in the code"


def test_every_import_goes_down_or_sideways() -> None:
    layers = drawn_layers()
    upward = [
        f"{module} ({layer_of(module, layers)[1]}) imports {target} ({layer_of(target, layers)[1]})"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if layer_of(target, layers)[0] > layer_of(module, layers)[0]
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    graph = import_graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_adapters_import_only_the_wire_layer() -> None:
    layers = drawn_layers()
    wire = min(number for number, _ in layers.values())
    for module, targets in import_graph().items():
        if module.split(".")[0] != "adapters":
            continue
        for target in targets:
            if target.split(".")[0] == "gateway":
                assert layer_of(target, layers)[0] == wire, f"{module} imports {target}"
    assert layer_of("gateway.observability.metrics", layers)[0] > layer_of("adapters.base", layers)[0]


def test_the_checks_see_what_they_check() -> None:
    """The graph is not vacuous: known edges are in it, of each kind of import."""
    graph = import_graph()
    assert "gateway.wire.events" in graph["gateway.wire.sse"]  # module level
    assert "adapters._entra" in graph["adapters.claude"]  # inside a function
    assert "gateway.core" in graph["gateway.http.messages"]  # for type checking only
    assert "adapters" in graph["gateway.runtime"]  # a package's attribute
