"""A missing optional extra is named with the command that installs it, from the index and from a
clone of the repository (where ``pip install 'tokstream[...]'`` would look the name up instead)."""

from __future__ import annotations

import importlib
import io
import sys

import pytest

from tests.conftest import byte_level_bpe
from tokstream import cli
from tokstream._extras import install_hint


def test_the_hint_names_the_extra_for_the_index_and_for_a_clone():
    assert install_hint("arrow") == (
        "pip install 'tokstream[arrow]' (in a clone of the repository: pip install '.[arrow]')"
    )


def test_arrow_without_pyarrow_says_how_to_install_it(monkeypatch):
    from tokstream.formats import arrow

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` fail
    with pytest.raises(ImportError) as error:
        arrow.require()
    assert str(error.value).endswith(install_hint("arrow"))


def test_a_tokenizers_file_without_tokenizers_says_how_to_install_it(tmp_path, monkeypatch):
    from tokstream.tokenize.encoders import Encoder

    spec = tmp_path / "tokenizer.json"
    spec.write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError) as error:
        Encoder(str(spec))
    assert str(error.value).endswith(install_hint("tokenize"))


def test_the_ray_engine_without_ray_is_one_line_naming_the_extra_and_writes_nothing(
    tmp_path, monkeypatch
):
    pytest.importorskip("tokenizers")
    texts = [f"document {i}: some words" for i in range(20)]
    tokenizer = byte_level_bpe(texts, tmp_path / "tokenizer.json", vocab_size=300)
    (tmp_path / "in.txt").write_text("\n".join(texts))
    monkeypatch.setitem(sys.modules, "ray", None)
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["tokenize", str(tmp_path / "in.txt"), "--tokenizer", str(tokenizer)]
    argv += ["--output", str(tmp_path / "out"), "--engine", "ray", "--quiet"]
    assert cli.main(argv, stdout=stdout, stderr=stderr) == 1
    assert stderr.getvalue().count("\n") == 1 and stdout.getvalue() == ""
    assert stderr.getvalue().rstrip().endswith(install_hint("ray"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("module", "extra"), [("tokstream.grain", "grain"), ("tokstream.jax", "jax")]
)
def test_an_adapter_without_its_library_says_how_to_install_it(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, extra, None)  # makes `import grain` fail
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as error:
        importlib.import_module(module)
    assert install_hint(extra) in str(error.value)
