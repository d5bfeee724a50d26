"""Which order a stream takes when ``permutation`` is not given, and when that order warns.

The reference generator's order is the default only where byte parity with it is at stake: an
array or a sequence (what the reference takes) streamed in the reference's windows. A
:class:`~tokstream.Corpus` (what :func:`~tokstream.open_tokens` returns) or a mixture gets the
implicit order, with nothing to draw. A materialized order large enough to take about a second
to draw warns once, naming ``permutation="implicit"``; decided by window count, never timed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tokstream import Corpus, mix, open_tokens, stream_token_source, write_tokens
from tokstream._order import SLOW_DRAW_WINDOWS, warn_if_slow_draw
from tokstream.reference import stream_token_source as reference_stream


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(lambda ids: ids, "materialized", id="array"),
        pytest.param(lambda ids: ids.tolist(), "materialized", id="list"),
        pytest.param(lambda ids: ids.astype(np.float64), "materialized", id="float-array"),
        pytest.param(lambda ids: Corpus([ids]), "implicit", id="corpus"),
        pytest.param(lambda ids: Corpus([ids[:50], ids[50:]]), "implicit", id="shards"),
        pytest.param(lambda ids: mix({"a": ids}, {"a": 1}), "implicit", id="mixture"),
    ],
)
def test_the_default_order_is_the_references_only_for_what_the_reference_takes(make, expected):
    stream = stream_token_source(make(np.arange(100)), 4, 3)
    assert stream.permutation == expected


@pytest.mark.parametrize(
    "options", [{"stride": 2}, {"eos": 5}, {"windows": "within"}], ids=["stride", "eos", "within"]
)
def test_other_windows_than_the_references_default_to_the_implicit_order(options):
    assert stream_token_source(np.arange(100), 4, 3, **options).permutation == "implicit"


def test_an_opened_file_starts_without_drawing_an_order(tmp_path):
    path = tmp_path / "tokens.bin"
    write_tokens(path, np.arange(1000, dtype=np.uint16))
    stream = stream_token_source(open_tokens(path), 16, 4)
    assert stream.permutation == "implicit"
    assert stream._order.draws_orders is False
    # An explicit choice still gives the reference's order over the same tokens.
    explicit = stream_token_source(open_tokens(path), 16, 4, permutation="materialized")
    expected = next(reference_stream(np.arange(1000, dtype=np.uint16), 16, 4))
    np.testing.assert_array_equal(next(explicit)[0], expected[0])


def test_an_array_keeps_byte_parity_with_the_reference_by_default():
    ids = np.arange(300, dtype=np.int32)
    got = list(stream_token_source(ids, 8, 16, epochs=2, seed=7))
    want = list(reference_stream(ids, 8, 16, epochs=2, seed=7))
    assert len(got) == len(want)
    for (w, t), (rw, rt) in zip(got, want, strict=True):
        np.testing.assert_array_equal(w, rw)
        np.testing.assert_array_equal(t, rt)


def test_a_draw_of_about_a_second_warns_naming_the_implicit_order():
    with pytest.warns(UserWarning, match="permutation='implicit'") as caught:
        warn_if_slow_draw(SLOW_DRAW_WINDOWS)
    assert f"{SLOW_DRAW_WINDOWS:,} windows" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_slow_draw(SLOW_DRAW_WINDOWS - 1)


def test_a_large_array_warns_when_the_stream_is_made_before_anything_is_drawn():
    block = 8
    ids = np.zeros(SLOW_DRAW_WINDOWS + block, np.uint8)  # exactly SLOW_DRAW_WINDOWS windows
    with pytest.warns(UserWarning, match="permutation='implicit'"):
        stream = stream_token_source(ids, block, 4)
    assert stream._order._drawn is None  # warned before the first batch, nothing drawn yet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream_token_source(ids[1:], block, 4)  # one window fewer: no warning
        stream_token_source(ids, block, 4, permutation="implicit")
        stream_token_source(ids, block, 4, shuffle=False)
        # Asked for by name, as the benchmark asks for the reference's order: no warning.
        stream_token_source(ids, block, 4, permutation="materialized")
