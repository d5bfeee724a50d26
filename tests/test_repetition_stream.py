"""``instance_filter=``: every window policy's batches, filtered as the slow oracle decides.

The filtered stream must yield the unfiltered stream's batches (same shape, same tokens), with
``"instance_mask"`` False exactly for the rows the oracle (``tests/oracle_repetition.py``, from
the definition) finds a long periodic run in (a window and its target; each piece of a packed
row), those rows' loss masks all False and the others' unchanged; ``stats()`` counts them, and a
state saved with the filter resumes to the same batches in any world size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.oracle_repetition import repeats, row_pieces, row_slots
from tokstream import Corpus, mix, stream_token_source

SETTINGS = (1, 13, 32)


def planted_corpus(seed: int = 0) -> Corpus:
    """Documents over a small vocabulary, one in five with a repeated unit of 1-15 tokens."""
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, 500, int(n)).astype(np.uint16) for n in rng.integers(5, 300, 200)]
    for document in documents[::5]:
        unit = rng.integers(0, 500, int(rng.integers(1, 16))).astype(np.uint16)
        run = np.tile(unit, int(rng.integers(28, 40)))[: document.shape[0]]
        at = int(rng.integers(0, document.shape[0] - run.shape[0] + 1))
        document[at : at + run.shape[0]] = run
    return Corpus.from_documents(documents)


POLICIES: dict[str, dict[str, Any]] = {
    "cross next": {},
    "cross shifted": {"targets": "shifted"},
    "within": {"windows": "within", "targets": "shifted"},
    "strided int32": {"stride": 16, "out_dtype": "int32"},
    "packed": {"windows": "packed", "pad": 0},
    "packed prefetch": {"windows": "packed", "pad": 0, "prefetch": 2, "reuse_buffers": 1},
}


def expected_kept(batch: dict[str, np.ndarray], packed: bool) -> np.ndarray:
    labels = batch["labels"]
    last = labels if labels.ndim == 1 else labels[:, -1]
    slots = row_slots(batch["input_ids"], last)
    if not packed:
        return np.array([not repeats(row, *SETTINGS) for row in slots])
    return np.array(
        [
            not any(repeats(piece, *SETTINGS) for piece in row_pieces(row, links))
            for row, links in zip(slots, batch["loss_mask"], strict=True)
        ]
    )


@pytest.mark.parametrize("policy", POLICIES, ids=list(POLICIES))
def test_filtered_rows_are_the_oracle_s_and_the_batch_keeps_its_shape(policy):
    corpus = planted_corpus()
    options = {"block": 64, "batch_size": 8, "seed": 3, **POLICIES[policy]}
    plain = stream_token_source(corpus, extras=("loss_mask",), **options)
    filtered = stream_token_source(corpus, instance_filter=True, **options)
    dropped = rows = 0
    for expected, batch in zip(plain, filtered, strict=True):
        expected = {k: np.array(v) for k, v in expected.items()}
        for key in ("input_ids", "labels"):
            np.testing.assert_array_equal(batch[key], expected[key])
        kept = expected_kept(expected, "packed" in policy)
        np.testing.assert_array_equal(batch["instance_mask"], kept)
        assert batch["instance_mask"].dtype == np.bool_
        assert batch["loss_mask"].shape == expected["loss_mask"].shape
        assert not batch["loss_mask"][~kept].any()
        np.testing.assert_array_equal(batch["loss_mask"][kept], expected["loss_mask"][kept])
        dropped += int((~kept).sum())
        rows += kept.shape[0]
    assert filtered.stats() == {"samples": rows, "filtered": dropped}
    assert 0 < dropped < rows


def test_a_mixture_is_filtered_and_names_its_sources():
    corpus = planted_corpus(1)
    mixture = mix({"a": corpus, "b": (np.arange(5000) % 700).astype(np.uint16)}, {"a": 3, "b": 1})
    stream = stream_token_source(
        mixture, 32, 16, instance_filter={"max_count": 8}, extras=("source",), epochs=1
    )
    batch = next(stream)
    assert set(batch) == {"input_ids", "labels", "loss_mask", "instance_mask", "source"}
    slots = row_slots(batch["input_ids"], batch["labels"])
    np.testing.assert_array_equal(
        batch["instance_mask"], [not repeats(row, 1, 13, 8) for row in slots]
    )


@pytest.mark.parametrize("policy", ["cross next", "packed"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_filtered_stream_resumes_to_the_same_batches_in_any_world_size(policy, world_size):
    corpus = planted_corpus(2)
    options = {"block": 48, "seed": 5, "instance_filter": True, **POLICIES[policy]}
    whole = list(stream_token_source(corpus, batch_size=6, **options))
    first = stream_token_source(corpus, batch_size=6, **options)
    for _ in range(3):
        next(first)
    state = first.state_dict()
    ranks = [
        stream_token_source(corpus, batch_size=2, rank=r, world_size=world_size, **options)
        for r in range(world_size)
    ]
    for stream in ranks:
        stream.load_state_dict(state)
    # Global batches of 6 rows after the third: the ranks' rows interleaved.
    resumed = []
    for step in zip(*ranks, strict=True):
        rows = {k: np.stack([b[k] for b in step], axis=1) for k in ("input_ids", "instance_mask")}
        resumed.append({k: v.reshape(-1, *v.shape[2:]) for k, v in rows.items()})
    flat = {k: np.concatenate([b[k] for b in whole[3:]]) for k in ("input_ids", "instance_mask")}
    got = {k: np.concatenate([b[k] for b in resumed]) for k in ("input_ids", "instance_mask")}
    size = min(len(flat["input_ids"]), len(got["input_ids"]))
    assert size > 0
    for key in flat:
        np.testing.assert_array_equal(got[key][:size], flat[key][:size])


def test_the_filter_does_not_change_the_fingerprint():
    corpus = planted_corpus(3)
    state = stream_token_source(corpus, 32, 4, instance_filter=True).state_dict()
    stream = stream_token_source(corpus, 32, 4)
    stream.load_state_dict(state)
    assert stream.stats() == {"samples": 0, "filtered": 0}


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ("yes", TypeError, "instance_filter must be a bool or a dict"),
        ({"max_period": 0}, ValueError, r"instance_filter\['max_period'\] must be positive"),
        ({"min_period": 9, "max_period": 3}, ValueError, r"instance_filter\['max_period'\]"),
        ({"periods": 3}, ValueError, r"instance_filter\['periods'\] is no setting"),
    ],
)
def test_bad_settings_are_refused_when_the_stream_is_made(value, kind, message):
    with pytest.raises(kind, match=message):
        stream_token_source(np.arange(100), 8, 2, instance_filter=value)
