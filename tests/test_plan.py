"""The window plan is decided in one place: the package's source says so.

Read from the installed package (not the checkout), so the check holds for what is shipped:
``windows`` is compared to its values in :mod:`tokstream._options` only, and only
:func:`tokstream.mixture.mixture_of` tests whether something is a :class:`~tokstream.Mixture`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import tokstream
from tokstream import mix, stream_token_source
from tokstream.corpus import Corpus
from tokstream.plan.mixture_order import MixtureOrder
from tokstream.plan.order import WindowOrder
from tokstream.plan.packed import (
    PackedFill,
    PackedMixtureOrder,
    PackedMixtureSpace,
    PackedOrder,
    PackedSpace,
)
from tokstream.plan.windows import WindowFill, WindowSpace

PACKAGE = Path(tokstream.__file__).parent
WINDOW_POLICIES = {"cross", "within", "packed"}


def _modules() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _names(node: ast.expr) -> set[str]:
    """The name an operand reads (``windows``, ``options.windows``, ``args.windows``)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _policy_values(node: ast.expr) -> bool:
    """Whether ``node`` is a window policy's value, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return node.value in WINDOW_POLICIES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_policy_values(e) for e in node.elts)
    return False


def test_windows_is_compared_to_its_values_in_one_module() -> None:
    found = set()
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any("windows" in _names(o) for o in operands) and any(
                    _policy_values(o) for o in operands
                ):
                    found.add(name)
    assert found == {"_options.py"}


def test_one_place_asks_whether_a_source_is_a_mixture() -> None:
    found = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and len(node.args) == 2
                and "Mixture" in {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            ):
                found.append(name)
    assert found == ["mixture.py"]


@pytest.mark.parametrize(
    ("windows", "mixture", "space", "order", "fill"),
    [
        ("cross", False, WindowSpace, WindowOrder, WindowFill),
        ("within", False, WindowSpace, WindowOrder, WindowFill),
        ("cross", True, WindowSpace, MixtureOrder, WindowFill),
        ("within", True, WindowSpace, MixtureOrder, WindowFill),
        ("packed", False, PackedSpace, PackedOrder, PackedFill),
        ("packed", True, PackedMixtureSpace, PackedMixtureOrder, PackedFill),
    ],
)
def test_the_plan_of_every_policy_and_source(
    windows: str, mixture: bool, space: type, order: type, fill: type
) -> None:
    corpus = Corpus.from_documents([np.arange(1, 40, dtype=np.int32), np.arange(7, dtype=np.int32)])
    source = mix({"a": corpus, "b": corpus}, {"a": 1, "b": 2}) if mixture else corpus
    options = {"pad": 0} if windows == "packed" else {}
    stream = stream_token_source(source, 4, 3, windows=windows, **options)
    plan = stream._plan
    assert type(plan.space) is space
    assert type(plan.order) is order
    assert type(plan.fill) is fill
    assert plan.corpus is (source.corpus if mixture else corpus)
    assert plan.fill.space is plan.space
