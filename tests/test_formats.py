"""The files users already have: Megatron datasets, llm.c v7 shards, Arrow; detection; convert.

Every file here is written from its project's documented layout by the test itself (or by the
project's own writer where it installs without heavy dependencies), never by tokstream's
writer, so a reader that agrees with tokstream's writer but not with the real layout fails.
"""

from __future__ import annotations

import gzip
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tokstream import Corpus, _validate, open_tokens, write_tokens
from tokstream.formats import megatron
from tokstream.formats.table import FORMATS, detect_format
from tokstream.shards.filemap import FileMap

MEGATRON_CODES = {
    np.uint8: 1,
    np.int8: 2,
    np.int16: 3,
    np.int32: 4,
    np.int64: 5,
    np.uint16: 8,
}


def memmap_of(array: np.ndarray) -> FileMap | None:
    """The file map an array is a view of (tokstream maps files without np.memmap)."""
    base = array
    while base is not None and not isinstance(base, FileMap):
        base = getattr(base, "base", None)
    return base


def documents_of(corpus: Corpus) -> list[list[int]]:
    tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in corpus.shards])
    bounds = corpus.document_boundaries
    return [tokens[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


# ---------------------------------------------------------------------------------------------
# Megatron: written from the layout of Megatron-LM's _IndexWriter


def write_megatron(
    prefix: Path,
    documents,
    dtype=np.uint16,
    *,
    sentences: int = 1,
    code: int | None = None,
    version: int = 1,
    lengths=None,
    pointers=None,
    document_indices=None,
    extra_index: bytes = b"",
    bin_extra: bytes = b"",
    counts: tuple[int, int] | None = None,
) -> Path:
    """``prefix.bin``/``prefix.idx`` as Megatron writes them; each document split in
    ``sentences`` sequences (as --split-sentences does); any field can be made to lie."""
    sequences = []
    doc_idx = [0]
    for doc in documents:
        doc = np.asarray(doc, dtype=dtype)
        for piece in np.array_split(doc, sentences) if len(doc) else [doc]:
            sequences.append(piece)
        doc_idx.append(len(sequences))
    itemsize = np.dtype(dtype).itemsize
    seq_lengths = [len(s) for s in sequences] if lengths is None else lengths
    if pointers is None:
        pointers = np.concatenate([[0], np.cumsum([len(s) for s in sequences])[:-1]]) * itemsize
    doc_idx = doc_idx if document_indices is None else document_indices
    with open(f"{prefix}.bin", "wb") as f:
        for s in sequences:
            f.write(s.tobytes())
        f.write(bin_extra)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", version))
        f.write(struct.pack("<B", MEGATRON_CODES[dtype] if code is None else code))
        sequence_count, document_count = counts or (len(seq_lengths), len(doc_idx))
        f.write(struct.pack("<Q", sequence_count))
        f.write(struct.pack("<Q", document_count))
        f.write(np.asarray(seq_lengths, dtype=np.int32).tobytes())
        f.write(np.asarray(pointers, dtype=np.int64).tobytes())
        f.write(np.asarray(doc_idx, dtype=np.int64).tobytes())
        f.write(extra_index)
    return prefix


DOCS = [[5, 6, 7], [8], [], [9, 10, 11, 12, 13]]


@pytest.mark.parametrize("dtype", list(MEGATRON_CODES))
@pytest.mark.parametrize("name", ["", ".bin", ".idx"])
def test_megatron_opens_by_prefix_bin_or_idx_with_its_dtype_and_documents(tmp_path, dtype, name):
    prefix = write_megatron(tmp_path / "corpus_text_document", DOCS, dtype)
    corpus = open_tokens(f"{prefix}{name}")
    assert corpus.dtype == dtype and len(corpus.shards) == 1
    assert documents_of(corpus) == DOCS
    assert memmap_of(corpus.shards[0]) is not None, "the .bin is mapped, not read"
    assert detect_format(f"{prefix}{name}") == "megatron"


def test_megatron_documents_of_several_sentences_are_one_document(tmp_path):
    prefix = write_megatron(tmp_path / "d", [list(range(10)), list(range(20, 27))], sentences=3)
    assert documents_of(open_tokens(prefix)) == [list(range(10)), list(range(20, 27))]


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 20])
def test_megatron_document_offsets_are_the_documents_lengths_summed_chunk_by_chunk(
    tmp_path, monkeypatch, chunk
):
    """The index is read in chunks of ``SCAN_CHUNK`` documents: documents of one or several
    sequences, empty ones first, last, throughout or everywhere, across every chunk edge."""
    monkeypatch.setattr(_validate, "SCAN_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    layouts = [DOCS, [[], [], [1]], [[1, 2], [], []], [[], []], [[]], [list(range(7))]]
    layouts += [
        [rng.integers(0, 9, rng.integers(0, 5)).tolist() for _ in range(rng.integers(1, 12))]
        for _ in range(20)
    ]
    for number, documents in enumerate(layouts):
        for sentences in (1, 2):
            prefix = write_megatron(
                tmp_path / f"d{number}_{sentences}", documents, sentences=sentences
            )
            shard = megatron.read(prefix)
            lengths = [len(document) for document in documents]
            assert shard.document_offsets.tolist() == [0, *np.cumsum(lengths).tolist()]
            assert shard.tokens.tolist() == [token for document in documents for token in document]


def test_a_glob_over_a_megatron_dataset_counts_it_once(tmp_path):
    write_megatron(tmp_path / "a", DOCS)
    write_megatron(tmp_path / "b", [[1, 2]])
    corpus = open_tokens(tmp_path / "*")
    assert [s.shape[0] for s in corpus.shards] == [9, 2]
    assert documents_of(corpus) == DOCS + [[1, 2]]


def test_write_tokens_megatron_matches_the_layout_and_round_trips_documents(tmp_path):
    prefix = write_tokens(tmp_path / "out", Corpus.from_documents(DOCS), format="megatron")
    assert prefix == tmp_path / "out"
    idx = (tmp_path / "out.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, sequences, doc_count = struct.unpack("<QBQQ", idx[9:34])
    assert (version, code, sequences, doc_count) == (1, 8, 4, 5)
    lengths = np.frombuffer(idx, "<i4", 4, 34)
    pointers = np.frombuffer(idx, "<i8", 4, 34 + 16)
    doc_idx = np.frombuffer(idx, "<i8", 5, 34 + 48)
    assert lengths.tolist() == [3, 1, 0, 5] and pointers.tolist() == [0, 6, 8, 8]
    assert doc_idx.tolist() == [0, 1, 2, 3, 4] and len(idx) == 34 + 48 + 40
    assert np.fromfile(tmp_path / "out.bin", "<u2").tolist() == sum(DOCS, [])
    assert documents_of(open_tokens(prefix)) == DOCS


def test_write_tokens_megatron_picks_int32_past_uint16_and_refuses_uint32(tmp_path):
    prefix = write_tokens(tmp_path / "wide.bin", [1, 70000], format="megatron")
    assert prefix == tmp_path / "wide" and open_tokens(prefix).dtype == np.int32
    with pytest.raises(ValueError, match="no dtype code for uint32"):
        write_tokens(tmp_path / "u", [1, 2], format="megatron", dtype=np.uint32)


LYING_INDEXES = {
    # name: (write_megatron overrides, what the message says)
    "pointer past the end": ({"pointers": [0, 6, 8, 800]}, "sequence 3 points at byte 800"),
    "pointers out of order": ({"pointers": [0, 8, 6, 8]}, "sequence 1 points at byte 8"),
    "lengths beyond the .bin": ({"lengths": [3, 1, 0, 50]}, "truncated"),
    "negative length": ({"lengths": [3, 1, -1, 5]}, "negative length"),
    "document count disagrees": ({"counts": (4, 6)}, "6 document indices"),
    "sequence count disagrees": ({"counts": (5, 5)}, "5 sequences"),
    "document indices end early": ({"document_indices": [0, 1, 2, 3]}, "from 0 to 3"),
    "document indices decrease": ({"document_indices": [0, 2, 1, 3, 4]}, "decrease"),
    "no document indices": ({"document_indices": []}, "no document indices"),
    "unknown dtype code": ({"code": 9}, "unknown dtype code 9"),
    "float dtype code": ({"code": 7}, "float32"),
    "unknown version": ({"version": 2}, "version 2"),
    "extra .bin bytes": ({"bin_extra": b"\x00\x00"}, "the file has 20 bytes"),
    "multimodal modes": ({"extra_index": b"\x00" * 4}, "multimodal"),
    "trailing index bytes": ({"extra_index": b"\x00" * 3}, "the file has"),
}


@pytest.mark.parametrize("case", list(LYING_INDEXES))
def test_a_lying_megatron_index_is_a_value_error_naming_the_file(tmp_path, case):
    overrides, message = LYING_INDEXES[case]
    prefix = write_megatron(tmp_path / "lie", DOCS, **overrides)
    with pytest.raises(ValueError, match=message) as info:
        open_tokens(prefix)
    assert "lie." in str(info.value)


@pytest.mark.parametrize("keep", [9, 30, 33])
def test_a_truncated_megatron_index_is_a_value_error(tmp_path, keep):
    prefix = write_megatron(tmp_path / "cut", DOCS)
    idx = tmp_path / "cut.idx"
    idx.write_bytes(idx.read_bytes()[:keep])
    with pytest.raises(ValueError, match="cut.idx"):
        open_tokens(prefix if keep >= 9 else idx)


def test_a_megatron_dataset_without_its_bin_is_file_not_found(tmp_path):
    prefix = write_megatron(tmp_path / "half", DOCS)
    Path(f"{prefix}.bin").unlink()
    with pytest.raises(FileNotFoundError) as info:
        open_tokens(Path(f"{prefix}.idx"))
    assert info.value.filename.endswith("half.bin")


# ---------------------------------------------------------------------------------------------
# llm.c version 7 (llama-3): written from the layout of llm.c's data_common.write_datafile


def write_llmc(path: Path, tokens, magic: int, version: int, dtype) -> Path:
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (magic, version, len(tokens))
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=dtype).tobytes())
    return path


def test_llmc_version_7_shards_read_as_uint32(tmp_path):
    ids = [0, 128000, 128255, 5]
    path = write_llmc(tmp_path / "fineweb_train_000001.bin", ids, 20240801, 7, np.uint32)
    assert detect_format(path) == "llmc"
    corpus = open_tokens(path)
    assert corpus.dtype == np.uint32 and corpus.shards[0].tolist() == ids
    assert memmap_of(corpus.shards[0]) is not None


def test_write_tokens_llmc_writes_version_7_past_uint16_and_version_1_below(tmp_path):
    wide = write_tokens(tmp_path / "wide.bin", [1, 128000], format="llmc")
    narrow = write_tokens(tmp_path / "narrow.bin", [1, 2], format="llmc")
    forced = write_tokens(tmp_path / "forced.bin", [1, 2], format="llmc", dtype=np.uint32)
    for path, header, dtype in [
        (wide, [20240801, 7, 2], "<u4"),
        (narrow, [20240520, 1, 2], "<u2"),
        (forced, [20240801, 7, 2], "<u4"),
    ]:
        raw = path.read_bytes()
        assert np.frombuffer(raw[:12], "<i4").tolist() == header
        assert np.frombuffer(raw[1024:], dtype).tolist() == open_tokens(path).shards[0].tolist()


def test_an_llmc_eval_file_is_refused_by_name(tmp_path):
    path = write_llmc(tmp_path / "hellaswag_val.bin", [65535, 10], 20240522, 1, np.uint16)
    with pytest.raises(ValueError, match="eval file"):
        open_tokens(path)


# ---------------------------------------------------------------------------------------------
# Detection: other known kinds are refused with what they look like


def _zip(path: Path) -> None:
    np.savez(path, tokens=np.arange(10))


OTHER_KINDS = {
    "npz": ("t.npz", _zip, "zip archive"),
    "gzip": ("t.bin.gz", lambda p: p.write_bytes(gzip.compress(b"\x01\x00" * 50)), "gzip"),
    "zstd": ("t.zst", lambda p: p.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(60)), "zstd"),
    "json": ("state.json", lambda p: p.write_text(json.dumps({"_data_files": []})), "JSON"),
    "jsonl": ("d.jsonl", lambda p: p.write_text('{"text": "a"}\n{"text": "b"}\n'), "JSON"),
    "feather v1": ("t.feather", lambda p: p.write_bytes(b"FEA1" + bytes(60)), "Feather"),
}


@pytest.mark.parametrize("kind", list(OTHER_KINDS))
def test_files_of_other_kinds_are_refused_with_what_they_look_like(tmp_path, kind):
    name, write, looks_like = OTHER_KINDS[kind]
    path = tmp_path / name
    write(path)
    with pytest.raises(ValueError, match=looks_like) as info:
        open_tokens(path)
    assert name in str(info.value) and "format='bin'" in str(info.value)
    if path.stat().st_size % 2 == 0:
        assert open_tokens(path, format="bin").num_tokens == path.stat().st_size // 2


def test_a_parquet_file_is_refused_as_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="Parquet"):
        open_tokens(tmp_path / "t.parquet")


def test_raw_tokens_that_start_like_a_zip_but_do_not_end_like_one_stay_raw(tmp_path):
    ids = np.frombuffer(b"PK\x03\x04", dtype="<u2").tolist() + list(range(100))
    path = write_tokens(tmp_path / "raw.bin", ids, format="bin")
    assert detect_format(path) == "bin"
    assert open_tokens(path).shards[0].tolist() == ids


# ---------------------------------------------------------------------------------------------
# Arrow: written by pyarrow itself, as Hugging Face datasets lays it out


def _pa():
    return pytest.importorskip("pyarrow")


def write_arrow_stream(path: Path, column, name="input_ids", rows_per_batch=None, file_form=False):
    pa = _pa()
    table = pa.table({name: column, "text": [str(i) for i in range(len(column))]})
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_file if file_form else pa.ipc.new_stream
        with new(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=rows_per_batch)
    return path


@pytest.mark.parametrize("file_form", [False, True])
def test_arrow_ipc_streams_and_files_map_each_record_batch_with_its_documents(tmp_path, file_form):
    pa = _pa()
    column = pa.array(DOCS, pa.list_(pa.int32()))
    path = write_arrow_stream(
        tmp_path / "data-00000-of-00001.arrow", column, rows_per_batch=2, file_form=file_form
    )
    assert path.read_bytes()[: 6 if file_form else 4] == (
        b"ARROW1" if file_form else b"\xff\xff\xff\xff"
    )
    assert detect_format(path) == "arrow"
    corpus = open_tokens(path)
    assert corpus.dtype == np.int32 and len(corpus.shards) == 2
    assert documents_of(corpus) == DOCS
    for shard in corpus.shards:
        assert memmap_of(shard) is not None and not shard.flags.writeable


def test_feather_v2_files_are_arrow_files(tmp_path):
    pa = _pa()
    import pyarrow.feather as feather

    feather.write_feather(
        pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.uint16()))}),
        tmp_path / "t.feather",
        compression="uncompressed",
    )
    assert documents_of(open_tokens(tmp_path / "t.feather")) == DOCS


def test_a_compressed_arrow_file_is_refused_rather_than_copied(tmp_path):
    pa = _pa()
    import pyarrow.feather as feather

    feather.write_feather(
        pa.table({"input_ids": pa.array(DOCS * 50, pa.list_(pa.int64()))}),
        tmp_path / "z.feather",
        compression="zstd",
    )
    with pytest.raises(ValueError, match="z.feather.*uncompressed"):
        open_tokens(tmp_path / "z.feather")


def write_save_to_disk_layout(directory: Path, columns: list, name="input_ids") -> Path:
    """``Dataset.save_to_disk``'s layout: data-XXXXX-of-NNNNN.arrow streams and state.json."""
    directory.mkdir()
    files = []
    for i, column in enumerate(columns):
        filename = f"data-{i:05d}-of-{len(columns):05d}.arrow"
        write_arrow_stream(directory / filename, column, name=name, rows_per_batch=1000)
        files.append({"filename": filename})
    state = {
        "_data_files": files,
        "_fingerprint": "0",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (directory / "state.json").write_text(json.dumps(state))
    (directory / "dataset_info.json").write_text("{}")
    return directory


def test_a_save_to_disk_directory_opens_in_its_state_order(tmp_path):
    pa = _pa()
    first = pa.array([[1, 2], [3]], pa.list_(pa.int64()))
    second = pa.array([[4, 5, 6]], pa.list_(pa.int64()))
    directory = write_save_to_disk_layout(tmp_path / "ds", [first, second])
    assert detect_format(directory) == "arrow"
    corpus = open_tokens(directory)
    assert documents_of(corpus) == [[1, 2], [3], [4, 5, 6]]
    assert corpus.dtype == np.int64


def test_a_dataset_dict_directory_names_its_splits(tmp_path):
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(ValueError, match=r"splits train, test.*dd/train"):
        open_tokens(tmp_path / "dd")


def test_datasets_save_to_disk_and_in_memory_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"input_ids": DOCS, "text": ["a", "b", "c", "d"]})
    dataset.save_to_disk(str(tmp_path / "saved"))
    assert documents_of(open_tokens(tmp_path / "saved")) == DOCS
    assert documents_of(open_tokens(dataset)) == DOCS
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    assert documents_of(open_tokens(loaded)) == DOCS
    with pytest.raises(ValueError, match="flatten_indices"):
        open_tokens(dataset.shuffle(seed=0))
    assert documents_of(open_tokens(dataset.shuffle(seed=0).flatten_indices()))[0] in DOCS


def test_an_in_memory_table_is_read_without_a_copy(tmp_path):
    pa = _pa()
    table = pa.table({"ids": pa.array(DOCS, pa.large_list(pa.uint32()))})
    corpus = open_tokens(table, column="ids")
    assert corpus.dtype == np.uint32 and documents_of(corpus) == DOCS
    values = table.column("ids").chunk(0).values
    address = corpus.shards[0].__array_interface__["data"][0]
    assert address == values.buffers()[1].address


def test_other_list_layouts_and_plain_integer_columns(tmp_path):
    pa = _pa()
    fixed = pa.table({"input_ids": pa.array([[1, 2], [3, 4]], pa.list_(pa.int16(), 2))})
    assert documents_of(open_tokens(fixed)) == [[1, 2], [3, 4]]
    flat = pa.table({"tokens": pa.array([7, 8, 9], pa.uint16())})
    corpus = open_tokens(flat, column="tokens")
    assert corpus.shards[0].tolist() == [7, 8, 9] and not corpus.has_documents
    sliced = pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))}).slice(1, 3)
    assert documents_of(open_tokens(sliced)) == DOCS[1:4]


BAD_COLUMNS = {
    "floats": (lambda pa: pa.array([[1.0, 2.0]], pa.list_(pa.float32())), "lists of float"),
    "nested lists": (
        lambda pa: pa.array([[[1], [2]]], pa.list_(pa.list_(pa.int32()))),
        "nested lists",
    ),
    "strings": (lambda pa: pa.array(["a b"]), "not a list of integer"),
    "null rows": (lambda pa: pa.array([[1], None], pa.list_(pa.int32())), "null rows"),
    "null ids": (lambda pa: pa.array([[1, None]], pa.list_(pa.int32())), "null token ids"),
}


@pytest.mark.parametrize("case", list(BAD_COLUMNS))
def test_a_bad_arrow_column_is_a_value_error_naming_the_file(tmp_path, case):
    pa = _pa()
    make, message = BAD_COLUMNS[case]
    path = write_arrow_stream(tmp_path / "bad.arrow", make(pa))
    with pytest.raises(ValueError, match=message) as info:
        open_tokens(path)
    assert "bad.arrow" in str(info.value)


def test_a_missing_column_lists_the_columns(tmp_path):
    pa = _pa()
    path = write_arrow_stream(tmp_path / "t.arrow", pa.array([[1]]), name="tokens")
    with pytest.raises(ValueError, match=r"no column 'input_ids' \(its columns: tokens, text\)"):
        open_tokens(path)
    assert open_tokens(path, column="tokens").num_tokens == 1


def test_corrupt_arrow_data_is_a_value_error_that_offers_the_raw_reading(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\xff\xff\xff\xff\x08\x00\x00\x00" + bytes(16))
    with pytest.raises(ValueError, match="odd.bin.*format='bin'"):
        open_tokens(path)


def test_write_tokens_arrow_is_a_stream_pyarrow_reads_with_one_row_per_document(tmp_path):
    pa = _pa()
    path = write_tokens(tmp_path / "out.arrow", Corpus.from_documents(DOCS), format="arrow")
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_stream(source).read_all()
    assert table.column("input_ids").to_pylist() == DOCS
    assert documents_of(open_tokens(path)) == DOCS


def test_without_pyarrow_arrow_data_is_an_import_error_naming_the_extra(tmp_path, monkeypatch):
    pa = _pa()
    path = write_arrow_stream(tmp_path / "t.arrow", pa.array(DOCS, pa.list_(pa.int32())))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"tokstream\[arrow\]"):
        open_tokens(path)
    with pytest.raises(ImportError, match=r"tokstream\[arrow\]"):
        write_tokens(tmp_path / "o.arrow", [1, 2], format="arrow")


# ---------------------------------------------------------------------------------------------
# Convert between every pair, keeping documents where both sides hold them

DOCUMENT_FORMATS = {"megatron", "arrow"}


def _write_source(tmp_path: Path, format: str) -> Path:
    if format == "arrow":
        _pa()
    return write_tokens(tmp_path / f"src.{format}", Corpus.from_documents(DOCS), format=format)


@pytest.mark.parametrize("source", FORMATS)
@pytest.mark.parametrize("target", FORMATS)
def test_every_format_converts_to_every_other_keeping_documents(tmp_path, source, target):
    if target == "arrow":
        _pa()
    src = _write_source(tmp_path, source)
    corpus = open_tokens(src)
    out = write_tokens(tmp_path / f"out.{target}", corpus, format=target, dtype=np.uint16)
    again = open_tokens(out, dtype=np.uint16 if target == "bin" else None)
    assert np.concatenate(again.shards).tolist() == sum(DOCS, [])
    if source in DOCUMENT_FORMATS and target in DOCUMENT_FORMATS:
        assert documents_of(again) == DOCS


def test_an_arrow_stream_whose_field_name_is_not_utf8_is_a_value_error_naming_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    sink = pa.BufferOutputStream()
    batch = pa.record_batch([pa.array([[1, 2]], pa.list_(pa.uint16()))], names=["tokens"])
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = sink.getvalue().to_pybytes().replace(b"tokens", b"\x80okens")
    path = tmp_path / "data-00000-of-00001.arrow"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="data-00000-of-00001.arrow") as caught:
        open_tokens(path, format="arrow")
    assert type(caught.value) is ValueError
