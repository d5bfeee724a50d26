"""Loss masks through the streams: ``labels_ignore_index`` writes it wherever the loss mask is
False, in every window mode; the labels elsewhere and every other array are the plain stream's.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import Corpus, stream_token_source

DOCUMENTS = [
    np.arange(n, dtype=np.int64) + 100 * (i + 1) for i, n in enumerate([5, 9, 3, 14, 1, 7])
]

MODES = {
    "cross": {"windows": "cross", "extras": ("loss_mask",), "eos": 0},
    "within": {"windows": "within", "extras": ("loss_mask",)},
    "strided": {"windows": "cross", "stride": 3, "extras": ("loss_mask",), "eos": 0},
    "packed": {"windows": "packed", "pad": 0},
    "next tokens": {"windows": "cross", "targets": "next", "extras": ("loss_mask",), "eos": 0},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("ignore", [-100, -1, 7])
def test_labels_ignore_index_is_written_where_the_loss_mask_is_false(mode, ignore):
    corpus = Corpus.from_documents(DOCUMENTS)
    options = dict(MODES[mode], shuffle=True, seed=3, epochs=2)
    plain = list(stream_token_source(corpus, 4, 3, **options))
    ignored = list(stream_token_source(corpus, 4, 3, labels_ignore_index=ignore, **options))
    assert len(plain) == len(ignored) > 0
    for a, b in zip(plain, ignored, strict=True):
        assert set(a) == set(b)
        np.testing.assert_array_equal(a["loss_mask"], b["loss_mask"])
        np.testing.assert_array_equal(b["labels"], np.where(a["loss_mask"], a["labels"], ignore))
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])


def test_labels_ignore_index_alone_makes_a_dict_batch_with_the_loss_mask():
    corpus = Corpus.from_documents(DOCUMENTS)
    batch = next(iter(stream_token_source(corpus, 4, 2, labels_ignore_index=-100, eos=0)))
    assert set(batch) == {"input_ids", "labels", "loss_mask"}


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("-100", TypeError, "labels_ignore_index"),
        (1.5, ValueError, "labels_ignore_index"),
        (True, TypeError, "labels_ignore_index"),
        (2**40, ValueError, "labels_ignore_index"),
    ],
)
def test_bad_labels_ignore_index(value, error, match):
    with pytest.raises(error, match=match):
        stream_token_source(np.arange(50), 4, 2, labels_ignore_index=value)
