"""Batch buffers: a batch the caller holds is never written again, dropped ones are reused, and
no reshaping of what the caller was handed can make a kernel write past a buffer."""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import _batch, stream_token_source
from tokstream._options import StreamOptions

EXTRAS = ("position_ids", "loss_mask", "cu_seqlens")


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def pooled_arrays(batch) -> list[np.ndarray]:
    """The arrays of a batch that come from reused buffers (not cu_seqlens, made per batch)."""
    if isinstance(batch, tuple):
        return list(batch)
    return [batch[name] for name in ("input_ids", "labels", "position_ids", "loss_mask")]


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("extras", [(), EXTRAS])
def test_a_batch_the_caller_holds_in_any_form_is_never_written_again(prefetch, extras):
    ids = np.random.default_rng(0).integers(0, 1000, 5000)
    stream = stream_token_source(ids, 16, 8, epochs=3, seed=1, prefetch=prefetch, extras=extras)
    held, copies = [], []
    for step, batch in enumerate(stream):
        arrays = pooled_arrays(batch)
        if step % 3 == 0:
            # Only a view, a buffer export and an array made from one: the batch is dropped.
            forms = (arrays[0][1:, ::2], memoryview(arrays[1]))
            forms += (np.frombuffer(arrays[-1], dtype=arrays[-1].dtype),)
            held.append(forms)
            copies.append([np.array(form, copy=True) for form in forms])
        del batch, arrays
    assert len(held) >= 10
    for forms, at_receipt in zip(held, copies, strict=True):
        for form, copy in zip(forms, at_receipt, strict=True):
            assert np.array_equal(np.asarray(form), copy)


def test_dropped_batches_lend_their_memory_to_later_ones():
    stream = stream_token_source(np.arange(10_000), 64, 32, epochs=5)
    seen = set()
    for windows, targets in stream:
        seen.add(address(windows))
        del windows, targets
    # A loop holds one batch while the next is made: two sets of buffers serve every batch.
    assert len(seen) <= 2


def test_the_pool_keeps_at_most_its_capacity_of_buffer_sets():
    options = StreamOptions.create(4, 3)
    pool = _batch.BufferPool(options, 3, capacity=2)
    held = [pool.take(3) for _ in range(5)]  # all held: five distinct sets, two kept
    assert len({address(views[0]) for views in held}) == 5
    assert len(pool._sets) == 2
    del held
    again = pool.take(2)
    assert again[0].shape == (2, 4) and again[1].shape == (2,)
    pool.clear()
    assert pool._sets == []


@pytest.mark.parametrize(
    ("extras", "made"),
    [
        ((), set()),
        (("loss_mask",), {"label_continues"}),
        (("position_ids",), {"position_ids"}),
        (("cu_seqlens",), {"position_ids"}),  # cu_seqlens is read from the position ids
        (EXTRAS, {"position_ids", "label_continues"}),
    ],
)
def test_a_batch_has_buffers_only_for_the_extras_it_asked_for(extras, made):
    # What is not asked for is neither allocated nor written (512 KiB of position ids for a
    # 64 x 1024 batch that only wants its loss mask).
    buffers = _batch.new_buffers(StreamOptions.create(4, 3, extras=extras), 3)
    assert set(buffers) == {"input_ids", "labels"} | made


def test_a_caller_reshaping_its_batch_leaves_the_stream_working():
    ids = np.arange(300)
    for reuse_buffers in (0, 1):
        stream = stream_token_source(ids, 8, 4, shuffle=False, reuse_buffers=reuse_buffers)
        windows, targets = next(stream)
        windows.shape = (2, 16)  # in place, on the caller's own view
        targets.shape = (2, 2)
        del windows, targets
        again, _ = next(stream)
        assert again.shape == (4, 8) and again[0, 0] == 4


@pytest.mark.parametrize("reuse_buffers", [0, 1])
def test_a_buffer_reshaped_through_base_is_refused_not_written_past(reuse_buffers):
    # A wider block would make the kernel read past the validated windows, more rows write past
    # the buffer: the shape check before every kernel call refuses it.
    stream = stream_token_source(np.arange(300), 8, 4, shuffle=False, reuse_buffers=reuse_buffers)
    windows, _ = next(stream)
    windows.base.shape = (2, 16)
    del windows
    with pytest.raises(ValueError, match=r"not \(4, 8\).*reshaped"):
        for _ in range(3):
            next(stream)


def test_a_tensor_made_from_a_batch_keeps_it_intact():
    torch = pytest.importorskip("torch")
    stream = stream_token_source(np.arange(5000), 16, 8, epochs=2, seed=3)
    held = []
    for step, (windows, _) in enumerate(stream):
        if step % 4 == 0:
            tensor = torch.from_numpy(windows)
            held.append((tensor, tensor.clone()))
    assert len(held) >= 10
    for tensor, at_receipt in held:
        assert torch.equal(tensor, at_receipt)
