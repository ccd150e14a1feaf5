"""Static checks of the layout: imports go one way and the library has no circles.

* nothing in ``metasampler/`` imports the application: ``tasks``, ``experiments``,
  ``evaluate`` or ``train_meta``;
* nothing in ``tasks/`` imports ``metasampler.benchmark``, ``experiments``, ``evaluate`` or
  ``train_meta``;
* nothing in ``experiments/`` (the config schemas) imports the entry points ``evaluate`` or
  ``train_meta``;
* nothing outside ``research/`` (the lab notebook and its scripts) imports ``research``;
* the ``metasampler`` modules import each other without a cycle (and so do those of ``tasks``
  and of ``experiments``).

Every ``import`` statement counts, at the top of a module or inside a function (a local
import that dodges a circle is still a circle). The sources are parsed with :mod:`ast`;
nothing is imported. The checker is tested on small synthetic trees, so that it is known to
fail on a violation.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

APPLICATION = ("tasks", "experiments", "evaluate", "train_meta")
#: What each tree must never import (a module or any of its submodules).
FORBIDDEN = {
    "metasampler": APPLICATION,
    "tasks": ("metasampler.benchmark", "experiments", "evaluate", "train_meta"),
    "experiments": ("evaluate", "train_meta"),
}
#: Directories of the checkout that hold no project source.
NOT_SOURCE = {".git", ".venv", "build", "dist", "__pycache__", "research"}


def module_name(path: Path, root: Path) -> str:
    """``metasampler/benchmark/__init__.py`` -> ``metasampler.benchmark``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    """``name`` is a module or package of the source tree under ``root``."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, root: Path) -> set[str]:
    """The modules whose code ``path`` makes run, by every import statement it holds.

    ``import a.b`` names ``a.b``; ``from a import b`` names ``a.b`` when that is a module,
    and ``a`` itself (its ``__init__`` runs) unless ``a`` is a package the importing module
    lives in and ``b`` is one of its modules. Relative imports are resolved.
    """
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            ancestor = name == target or name.startswith(target + ".")
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if is_module(sub, root):
                    found.add(sub)
                    if not ancestor:
                        found.add(target)
                else:
                    found.add(target)
    return found


def import_graph(root: Path, top: str) -> dict[str, set[str]]:
    """``{module: modules it imports}`` for every module of the package ``top``."""
    return {
        module_name(path, root): imports(path, root)
        for path in sorted((root / top).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def forbidden_imports(root: Path, top: str, forbidden: Iterable[str]) -> list[str]:
    """``"module imports name"`` for every import of ``top``'s modules that ``forbidden``
    (module names, each with its submodules) rules out."""
    return [
        f"{module} imports {name}"
        for module, names in import_graph(root, top).items()
        for name in sorted(names)
        if any(name == bad or name.startswith(bad + ".") for bad in forbidden)
    ]


def research_imports(root: Path) -> list[str]:
    """``"file imports name"`` for every module outside ``research/`` (and outside hidden or
    build directories) that imports ``research`` or one of its modules."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs
            if d not in NOT_SOURCE and not d.startswith(".") and not d.endswith(".egg-info")
        )  # fmt: skip
        for file in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / file
            if "research" not in path.read_text(encoding="utf-8"):
                continue  # (no import of it; parsing every file is slow)
            for name in sorted(imports(path, root)):
                if name == "research" or name.startswith("research."):
                    found.append(f"{path.relative_to(root).as_posix()} imports {name}")
    return found


def import_cycles(root: Path, top: str) -> list[list[str]]:
    """The import cycles among ``top``'s modules: one list of modules per strongly connected
    component with more than one module (or a module importing itself)."""
    full = import_graph(root, top)
    graph = {module: names & full.keys() for module, names in full.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph[module]:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


# --------------------------------------------------------------------------------------------
# The project
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top", sorted(FORBIDDEN))
def test_imports_go_one_way(top):
    assert forbidden_imports(ROOT, top, FORBIDDEN[top]) == []


def test_nothing_outside_research_imports_it():
    assert research_imports(ROOT) == []


@pytest.mark.parametrize("top", ["metasampler", "tasks", "experiments"])
def test_no_import_cycle(top):
    assert import_cycles(ROOT, top) == []


# --------------------------------------------------------------------------------------------
# The checker fails on violations
# --------------------------------------------------------------------------------------------
def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "lib/__init__.py": "from .a import f\nfrom . import sub\n",
    "lib/a.py": "from .b import g\n\ndef f():\n    return g()\n",
    "lib/b.py": "import math\n\ndef g():\n    return math.pi\n",
    "lib/sub/__init__.py": "from .c import h\n",
    "lib/sub/c.py": "from ..b import g\nfrom . import d\n\ndef h():\n    return g()\n",
    "lib/sub/d.py": "X = 1\n",
    "app/__init__.py": "",
    "app/run.py": "from lib import f\nimport lib.sub\n",
}


def test_the_checker_passes_a_clean_tree(tmp_path):
    root = write_tree(tmp_path, CLEAN)
    assert import_cycles(root, "lib") == []
    assert forbidden_imports(root, "lib", ["app"]) == []
    assert forbidden_imports(root, "app", ["lib.sub"]) == ["app.run imports lib.sub"]


@pytest.mark.parametrize(
    ("name", "text", "cycle"),
    [
        # a function-local import that dodges the circle at import time is still a circle
        ("lib/b.py", "def g():\n    from .a import f\n    return f\n", ["lib.a", "lib.b"]),
        # through a package's __init__
        ("lib/sub/d.py", "from lib import f\n", ["lib", "lib.sub", "lib.sub.c", "lib.sub.d"]),
        ("lib/sub/d.py", "from . import h\n", ["lib.sub", "lib.sub.d"]),
        ("lib/b.py", "import lib.b\n", ["lib.b"]),
    ],
)
def test_the_checker_finds_a_cycle(tmp_path, name, text, cycle):
    root = write_tree(tmp_path, {**CLEAN, name: text})
    found = import_cycles(root, "lib")
    assert any(set(cycle) <= set(component) for component in found), found


@pytest.mark.parametrize(
    "text", ["import app.run\n", "from app import run\n", "def f():\n    import app\n"]
)
def test_the_checker_finds_a_forbidden_import(tmp_path, text):
    root = write_tree(tmp_path, {**CLEAN, "lib/b.py": text})
    assert forbidden_imports(root, "lib", ["app"]) != []


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("app/run.py", "import research.scripts.tool\n"),
        ("speed/bench.py", "from research import notes\n"),
        ("tests/test_x.py", "def f():\n    import research\n"),
        ("entry.py", "from research.scripts import tool\n"),
    ],
)
def test_the_checker_finds_an_import_of_research(tmp_path, name, text):
    files = {**CLEAN, "research/__init__.py": "", "research/notes.py": "import lib\n"}
    root = write_tree(tmp_path, files)
    assert research_imports(root) == []  # research importing the library is fine
    root = write_tree(tmp_path, {name: text})
    found = research_imports(root)
    assert found and all(line.startswith(f"{name} imports research") for line in found), found


def test_the_checker_finds_experiments_importing_an_entry_point(tmp_path):
    schema = {"experiments/__init__.py": "", "experiments/schema.py": "import evaluate\n"}
    root = write_tree(tmp_path, {**CLEAN, **schema, "evaluate.py": ""})
    found = forbidden_imports(root, "experiments", FORBIDDEN["experiments"])
    assert found == ["experiments.schema imports evaluate"]
