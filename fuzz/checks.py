"""The fuzz harness' checks: run one generated call, state edit or token file against the model.

Every check ends in exactly one of two ways: the batches (or file contents) the model predicts,
and with the reference's own arguments on a plain array the batches of
``tokstream.reference.stream_token_source`` byte for byte; or the TypeError/ValueError the model
predicts, whose message names the offending argument. Anything else is an AssertionError. Each
check returns a short name of its outcome, for the runner's tally.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import itertools
import json
import os
import pickle
import sys
import threading
import warnings
from typing import Any

import numpy as np

from fuzz.model import (
    DEFAULTS,
    EXTRA_ARGS,
    REFUSED,
    SPEC_ARGS,
    DocumentList,
    Rejected,
    ShardList,
    TokenFile,
    cursor_of,
    file_verdict,
    mixture_epoch,
    model_batches,
    model_call,
    model_length,
    model_mixture,
    model_mixture_batches,
    model_mixture_length,
    model_reshaped_run,
    recorded_offsets,
    windows_in,
)
from fuzz.schedule import schedule_edit_verdict
from tokstream import Corpus, mix, open_tokens, reference, stream_token_source, write_tokens
from tokstream._options import DOCUMENT_EXTRAS
from tokstream.shards.filemap import file_map_of

# Batches compared per call: epochs may be 2**70.
MAX_BATCHES = 30


def build_stream(tokens: Any, kwargs: dict[str, Any]):
    if isinstance(tokens, DocumentList):
        return stream_token_source(Corpus.from_documents(tokens.documents), **kwargs)
    source = Corpus(tokens.shards) if isinstance(tokens, ShardList) else tokens
    return stream_token_source(source, **kwargs)


def assert_batches_equal(got, expected, what: str, held: int = 1) -> int:
    """Compare batch by batch, as they arrive, and hold on to the last ``held``: with
    ``reuse_buffers=k`` a batch must stay intact until the caller has received ``k`` more (so
    each of the last ``k`` is checked again at every step), and may be overwritten after."""
    missing = object()
    count = 0
    # A huge reuse_buffers holds every batch compared (at most MAX_BATCHES of them).
    holding: collections.deque = collections.deque(maxlen=min(max(held, 1), MAX_BATCHES + 1))
    for i, (batch, want_batch) in enumerate(
        itertools.zip_longest(got, expected, fillvalue=missing)
    ):
        assert batch is not missing, f"{what}: {i} batches, expected more"
        assert want_batch is not missing, f"{what}: more than the {i} batches expected"
        holding.append((i, batch, want_batch))
        for j, held_batch, held_want in holding:
            assert_batch_equal(held_batch, held_want, f"{what} batch {j} (at batch {i})")
        count += 1
    return count


def assert_batch_equal(batch, want, what: str) -> None:
    """A tuple of int64 arrays, or a dict of the extras, equal to the model's."""
    if isinstance(want, dict):
        assert isinstance(batch, dict) and batch.keys() == want.keys(), f"{what}: {batch.keys()}"
        pairs = [(batch[k], want[k]) for k in want]
    else:
        assert isinstance(batch, tuple), f"{what}: {type(batch).__name__}"
        pairs = list(zip(batch, want, strict=True))
    for array, expected in pairs:
        if not isinstance(expected, np.ndarray):
            assert type(array) is type(expected) and array == expected, what
            continue
        assert array.dtype == expected.dtype and array.flags.c_contiguous, f"{what}: dtype"
        assert array.shape == expected.shape, f"{what}: {array.shape} != {expected.shape}"
        assert np.array_equal(array, expected), f"{what} differs"


def assert_no_prefetch_thread() -> None:
    """close() stops a prefetching stream's thread and waits for it."""
    alive = [t for t in threading.enumerate() if t.name.startswith("tokstream")]
    assert not alive, f"threads left running: {alive}"


# ---------------------------------------------------------------------------------------------
# Calls


def check_call(tokens: Any, kwargs: dict[str, Any]) -> str:
    """Run one call against the model (and the reference); return the outcome's kind."""
    try:
        shards, controls = model_call(tokens, kwargs)
    except Rejected as verdict:
        expected = verdict
    else:
        expected = None

    try:
        stream = build_stream(tokens, kwargs)
    except (TypeError, ValueError) as exc:
        assert expected is not None, f"valid call raised {exc!r}"
        assert type(exc) is expected.error, f"{exc!r}: expected {expected.error.__name__}"
        assert expected.name in str(exc), f"{exc!r} does not name {expected.name}"
        outcome = f"{type(exc).__name__}:{expected.name.split('[')[0]}"
    else:
        assert expected is None, f"expected {expected.error.__name__} for {expected.name}"
        outcome = check_stream(stream, shards, controls)

    if not isinstance(tokens, ShardList):
        check_reference(tokens, kwargs, expected)
    return outcome


def check_stream(stream, shards, controls) -> str:
    """The stream's batches are the model's; returns ``"batches"``, or ``"batches, then
    refused"`` when the model's batches reach one that ``out_dtype`` must refuse."""
    try:
        count = model_length(shards, controls)
        if count <= sys.maxsize:
            assert len(stream) == count, f"len {len(stream)} != {count}"
        expected = list(itertools.islice(model_batches(shards, controls), MAX_BATCHES))
        refused = next((i for i, batch in enumerate(expected) if batch is REFUSED), None)
        head = itertools.islice(stream, MAX_BATCHES if refused is None else refused)
        held = controls["reuse_buffers"]
        assert_batches_equal(head, iter(expected[:refused]), "stream", held=held)
        if refused is not None:
            check_refused(stream, refused)
    finally:
        stream.close()
    assert_no_prefetch_thread()
    return "batches" if refused is None else "batches, then refused"


def check_refused(stream, step: int) -> None:
    """Batch ``step`` holds a token outside int32 (out_dtype="int32"): refused whole with a
    ValueError naming out_dtype, again on the next call (the stream has not moved)."""
    for attempt in range(2):
        try:
            next(stream)
        except ValueError as exc:
            assert "out_dtype" in str(exc), f"batch {step}: {exc!r} does not name out_dtype"
        else:
            raise AssertionError(f"batch {step} (attempt {attempt}): a token outside int32 passed")


def uses_spec_options_only(kwargs: dict[str, Any]) -> bool:
    """No tokstream option (targets, sharding, ...) differs from its default."""
    return all(
        type(kwargs[name]) is type(DEFAULTS[name]) and kwargs[name] == DEFAULTS[name]
        for name in EXTRA_ARGS
        if name in kwargs
    )


def check_reference(tokens: Any, kwargs: dict[str, Any], expected: Rejected | None) -> None:
    """The reference path raises what the fast path raises on the spec's own arguments."""
    spec_kwargs = {k: v for k, v in kwargs.items() if k in SPEC_ARGS}
    extras_only = expected is not None and expected.name.split("[")[0] in EXTRA_ARGS
    try:
        ref = reference.stream_token_source(tokens, **spec_kwargs)
    except (TypeError, ValueError) as exc:
        assert expected is not None and not extras_only, f"reference raised {exc!r}"
        assert type(exc) is expected.error and expected.name in str(exc), repr(exc)
        return
    assert expected is None or extras_only, "reference accepted an invalid call"
    if expected is not None or not uses_spec_options_only(kwargs):
        return
    fast = build_stream(tokens, kwargs)
    assert_batches_equal(
        itertools.islice(fast, MAX_BATCHES), itertools.islice(ref, MAX_BATCHES), "reference"
    )


def check_mixture(sources, weights, kwargs) -> str:
    """A mixture's stream yields the model's batches and length, or the predicted error."""
    try:
        arrays, stages, controls = model_mixture(sources, weights, kwargs)
    except Rejected as verdict:
        expected = verdict
    else:
        expected = None
    try:
        stream = stream_token_source(mix(sources, weights), **kwargs)
    except (TypeError, ValueError) as exc:
        assert expected is not None, f"valid mixture raised {exc!r}"
        assert type(exc) is expected.error, f"{exc!r}: expected {expected.error.__name__}"
        assert expected.name in str(exc), f"{exc!r} does not name {expected.name}"
        return f"mixture {type(exc).__name__}:{expected.name.split('[')[0]}"
    assert expected is None, f"expected {expected.error.__name__} for {expected.name}"
    try:
        assert len(stream) == model_mixture_length(arrays, controls)
        expected_batches = model_mixture_batches(arrays, stages, controls)
        assert_batches_equal(
            itertools.islice(stream, MAX_BATCHES),
            itertools.islice(expected_batches, MAX_BATCHES),
            "mixture",
            held=controls["reuse_buffers"],
        )
    finally:
        stream.close()
    assert_no_prefetch_thread()
    return "mixture batches"


# ---------------------------------------------------------------------------------------------
# Resumable state, edited by hand


def check_state_edit(tokens, kwargs, steps: int, edit) -> str:
    """Take a state after ``steps`` batches, edit it, load it into a fresh stream.

    The load either raises TypeError/ValueError and leaves the stream where it was, or the
    stream then yields exactly the model's batches from the cursor it reports.
    """
    shards, controls = model_call(tokens, kwargs)
    return _edited_state_outcome(
        lambda: build_stream(tokens, kwargs),
        lambda cursor=None: model_batches(shards, controls, cursor),
        steps,
        edit,
    )


def check_mixture_state_edit(sources, weights, kwargs, steps: int, edit) -> str:
    """:func:`check_state_edit` for a valid mixture call (its sources, weights and schedule are
    fingerprinted too)."""
    arrays, stages, controls = model_mixture(sources, weights, kwargs)
    counts = [windows_in(len(t), controls["block"], controls["stride"]) for t in arrays]

    def schedule_edit(state):
        # A schedule edited only after the saved position loads (a stage added to a run).
        original = copy.deepcopy(state)
        edited, must_reject = edit(state)
        verdict = schedule_edit_verdict(
            original, edited, must_reject, mixture_epoch(counts, controls)
        )
        return edited, verdict

    return "mixture state " + _edited_state_outcome(
        lambda: stream_token_source(mix(sources, weights), **kwargs),
        lambda cursor=None: model_mixture_batches(arrays, stages, controls, cursor),
        steps,
        schedule_edit,
    )


def _edited_state_outcome(make_stream, model, steps, edit) -> str:
    """Two streams from ``make_stream()``: the state the first reports after ``steps`` batches,
    edited, loaded into the second. ``model(cursor=None)``: the model's batches from the start,
    or from a cursor."""
    source, target = make_stream(), make_stream()
    try:
        outcome = _load_edited_state(source, target, model, steps, edit)
    finally:
        source.close()
        target.close()
    assert_no_prefetch_thread()
    return outcome


def _load_edited_state(source, target, model, steps, edit) -> str:
    for _ in itertools.islice(source, steps):
        pass
    state = json.loads(json.dumps(source.state_dict()))
    edited, must_reject = edit(copy.deepcopy(state))
    try:
        target.load_state_dict(edited)
    except (TypeError, ValueError) as exc:
        assert "state" in str(exc), f"{exc!r} does not name the state"
        assert_batches_equal(
            itertools.islice(target, 3),
            itertools.islice(model(), 3),
            "stream after a refused state",
        )
        return "refused"
    assert not must_reject, f"accepted a state whose config or version was edited: {edited!r}"
    loaded = target.state_dict()
    assert loaded["config"] == state["config"]
    if edited == state:
        # An unedited state resumes right after the batches the source consumed.
        expected = itertools.islice(model(), steps, steps + MAX_BATCHES)
    else:
        expected = itertools.islice(model(cursor_of(loaded)), MAX_BATCHES)
    assert_batches_equal(
        itertools.islice(target, MAX_BATCHES), expected, "stream after an accepted state"
    )
    return "accepted"


def check_reshaped_resume(tokens, kwargs, shapes) -> str:
    """A run whose ``(world_size, batch_size)`` changes at each resume: ``shapes`` is
    ``[(world_size, batch_size, steps), ...]``; every rank of a shape streams ``steps`` global
    steps (the last shape: to the end), then rank 0's state is loaded into every rank of the
    next shape. The union of the ranks' rows, step by step in order-position order, is the
    model's global sequence (:func:`fuzz.model.model_reshaped_run`)."""
    kwargs = {**kwargs, "extras": (), "prefetch": 0}  # rows compared one by one
    shards, controls = model_call(tokens, kwargs)
    expected = model_reshaped_run(shards, controls, shapes)
    got, state = [], None
    for world, batch_size, steps in shapes:
        streams = []
        for rank in range(world):
            call = {**kwargs, "world_size": world, "batch_size": batch_size, "rank": rank}
            stream = build_stream(tokens, call)
            if state is not None:
                stream.load_state_dict(state)
            streams.append(stream)
        lengths = {stream.__length_hint__() for stream in streams}
        assert len(lengths) == 1, f"ranks have different batches left: {lengths}"
        for _ in itertools.count() if steps is None else range(steps):
            batches = [next(stream, None) for stream in streams]
            if batches[0] is None:
                assert all(batch is None for batch in batches), "ranks ended apart"
                break
            # Rank r's row k is order position first + r + k * world.
            rows = batches[0][0].shape[0]
            assert all(batch[0].shape[0] == rows for batch in batches), "ranks' rows differ"
            got.append(
                tuple(
                    np.stack([batches[r][part][k] for k in range(rows) for r in range(world)])
                    for part in (0, 1)
                )
            )
        state = json.loads(json.dumps(streams[0].state_dict()))
        assert all(stream.state_dict() == {**state, "rank": i} for i, stream in enumerate(streams))
        for stream in streams:
            stream.close()
    assert len(got) == len(expected), f"{len(got)} global steps, the model has {len(expected)}"
    for step, (batch, want) in enumerate(zip(got, expected, strict=True)):
        assert_batch_equal(batch, want, f"global step {step} of a reshaped run")
    return f"reshaped resume x{len(shapes) - 1}"


# ---------------------------------------------------------------------------------------------
# Token files and the command line that reads them


def check_token_file(directory, token_file: TokenFile) -> str:
    """open_tokens gives exactly the file's tokens, or a ValueError/TypeError naming the file;
    a stream over what it gives yields the model's batches, read in bounds (debug build), and
    so does a stream with every extra over the documents a Megatron or Arrow file records."""
    path = directory / token_file.name
    path.write_bytes(token_file.data)
    for name, data in token_file.beside.items():
        (directory / name).write_bytes(data)
    try:
        expected = file_verdict(path, token_file.data, token_file.kwargs)
        try:
            corpus = open_tokens(path, **token_file.kwargs)
        except (TypeError, ValueError) as exc:
            assert isinstance(expected, type), f"a valid file raised {exc!r}"
            assert type(exc) is expected, f"{exc!r}: expected {expected.__name__}"
            names_argument = any(k in str(exc) for k in ("dtype", "format"))
            names_file = any(str(directory / n) in str(exc) for n in token_file.names())
            assert names_file or names_argument, f"{exc!r} does not name the file"
            return f"file {type(exc).__name__}"
        assert not isinstance(expected, type), f"expected {expected.__name__}, got {corpus}"
        (shard,) = corpus.shards
        assert shard.dtype == expected.dtype.newbyteorder("=")
        assert np.array_equal(shard, expected), "the corpus differs from the file's tokens"
        assert not shard.flags.writeable
        controls = {
            **DEFAULTS,
            "block": 3,
            "batch_size": 5,
            "epochs": 1,
            "shuffle": True,
            "seed": 1,
            "recorded": [set()],
            # A corpus (an opened file is one) is not what the reference takes: no reference
            # order to match, so the default is the implicit one.
            "permutation": "implicit",
        }
        stream = stream_token_source(corpus, 3, 5, seed=1)
        try:
            assert_batches_equal(
                itertools.islice(stream, MAX_BATCHES),
                itertools.islice(model_batches([expected.astype(np.int64)], controls), MAX_BATCHES),
                "stream over a token file",
            )
        finally:
            stream.close()
            del stream
        offsets = recorded_offsets(path, token_file.data, token_file.kwargs)
        if offsets is None:
            del corpus, shard
            return "file accepted"
        # The documents the file records: every extra, both window policies, as the model has
        # them from the file's own offsets.
        controls["extras"], controls["recorded"] = DOCUMENT_EXTRAS, [set(offsets[1:-1].tolist())]
        for windows in ("cross", "within"):
            controls["windows"] = windows
            stream = stream_token_source(
                corpus, 3, 5, seed=1, extras=DOCUMENT_EXTRAS, windows=windows
            )
            # The default order of a stream outside the reference's options is implicit.
            controls["permutation"] = stream.options.permutation
            try:
                assert_batches_equal(
                    itertools.islice(stream, MAX_BATCHES),
                    itertools.islice(
                        model_batches([expected.astype(np.int64)], controls), MAX_BATCHES
                    ),
                    f"documents of a token file, windows={windows!r}",
                )
            finally:
                stream.close()
                del stream
        del corpus, shard
        return "file documents"
    finally:
        path.unlink()
        for name in token_file.beside:
            (directory / name).unlink()


def cli_flags(kwargs: dict[str, Any], prefix: str = "") -> list[str] | None:
    """The ``open_tokens`` arguments as command-line flags, or None if they have no spelling."""
    flags = []
    for name in ("format", "dtype"):
        value = kwargs.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return None
        flags += [f"--{prefix}{name}", value]
    return flags


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from tokstream import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    # argparse writes its usage errors to sys.stderr itself, not to main()'s stderr.
    with contextlib.redirect_stderr(stderr):
        code = cli.main(argv, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def check_cli_file(directory, token_file: TokenFile) -> str:
    """``tokstream inspect`` and ``convert`` on any file: the file's true contents and exit
    code 0, or exit code 1 (2 for a flag argparse refuses) with one line of error naming the
    file on stderr: never a traceback, never a half-written output."""
    inspect_flags = cli_flags(token_file.kwargs)
    if inspect_flags is None:
        return "cli skipped"
    path = directory / token_file.name
    output = directory / "converted.npy"
    path.write_bytes(token_file.data)
    for name, data in token_file.beside.items():
        (directory / name).write_bytes(data)
    try:
        expected = file_verdict(path, token_file.data, token_file.kwargs)
        code, out, err = run_cli(["inspect", "--json", "--quiet", str(path), *inspect_flags])
        assert "Traceback" not in err, err
        if isinstance(expected, type):
            assert code in (1, 2), f"inspect exited {code} on a bad file: {out!r} {err!r}"
            if code == 1:
                assert err.count("\n") == 1, err
                assert any(str(directory / n) in err for n in token_file.names()), err
            return f"cli exit {code}"
        assert code == 0, f"inspect exited {code} on a valid file: {err!r}"
        (summary,) = json.loads(out)
        assert summary["tokens"] == expected.shape[0]
        if expected.size:
            assert summary["min_id"] == int(expected.min())
            assert summary["max_id"] == int(expected.max())
        code, out, err = run_cli(
            ["convert", "--quiet", str(path), str(output), *cli_flags(token_file.kwargs, "in-")]
        )
        assert code == 0, f"convert exited {code} on a valid file: {err!r}"
        (shard,) = open_tokens(output).shards
        assert np.array_equal(shard, expected), "convert changed the tokens"
        del shard
        return "cli exit 0"
    finally:
        path.unlink()
        output.unlink(missing_ok=True)
        for name in token_file.beside:
            (directory / name).unlink()


# ---------------------------------------------------------------------------------------------
# Lifecycle: rewinds, attribute edits, pickling and forks in the middle of a stream

# Public attributes a caller might assign to mid-stream, and values that would break the
# kernel's bounds if they were taken.
ATTRIBUTE_EDITS = [
    ("block", 10**6),
    ("batch_size", 10**6),
    ("num_windows", 10**9),
    ("positions_per_epoch", 10**9),
]


def check_lifecycle(tokens, kwargs, steps: int, event: str, directory) -> str:
    """After ``steps`` batches, ``event`` happens; the stream then yields the model's batches.

    ``rewind``: load the state taken at the start (with a prefetch thread running ahead).
    ``edit``: assign to the public attributes and to the corpus' arrays; each assignment raises
    and changes nothing. ``pickle``: the tokens as a token file, the corpus pickled and
    unpickled (it maps the file again), a new stream over it resumed from the state. ``fork``:
    the rest of the stream comes from a forked child (POSIX), and the parent's is unchanged.
    ``seek``: ``seek()`` to a step behind (odd ``steps``) or ahead; the model's batches from it.
    """
    shards, controls = model_call(tokens, kwargs)
    if event == "pickle":
        path = write_tokens(directory / "tokens.npy", tokens, dtype=tokens.dtype)
        stream = stream_token_source(open_tokens(path), **kwargs)
    else:
        stream = build_stream(tokens, kwargs)
    expected = model_batches(shards, controls)
    try:
        start = stream.state_dict()
        assert_batches_equal(
            itertools.islice(stream, steps), itertools.islice(expected, steps), "before"
        )
        rest = itertools.islice(model_batches(shards, controls), steps, steps + MAX_BATCHES)
        if event == "rewind":
            stream.load_state_dict(start)
            rest = itertools.islice(model_batches(shards, controls), MAX_BATCHES)
        elif event == "edit":
            _edit_attributes(stream)
        elif event == "seek":
            target = steps // 2 if steps % 2 else steps + 3
            stream.seek(target)
            rest = itertools.islice(model_batches(shards, controls), target, target + MAX_BATCHES)
        elif event == "pickle":
            state = stream.state_dict()
            corpus = pickle.loads(pickle.dumps(stream.corpus))
            assert file_map_of(corpus.shards[0]) is not None, "the corpus was copied"
            stream.close()
            stream = stream_token_source(corpus, **kwargs)
            stream.load_state_dict(state)
        elif event == "fork":
            if not hasattr(os, "fork"):
                return "lifecycle fork skipped"
            _check_in_a_forked_child(stream, list(itertools.islice(rest, 5)))
            rest = itertools.islice(model_batches(shards, controls), steps, steps + MAX_BATCHES)
        assert_batches_equal(
            itertools.islice(stream, MAX_BATCHES),
            rest,
            f"after {event}",
            held=controls["reuse_buffers"],
        )
    finally:
        stream.close()
    assert_no_prefetch_thread()
    return f"lifecycle {event}"


def _edit_attributes(stream) -> None:
    for name, value in ATTRIBUTE_EDITS:
        before = getattr(stream, name)
        try:
            setattr(stream, name, value)
        except AttributeError:
            pass
        assert getattr(stream, name) == before, f"assigning stream.{name} took effect"
    lengths = stream.corpus.lengths
    before = lengths.copy()
    with contextlib.suppress(ValueError):  # "assignment destination is read-only"
        lengths[...] = 10**12
    assert np.array_equal(stream.corpus.lengths, before), "editing corpus.lengths took effect"
    shards = stream.corpus.shards
    with contextlib.suppress(AttributeError):
        stream.corpus.shards = ()
    assert stream.corpus.shards is shards, "rebinding corpus.shards took effect"


def _check_in_a_forked_child(stream, expected: list) -> None:
    """The child takes the next batches of ``stream`` and reports whether they are ``expected``."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock: the case tested.
        warnings.filterwarnings("ignore", "This process .* fork", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        verdict = b"ok"
        try:
            got = list(itertools.islice(stream, len(expected)))
            assert len(got) == len(expected), f"the child got {len(got)} batches"
            for i, (batch, want) in enumerate(zip(got, expected, strict=True)):
                assert_batch_equal(batch, want, f"the child's batch {i}")
        except BaseException as error:  # reported to the parent
            verdict = repr(error).encode()
        os.write(write_end, verdict)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report:
        verdict = report.read()
    os.waitpid(pid, 0)
    assert verdict == b"ok", f"forked child: {verdict.decode()}"
