"""The layout at the top of docs/development.md names every module of the package, and only
modules that exist: a reader knows from it where a change goes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "tokstream"
#: What a layout line may name: a package (``name/``) or one of these files.
NAMED = re.compile(r"[\w.]+(/|\.(py|pyx|pyi|pxd|h))")
#: Files that are modules: each must have a line of its own.
MODULES = (".py", ".pyx")


def layout_entries() -> set[str]:
    """The paths (relative to src/tokstream) the layout's ``src/tokstream/`` tree names.

    An entry is a name at the start of a line, indented two spaces per level below
    ``src/tokstream/``; a package's entries follow its ``name/`` line one level deeper. A line
    indented further than an entry could be continues the description above it; the tree ends
    at the next line that is not indented.
    """
    text = (ROOT / "docs" / "development.md").read_text()
    (tree,) = re.findall(r"```text\nsrc/tokstream/\n(.*?)```", text, flags=re.DOTALL)
    entries: set[str] = set()
    parents: list[str] = []
    for line in tree.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        name = stripped.split(" ", 1)[0]
        depth, odd = divmod(indent, 2)
        if stripped and depth == 0:
            break  # the next tree (tests/, docs/, ...)
        if not stripped or odd or depth > len(parents) + 1:
            continue  # a description's continuation, or not below src/tokstream/
        if not NAMED.fullmatch(name):
            continue
        del parents[depth - 1 :]
        entries.add("".join(parents) + name)
        if name.endswith("/"):
            parents.append(name)
    return entries


def package_modules() -> set[str]:
    """Every module file (and package directory) under src/tokstream, as the layout names them."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*"):
        relative = path.relative_to(PACKAGE)
        if "__pycache__" in relative.parts:
            continue
        if path.is_dir() and any(path.glob("__init__.py")):
            found.add(relative.as_posix() + "/")
        elif path.suffix in MODULES:
            found.add(relative.as_posix())
    return found


def test_the_layout_names_every_module_of_the_package():
    missing = package_modules() - layout_entries()
    assert not missing, f"docs/development.md's layout lacks {sorted(missing)}"


def test_the_layout_names_nothing_that_is_not_there():
    stale = sorted(name for name in layout_entries() if not (PACKAGE / name.rstrip("/")).exists())
    assert not stale, f"docs/development.md's layout names {stale}, which do not exist"
