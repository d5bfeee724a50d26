"""Any shape on resume: a state saved with one ``(world_size, batch_size)`` loads into any other.

The cursor counts order positions (global samples), so the ranks of the new shape continue from
the first position not yet consumed and the global sequence of positions is unchanged; only the
epoch tail is the new shape's (``(n - p) % W`` positions left over are skipped, and with
``drop_last`` a final partial global batch). The corpus here is ``np.arange``, so a window's
first token is its index and the order can be read off the batches.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.model import model_positions
from tokstream import mix, stream_token_source

BLOCK = 2


def epoch_orders(source: Any, epochs: int, **controls: Any) -> list[np.ndarray]:
    """Each epoch's order (window indices by position), as one process with one batch per
    epoch streams it."""
    single = stream_token_source(source, BLOCK, 1, epochs=epochs, **controls)
    n = single.num_windows
    whole = stream_token_source(source, BLOCK, max(n, 1), epochs=epochs, **controls)
    return [windows[:, 0] for windows, _ in whole] if n else [np.empty(0, np.int64)] * epochs


def oracle_steps(orders, shapes, drop_last: bool) -> list[np.ndarray]:
    """The global steps (window indices in position order) of a run that streams ``steps``
    global steps with each ``(world_size, batch_size, steps)`` of ``shapes`` in turn (None: to
    the end): the positions the fuzz model's rule gives (:func:`fuzz.model.model_positions`),
    read off each epoch's order."""
    controls = {"drop_last": drop_last, "epochs": len(orders)}
    return [
        orders[epoch][first : first + rows * world]
        for epoch, first, rows, world in model_positions(len(orders[0]), controls, shapes)
    ]


def run_shapes(source: Any, shapes, **controls: Any) -> list[np.ndarray]:
    """Stream ``source`` through ``shapes``, loading rank 0's state into every rank of the next
    shape; each global step's window indices in position order."""
    steps, state = [], None
    for world, batch, count in shapes:
        streams = [
            stream_token_source(source, BLOCK, batch, rank=r, world_size=world, **controls)
            for r in range(world)
        ]
        for stream in streams:
            if state is not None:
                stream.load_state_dict(state)
        assert len({len(s) for s in streams}) == 1
        assert len({s.__length_hint__() for s in streams}) == 1
        taken = 0
        while count is None or taken < count:
            batches = [next(stream, None) for stream in streams]
            if batches[0] is None:
                assert all(b is None for b in batches), "the ranks ended apart"
                break
            # Row k of rank r holds position first + r + k * world: interleave the ranks.
            steps.append(np.stack([b[0][:, 0] for b in batches], axis=1).reshape(-1))
            taken += 1
        state = json.loads(json.dumps(streams[0].state_dict()))
    return steps


def assert_same_steps(got, want) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"global step {step}")


shape = st.tuples(st.integers(1, 5), st.integers(1, 9), st.integers(0, 8))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    num_windows=st.integers(0, 70),
    epochs=st.integers(1, 3),
    shapes=st.lists(shape, min_size=2, max_size=4),
    order=st.sampled_from(
        [
            {"shuffle": False},
            {"shuffle": True, "permutation": "materialized"},
            {"shuffle": True, "permutation": "implicit"},
        ]
    ),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_resume_into_any_shape_continues_the_global_sequence(
    num_windows, epochs, shapes, order, drop_last, seed
):
    shapes[-1] = (*shapes[-1][:2], None)
    tokens = np.arange(num_windows + BLOCK, dtype=np.int64)
    orders = epoch_orders(tokens, epochs, **order, seed=seed)
    controls = {**order, "seed": seed, "drop_last": drop_last, "epochs": epochs}
    assert_same_steps(
        run_shapes(tokens, shapes, **controls), oracle_steps(orders, shapes, drop_last)
    )


def test_a_batch_size_ramp_sees_every_window_of_an_epoch_once():
    # Two ranks ramp 4 -> 8 -> 16 windows each within one epoch of 1000 windows.
    tokens = np.arange(1000 + BLOCK)
    shapes = [(2, 4, 10), (2, 8, 20), (2, 16, None)]
    steps = run_shapes(tokens, shapes, epochs=1, seed=3)
    seen = np.concatenate(steps)
    assert [len(s) for s in steps] == [8] * 10 + [16] * 20 + [32] * 18 + [24]
    np.testing.assert_array_equal(np.sort(seen), np.arange(1000))


def test_a_state_saved_mid_step_of_another_world_continues_at_its_position():
    tokens = np.arange(100 + BLOCK)
    old = stream_token_source(tokens, BLOCK, 3, world_size=1, shuffle=False)
    next(old)
    state = old.state_dict()
    assert state["position"] == 3
    # Two ranks of 2: positions 3, 4 / 5, 6 and so on; the tail is what two ranks leave over.
    new = [
        stream_token_source(tokens, BLOCK, 2, rank=r, world_size=2, shuffle=False) for r in (0, 1)
    ]
    for stream in new:
        stream.load_state_dict(state)
    assert next(new[0])[0][:, 0].tolist() == [3, 5]
    assert next(new[1])[0][:, 0].tolist() == [4, 6]
    # 97 positions were left: 48 each, the last position (99) is the new world's tail.
    assert new[0].__length_hint__() == new[1].__length_hint__() == 23


def test_a_state_past_the_new_shapes_last_batch_starts_the_next_epoch():
    tokens = np.arange(10 + BLOCK)
    old = stream_token_source(tokens, BLOCK, 3, epochs=2, shuffle=False)
    for _ in range(3):
        next(old)  # positions 0..8 consumed; position 9 remains for one process
    assert old.state_dict()["position"] == 9
    new = stream_token_source(tokens, BLOCK, 1, world_size=2, epochs=2, shuffle=False)
    new.load_state_dict(old.state_dict())
    # Saved before a batch, the state is still the loaded one: one process resumed from it
    # streams position 9.
    assert (new.state_dict()["epoch"], new.state_dict()["position"]) == (0, 9)
    again = stream_token_source(tokens, BLOCK, 1, epochs=2, shuffle=False)
    again.load_state_dict(new.state_dict())
    assert next(again)[0][:, 0].tolist() == [9]
    # One position left is two ranks' tail: the run continues with the next epoch.
    assert next(new)[0][:, 0].tolist() == [0]
    assert new.state_dict()["epoch"] == 1


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_state_moved_to_the_next_epoch_is_reported_until_a_batch_is_handed_out(prefetch):
    tokens = np.arange(10 + BLOCK)
    old = stream_token_source(tokens, BLOCK, 3, epochs=1, shuffle=False)
    for _ in range(3):
        next(old)
    new = stream_token_source(tokens, BLOCK, 1, world_size=2, shuffle=False, prefetch=prefetch)
    new.load_state_dict(old.state_dict())
    # The run's only epoch has no batch left for two ranks: nothing comes, nothing is lost.
    assert next(new, None) is None
    assert (new.state_dict()["epoch"], new.state_dict()["position"]) == (0, 9)
    new.seek(0)
    assert next(new)[0][:, 0].tolist() == [0]
    assert (new.state_dict()["epoch"], new.state_dict()["position"]) == (0, 2)


def test_a_mixture_resumes_into_any_shape():
    mixture = mix({"a": np.arange(60), "b": 1000 + np.arange(40)}, {"a": 2, "b": 1})
    shapes = [(3, 4, 2), (2, 7, 3), (4, 1, None)]
    got = run_shapes(mixture, shapes, epochs=2, seed=5, samples=50)
    orders = epoch_orders(mixture, 2, seed=5, samples=50)
    assert_same_steps(got, oracle_steps(orders, shapes, drop_last=False))


def test_a_state_of_an_earlier_version_with_its_global_batch_size_still_loads():
    stream = stream_token_source(np.arange(50), BLOCK, 4, world_size=2)
    next(stream)
    state = stream.state_dict()
    state["config"]["global_batch_size"] = 8  # what earlier fingerprints held
    other = stream_token_source(np.arange(50), BLOCK, 3)
    other.load_state_dict(state)
    assert other.state_dict()["position"] == 8


@pytest.mark.parametrize(
    ("position", "error", "match"),
    [
        (49, ValueError, r"state\['position'\] = 49 is past the end of an epoch of 48"),
        (-1, ValueError, r"state\['position'\] must be nonnegative"),
        (1.5, TypeError, r"state\['position'\] must be an int"),
    ],
)
def test_a_position_outside_the_epoch_is_refused_naming_it(position, error, match):
    stream = stream_token_source(np.arange(50), BLOCK, 4, shuffle=False)
    state = stream.state_dict()
    state["position"] = position
    with pytest.raises(error, match=match):
        stream_token_source(np.arange(50), BLOCK, 5, world_size=3, shuffle=False).load_state_dict(
            state
        )


def test_a_torch_dataset_resumes_into_another_world_and_batch_size():
    pytest.importorskip("torch")
    from tokstream.torch import TokenDataset

    tokens = np.arange(200 + BLOCK)
    old = [TokenDataset(tokens, BLOCK, 4, rank=r, world_size=2, seed=1) for r in (0, 1)]
    iterators = [iter(d) for d in old]
    first = [[next(it)[0][:, 0].numpy() for _ in range(5)] for it in iterators]
    state = old[0].state_dict()
    new = [TokenDataset(tokens, BLOCK, 6, rank=r, world_size=3, seed=1) for r in range(3)]
    for dataset in new:
        dataset.load_state_dict(state)
    rest = [[x[:, 0].numpy() for x, _ in d] for d in new]
    seen = np.concatenate([np.concatenate(r) for r in first] + [np.concatenate(r) for r in rest])
    # 200 windows: 40 consumed by the old world, 160 left, shared by three ranks (159 used).
    assert len(seen) == 40 + 159 and len(np.unique(seen)) == len(seen)
