"""The package's import structure: no import circle, no reach into another package's privates.

The graph is read with :mod:`ast` from the installed package's sources: every ``import`` and
``from ... import`` at module level and inside functions (an import in a function runs too, just
later), except those under ``if TYPE_CHECKING:``, which never run. A module importing
``a.b.c`` also runs the packages ``a`` and ``a.b`` first, so it depends on every ancestor package
of its target that does not contain it.

A name with a leading underscore (a module, a package or a name in a module) is private to the
package that holds it: ``tokstream.formats.common`` to :mod:`tokstream.formats`, a function
``_f`` of ``tokstream.corpus`` to :mod:`tokstream`. Only modules inside that package import it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import tokstream

ROOT = Path(tokstream.__file__).parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every Python module of the package, by dotted name (a package by its ``__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth, skipping ``if TYPE_CHECKING:``
    bodies (their ``else`` runs)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """What module ``name`` imports, as dotted targets inside the package: a module, or
    ``module.name`` for a name imported from a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in _imports(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            targets.add(base if alias.name == "*" else f"{base}.{alias.name}")
    root = name.partition(".")[0]
    return {t for t in targets if within(t, root)}


def module_of(target: str, modules: dict[str, Path]) -> str:
    """The module a target runs: itself, or the module a name is imported from."""
    while target not in modules:
        target = target.rpartition(".")[0]
    return target


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's runtime dependencies (see the module docstring)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in imported(name, path, modules):
            module = module_of(target, modules)
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):
                step = ".".join(parts[:depth])
                if step in modules and not within(name, step) and step != name:
                    edges.add(step)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports
    itself (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return found


def private_owner(target: str, modules: dict[str, Path]) -> str | None:
    """The package a target is private to (its first name with a leading underscore, dunders
    aside), or None when it is public."""
    parts = target.split(".")
    for depth, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            holder = ".".join(parts[:depth])
            # A private name in a module is its package's.
            return holder if is_package(holder, modules) else holder.rpartition(".")[0]
    return None


def private_reaches(modules: dict[str, Path]) -> list[str]:
    """``importer -> target`` for every import of a private name from outside its package."""
    found = []
    for name, path in modules.items():
        for target in sorted(imported(name, path, modules)):
            owner = private_owner(target, modules)
            if owner is not None and not within(name, owner):
                found.append(f"{name} -> {target}")
    return found


def test_graph_reader_sees_function_level_imports_and_skips_type_checking(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg import c\n"
        "def f():\n    from pkg.sub import _hidden\n"
    )
    (package / "sub" / "_hidden.py").write_text("from pkg import a\n")
    (package / "c.py").write_text("from pkg import a\n")
    modules = module_files(package)
    assert modules.keys() == {"pkg", "pkg.a", "pkg.c", "pkg.sub", "pkg.sub._hidden"}
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub._hidden"}  # not pkg.c: TYPE_CHECKING only
    assert cycles(graph) == [["pkg.a", "pkg.sub._hidden"]]
    assert private_owner("pkg.sub._hidden", modules) == "pkg.sub"
    assert private_owner("pkg.a._name", modules) == "pkg"


def test_the_package_has_no_import_circle():
    modules = module_files()
    assert len(modules) > 20  # the installed package's sources were found
    found = cycles(import_graph(modules))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_another_packages_private_names():
    found = private_reaches(module_files())
    assert not found, "private names imported from outside their package:\n" + "\n".join(found)


#: Run first in a child process: the object-storage package cannot be imported, as if deleted.
WITHOUT_OBJECT_STORAGE = """
import importlib.abc
import sys

class WithoutObjectStorage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tokstream.shards.remote" or name.startswith("tokstream.shards.remote."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, WithoutObjectStorage())
"""

LOCAL_STREAMS = """
import pickle
import numpy as np
import tokstream
from tokstream.manifest import write_manifest

def batches(source, **options):
    return [np.array(part) for batch in tokstream.stream_token_source(source, 8, 4, **options)
            for part in (batch.values() if isinstance(batch, dict) else batch)]

ids = (np.arange(5000) % 97).astype(np.uint16)
documents = tokstream.Corpus.from_documents([ids[:2000], ids[2000:3100], ids[3100:]])
expected = batches(ids, seed=3)
paths = [tokstream.write_tokens(f"{i}.npy", part) for i, part in enumerate(np.split(ids, 2))]
tokstream.write_tokens("docs.bin", documents, format="megatron")
opened = tokstream.open_tokens(paths)
assert all(np.array_equal(a, b) for a, b in zip(batches(opened, seed=3), batches(
    tokstream.Corpus(np.split(ids, 2)), seed=3)))
assert all(np.array_equal(a, b) for a, b in zip(batches(ids, seed=3), expected))
write_manifest(["0.npy", "1.npy", "docs.bin"], "manifest.json")
listed = tokstream.open_tokens("manifest.json")
within = batches(listed, windows="within", eos=96, extras=("position_ids",))
assert len(within) > 0
mixture = tokstream.mix({"a": opened, "b": listed}, {"a": 1, "b": 1})
assert len(batches(mixture, seed=1)) > 0
copy = pickle.loads(pickle.dumps(opened))
assert all(np.array_equal(a, b) for a, b in zip(batches(copy), batches(opened)))
tokstream.write_tokens("copy.npy", listed)
assert np.array_equal(np.load("copy.npy"), np.concatenate([ids, ids]))
assert "tokstream.shards.remote" not in sys.modules
try:
    tokstream.open_tokens("s3://bucket/tokens.bin")
except ModuleNotFoundError as exc:
    assert exc.name == "tokstream.shards.remote", exc
else:
    raise AssertionError("a URL opened without the object-storage package")
print("ok")
"""


def test_local_streams_and_manifests_need_no_object_storage_package(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_OBJECT_STORAGE + LOCAL_STREAMS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["ok"]
