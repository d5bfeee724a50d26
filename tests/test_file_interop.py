"""Token files as other tools leave them: byte orders, empty partitions, caches, names, pickles.

Each file is written as its project writes it (Megatron's index layout, pyarrow's own writer,
``np.memmap``, ``datasets``), never by tokstream's writer alone.
"""

from __future__ import annotations

import io
import itertools
import json
import multiprocessing
import pickle
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_formats import documents_of, write_megatron
from tokstream import Corpus, cli, open_tokens, stream_token_source, write_tokens
from tokstream.corpus import EosNotFoundWarning

# ---------------------------------------------------------------------------------------------
# Byte order: the formats whose header says little-endian


@pytest.mark.parametrize("format", ["llmc", "megatron", "arrow"])
@pytest.mark.parametrize("dtype", [">u2", ">i4", np.dtype(np.uint16).newbyteorder(">")])
def test_a_big_endian_dtype_for_a_little_endian_format_is_refused_naming_dtype(
    tmp_path, format, dtype
):
    if format == "arrow":
        pytest.importorskip("pyarrow")
    if format == "llmc" and np.dtype(dtype).kind == "i":
        dtype = ">u4"
    with pytest.raises(ValueError, match="dtype='>"):
        write_tokens(tmp_path / "out.bin", np.array([1, 2, 3]), format=format, dtype=dtype)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("format", ["llmc", "megatron"])
@pytest.mark.parametrize("dtype", ["<u2", "=u2", "uint16"])
def test_a_little_endian_or_native_dtype_writes_the_ids_themselves(tmp_path, format, dtype):
    path = write_tokens(tmp_path / "out.bin", np.array([1, 256, 65535]), format=format, dtype=dtype)
    assert open_tokens(path).shards[0].tolist() == [1, 256, 65535]


def test_convert_with_a_big_endian_dtype_to_llmc_is_one_line_naming_dtype(tmp_path):
    source = write_tokens(tmp_path / "in.npy", np.array([1, 2, 3], dtype=np.uint16))
    stdout, stderr = io.StringIO(), io.StringIO()
    code = cli.main(
        ["convert", str(source), str(tmp_path / "out.bin"), "--format", "llmc", "--dtype", ">u2"],
        stdout=stdout,
        stderr=stderr,
    )
    assert code == 1 and "dtype='>u2'" in stderr.getvalue()
    assert "Traceback" not in stderr.getvalue() and not (tmp_path / "out.bin").exists()


# ---------------------------------------------------------------------------------------------
# Shards without documents


def write_empty_megatron(prefix: Path) -> Path:
    """Megatron's files for an empty partition, as its ``_IndexWriter.write`` lays out no
    sequence lengths, no pointers and the document indices ``[0]``, and an empty ``.bin``."""
    Path(f"{prefix}.bin").write_bytes(b"")
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8)
    Path(f"{prefix}.idx").write_bytes(header + struct.pack("<QQ", 0, 1) + struct.pack("<q", 0))
    return prefix


def test_megatrons_index_of_an_empty_partition_is_an_empty_shard_without_documents(tmp_path):
    prefix = write_empty_megatron(tmp_path / "part_00001_text_document")
    assert Path(f"{prefix}.idx").read_bytes()[-8:] == struct.pack("<q", 0)
    corpus = open_tokens(prefix)
    assert corpus.num_tokens == 0 and corpus.document_lengths.tolist() == []
    assert corpus.has_documents and corpus.shard_documents(0).tolist() == [0]


def test_an_empty_partition_in_a_glob_leaves_the_others_readable(tmp_path):
    write_megatron(tmp_path / "part_0_text_document", [[1, 2, 3], [4, 5]])
    write_empty_megatron(tmp_path / "part_1_text_document")
    write_megatron(tmp_path / "part_2_text_document", [[6, 7, 8, 9]])
    corpus = open_tokens(tmp_path / "part_*")
    assert [len(s) for s in corpus.shards] == [5, 0, 4]
    assert documents_of(corpus) == [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    for windows in ("cross", "within"):
        batches = list(stream_token_source(corpus, 2, 8, shuffle=False, windows=windows))
        assert sum(len(b[0]) for b in batches) == (5 if windows == "cross" else 3)


def test_a_corpus_without_documents_writes_megatrons_empty_partition_and_reads_back(tmp_path):
    corpus = Corpus._from_arrays([np.empty(0, np.uint16)], ["e"], "e", [np.array([0])])
    prefix = write_tokens(tmp_path / "empty_text_document", corpus, format="megatron")
    write_empty_megatron(tmp_path / "reference")
    for suffix in (".idx", ".bin"):
        written = Path(f"{prefix}{suffix}").read_bytes()
        assert written == Path(f"{tmp_path / 'reference'}{suffix}").read_bytes()
    assert open_tokens(prefix).document_lengths.tolist() == []


def test_a_zero_row_arrow_record_batch_is_an_empty_shard(tmp_path):
    pa = pytest.importorskip("pyarrow")
    schema = pa.schema([("input_ids", pa.list_(pa.uint16()))])
    batches = [
        pa.record_batch([pa.array([[1, 2, 3], [4]], pa.list_(pa.uint16()))], schema=schema),
        pa.record_batch([pa.array([], pa.list_(pa.uint16()))], schema=schema),
        pa.record_batch([pa.array([[5, 6]], pa.list_(pa.uint16()))], schema=schema),
    ]
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    corpus = open_tokens(path)
    assert [len(s) for s in corpus.shards] == [4, 0, 2]
    assert documents_of(corpus) == [[1, 2, 3], [4], [5, 6]]
    # Written back, the empty shard is a zero-row batch of the single one: documents kept.
    again = open_tokens(write_tokens(tmp_path / "again.arrow", corpus, format="arrow"))
    assert documents_of(again) == [[1, 2, 3], [4], [5, 6]]
    table = pa.Table.from_batches(batches)
    assert documents_of(open_tokens(table)) == [[1, 2, 3], [4], [5, 6]]
    empty = pa.Table.from_batches([batches[1]])
    assert open_tokens(empty).document_lengths.tolist() == []


# ---------------------------------------------------------------------------------------------
# Names: globs and prefixes


def test_a_glob_over_a_tokenize_directory_takes_the_shards_not_their_document_offsets(tmp_path):
    from tokstream.formats import tokenized

    directory = tmp_path / "tokens"
    directory.mkdir()
    for index, documents in enumerate([[[1, 2, 3], [4]], [[5, 6]]]):
        tokens = np.concatenate([np.array(d, np.uint16) for d in documents])
        write_tokens(directory / tokenized.shard_file(index, "npy"), tokens)
        offsets = np.cumsum([0] + [len(d) for d in documents]).astype(np.int64)
        np.save(directory / tokenized.documents_file(index), offsets)
    (directory / tokenized.MANIFEST).write_text("{}")
    corpus = open_tokens(f"{directory}/shard_*.npy")
    assert [s.tolist() for s in corpus.shards] == [[1, 2, 3, 4], [5, 6]]
    with pytest.raises(ValueError, match="document offsets"):
        open_tokens(f"{directory}/*.documents.npy")


def test_a_megatron_prefix_with_glob_characters_is_a_prefix(tmp_path):
    prefix = write_megatron(tmp_path / "corpus[v2]_text_document", [[1, 2, 3], [4, 5]])
    write_megatron(tmp_path / "corpusv_text_document", [[9, 9]])  # what the glob would match
    for name in (str(prefix), f"{prefix}.bin", f"{prefix}.idx"):
        assert documents_of(open_tokens(name)) == [[1, 2, 3], [4, 5]]


def test_a_megatron_prefix_beside_megatrons_index_cache_directory_opens(tmp_path):
    prefix = write_megatron(tmp_path / "corpus_text_document", [[1, 2, 3], [4, 5]])
    # What Megatron-core's GPTDataset makes when no path_to_cache is configured.
    cache = prefix / "cache" / "GPTDataset_indices"
    cache.mkdir(parents=True)
    (cache / "abc-GPTDataset-train-document_index.npy").write_bytes(b"\x93NUMPY")
    assert documents_of(open_tokens(prefix)) == [[1, 2, 3], [4, 5]]
    code = cli.main(["inspect", str(prefix), "--quiet"], stdout=io.StringIO(), stderr=io.StringIO())
    assert code == 0


# ---------------------------------------------------------------------------------------------
# Pickling inputs memory-mapped by others: by file and offset, as open_tokens' own maps


def _first_batches(corpus) -> list[list[int]]:
    stream = stream_token_source(corpus, 16, 8, seed=5, permutation="implicit")
    return [w.tolist() for w, _ in itertools.islice(stream, 4)]


def _spawned(data: bytes) -> tuple[list[list[int]], str | None]:
    """In a spawned process: unpickle the corpus, stream, and say which file shard 0 maps."""
    from tokstream.shards.filemap import file_map_of

    corpus = pickle.loads(data)
    found = file_map_of(corpus.shards[0])
    return _first_batches(corpus), None if found is None else found.path


def _in_a_spawned_process(corpus):
    data = pickle.dumps(corpus)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return len(data), pool.apply(_spawned, (data,))


needs_proc_maps = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds mapped files in /proc/self/maps"
)


@needs_proc_maps
@pytest.mark.parametrize("how", ["np.memmap", "np.load", "slice"])
def test_a_numpy_memory_map_pickles_as_its_file_and_maps_again_when_spawned(tmp_path, how):
    path = tmp_path / "train.bin"
    tokens = (np.arange(1_000_000) % 50_000).astype(np.uint16)
    tokens.tofile(path)  # nanoGPT's prepare.py
    if how == "np.load":
        np.save(tmp_path / "train.npy", tokens)
        path = tmp_path / "train.npy"
        ids = np.load(path, mmap_mode="r")
    else:
        ids = np.memmap(path, dtype=np.uint16, mode="r")
    if how == "slice":
        ids, tokens = ids[12_345:], tokens[12_345:]
    corpus = Corpus([ids])
    size, (batches, mapped) = _in_a_spawned_process(corpus)
    assert size < 2_000, "the tokens alone are 2 MB"
    assert mapped == str(path)
    assert batches == _first_batches(Corpus([tokens]))


@needs_proc_maps
def test_a_memory_map_is_pickled_by_value_when_its_mapping_may_differ_from_the_file(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(100_000, dtype=np.uint16).tofile(path)
    edited = np.memmap(path, dtype=np.uint16, mode="c")  # private copy on write
    edited[:10] = 7
    assert pickle.loads(pickle.dumps(Corpus([edited]))).shards[0][:12].tolist() == [7] * 10 + [
        10,
        11,
    ]
    replaced = np.memmap(path, dtype=np.uint16, mode="r")
    path.rename(tmp_path / "moved.bin")
    np.zeros(100_000, dtype=np.uint16).tofile(path)  # another file under the name
    assert pickle.loads(pickle.dumps(Corpus([replaced]))).shards[0][:3].tolist() == [0, 1, 2]


@needs_proc_maps
def test_a_datasets_dataset_loaded_from_disk_pickles_as_its_arrow_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [list(range(i, i + 200)) for i in range(5_000)]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(tmp_path / "ds")
    dataset = datasets.load_from_disk(tmp_path / "ds")
    corpus = open_tokens(dataset)
    size, (batches, mapped) = _in_a_spawned_process(corpus)
    assert size < 60_000, "5,000 document boundaries (40 KB), not 4 MB of tokens"
    assert mapped == dataset.cache_files[0]["filename"]
    assert batches == _first_batches(corpus)


@needs_proc_maps
def test_an_arrow_table_from_a_memory_mapped_file_pickles_as_its_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    path = write_tokens(
        tmp_path / "t.arrow", Corpus.from_documents([np.arange(300_000) % 1000] * 3), "arrow"
    )
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_stream(source).read_all()
    corpus = open_tokens(table)
    assert len(pickle.dumps(corpus)) < 4_000
    assert _in_a_spawned_process(corpus)[1] == (_first_batches(corpus), str(path))


# ---------------------------------------------------------------------------------------------
# Which boundaries a stream uses: recorded documents, eos tokens, both or neither


def test_a_stream_with_an_eos_the_corpus_lacks_warns_once_naming_the_documents_it_uses(tmp_path):
    # Megatron's preprocess_data.py without --append-eod: documents recorded, no eod tokens.
    corpus = open_tokens(write_megatron(tmp_path / "text_document", [[5, 6, 7, 8], [9, 10, 11]]))
    with pytest.warns(
        EosNotFoundWarning,
        match=r"eos=0 occurs in none of the corpus' 7 tokens.*only the 2 documents",
    ):
        stream_token_source(corpus, 2, 4, eos=0, extras=("position_ids",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream_token_source(corpus, 2, 4, eos=0, windows="within")  # once per corpus and token
        stream_token_source(corpus, 2, 4, eos=7)  # present
        plain = Corpus([np.arange(1, 50)])
        stream_token_source(plain, 2, 4)  # no eos asked: nothing to check
    with pytest.warns(EosNotFoundWarning, match="no document boundaries but the shards' own"):
        stream_token_source(plain, 2, 4, eos=0, windows="within")


def test_a_large_corpus_is_checked_for_eos_in_evenly_spaced_runs_not_read_whole(monkeypatch):
    from tokstream import corpus as corpus_module

    monkeypatch.setattr(corpus_module, "EOS_CHECK_TOKENS", 640)  # 64 runs of 10 tokens
    tokens = np.ones(100_000, dtype=np.uint16)
    with pytest.warns(
        EosNotFoundWarning, match="64 evenly spaced runs of 10 of the corpus' 100,000"
    ):
        stream_token_source(Corpus([tokens]), 8, 4, eos=0)
    tokens[::9] = 0  # an eos every 9 tokens is in every run of 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream_token_source(Corpus([tokens[:50_000], tokens[50_000:]]), 8, 4, eos=0)
    # The runs looked at: 64 x 10 tokens, whatever the corpus' size.
    looked = []
    monkeypatch.setattr(
        corpus_module.np, "count_nonzero", lambda a, *k: looked.append(a.shape[0]) or 0
    )
    with pytest.warns(EosNotFoundWarning):
        Corpus([tokens[:50_000], tokens[50_000:]]).check_eos(0)
    assert sum(looked) == 640


@settings(max_examples=200, deadline=None)
@given(
    documents=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    shards=st.integers(1, 3),
    block=st.integers(1, 12),
    stride=st.integers(1, 20),
)
def test_tokens_in_windows_counts_the_tokens_some_window_covers(documents, shards, block, stride):
    tokens = [np.arange(n) + 100 * i for i, n in enumerate(documents)]
    groups = [tokens[i::shards] for i in range(shards)]
    groups = [g for g in groups if g]
    corpus = Corpus([Corpus.from_documents(g).shards[0] for g in groups])
    corpus = Corpus._from_arrays(
        list(corpus.shards),
        [str(i) for i in range(len(groups))],
        "c",
        [np.cumsum([0] + [len(d) for d in g]) for g in groups],
    )
    bounds = corpus.document_boundaries
    for windows, segments in [
        (
            "cross",
            [
                (int(a), int(a + n))
                for a, n in zip(corpus.shard_starts, corpus.lengths, strict=True)
            ],
        ),
        ("within", list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))),
    ]:
        covered = set()
        for first, end in segments:
            for start in range(first, end - block, stride):
                covered.update(range(start, start + block + 1))
        assert corpus.tokens_in_windows(block, stride, windows) == len(covered)


def test_inspect_says_which_boundaries_a_stream_uses_and_the_share_each_policy_keeps(tmp_path):
    prefix = write_megatron(tmp_path / "text_document", [list(range(1, 40)), list(range(1, 200))])
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["inspect", str(prefix), "--block", "64", "--eos", "0", "--quiet"]
    code = cli.main(argv, stdout=stdout, stderr=stderr)
    assert code == 0, stderr.getvalue()
    # 238 tokens; within drops the 39-token document, shorter than a window of 65.
    assert "kept: cross / within" in stdout.getvalue()
    assert f"100.0% / {199 / 238:.1%}" in stdout.getvalue()
    assert "the 2 documents the file records only: eos=0 occurs nowhere" in stdout.getvalue()
    stdout = io.StringIO()
    code = cli.main(
        ["inspect", str(prefix), "--eos", "5", "--block", "4", "--json"],
        stdout=stdout,
        stderr=stderr,
    )
    (summary,) = json.loads(stdout.getvalue())
    assert summary["eos_tokens"] == 2 and summary["kept_within"] == 1.0
    assert "4 documents in all" in summary["boundaries"]
