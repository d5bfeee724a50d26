"""Manifests: written for files of every format, opened reading only the manifest, shards mapped
and checked when first read, at most ``max_open_maps`` maps open."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

import tokstream
from tokstream import _readahead as readahead
from tokstream import files, manifest, writing
from tokstream.formats import tokenized
from tokstream.manifest import write_manifest
from tokstream.shards import filemap

from .conftest import assert_same_batches
from .test_formats import write_save_to_disk_layout

STREAMS = [
    dict(shuffle=True, seed=3),
    dict(shuffle=False),
    dict(shuffle=True, seed=5, windows="within"),
    dict(shuffle=True, seed=7, extras=("position_ids", "loss_mask", "cu_seqlens", "origin")),
    dict(shuffle=True, seed=9, stride=5),
    dict(shuffle=True, seed=11, windows="packed", pad=0, extras=("position_ids", "loss_mask")),
]


def documents(seed: int, count: int, dtype=np.uint16) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, int(n)).astype(dtype) for n in rng.integers(0, 60, count)]


def write_llmc(path: Path, tokens: np.ndarray, magic: int, version: int) -> Path:
    header = np.zeros(256, "<i4")
    header[:3] = magic, version, tokens.shape[0]
    path.write_bytes(header.tobytes() + tokens.tobytes())
    return path


def write_tokenize_directory(directory: Path, format: str, shards: list[list[np.ndarray]]) -> Path:
    """A finished ``tokstream tokenize`` output, laid out by its own module's names."""
    directory.mkdir()
    entries = []
    for index, docs in enumerate(shards):
        corpus = tokstream.Corpus.from_documents(docs)
        name = directory / tokenized.shard_file(index, format)
        writing.write_tokens(name, corpus, format=format, dtype=np.uint16)
        if format != "megatron":
            np.save(directory / tokenized.documents_file(index), corpus.document_boundaries)
        entries.append({"tokens": corpus.num_tokens, "documents": len(docs)})
    body = {"kind": tokenized.KIND, "version": tokenized.VERSION, "format": format}
    tokenized.save(directory, {**body, "dtype": "uint16", "shards": entries, "complete": True})
    return directory


def make_inputs(tmp_path: Path, kind: str) -> list[str]:
    """Token files of one kind; returns what open_tokens takes for them."""
    rng = np.random.default_rng(len(kind))
    if kind in ("npy", "bin"):
        for i in range(4):
            ids = rng.integers(0, 50_000, 200 + 37 * i).astype(np.uint16)
            writing.write_tokens(tmp_path / f"s{i}.{kind}", ids, format=kind)
        return [str(tmp_path / f"s*.{kind}")]
    if kind in ("llmc1", "llmc7"):
        magic, version, dtype = (20240520, 1, "<u2") if kind == "llmc1" else (20240801, 7, "<u4")
        for i in range(3):
            ids = rng.integers(0, 70_000 if kind == "llmc7" else 50_000, 300 + i).astype(dtype)
            write_llmc(tmp_path / f"shard_{i}.bin", ids, magic, version)
        return [str(tmp_path / "shard_*.bin")]
    if kind == "megatron":
        for i in range(3):
            corpus = tokstream.Corpus.from_documents(documents(i, 12))
            writing.write_tokens(tmp_path / f"part{i}", corpus, format="megatron")
        writing.write_tokens(tmp_path / "part3", np.zeros(0, np.uint16), format="megatron")
        return [str(tmp_path / "part*.bin")]
    if kind == "arrow":
        pa = pytest.importorskip("pyarrow")
        lists = [d.astype(np.int32).tolist() for d in documents(4, 30)]
        table = pa.table({"input_ids": pa.array(lists, pa.list_(pa.int32()))})
        with pa.OSFile(str(tmp_path / "data.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=7):
                    writer.write_batch(batch)
        return [str(tmp_path / "data.arrow")]
    if kind == "save_to_disk":
        pa = pytest.importorskip("pyarrow")
        columns = [
            pa.array([d.tolist() for d in documents(5 + i, 20)], pa.list_(pa.uint16()))
            for i in range(2)
        ]
        return [str(write_save_to_disk_layout(tmp_path / "dataset", columns))]
    if kind.startswith("tokenize"):
        format = kind.split("-")[1]
        shards = [documents(10 + i, 9) for i in range(3)]
        return [str(write_tokenize_directory(tmp_path / "out", format, shards))]
    raise AssertionError(kind)


KINDS = [
    "npy",
    "bin",
    "llmc1",
    "llmc7",
    "megatron",
    "arrow",
    "save_to_disk",
    "tokenize-npy",
    "tokenize-bin",
    "tokenize-megatron",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_of_every_format_opens_to_the_same_corpus_states_and_batches(tmp_path, kind):
    inputs = make_inputs(tmp_path, kind)
    dtype = {"bin": np.uint16}.get(kind)
    globbed = files.open_tokens(inputs if len(inputs) > 1 else inputs[0], dtype=dtype)
    written = write_manifest(inputs, tmp_path / "toc" / "manifest.json", dtype=dtype)
    listed = files.open_tokens(tmp_path / "toc")  # the directory holding manifest.json
    assert listed.source is not None and listed.source.open_maps == 0
    # Shuffled windows of its files are read ahead, as a glob's are.
    assert tokstream.TokenStream(listed, 8, 4, shuffle=True)._readahead is not None
    assert written == tmp_path / "toc" / "manifest.json"
    assert listed.dtype == globbed.dtype and len(listed.shards) == len(globbed.shards)
    np.testing.assert_array_equal(listed.lengths, globbed.lengths)
    assert listed.has_documents == globbed.has_documents
    np.testing.assert_array_equal(listed.document_boundaries, globbed.document_boundaries)
    for options in STREAMS:
        if options.get("windows") == "within" and not globbed.has_documents:
            options = {**options, "eos": 0}
        ours = tokstream.TokenStream(listed, 8, 4, **options)
        theirs = tokstream.TokenStream(globbed, 8, 4, **options)
        assert ours.state_dict() == theirs.state_dict()
        for mine, want in zip(ours, theirs, strict=True):
            if isinstance(want, dict):
                assert mine.keys() == want.keys()
                for key in want:
                    np.testing.assert_array_equal(mine[key], want[key])
            else:
                assert_same_batches([mine], [want])
    for j in range(len(globbed.shards)):
        np.testing.assert_array_equal(listed.shards[j], globbed.shards[j])


def test_shard_paths_are_relative_so_the_directory_can_move(tmp_path):
    (tmp_path / "a").mkdir()
    make_inputs(tmp_path / "a", "npy")
    write_manifest(str(tmp_path / "a" / "s*.npy"), tmp_path / "a" / "manifest.json")
    table = json.loads((tmp_path / "a" / "manifest.json").read_text())["shards"]
    assert table["path"] == ["s0.npy", "s1.npy", "s2.npy", "s3.npy"]
    (tmp_path / "a").rename(tmp_path / "b")
    corpus = files.open_tokens(tmp_path / "b" / "manifest.json")
    np.testing.assert_array_equal(corpus.shards[3], np.load(tmp_path / "b" / "s3.npy"))


class CallCounter:
    """Counts the file system calls Python code makes (stat, open, map) while active."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for module, name in [
            (os, "stat"),
            (os, "lstat"),
            (os, "open"),
            (os, "fstat"),
            (os, "scandir"),
            (os, "listdir"),
            (builtins, "open"),
        ]:
            monkeypatch.setattr(module, name, self._wrap(getattr(module, name), name))
        init = filemap.FileMap.__init__

        def counted_map(map_self, *args, **kwargs):
            self.calls.append("map")
            init(map_self, *args, **kwargs)

        monkeypatch.setattr(filemap.FileMap, "__init__", counted_map)

    def _wrap(self, function, name):
        def counted(*args, **kwargs):
            self.calls.append(name)
            return function(*args, **kwargs)

        return counted


@pytest.mark.parametrize("shards", [50, 2000])
def test_opening_a_manifest_makes_the_same_few_system_calls_whatever_its_shard_count(
    tmp_path, monkeypatch, shards
):
    rng = np.random.default_rng(0)
    for i in range(shards):
        writing.write_tokens(tmp_path / f"s{i:05d}.npy", rng.integers(0, 9, 40).astype(np.uint16))
    write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    counter = CallCounter(monkeypatch)
    corpus = files.open_tokens(tmp_path / "manifest.json")
    opened = list(counter.calls)
    stream = tokstream.TokenStream(corpus, 16, 3, shuffle=True, seed=1)
    next(stream)
    monkeypatch.undo()
    # The manifest's stat and read (Path.read_bytes) and nothing per shard.
    assert len(opened) <= 4, opened
    # The first batch maps the shards its 3 windows lie in and those of the windows read
    # ahead, whatever the shard count; without read-ahead (in order), only its own.
    ahead = readahead.WINDOWS_AHEAD + 3
    assert counter.calls.count("map") <= 3 + ahead
    assert corpus.source.open_maps <= 3 + ahead
    assert len(counter.calls) < 20 * (3 + ahead), counter.calls
    counter.calls.clear()
    monkeypatch.undo()
    ordered = files.open_tokens(tmp_path / "manifest.json")
    counter = CallCounter(monkeypatch)
    next(tokstream.TokenStream(ordered, 16, 3, shuffle=False))
    monkeypatch.undo()
    assert counter.calls.count("map") <= 3 and ordered.source.open_maps <= 3


@pytest.mark.parametrize("kind", ["npy", "bin", "llmc1", "megatron"])
def test_a_shards_first_read_looks_at_its_file_a_few_times(tmp_path, monkeypatch, kind):
    # Its size checked, its reader's header read and its map: no sniffing of its first bytes
    # beforehand (on a network filesystem each look at a file is a round trip).
    inputs = make_inputs(tmp_path, kind)
    dtype = {"bin": np.uint16}.get(kind)
    write_manifest(inputs, tmp_path / "manifest.json", dtype=dtype)
    corpus = files.open_tokens(tmp_path / "manifest.json")
    counter = CallCounter(monkeypatch)
    tokens = corpus.shards[1]
    monkeypatch.undo()
    looks = [call for call in counter.calls if call != "map"]
    # Before: npy 13, raw bin 8, llm.c 14, Megatron 28-30 (its reader opens PREFIX.idx and .bin).
    assert len(looks) <= {"megatron": 22}.get(kind, 6), looks
    np.testing.assert_array_equal(tokens, files.open_tokens(inputs[0], dtype=dtype).shards[1])


@pytest.mark.parametrize(
    "options",
    [{}, {"extras": ("position_ids", "loss_mask")}, {"windows": "packed", "pad": 0}],
    ids=["cross", "extras", "packed"],
)
def test_at_most_max_open_maps_stay_open_and_the_batches_are_those_of_a_glob(tmp_path, options):
    rng = np.random.default_rng(1)
    for i in range(40):
        writing.write_tokens(tmp_path / f"s{i:03d}.npy", rng.integers(0, 99, 30).astype(np.uint16))
    write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    corpus = files.open_tokens(tmp_path / "manifest.json", max_open_maps=3)
    globbed = files.open_tokens(str(tmp_path / "s*.npy"))
    ours = tokstream.TokenStream(corpus, 8, 2, shuffle=True, seed=2, epochs=2, **options)
    theirs = tokstream.TokenStream(globbed, 8, 2, shuffle=True, seed=2, epochs=2, **options)
    most = 0
    for mine, want in zip(ours, theirs, strict=True):
        if isinstance(want, dict):
            mine, want = list(mine.values()), list(want.values())
        for array, expected in zip(mine, want, strict=True):
            np.testing.assert_array_equal(array, expected)
        most = max(most, corpus.source.open_maps)
    # A batch keeps the maps it reads until it is copied (two rows of at most two pieces):
    # between batches the bound holds.
    assert most <= 3


def test_streams_in_threads_over_one_manifest_corpus_with_few_maps_read_the_right_tokens(
    tmp_path,
):
    rng = np.random.default_rng(2)
    for i in range(30):
        writing.write_tokens(tmp_path / f"s{i:03d}.npy", rng.integers(0, 99, 50).astype(np.uint16))
    write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    corpus = files.open_tokens(tmp_path / "manifest.json", max_open_maps=2)
    expected = list(tokstream.TokenStream(files.open_tokens(str(tmp_path / "s*.npy")), 8, 6))
    results: list[list] = [[], [], []]

    def run(k: int) -> None:
        results[k] = list(tokstream.TokenStream(corpus, 8, 6, prefetch=k))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        assert_same_batches(result, expected)


def test_a_manifest_corpus_pickles_as_its_table_and_streams_the_same(tmp_path):
    make_inputs(tmp_path, "megatron")
    write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    corpus = files.open_tokens(tmp_path / "manifest.json")
    next(tokstream.TokenStream(corpus, 4, 2))  # maps a shard: not pickled
    data = pickle.dumps(corpus)
    assert len(data) < 4000
    copy = pickle.loads(data)
    assert copy.source.open_maps == 0
    assert_same_batches(
        tokstream.TokenStream(copy, 4, 2, windows="within"),
        tokstream.TokenStream(corpus, 4, 2, windows="within"),
    )


# ---------------------------------------------------------------------------------------------
# Manifests that disagree with their files


def lie(path: Path, column: str, index: int, value) -> None:
    body = json.loads(path.read_text())
    body["shards"][column][index] = value
    if column == "tokens":
        body["num_tokens"] = sum(body["shards"]["tokens"])
    path.write_text(json.dumps(body))


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("tokens", 231, "holds 237 uint16 tokens from byte 128.*says 231"),
        ("tokens", 300, "holds 237 uint16 tokens.*says 300"),
        ("size", 1, "602 bytes, the manifest .* says 1"),
        ("offset", 0, "from byte 128, the manifest .* from byte 0"),
        ("format", "bin", "holds 301 uint16 tokens from byte 0"),
        ("format", "llmc", "truncated llm.c header: 602 bytes"),  # its own reader says
        ("format", "parquet", "unknown format 'parquet'"),
        ("documents", 4, "records None documents, the manifest .* says 4"),
    ],
)
def test_a_lying_manifest_is_refused_naming_the_file_when_the_shard_is_first_read(
    tmp_path, column, value, message
):
    make_inputs(tmp_path, "npy")
    path = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    lie(path, column, 1, value)
    if column == "documents":
        body = json.loads(path.read_text())
        body["documents_file"] = "nothing.npy"
        path.write_text(json.dumps(body))
    corpus = files.open_tokens(path)  # opening reads only the manifest
    np.testing.assert_array_equal(corpus.shards[0], np.load(tmp_path / "s0.npy"))
    with pytest.raises(ValueError, match=f"token file {tmp_path / 's1.npy'}: .*{message}"):
        corpus.shards[1]
    # A stream reading that shard raises before yielding any batch of it.
    stream = tokstream.TokenStream(corpus, 8, 1000, shuffle=False, epochs=1)
    with pytest.raises(ValueError, match="s1.npy"):
        next(stream)


def test_a_manifest_whose_dtype_lies_is_refused_naming_the_file(tmp_path):
    make_inputs(tmp_path, "npy")
    path = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    body = json.loads(path.read_text())
    body["dtype"] = "int16"
    path.write_text(json.dumps(body))
    corpus = files.open_tokens(path)
    assert corpus.dtype == np.int16
    with pytest.raises(ValueError, match="s0.npy.*uint16 tokens.*int16"):
        next(tokstream.TokenStream(corpus, 8, 2))


def test_a_file_replaced_after_the_manifest_was_written_is_refused(tmp_path):
    make_inputs(tmp_path, "megatron")
    path = write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    corpus = tokstream.Corpus.from_documents(documents(0, 12)[::-1])
    writing.write_tokens(tmp_path / "part0", corpus, format="megatron")
    with pytest.raises(ValueError, match="part0.bin: its documents are not those"):
        files.open_tokens(path).shards[0]


def test_a_documents_file_that_lies_is_refused_naming_it(tmp_path):
    make_inputs(tmp_path, "megatron")
    path = write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    sidecar = tmp_path / "manifest.documents.npy"
    boundaries = np.load(sidecar)
    swapped = boundaries.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    np.save(sidecar, swapped)
    with pytest.raises(ValueError, match="manifest.documents.npy: document boundaries must rise"):
        _ = files.open_tokens(path).document_boundaries
    np.save(sidecar, boundaries[:-1])
    with pytest.raises(ValueError, match="manifest.documents.npy: holds"):
        next(tokstream.TokenStream(files.open_tokens(path), 4, 2, windows="within"))


# Four npy shards of 200, 237, 274 and 311 tokens (make_inputs), documents told by an edited
# manifest: each sidecar fails one check only.
SHARD_STARTS = [0, 200, 437, 711, 1022]
LYING_SIDECARS = {
    "falling": ([2, 1, 1, 1], [0, 150, 100, 437, 711, 1022]),
    "a shard's first document not at its first token": ([1, 1, 1, 1], [0, 201, 437, 711, 1022]),
    # A shard that says it has no documents: the one before may not reach into its tokens.
    "a document starting past its shard's end": ([2, 0, 1, 1], [0, 205, 437, 711, 1022]),
    "a document starting in a last shard that says it has none": (
        [1, 1, 2, 0],
        [0, 200, 437, 800, 1022],
    ),
}


@pytest.mark.parametrize("case", list(LYING_SIDECARS))
def test_documents_that_leave_their_shard_are_refused_before_any_batch(tmp_path, case):
    counts, boundaries = LYING_SIDECARS[case]
    make_inputs(tmp_path, "npy")
    path = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    assert files.open_tokens(path).lengths.tolist() == np.diff(SHARD_STARTS).tolist()

    def told(body):
        body["shards"]["documents"] = counts
        body["documents_file"] = "told.documents.npy"

    edit(path, told)
    np.save(tmp_path / "told.documents.npy", np.array(boundaries, np.int64))
    with pytest.raises(ValueError, match="told.documents.npy: document boundaries must rise"):
        _ = files.open_tokens(path).document_boundaries


def test_a_manifests_documents_are_read_once_and_shared_with_its_corpus(tmp_path):
    make_inputs(tmp_path, "megatron")
    path = write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    corpus = files.open_tokens(path)
    boundaries = corpus.document_boundaries
    assert not boundaries.flags.writeable
    with pytest.raises(ValueError):
        boundaries.setflags(write=True)
    corpus.shards[1]  # compared with the manifest's documents at its first read
    assert corpus._source._documents_table()[0] is boundaries


def test_a_missing_shard_file_is_file_not_found_when_first_read(tmp_path):
    make_inputs(tmp_path, "npy")
    path = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    (tmp_path / "s2.npy").unlink()
    corpus = files.open_tokens(path)
    with pytest.raises(FileNotFoundError, match="s2.npy"):
        corpus.shards[2]


# ---------------------------------------------------------------------------------------------
# Bad values


def edit(path: Path, change) -> Path:
    body = json.loads(path.read_text())
    change(body)
    path.write_text(json.dumps(body))
    return path


BAD_MANIFESTS = [
    (lambda b: b.update(kind="other"), "not a tokstream manifest"),
    (lambda b: b.update(version=2), "manifest version 2"),
    (lambda b: b.update(dtype="float32"), "bad 'dtype'"),
    (lambda b: b.update(dtype=">u2"), "native byte order"),
    (lambda b: b.update(column=3), "bad 'column'"),
    (lambda b: b.update(shards=[]), "'shards' must hold the lists"),
    (lambda b: b["shards"].pop("size"), "'shards' must hold the lists"),
    (lambda b: b["shards"]["tokens"].pop(), "disagree in length"),
    (lambda b: b.update(num_shards=9), "disagree in length"),
    (lambda b: b["shards"]["tokens"].__setitem__(0, -1), "'tokens' must be an integer >= 0"),
    (lambda b: b["shards"]["tokens"].__setitem__(0, True), "'tokens' must be an integer >= 0"),
    (lambda b: b["shards"]["size"].__setitem__(0, 1.5), "'size' must be an integer >= 0"),
    (lambda b: b["shards"]["path"].__setitem__(0, ""), "'path' must be a nonempty string"),
    (lambda b: b["shards"]["size"].__setitem__(0, 2**70), "'size' must be an integer below"),
    (lambda b: b.update(path_prefix=None), "bad 'path_prefix'"),
    (lambda b: b.update(num_tokens=1), "'num_tokens' is not the sum"),
    (lambda b: b["shards"]["documents"].__setitem__(0, 3), "no 'documents_file'"),
]


@pytest.mark.parametrize(("change", "message"), BAD_MANIFESTS)
def test_a_malformed_manifest_is_a_value_error_naming_it(tmp_path, change, message):
    make_inputs(tmp_path, "npy")
    path = edit(write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json"), change)
    # A directory's manifest.json must be a manifest; so must a .json file of the kind.
    with pytest.raises(ValueError, match=f"token file {path}: .*{message}"):
        files.open_tokens(tmp_path)
    if json.loads(path.read_text())["kind"] == manifest.KIND:
        with pytest.raises(ValueError, match=f"token file {path}: .*{message}"):
            files.open_tokens(path)
    else:
        with pytest.raises(ValueError, match="manifest.json.*JSON"):
            files.open_tokens(path)


def test_unreadable_json_is_a_value_error_naming_the_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="manifest.json: unreadable JSON"):
        files.open_tokens(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(format="npy"), ValueError, "format= does not apply"),
        (dict(dtype=np.int32), ValueError, "lists uint16 tokens, dtype=int32"),
        (dict(column="text"), ValueError, "lists column 'input_ids', column='text'"),
        (dict(max_open_maps=0), ValueError, "max_open_maps must be at least 1"),
        (dict(max_open_maps=2.0), TypeError, "max_open_maps must be an int"),
    ],
)
def test_bad_arguments_with_a_manifest_name_them(tmp_path, kwargs, error, message):
    make_inputs(tmp_path, "npy")
    path = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    with pytest.raises(error, match=message):
        files.open_tokens(path, **kwargs)


def test_max_open_maps_without_a_manifest_is_a_value_error(tmp_path):
    make_inputs(tmp_path, "npy")
    with pytest.raises(ValueError, match="max_open_maps applies to a manifest"):
        files.open_tokens(tmp_path / "s0.npy", max_open_maps=4)


def test_write_manifest_refuses_bad_outputs_and_mixed_dtypes_writing_nothing(tmp_path):
    make_inputs(tmp_path, "npy")
    writing.write_tokens(tmp_path / "wide.npy", np.arange(10), dtype=np.uint32)
    with pytest.raises(ValueError, match="must name a .json file"):
        write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.txt")
    with pytest.raises(ValueError, match="mix token dtypes"):
        write_manifest([tmp_path / "s0.npy", tmp_path / "wide.npy"], tmp_path / "m.json")
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        write_manifest([tmp_path / "nope.npy"], tmp_path / "m.json")
    with pytest.raises(TypeError, match="output must be a str"):
        write_manifest(str(tmp_path / "s*.npy"), 3)
    assert not (tmp_path / "m.json").exists()


def test_the_fingerprint_reads_a_bounded_sample_and_changes_with_the_content(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(3 << 20))
    before = manifest.fingerprint(path)
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"x")
    assert manifest.fingerprint(path) != before
    assert len(before) == 32 and int(before, 16) >= 0


# ---------------------------------------------------------------------------------------------
# The command


def run_cli(*argv: str) -> tuple[int, str, str]:
    import io

    from tokstream.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_manifest_command_writes_one_that_open_tokens_and_inspect_read(tmp_path):
    make_inputs(tmp_path, "megatron")
    make_inputs(tmp_path, "npy")
    output = tmp_path / "toc" / "manifest.json"
    code, out, err = run_cli(
        "manifest", str(tmp_path / "part*.bin"), str(tmp_path / "s0.npy"), "--output", str(output)
    )
    assert (code, err) == (0, "")
    assert out == (
        f"wrote {output}: 5 shards (megatron, npy), uint16, 1,232 tokens, 37 documents\n"
    )
    corpus = files.open_tokens(tmp_path / "toc")
    expected = files.open_tokens([*sorted(tmp_path.glob("part*.bin")), tmp_path / "s0.npy"])
    np.testing.assert_array_equal(corpus.lengths, expected.lengths)
    code, out, err = run_cli("inspect", str(output), "--json")
    assert code == 0, err
    summary = json.loads(out)[0]
    assert (summary["format"], summary["tokens"], summary["documents"]) == ("manifest", 1232, 38)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope.npy"], "token file not found: 'nope.npy'"),
        (["s0.npy", "--dtype", "int32"], "s0.npy holds uint16 tokens, dtype=int32 was asked"),
        (["s0.npy", "wide.npy"], "mix token dtypes"),
    ],
)
def test_a_failing_manifest_command_is_one_line_exit_1_and_writes_nothing(
    tmp_path, monkeypatch, argv, message
):
    make_inputs(tmp_path, "npy")
    writing.write_tokens(tmp_path / "wide.npy", np.arange(10), dtype=np.uint32)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("manifest", *argv, "--output", "toc/manifest.json")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and message in err and err.startswith("tokstream manifest: ")
    assert not (tmp_path / "toc").exists()


def test_the_manifest_command_without_an_output_is_a_usage_error(tmp_path):
    code, _, err = run_cli("manifest", str(tmp_path / "a.npy"))
    assert code == 2 and "--output" in err


@pytest.mark.parametrize(
    "options",
    [{}, {"extras": ("position_ids", "source")}, {"windows": "within"}, {"windows": "packed"}],
    ids=["cross", "extras", "within", "packed"],
)
def test_a_mixture_of_a_manifest_and_an_array_maps_no_shard_when_made_and_streams_the_same(
    tmp_path, options
):
    make_inputs(tmp_path, "megatron")
    path = write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    listed = files.open_tokens(path, max_open_maps=2)
    globbed = files.open_tokens(str(tmp_path / "part*.bin"))
    other = tokstream.Corpus.from_documents(documents(99, 20))
    mixed = tokstream.mix({"web": listed, "code": other}, {"web": 2, "code": 1})
    assert listed.source.open_maps == 0 and mixed.corpus.source is not None
    expected = tokstream.mix({"web": globbed, "code": other}, {"web": 2, "code": 1})
    if options.get("windows") == "packed":
        options = {**options, "pad": 0}
    ours = tokstream.TokenStream(mixed, 4, 3, shuffle=True, seed=4, **options)
    theirs = tokstream.TokenStream(expected, 4, 3, shuffle=True, seed=4, **options)
    assert ours.state_dict() == theirs.state_dict()
    for mine, want in zip(ours, theirs, strict=True):
        if isinstance(want, dict):
            mine, want = list(mine.values()), list(want.values())
        for array, expected_array in zip(mine, want, strict=True):
            np.testing.assert_array_equal(array, expected_array)
    assert listed.source.open_maps <= 3


def test_a_manifest_corpus_cannot_be_edited_into_reading_outside_its_files(tmp_path):
    make_inputs(tmp_path, "npy")
    path = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    corpus = files.open_tokens(path)
    source = corpus.source
    for name, value in [("lengths", np.zeros(4, np.int64)), ("dtype", np.dtype(np.int64))]:
        with pytest.raises(AttributeError, match="read-only"):
            setattr(source, name, value)
    with pytest.raises(ValueError):
        source.lengths.setflags(write=True)
    with pytest.raises(AttributeError):
        corpus.source = None
    # A range outside its shard is refused by the source itself, whatever asks for it.
    with pytest.raises(ValueError, match="outside its shard"):
        source.readable(np.array([0]), np.array([400]), 2)
    with pytest.raises(ValueError, match="outside its shard"):
        source.readable(np.array([4]), np.array([0]), 2)
