"""The repetition filter's kernel against OLMo-core's ``find_periodic_sequences`` and a slow oracle.

OLMo-core (``ai2-olmo-core`` from PyPI) filters an instance when a run it reports repeats at
least ``repetition_max_count`` times; the kernel must decide the same on every sample, window or
packed piece, whatever its tokens. Samples are drawn at random over small vocabularies (runs
happen by chance) and with runs planted around the threshold (one repeat short of it, at it, past
it, cut mid-unit, at the sample's edges).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle_repetition import repeats, row_pieces, row_slots
from tokstream._kernels.repetition import filter_repeated
from tokstream._repetition import RepetitionFilter, filter_rows, instance_filter

DEFAULTS = (1, 13, 32)


def olmo_core_filters(tokens: np.ndarray, min_period: int, max_period: int, count: int) -> bool:
    """OLMo-core's own decision (``NumpyDatasetBase._validate_instance``), on int64 tokens."""
    utils = pytest.importorskip("olmo_core.data.utils")
    runs = utils.find_periodic_sequences(
        np.asarray(tokens, np.int64), max_period=max_period, min_period=min_period
    )
    return any(run.times >= count for run in runs)


def planted_samples(
    rng: np.random.Generator, rows: int, block: int, settings: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` samples of ``block + 1`` tokens, most with a run planted near the threshold."""
    min_period, max_period, count = settings
    vocab = int(rng.choice([2, 3, 7, 50_000]))
    slots = rng.integers(0, vocab, (rows, block + 1))
    for row in slots:
        if rng.random() < 0.25:
            continue
        period = int(rng.integers(max(1, min_period - 1), max_period + 3))
        times = max(count, 3) + int(rng.integers(-2, 3))
        unit = rng.integers(0, vocab, period)
        run = np.tile(unit, max(times, 1))
        # Cut mid-unit now and then: a partial last unit counts no repeat.
        run = run[: max(1, run.shape[0] - int(rng.integers(0, period + 1)))]
        run = run[: block + 1]
        at = int(
            rng.choice([0, block + 1 - run.shape[0], rng.integers(0, block + 2 - run.shape[0])])
        )
        row[at : at + run.shape[0]] = run
    return np.ascontiguousarray(slots[:, :-1]), slots[:, -1].copy()


def random_links(rng: np.random.Generator, rows: int, block: int) -> np.ndarray:
    """Packed rows' loss masks: pieces of random lengths, some padding (links of 0) at the end."""
    links = np.ones((rows, block), np.uint8)
    for row in links:
        cuts = rng.integers(0, block, int(rng.integers(0, 6)))
        row[cuts] = 0
        if rng.random() < 0.5:
            row[int(rng.integers(0, block)) :] = 0
    return links


def kernel(
    input_ids: np.ndarray,
    last_tokens: np.ndarray,
    settings: tuple[int, int, int],
    links: np.ndarray | None = None,
) -> tuple[np.ndarray, int, np.ndarray | None]:
    """``(kept, filtered count, loss mask after)`` from one kernel call."""
    kept = np.empty(input_ids.shape[0], np.uint8)
    mask = None if links is None else links.copy()
    count = filter_repeated(input_ids, last_tokens, mask, links is not None, *settings, kept)
    return kept.view(np.bool_), count, mask


SETTINGS = [DEFAULTS, (1, 13, 3), (2, 5, 6), (3, 3, 4), (1, 1, 1), (1, 20, 10), (4, 16, 2)]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("out_dtype", [np.int64, np.int32])
def test_windows_filtered_exactly_as_olmo_core_decides(settings, out_dtype):
    pytest.importorskip("olmo_core.data.utils")
    rng = np.random.default_rng(sum(settings) + np.dtype(out_dtype).itemsize)
    decided = 0
    for block in (2, 8, 40, 129, 500):
        input_ids, last = planted_samples(rng, 120, block, settings)
        kept, count, _ = kernel(input_ids.astype(out_dtype), last.astype(out_dtype), settings)
        slots = row_slots(input_ids, last)
        expected = np.array([not olmo_core_filters(row, *settings) for row in slots])
        np.testing.assert_array_equal(kept, expected)
        assert count == int((~expected).sum())
        decided += len(slots)
    assert decided == 600


@pytest.mark.parametrize("settings", SETTINGS[:4])
def test_packed_pieces_filtered_exactly_as_olmo_core_decides(settings):
    pytest.importorskip("olmo_core.data.utils")
    rng = np.random.default_rng(7 + sum(settings))
    for block in (8, 64, 300):
        input_ids, last = planted_samples(rng, 150, block, settings)
        links = random_links(rng, 150, block)
        kept, count, mask = kernel(input_ids, last, settings, links)
        slots = row_slots(input_ids, last)
        expected = np.array(
            [
                not any(olmo_core_filters(piece, *settings) for piece in row_pieces(row, link))
                for row, link in zip(slots, links, strict=True)
            ]
        )
        np.testing.assert_array_equal(kept, expected)
        assert count == int((~expected).sum())
        # A filtered row's loss mask is all False; the others' untouched.
        np.testing.assert_array_equal(mask[~expected], 0)
        np.testing.assert_array_equal(mask[expected], links[expected])


def test_the_slow_oracle_is_olmo_core_on_thousands_of_samples():
    pytest.importorskip("olmo_core.data.utils")
    rng = np.random.default_rng(3)
    for rule in SETTINGS:
        input_ids, last = planted_samples(rng, 300, 97, rule)
        for row in row_slots(input_ids, last):
            assert repeats(row, *rule) == olmo_core_filters(row, *rule)


@pytest.mark.parametrize("settings", SETTINGS)
def test_windows_filtered_as_the_oracle_decides(settings):
    rng = np.random.default_rng(11 + sum(settings))
    for block in (1, 3, 33, 257, 2048):
        input_ids, last = planted_samples(rng, 64, block, settings)
        kept, count, _ = kernel(input_ids, last, settings)
        expected = np.array([not repeats(row, *settings) for row in row_slots(input_ids, last)])
        np.testing.assert_array_equal(kept, expected)
        assert count == int((~expected).sum())


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2), min_size=2, max_size=120),
    min_period=st.integers(1, 6),
    extra_periods=st.integers(0, 8),
    count=st.integers(1, 12),
    cuts=st.lists(st.integers(0, 118), max_size=4),
    pieces=st.booleans(),
)
def test_kernel_is_the_oracle_on_any_tokens(tokens, min_period, extra_periods, count, cuts, pieces):
    settings = (min_period, min_period + extra_periods, count)
    slots = np.array(tokens, np.int64)
    block = slots.shape[0] - 1
    links = np.ones((1, block), np.uint8)
    links[0, [c for c in cuts if c < block]] = 0
    kept, count_filtered, _ = kernel(
        slots[None, :-1], slots[-1:], settings, links if pieces else None
    )
    parts = row_pieces(slots, links[0]) if pieces else [slots]
    expected = not any(repeats(part, *settings) for part in parts)
    assert bool(kept[0]) == expected
    assert count_filtered == (not expected)


def test_the_defaults_filter_32_repeats_and_keep_31():
    unit = np.arange(100, 113)  # period 13, the largest by default
    for times, kept in ((31, True), (32, False)):
        slots = np.concatenate([[5], np.tile(unit, times), [7]])
        got, _, _ = kernel(slots[None, :-1].copy(), slots[-1:], DEFAULTS)
        assert bool(got[0]) is kept
    # Period 14 is past max_period whatever its repeats.
    slots = np.tile(np.arange(14), 40)
    got, _, _ = kernel(slots[None, :-1].copy(), slots[-1:], DEFAULTS)
    assert bool(got[0])


def test_a_run_ending_in_the_last_target_counts():
    # 31 repeats in the window and the 32nd completed by the target after it.
    slots = np.concatenate([[9, 9], np.tile([1, 2], 32)])
    got, _, _ = kernel(slots[None, :-1].copy(), slots[-1:], DEFAULTS)
    assert not got[0]
    got, _, _ = kernel(slots[None, :-2].copy(), slots[-2:-1], DEFAULTS)
    assert got[0]


def test_strided_last_tokens_and_a_one_wide_loss_mask():
    # targets="shifted": each row's last token is its labels' last column, a strided view.
    labels = np.tile(np.arange(3, dtype=np.int64), (4, 1))
    input_ids = np.zeros((4, 40), np.int64)
    input_ids[1] = np.arange(40) % 4
    input_ids[2, :] = 1
    mask = np.ones((4, 1), np.uint8)
    kept = np.empty(4, np.uint8)
    assert filter_repeated(input_ids, labels[:, -1], mask, False, 1, 13, 32, kept) == 3
    assert kept.tolist() == [0, 1, 0, 0] and mask[:, 0].tolist() == [0, 1, 0, 0]


BAD_BUFFERS = {
    "last tokens of another batch": dict(last=np.zeros(3, np.int64)),
    "instance mask of another batch": dict(kept=np.zeros(5, np.uint8)),
    "loss mask of another batch": dict(mask=np.ones((3, 8), np.uint8)),
    "loss mask of another width": dict(mask=np.ones((4, 5), np.uint8)),
    "pieces without a loss mask": dict(mask=None, pieces=True),
    "pieces with a one-wide loss mask": dict(mask=np.ones((4, 1), np.uint8), pieces=True),
    "no slots": dict(input_ids=np.zeros((4, 0), np.int64)),
    "period 0": dict(periods=(0, 13, 32)),
    "max period 0": dict(periods=(1, 0, 32)),
    "period past 2**31": dict(periods=(1, (1 << 31) + 1, 32)),
    "count past 2**31": dict(periods=(1, 13, (1 << 31) + 1)),
}


@pytest.mark.parametrize("case", BAD_BUFFERS, ids=list(BAD_BUFFERS))
def test_buffers_not_of_one_batch_are_refused_before_anything_is_written(case):
    given_ = {
        "input_ids": np.zeros((4, 8), np.int64),
        "last": np.zeros(4, np.int64),
        "mask": np.ones((4, 8), np.uint8),
        "pieces": False,
        "periods": DEFAULTS,
        "kept": np.full(4, 7, np.uint8),
        **BAD_BUFFERS[case],
    }
    kept, mask = given_["kept"], given_["mask"]
    before = None if mask is None else mask.copy()
    with pytest.raises(ValueError, match="filter_repeated"):
        filter_repeated(
            given_["input_ids"], given_["last"], mask, given_["pieces"], *given_["periods"], kept
        )
    assert (kept == 7).all() or kept.shape != (4,)
    if mask is not None:
        np.testing.assert_array_equal(mask, before)


def test_settings_default_to_olmo_core_s():
    assert instance_filter(True) == RepetitionFilter(1, 13, 32) == instance_filter({})
    assert instance_filter(None) is None and instance_filter(False) is None
    assert instance_filter({"max_count": 8}) == RepetitionFilter(1, 13, 8)
    assert instance_filter({"min_period": 2.0, "max_period": np.int64(4)}) == (2, 4, 32)


BAD_SETTINGS = [
    ("on", TypeError, "instance_filter must be a bool or a dict"),
    ([1, 13, 32], TypeError, "instance_filter must be a bool or a dict"),
    ({"period": 3}, ValueError, r"instance_filter\['period'\] is no setting"),
    ({"repetition_max_count": 3}, ValueError, r"instance_filter\['repetition_max_count'\]"),
    ({"min_period": 0}, ValueError, r"instance_filter\['min_period'\] must be positive"),
    ({"max_period": -1}, ValueError, r"instance_filter\['max_period'\] must be positive"),
    ({"max_count": 0}, ValueError, r"instance_filter\['max_count'\] must be positive"),
    ({"max_count": 2.5}, ValueError, r"instance_filter\['max_count'\]"),
    ({"max_count": "32"}, TypeError, r"instance_filter\['max_count'\] must be an int"),
    ({"max_period": True}, TypeError, r"instance_filter\['max_period'\] must be an int"),
    ({"min_period": 5, "max_period": 4}, ValueError, r"instance_filter\['max_period'\] = 4 must"),
    ({"max_period": (1 << 31) + 1}, ValueError, r"instance_filter\['max_period'\] must be at most"),
    ({"max_count": 1 << 40}, ValueError, r"instance_filter\['max_count'\] must be at most"),
]


@pytest.mark.parametrize(("value", "kind", "message"), BAD_SETTINGS)
def test_bad_settings_are_refused_naming_the_setting(value, kind, message):
    with pytest.raises(kind, match=message):
        instance_filter(value)


def test_filter_rows_reads_the_last_target_of_either_kind_of_labels():
    input_ids = np.zeros((2, 40), np.int64)
    input_ids[1] = np.arange(40)
    for labels in (np.zeros(2, np.int64), np.zeros((2, 40), np.int64)):
        mask = np.ones((2, 1 if labels.ndim == 1 else 40), np.uint8)
        kept = np.empty(2, np.bool_)
        assert filter_rows(RepetitionFilter(), input_ids, labels, mask, False, kept) == 1
        assert kept.tolist() == [False, True] and not mask[0].any() and mask[1].all()
