"""The stream options: one definition, typed by the values each option takes."""

from __future__ import annotations

import inspect
from typing import Literal, get_type_hints

import numpy as np
import pytest

from tokstream import Corpus, TokenStream, mix, stream_token_source
from tokstream._options import StreamOptions
from tokstream.plan import stream_source


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("targets", Literal["next", "shifted"]),
        ("permutation", Literal["materialized", "implicit"] | None),
        ("windows", Literal["cross", "within", "packed"]),
    ],
)
def test_string_options_are_typed_by_the_values_they_take(name, values):
    assert get_type_hints(StreamOptions)[name] == values
    for entry in (stream_token_source, TokenStream):
        assert inspect.signature(entry).parameters[name].annotation == values


def test_the_stream_resolves_its_source_and_checks_options_against_it():
    corpus, options = stream_source(np.arange(20, dtype=np.uint8), 4, 2, eos=3)
    assert isinstance(corpus, Corpus) and options.eos == 3
    mixture = mix({"a": np.arange(20, dtype=np.uint8)}, {"a": 1})
    source, options = stream_source(mixture, 4, 2, extras=("source",))
    assert source is mixture and options.extras == ("source",)
    # The eos rule is checked against the mixture's token dtype, as against a corpus'.
    with pytest.raises(ValueError, match=r"eos must be a token id of the corpus dtype uint8"):
        stream_source(mixture, 4, 2, eos=256)
