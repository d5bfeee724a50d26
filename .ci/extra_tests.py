"""The tests that need a package the README's test venv lacks: pytest node ids, one per line.

``python .ci/extra_tests.py [TESTS_DIR]``. The README's venv (only the ``test`` extra) skips
them; CI's release lane, which has every extra, runs exactly these instead of every module that
happens to name one. A test needs an extra when its code, a fixture or module-level helper it
uses, or its module's top-level code names one of :data:`EXTRAS` (a name, an attribute, an
imported module, an argument, or a string such as ``importorskip("torch")``); comments and
docstrings name nothing. A module whose top-level code names one is listed whole.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: What the README's venv lacks: the packages, the S3 server's fixtures and helper, and the
#: check of tokstream.bench.baselines for PyTorch.
EXTRAS = {
    "torch", "torchdata", "datasets", "obstore", "moto", "tiktoken", "jinja2", "transformers",
    "trl",
    "s3_server", "s3_bucket", "proxied_bucket", "s3_env", "fault_proxy", "require_remote",
    "torch_available",
}  # fmt: skip


def names_in(node: ast.AST) -> set[str]:
    """Every name ``node``'s code uses (docstrings and comments are not code)."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.alias):
            found.update(child.name.split("."))
        elif isinstance(child, ast.arg):
            found.add(child.arg)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            found.add(child.value)
    return found


def needing_extras(path: Path) -> list[str]:
    """``path`` whole, or the node ids of its tests that need an extra."""
    module = ast.parse(path.read_text(), str(path))
    functions = {
        node.name: node
        for node in module.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    top_level = [
        node for node in module.body if not isinstance(node, (ast.FunctionDef, ast.ClassDef))
    ]
    if any(names_in(node) & EXTRAS for node in top_level):
        return [str(path)]
    # A helper or fixture that needs one makes every function naming it need one too.
    tainted = set(EXTRAS)
    while True:
        more = {name for name, node in functions.items() if names_in(node) & tainted} - tainted
        if not more:
            break
        tainted |= more
    return [f"{path}::{name}" for name in functions if name.startswith("test_") and name in tainted]


def main() -> None:
    tests = Path(sys.argv[1] if len(sys.argv) > 1 else "tests")
    for path in sorted(tests.glob("test_*.py")):
        for node_id in needing_extras(path):
            print(node_id)


if __name__ == "__main__":
    main()
