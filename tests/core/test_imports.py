"""The library's import graph (issue 44): no module imports another module's private name, and
no two modules import each other, directly or through others (a function-level import that
hides a cycle counts; an import under `if TYPE_CHECKING:` does not). Pure Python, no JAX."""

import ast
from pathlib import Path

import jaxrl_suite

ROOT = Path(jaxrl_suite.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST):
    """ImportFrom / Import nodes, skipping the bodies of `if TYPE_CHECKING:`."""
    out = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for orelse in child.orelse:
                    visit(orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.append(child)
            visit(child)

    visit(tree)
    return out


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _reexports(package: str) -> dict[str, str]:
    """name -> defining module, for the names a package's __init__ imports from its modules."""
    out = {}
    for node in _imports(TREES[package]):
        if isinstance(node, ast.ImportFrom) and node.module in MODULES:
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


REEXPORTS = {p: _reexports(p) for p in PACKAGES}


def _targets(node) -> list[tuple[str, str | None]]:
    """(module, imported name or None) for each jaxrl_suite module `node` imports."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name in MODULES]
    if node.module not in MODULES:
        return []
    return [(node.module, a.name) for a in node.names]


def _resolve(module: str, name: str | None, seen=()) -> str:
    """The module that defines `name` (a package's re-export followed to its source)."""
    if name is None:
        return module
    if f"{module}.{name}" in MODULES:  # a submodule
        return f"{module}.{name}"
    if module in PACKAGES and name in REEXPORTS[module] and module not in seen:
        return _resolve(REEXPORTS[module][name], name, (*seen, module))
    return module


def test_no_module_imports_another_modules_private_name():
    bad = [(m, node.module, a.name) for m, tree in TREES.items() for node in _imports(tree)
           if isinstance(node, ast.ImportFrom) and node.module in MODULES
           and node.module != m for a in node.names
           if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


def test_no_import_cycles():
    graph = {m: set() for m in MODULES if m not in PACKAGES}
    for m in graph:
        for node in _imports(TREES[m]):
            for module, name in _targets(node):
                target = _resolve(module, name)
                if target in graph and target != m:
                    graph[m].add(target)
    cycles, state = [], {}

    def dfs(m, path):
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                dfs(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            dfs(m, [m])
    assert cycles == []


def test_the_walk_sees_function_level_imports_and_skips_type_checking_ones():
    """What the checks read: the agent <-> dispatch cycle of issue 44 hid behind a
    function-level import; an annotation-only import under TYPE_CHECKING is no cycle."""
    a = ast.parse("from jaxrl_suite.x import _helper\ndef f():\n    import jaxrl_suite.y\n")
    found = [(n.module if isinstance(n, ast.ImportFrom) else n.names[0].name)
             for n in _imports(a)]
    assert found == ["jaxrl_suite.x", "jaxrl_suite.y"]  # a function-level import counts
    hidden = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from jaxrl_suite.x import Y\n")
    assert [n.module for n in _imports(hidden)] == ["typing"]


def test_each_layers_public_names_resolve_to_their_modules_objects():
    """`jaxrl_suite.{algorithms, core, envs, kernels}` export their public names lazily; each
    name in `__all__` is the very object its module defines, and an unknown name is an
    AttributeError (not a silent None)."""
    import importlib

    import pytest

    for pkg in ("algorithms", "core", "envs", "kernels"):
        package = importlib.import_module(f"jaxrl_suite.{pkg}")
        assert package.__all__ and package.__all__ == sorted(set(package.__all__))
        for name in package.__all__:
            module = importlib.import_module(f"jaxrl_suite.{pkg}.{package._MODULE_OF[name]}")
            assert getattr(package, name) is getattr(module, name), (pkg, name)
        assert set(package.__all__) <= set(dir(package))
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name  # noqa: B018
    from jaxrl_suite.algorithms import GRPOTrainer
    from jaxrl_suite.core import Study

    assert GRPOTrainer.__module__ == "jaxrl_suite.algorithms.grpo"
    assert Study.__module__ == "jaxrl_suite.core.study"
