"""A missing optional extra is named with the command that installs it, from the index and from a
clone of the repository (where ``pip install 'tokstream[...]'`` would look the name up instead)."""

from __future__ import annotations

import sys

import pytest

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
