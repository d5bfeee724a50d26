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


# ---------------------------------------------------------------------------------------------
# A corpus's recorded masks: each label's mask AND the stream's own, in every window mode.
# The oracle: every token's value is its position in the corpus, so a label's value names the
# token whose recorded mask applies to it.


def positional_corpus(kind: str, seed: int) -> tuple[Corpus, list[np.ndarray], np.ndarray]:
    """A corpus whose tokens are 1, 2, ... (its shards, or its documents, of random lengths), a
    random mask per shard, and the masks by token value."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 30, 12)
    tokens = np.arange(1, int(lengths.sum()) + 1, dtype=np.int64)  # 0 is the padding token
    pieces = np.split(tokens, np.cumsum(lengths)[:-1])
    flat_mask = rng.random(tokens.shape[0] + 1) < 0.6
    if kind == "documents":
        corpus = Corpus.from_documents(pieces)
        masks = [flat_mask[1:]]
    else:  # one shard per piece, no documents recorded
        corpus = Corpus([p for p in pieces if p.size] or [tokens])
        masks = [flat_mask[p] for p in pieces if p.size]
    return corpus, masks, flat_mask


DATA_MODES = {
    "cross": ("shards", {"windows": "cross", "extras": ("loss_mask",)}),
    "cross, documents": ("documents", {"windows": "cross", "extras": ("loss_mask",)}),
    "within": ("documents", {"windows": "within", "extras": ("loss_mask",)}),
    "within, eos": ("documents", {"windows": "within", "extras": ("loss_mask",), "eos": 40}),
    "strided": ("shards", {"windows": "cross", "stride": 3, "extras": ("loss_mask",)}),
    "packed": ("documents", {"windows": "packed", "pad": 0}),
    "packed, eos": ("documents", {"windows": "packed", "eos": 40, "pad": 0}),
    "next tokens": ("documents", {"targets": "next", "extras": ("loss_mask",)}),
    "ignore index": ("documents", {"windows": "packed", "pad": 0, "labels_ignore_index": -100}),
}


@pytest.mark.parametrize("mode", list(DATA_MODES))
@pytest.mark.parametrize("seed", range(4))
def test_a_corpus_mask_is_anded_into_every_modes_loss_mask(mode, seed):
    kind, options = DATA_MODES[mode]
    unmasked, masks, flat_mask = positional_corpus(kind, seed)
    corpus = unmasked.with_loss_masks(masks)
    common = dict(options, shuffle=True, seed=seed, epochs=2, drop_last=False)
    plain_options = {k: v for k, v in common.items() if k != "labels_ignore_index"}
    plain = list(stream_token_source(unmasked, 5, 3, **plain_options))
    masked = list(stream_token_source(corpus, 5, 3, **common))
    assert len(plain) == len(masked) > 0
    for a, b in zip(plain, masked, strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
        expected = a["loss_mask"] & flat_mask[a["labels"]]
        np.testing.assert_array_equal(b["loss_mask"], expected)
        ignore = common.get("labels_ignore_index")
        want = a["labels"] if ignore is None else np.where(expected, a["labels"], ignore)
        np.testing.assert_array_equal(b["labels"], want)


def test_masks_are_checked_against_the_shards():
    corpus = Corpus.from_documents([np.arange(5), np.arange(3)])
    with pytest.raises(ValueError, match=r"masks\[0\] has shape \(7,\), shard 0 holds 8"):
        corpus.with_loss_masks([np.ones(7, bool)])
    with pytest.raises(ValueError, match="values other than 0 and 1"):
        corpus.with_loss_masks([np.full(8, 2)])
    with pytest.raises(TypeError, match="bools or 0 and 1"):
        corpus.with_loss_masks([np.ones(8, float)])
    with pytest.raises(ValueError, match="1 masks for 2 shards"):
        Corpus([np.arange(3), np.arange(4)]).with_loss_masks([np.ones(3, bool)])


def test_a_mixture_of_masked_sources_is_refused_not_streamed_without_them():
    from tokstream import mix

    masked = Corpus.from_documents([np.arange(1, 20)]).with_loss_masks([np.ones(19, bool)])
    plain = Corpus.from_documents([np.arange(1, 30)])
    with pytest.raises(ValueError, match=r"mixture sources \['chat'\] record loss masks"):
        stream_token_source(
            mix({"chat": masked, "web": plain}, {"chat": 1, "web": 1}),
            4,
            2,
            extras=("loss_mask",),
        )
