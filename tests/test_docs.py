"""The documentation the installed package carries: doctests, signatures, stubs, py.typed."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.resources
import inspect
import pkgutil
import pydoc
import re
from pathlib import Path

import numpy as np
import pytest

import tokstream
from tokstream import _windows

# Modules whose import has a side effect (the command line runs) or needs an optional extra.
_NOT_IMPORTED = {"tokstream.__main__"}
_OPTIONAL = {"torch", "matplotlib"}


def _module_names() -> list[str]:
    names = ["tokstream"]
    for info in pkgutil.walk_packages(tokstream.__path__, prefix="tokstream."):
        if info.name not in _NOT_IMPORTED:
            names.append(info.name)
    return sorted(names)


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if exc.name in _OPTIONAL:
            pytest.skip(f"{name} needs the optional dependency {exc.name}")
        raise


_attempted: dict[str, int] = {}


@pytest.mark.parametrize("name", _module_names())
def test_module_doctests_pass(name: str) -> None:
    module = _import(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=False)
    _attempted[name] = result.attempted
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctests of {name} failed"


def test_doctests_actually_ran() -> None:
    """A doctest run that found no examples would pass vacuously: these modules carry some."""
    for name in ("tokstream.stream", "tokstream.reference", "tokstream.baselines", "tokstream.bench"):
        if name not in _attempted:
            test_module_doctests_pass(name)
        assert _attempted[name] > 0, f"no doctest examples found in {name}"


def test_the_doctest_runner_reports_a_failing_example() -> None:
    """The harness above must be able to fail: a wrong expected output is counted as failed."""

    def wrong() -> None:
        """
        >>> 1 + 1
        3
        """

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(verbose=False)
    for test in finder.find(wrong, "wrong", globs={}):
        runner.run(test, out=lambda _text: None)
    assert runner.failures == 1


def test_help_shows_the_real_signature_of_the_stream() -> None:
    text = pydoc.render_doc(tokstream.stream_token_source, renderer=pydoc.plaintext)
    assert "stream_token_source(token_ids: 'Any', block: 'int', batch_size: 'int', *" in text
    assert "Examples" in text


@pytest.mark.parametrize("name", ["gather_windows", "permuted_positions"])
def test_help_shows_the_real_signature_of_each_kernel(name: str) -> None:
    function = getattr(_windows, name)
    text = pydoc.render_doc(function, renderer=pydoc.plaintext)
    parameters = ", ".join(inspect.signature(function).parameters)
    assert parameters.startswith(("tokens, starts, windows", "out, first, stride"))
    assert f"{name}(" in text
    # What Cython embeds for a fused function when left to itself.
    assert "signatures, args, kwargs" not in text


def _stub_functions() -> dict[str, ast.FunctionDef]:
    source = (importlib.resources.files("tokstream") / "_windows.pyi").read_text()
    tree = ast.parse(source)
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _stub_attributes() -> set[str]:
    source = (importlib.resources.files("tokstream") / "_windows.pyi").read_text()
    return {
        node.target.id
        for node in ast.parse(source).body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def test_kernel_stubs_match_the_compiled_module() -> None:
    stubs = _stub_functions()
    compiled = {
        name
        for name in dir(_windows)
        if not name.startswith("_") and callable(getattr(_windows, name))
    }
    assert set(stubs) == compiled
    for name, node in stubs.items():
        runtime = inspect.signature(getattr(_windows, name))
        stub_args = [a.arg for a in node.args.args]
        assert stub_args == list(runtime.parameters), name
        empty = inspect.Parameter.empty
        defaults = [p.default for p in runtime.parameters.values() if p.default is not empty]
        assert len(node.args.defaults) == len(defaults), name
    for attribute in _stub_attributes():
        assert hasattr(_windows, attribute), attribute


def test_package_ships_py_typed_and_stubs() -> None:
    package = importlib.resources.files("tokstream")
    assert (package / "py.typed").is_file()
    assert (package / "_windows.pyi").is_file()


def _readme_block(defines: str) -> str:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if defines in b]
    return code


def test_readme_numpy_training_loop_resumes_exactly(tmp_path):
    namespace: dict = {"__name__": "readme_numpy_example"}
    exec(compile(_readme_block("def train_numpy("), "README.md", "exec"), namespace)
    train_numpy = namespace["train_numpy"]
    tokens = np.random.default_rng(1).integers(0, 256, 20_000).astype(np.uint16)
    whole = train_numpy(tokens, str(tmp_path / "whole.npz"), steps=150)
    first = train_numpy(tokens, str(tmp_path / "resumed.npz"), steps=100)
    rest = train_numpy(tokens, str(tmp_path / "resumed.npz"), steps=150)
    assert first + rest == whole
    assert whole[-1] < whole[0]  # it does learn
