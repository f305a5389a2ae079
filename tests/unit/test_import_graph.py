"""The architecture, as the import graph shows it (docs/architecture.md, "Where the code lives").

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from … import`` of
contract/, controller/ and runner_image/, at module level or inside functions alike; only imports
under ``if TYPE_CHECKING:`` are left out, since they never run.

- contract/ imports only the standard library (and itself): both sides can take it anywhere;
- the controller imports nothing of runner_image/, and runner_image/ nothing of the controller;
- no import cycle between controller modules (an import of ``a.b.c`` also runs ``a/__init__`` and
  ``a/b/__init__``, unless the importer is inside them);
- only the Swarm adapter imports docker;
- the controller imports none of the runner's libraries (its install and image do not carry them);
- controller's packages (and its top-level modules) form layers: no two of them import each other,
  nothing imports ``controller.cli`` (the top), ``controller.run`` never imports ``controller.serve``,
  and ``DockerSwarm`` is constructed only by the composition roots (cli/, the serve daemon);
- a module of the three packages longer than 400 lines is a flag to read, not a wall: it is listed in
  LONG_MODULES with why one module reads better there than a split would (a split along a real seam
  is the other answer), and taken off once it is short again.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "controller", "runner_image")
SWARM_ADAPTER = {
    "controller.swarm.docker",
    "controller.swarm.admin",
    "controller.swarm.events",
    "controller.swarm.network",
}
MAX_LINES = 400
# Modules longer than MAX_LINES, each with why it reads better as one module than split.
LONG_MODULES = {
    "contract/manifest.py": "the manifest and the checks of its tuning fields: one dataclass that checks itself",
    "controller/volume.py": "every descriptor-walking operation beneath the data root: one place to audit for links",
}

# Where DockerSwarm may be built: the CLI (the composition root) and the serve daemon (controller/serve/).
SWARM_BUILDERS = ("controller.cli", "controller.serve")


@dataclass(frozen=True)
class Import:
    target: str  # the dotted name as imported: a module, or a module's attribute
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` (their ``else:`` runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child.test):
            for stmt in child.orelse:
                yield stmt
                yield from _walk(stmt)
            continue
        yield child
        yield from _walk(child)


def imports(module: str, path: Path) -> list[Import]:
    is_package = path.name == "__init__.py"
    out: list[Import] = []
    for node in _walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [Import(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base == "__future__":
                continue
            out += [Import(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


def resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that an imported name lives in (``a.b.name`` → ``a.b``), if any."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def edges(module: str, target: str, modules: dict[str, Path]) -> set[str]:
    """What importing ``target`` runs: its module and the packages above it the importer is not in."""
    found = resolve(target, modules)
    if found is None:
        return set()
    parts = found.split(".")
    out = {found}
    for n in range(1, len(parts)):
        package = ".".join(parts[:n])
        if not (module == package or module.startswith(package + ".")):
            out.add(package)
    return out - {module}


def graph() -> dict[str, dict[str, int]]:
    """Module → {module it runs by importing: first line}, over our three packages."""
    modules = sources()
    out: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        deps: dict[str, int] = {}
        for imp in imports(module, path):
            for dep in edges(module, imp.target, modules):
                deps.setdefault(dep, imp.line)
        out[module] = deps
    return out


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def all_imports() -> Iterator[tuple[str, Path, Import]]:
    for module, path in sources().items():
        for imp in imports(module, path):
            yield module, path, imp


def where(path: Path, imp: Import) -> str:
    return f"{path.relative_to(ROOT)}:{imp.line}: {imp.target}"


def test_contract_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"contract"}
    bad = [
        where(path, imp)
        for module, path, imp in all_imports()
        if module.split(".")[0] == "contract" and imp.target.split(".")[0] not in allowed
    ]
    assert not bad, "contract/ must import only the standard library:\n" + "\n".join(bad)


def test_controller_and_runner_never_import_each_other() -> None:
    other = {"controller": "runner_image", "runner_image": "controller"}
    bad = [
        where(path, imp)
        for module, path, imp in all_imports()
        if other.get(module.split(".")[0]) == imp.target.split(".")[0]
    ]
    assert not bad, "what both sides need lives in contract/:\n" + "\n".join(bad)


def test_only_the_swarm_adapter_imports_docker() -> None:
    bad = [
        where(path, imp)
        for module, path, imp in all_imports()
        if imp.target.split(".")[0] == "docker" and module not in SWARM_ADAPTER
    ]
    assert not bad, f"only {sorted(SWARM_ADAPTER)} may import docker:\n" + "\n".join(bad)


RUNNER_LIBRARIES = {"cv2", "numpy", "onnxruntime", "onnx", "insightface", "scipy", "skimage"}
# Imports of a runner library the controller makes only when it is there (``except ImportError``).
OPTIONAL_RUNNER_IMPORTS = {
    ("controller.models", "onnx"),  # `models verify` checks each model's I/O with it; skipped without
}


def test_the_controller_imports_no_runner_library() -> None:
    bad = [
        where(path, imp)
        for module, path, imp in all_imports()
        if module.split(".")[0] == "controller"
        and imp.target.split(".")[0] in RUNNER_LIBRARIES
        and (module, imp.target.split(".")[0]) not in OPTIONAL_RUNNER_IMPORTS
    ]
    assert not bad, "only the runner imports these (the controller lock has none):\n" + "\n".join(bad)


def test_no_import_cycle_between_controller_modules() -> None:
    g = graph()
    controller = {m: {d: n for d, n in deps.items() if d.split(".")[0] == "controller"} for m, deps in g.items()}
    found = cycles({m: deps for m, deps in controller.items() if m.split(".")[0] == "controller"})
    assert not found, "import cycles (break them at their root):\n" + "\n".join(" ↔ ".join(c) for c in found)


def layer(module: str) -> str | None:
    """The package rules' unit: a subpackage of controller or one of its top-level modules."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "controller" and len(parts) > 1 else None


def layer_edges(g: dict[str, dict[str, int]]) -> dict[tuple[str, str], list[str]]:
    """(importing layer, imported layer) → the module imports that make the edge."""
    out: dict[tuple[str, str], list[str]] = {}
    for module, deps in g.items():
        a = layer(module)
        for dep, line in deps.items():
            b = layer(dep)
            if a is not None and b is not None and a != b:
                out.setdefault((a, b), []).append(f"{module}:{line} → {dep}")
    return out


def two_way(edges: dict[tuple[str, str], list[str]]) -> dict[frozenset[str], list[str]]:
    return {frozenset((a, b)): edges[(a, b)] + edges[(b, a)] for a, b in edges if a < b and (b, a) in edges}


def test_no_two_packages_import_each_other() -> None:
    found = two_way(layer_edges(graph()))
    assert not found, "packages that import each other (move what both need to a leaf below them):\n" + "\n".join(
        f"{' ⇄ '.join(sorted(pair))}: {', '.join(why)}" for pair, why in found.items()
    )


def test_nothing_imports_the_cli_and_run_never_imports_serve() -> None:
    edges = layer_edges(graph())
    bad = [why for (a, b), whys in edges.items() for why in whys if b == "controller.cli"]
    bad += [why for (a, b), whys in edges.items() for why in whys if (a, b) == ("controller.run", "controller.serve")]
    assert not bad, "the CLI is the top, and serve sits above run:\n" + "\n".join(bad)


def _names_docker_swarm(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "DockerSwarm") or (
        isinstance(node, ast.Attribute) and node.attr == "DockerSwarm"
    )


def swarm_builds(path: Path) -> list[int]:
    """Lines that build a DockerSwarm: a call of it, or it handed to a call (functools.partial)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call) and any(_names_docker_swarm(n) for n in (node.func, *node.args))
    ]


def test_only_the_composition_roots_build_docker_swarm() -> None:
    def allowed(module: str) -> bool:
        return module == "controller.swarm.docker" or any(
            module == root or module.startswith(root + ".") for root in SWARM_BUILDERS
        )

    builds = {m: lines for m, p in sources().items() if (lines := swarm_builds(p))}
    bad = [f"{m}: lines {lines}" for m, lines in builds.items() if not allowed(m)]
    assert not bad, f"only {SWARM_BUILDERS} build DockerSwarm; hand the backend down instead:\n" + "\n".join(bad)
    assert any(m.startswith("controller.cli.") for m in builds)  # the finder sees real builds


def long_modules() -> dict[str, int]:
    return {
        str(p.relative_to(ROOT)): n for p in sources().values() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }


def test_a_module_over_the_line_flag_says_why_it_is_one_module() -> None:
    long = long_modules()
    unsaid = {m: n for m, n in long.items() if m not in LONG_MODULES}
    assert not unsaid, (
        f"over {MAX_LINES} lines: split along a real seam, or add to LONG_MODULES why one module reads better: {unsaid}"
    )
    short = [m for m in LONG_MODULES if m not in long]
    assert not short, f"no longer over {MAX_LINES} lines, take them off LONG_MODULES: {short}"


# --- the checker itself ----------------------------------------------------------------------------


def test_the_graph_sees_real_imports() -> None:
    """Guards against a vacuous pass: known edges of each kind are found."""
    g = graph()
    assert "controller.run.supervisor" in g["controller.run.usecase"]  # from controller.run.supervisor import …
    assert "controller.run.join" in g["controller.run.usecase"]  # from controller.run import join
    assert "controller.job" in g["controller.run.jobs"]  # runs controller/job/__init__.py on the way
    assert "controller.run.usecase" in g["controller.serve.jobs"]  # serve runs jobs through the use case
    assert "controller.cli.main" in g["controller.cli"]  # a package's own __init__ importing its module
    assert "controller.cli" not in g["controller.cli.jobs"]  # … is not an edge back from inside it
    assert "contract.manifest" in g["contract.identity"]
    assert "runner_image.errors" in g["runner_image.pack"]  # relative: from .errors import …


def test_two_way_finder() -> None:
    g = {"controller.a.x": {"controller.b.y": 1}, "controller.b.y": {"controller.a.z": 2}, "controller.c": {}}
    g["controller.c"] = {"controller.a.x": 3}
    assert set(two_way(layer_edges(g))) == {frozenset({"controller.a", "controller.b"})}


def test_cycle_finder() -> None:
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_type_checking_imports_are_left_out(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import docker\nelse:\n    import json\n"
        "def f():\n    import controller.run.jobs\n"
    )
    assert [i.target for i in imports("m", source)] == ["typing.TYPE_CHECKING", "json", "controller.run.jobs"]
