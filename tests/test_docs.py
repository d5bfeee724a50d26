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
from tokstream._kernels import advice, documents, mixture, order, pack, packed_copy, repetition
from tokstream.bench import _device, _loop

# Modules whose import has a side effect (the command line runs).
_NOT_IMPORTED = {"tokstream.__main__"}
_OPTIONAL = {"torch", "matplotlib", "grain", "jax"}


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
        # tokstream.torch re-raises torch's ImportError with the extra to install, from it.
        missing = exc.name or getattr(exc.__cause__, "name", None)
        if missing in _OPTIONAL:
            pytest.skip(f"{name} needs the optional dependency {missing}")
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
    carriers = (
        "tokstream.stream",
        "tokstream.reference",
        "tokstream.bench.baselines",
        "tokstream.bench.harness",
        "tokstream.bench.report",
    )
    for name in carriers:
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


COMPILED = {
    "_windows": _windows,
    "_kernels.documents": documents,
    "_kernels.order": order,
    "_kernels.mixture": mixture,
    "_kernels.advice": advice,
    "_kernels.pack": pack,
    "_kernels.packed_copy": packed_copy,
    "_kernels.repetition": repetition,
    "bench._loop": _loop,
    "bench._device": _device,
}


@pytest.mark.parametrize(
    ("module", "name", "first_parameters"),
    [
        ("_windows", "gather_windows", "tokens, starts, input_ids"),
        ("_windows", "lookup_windows", "windows_index, offsets"),
        ("_kernels.order", "permuted_positions", "out, first, stride"),
        ("_kernels.order", "round_keys", "keys, seed, epoch"),
        ("_kernels.mixture", "schedule_samples", "nodes, root, first"),
        ("_kernels.advice", "advise_at", "addresses, window_bytes, sample"),
        ("_kernels.advice", "resident_fraction", "tokens"),
        ("_kernels.pack", "best_fit", "lengths, capacity, rows"),
        ("_kernels.packed_copy", "fill_packed", "anchor, addresses, lengths"),
        ("_kernels.repetition", "filter_repeated", "input_ids, last_tokens, loss_mask"),
        ("bench._loop", "copy_windows", "tokens, starts, windows"),
        ("bench._device", "read_at", "fd, offsets, buffer"),
    ],
)
def test_help_shows_the_real_signature_of_each_kernel(module, name, first_parameters) -> None:
    function = getattr(COMPILED[module], name)
    text = pydoc.render_doc(function, renderer=pydoc.plaintext)
    parameters = ", ".join(inspect.signature(function).parameters)
    assert parameters.startswith(first_parameters)
    assert f"{name}(" in text
    # What Cython embeds for a fused function when left to itself.
    assert "signatures, args, kwargs" not in text


def _stub_file(module: str):
    """The ``.pyi`` beside compiled module ``module`` (a name relative to ``tokstream``)."""
    return importlib.resources.files("tokstream").joinpath(*module.split(".")[:-1]) / (
        module.split(".")[-1] + ".pyi"
    )


def _stub(module: str) -> ast.Module:
    return ast.parse(_stub_file(module).read_text())


@pytest.mark.parametrize("module", list(COMPILED))
def test_kernel_stubs_match_the_compiled_module(module: str) -> None:
    tree = _stub(module)
    stubs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    compiled_module = COMPILED[module]
    public = {
        name: getattr(compiled_module, name)
        for name in dir(compiled_module)
        if not name.startswith("_") and not inspect.ismodule(getattr(compiled_module, name))
    }
    assert set(stubs) == {n for n, v in public.items() if callable(v) and not inspect.isclass(v)}
    for name, node in stubs.items():
        _assert_same_parameters(node, getattr(compiled_module, name), name)
    for name, node in classes.items():
        runtime_class = getattr(compiled_module, name)
        methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        runtime_public = {n for n in dir(runtime_class) if not n.startswith("_")}
        assert {n for n in methods if not n.startswith("_")} == runtime_public, name
        for method, method_node in methods.items():
            attribute = getattr(runtime_class, method)
            if method in runtime_public and callable(attribute):  # not a property
                _assert_same_parameters(method_node, attribute, f"{name}.{method}")
    attributes = {
        node.target.id
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    assert attributes | set(stubs) | set(classes) == set(public)


def _assert_same_parameters(node: ast.FunctionDef, function: object, name: str) -> None:
    runtime = inspect.signature(function)
    assert [a.arg for a in node.args.args] == list(runtime.parameters), name
    empty = inspect.Parameter.empty
    defaults = [p.default for p in runtime.parameters.values() if p.default is not empty]
    assert len(node.args.defaults) == len(defaults), name


def test_package_ships_py_typed_and_stubs() -> None:
    assert (importlib.resources.files("tokstream") / "py.typed").is_file()
    for module in COMPILED:
        assert _stub_file(module).is_file(), module


# ---------------------------------------------------------------------------------------------
# README.md and docs/*.md: every Python block runs as a user would paste it

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Libraries a block may import that the `test` extra does not install.
_OPTIONAL_IN_BLOCKS = {"torch", "torchdata", "grain", "jax", "flax", "orbax", "optax"}


def _python_blocks() -> list[tuple[Path, int, str]]:
    return [
        (document, index, code)
        for document in DOCUMENTS
        for index, code in enumerate(re.findall(r"```python\n(.*?)```", document.read_text(), re.S))
    ]


def _block_defining(name: str) -> str:
    (code,) = [code for _, _, code in _python_blocks() if f"def {name}(" in code]
    return code


def _imported_roots(code: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


# The README's packed example calls flex_attention eagerly (it says to compile it for training),
# which warns on CPU that the unfused path materialises the scores.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    ("document", "index", "code"),
    [pytest.param(*block, id=f"{block[0].name}-{block[1]}") for block in _python_blocks()],
)
def test_every_python_block_of_the_docs_runs_as_pasted(
    document, index, code, tmp_path, monkeypatch
):
    for name in sorted(_imported_roots(code) & _OPTIONAL_IN_BLOCKS):
        pytest.importorskip(name)
    if "chat=True" in code:  # tokenize's chat extra: jinja2 renders the templates
        pytest.importorskip("jinja2")
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    exec(compile(code, f"{document.name} block {index}", "exec"), {"__name__": "__docs__"})


def test_the_docs_have_python_blocks_to_run():
    documents = {document.name for document, _, _ in _python_blocks()}
    assert {"README.md", "training.md"} <= documents


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_the_docs_link_only_to_files_that_exist_and_name_the_reference_path(document):
    text = document.read_text()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (document.parent / target).exists(), f"{document.name} links to missing {target}"
    # The original generator's specification does not ship; the reference path does.
    assert "the spec" not in text.lower(), f"{document.name} refers to the spec"


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) < 350


def test_the_numpy_training_loop_resumes_exactly_and_a_finished_run_stops(tmp_path):
    namespace: dict = {"__name__": "docs_numpy_example"}
    exec(compile(_block_defining("train_numpy"), "docs/training.md", "exec"), namespace)
    train_numpy = namespace["train_numpy"]
    tokens = np.random.default_rng(1).integers(0, 256, 20_000).astype(np.uint16)
    whole = train_numpy(tokens, str(tmp_path / "whole.npz"), steps=150)
    first = train_numpy(tokens, str(tmp_path / "resumed.npz"), steps=100)
    rest = train_numpy(tokens, str(tmp_path / "resumed.npz"), steps=150)
    assert len(whole) == 150 and first + rest == whole
    assert whole[-1] < whole[0]  # it does learn
    # Run again, a finished run trains no further (the stream would have thousands more batches).
    assert train_numpy(tokens, str(tmp_path / "whole.npz"), steps=150) == []
    assert train_numpy(tokens, str(tmp_path / "resumed.npz"), steps=150) == []
