"""A corpus in object storage streams exactly the batches of the same files on disk: every format
that opens remotely, every window policy, ranks, resume, seek, mixtures and DataLoader workers.

The files live on moto's S3 server, a real server process on 127.0.0.1 that the client reaches
over TCP (``tests/object_store.py``); each remote stream is compared with the stream over the
local copy of the same files, batch by batch and byte by byte.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import pickle

import numpy as np
import pytest

import tokstream
from tests.object_store import Bucket
from tests.remote_cases import (
    EOS,
    WRITERS,
    assert_same,
    documents,
    require_remote,
    stream_batches,
)

remote = require_remote()

DOCS = documents()


@pytest.fixture(scope="module")
def corpora(s3_server, tmp_path_factory):
    """``corpora(name) -> (local spec, remote URL)``: the shared documents in the layout
    ``name``, written once per module on disk and uploaded to a bucket of their own."""
    bucket = Bucket(s3_server)
    made: dict[str, tuple[str, str]] = {}

    def get(name: str) -> tuple[str, str]:
        if name not in made:
            data = tmp_path_factory.mktemp(name) / "data"
            data.mkdir()
            spec = WRITERS[name](data, DOCS)
            bucket.upload(data, prefix=name)
            made[name] = (str(data / spec), bucket.url(f"{name}/{spec}"))
        return made[name]

    return get


@pytest.fixture
def pair(corpora, s3_env):
    """``pair(name) -> (local corpus, remote corpus)``, the remote one opened from its URL."""

    def get(name: str):
        local, url = corpora(name)
        return tokstream.open_tokens(local), tokstream.open_tokens(url)

    return get


def both(pair, name, block=16, batch_size=32, **options):
    local, far = pair(name)
    return (
        tokstream.stream_token_source(far, block, batch_size, **options),
        tokstream.stream_token_source(local, block, batch_size, **options),
    )


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_format_opens_remotely_with_the_same_shards_and_documents(pair, name):
    local, far = pair(name)
    assert far.dtype == local.dtype
    assert far.lengths.tolist() == local.lengths.tolist()
    assert far.has_documents == local.has_documents
    assert far.document_boundaries.tolist() == local.document_boundaries.tolist()


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "sequential"])
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_format_streams_the_same_batches_as_its_local_files(pair, name, shuffle):
    assert assert_same(*both(pair, name, shuffle=shuffle, seed=7)) > 4


#: Each window policy over the layout it matters most for: the Megatron corpus records
#: documents, the .npy shards do not (their documents come from eos).
POLICIES = {
    "cross-two-epochs": ("npy", dict(epochs=2, drop_last=True)),
    "within-eos": ("npy", dict(windows="within", eos=EOS)),
    "within-documents": ("megatron", dict(windows="within")),
    "stride-block": ("npy", dict(stride=16)),
    "shifted": ("megatron", dict(targets="shifted")),
    "extras": (
        "megatron",
        dict(extras=("position_ids", "loss_mask", "cu_seqlens", "document_ids")),
    ),
    "extras-eos": ("npy", dict(eos=EOS, extras=("position_ids", "loss_mask"))),
    "packed": ("megatron", dict(windows="packed", pad=EOS)),
    "int32": ("npy", dict(out_dtype="int32")),
    "prefetch": ("megatron", dict(prefetch=2)),
    "reused-buffers": ("npy", dict(reuse_buffers=2, prefetch=1)),
    "materialized": ("npy", dict(permutation="materialized")),
}


@pytest.mark.parametrize("name, options", POLICIES.values(), ids=POLICIES.keys())
def test_every_window_policy_streams_the_same_batches(pair, name, options):
    assert assert_same(*both(pair, name, seed=3, **options)) > 0


def test_a_mixture_of_remote_and_local_corpora_streams_the_same_batches(pair):
    npy_local, npy_far = pair("npy")
    meg_local, meg_far = pair("megatron")
    weights = {"a": 2, "b": 1}
    far = tokstream.mix({"a": npy_far, "b": meg_local}, weights)
    local = tokstream.mix({"a": npy_local, "b": meg_local}, weights)
    options = dict(samples=300, seed=11, extras=("source",))
    assert_same(
        tokstream.stream_token_source(far, 16, 32, **options),
        tokstream.stream_token_source(local, 16, 32, **options),
    )
    far = tokstream.mix({"a": npy_far, "b": meg_far}, weights)
    assert_same(
        tokstream.stream_token_source(far, 16, 32, **options),
        tokstream.stream_token_source(local, 16, 32, **options),
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_streams_the_same_batches_as_the_same_rank_locally(pair, world_size):
    for rank in range(world_size):
        streams = both(pair, "llmc", seed=5, rank=rank, world_size=world_size, drop_last=True)
        assert_same(*streams)


def test_a_remote_stream_resumes_from_its_own_state_and_from_a_local_streams(pair):
    local, far = pair("npy")
    options = dict(seed=9)
    expected = tokstream.stream_token_source(local, 16, 32, **options)
    head = [next(expected) for _ in range(5)]
    remote_stream = tokstream.stream_token_source(far, 16, 32, **options)
    assert_same([next(remote_stream) for _ in range(5)], head)
    state = remote_stream.state_dict()
    remote_stream.close()
    assert state == expected.state_dict()
    rest = list(expected)

    resumed = tokstream.stream_token_source(far, 16, 32, **options)
    resumed.load_state_dict(state)
    assert_same(resumed, rest)
    # The state is the same whichever copy made it: a local checkpoint resumes remotely.
    local_stream = tokstream.stream_token_source(local, 16, 32, **options)
    for _ in range(5):
        next(local_stream)
    resumed = tokstream.stream_token_source(far, 16, 32, **options)
    resumed.load_state_dict(local_stream.state_dict())
    assert_same(resumed, rest)


def test_a_remote_stream_resumes_with_another_batch_size_and_world_size(pair):
    local, far = pair("megatron")
    options = dict(seed=2, windows="within")
    source = tokstream.stream_token_source(far, 16, 32, **options)
    for _ in range(5):
        next(source)
    state = source.state_dict()
    source.close()
    for rank in range(2):
        expected = tokstream.stream_token_source(local, 16, 16, rank=rank, world_size=2, **options)
        expected.load_state_dict(state)
        resumed = tokstream.stream_token_source(far, 16, 16, rank=rank, world_size=2, **options)
        resumed.load_state_dict(state)
        assert_same(resumed, expected)


def test_seek_jumps_a_remote_stream_to_the_same_batch(pair):
    far_stream, local_stream = both(pair, "bin", seed=4, epochs=3)
    far_stream.seek(25)
    local_stream.seek(25)
    assert_same(far_stream, local_stream)


def test_a_pickled_remote_corpus_streams_the_same_batches(pair):
    # What a spawned DataLoader worker receives: the URLs and the headers, not the tokens.
    local, far = pair("megatron-glob")
    copy = pickle.loads(pickle.dumps(far))
    assert len(pickle.dumps(far)) < sum(doc.nbytes for doc in DOCS)
    assert_same(
        tokstream.stream_token_source(copy, 16, 32, seed=1),
        tokstream.stream_token_source(local, 16, 32, seed=1),
    )


def test_a_remote_corpus_sent_to_a_spawned_process_streams_the_same_batches(pair):
    # What a spawned DataLoader worker does with its copy of the dataset, without torch.
    local, far = pair("megatron")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        got = pool.submit(stream_batches, far, 16, 32, seed=12).result(timeout=120)
    assert_same(got, tokstream.stream_token_source(local, 16, 32, seed=12))


def test_the_same_windows_come_from_one_url_or_a_list_of_urls(corpora, s3_env):
    local, url = corpora("npy")
    prefix = url.rsplit("/", 1)[0]
    urls = [f"{prefix}/shard_{i:03d}.npy" for i in (2, 0, 1)]
    paths = [local.replace("shard_*.npy", f"shard_{i:03d}.npy") for i in (2, 0, 1)]
    assert_same(
        tokstream.stream_token_source(tokstream.open_tokens(urls), 16, 32, seed=8),
        tokstream.stream_token_source(tokstream.open_tokens(paths), 16, 32, seed=8),
    )


def test_a_url_that_matches_nothing_is_an_error_naming_it(s3_bucket):
    url = s3_bucket.url("nothing/*.bin")
    with pytest.raises((FileNotFoundError, ValueError)) as error:
        tokstream.open_tokens(url)
    assert url in str(error.value) or "nothing/" in str(error.value)


def test_a_missing_object_is_file_not_found_naming_it(s3_bucket):
    url = s3_bucket.url("absent.npy")
    with pytest.raises(FileNotFoundError) as error:
        tokstream.open_tokens(url)
    assert "absent.npy" in str(error.value)


def test_an_arrow_url_is_refused_rather_than_read_whole(s3_bucket, tmp_path):
    pytest.importorskip("pyarrow")
    corpus = tokstream.Corpus.from_documents(DOCS)
    path = tokstream.write_tokens(tmp_path / "docs.arrow", corpus, "arrow")
    url = s3_bucket.put("docs.arrow", path)
    with pytest.raises(ValueError, match="[Aa]rrow"):
        tokstream.open_tokens(url)


@pytest.mark.parametrize("format", ["npy", "megatron"])
def test_opening_reads_headers_and_indexes_not_the_tokens(proxied_bucket, tmp_path, format):
    # 400 KB of tokens; the proxy in front of the server counts what opening fetched.
    tokens = np.random.default_rng(0).integers(0, 50_000, 200_000, dtype=np.uint16)
    corpus = tokstream.Corpus.from_documents(np.array_split(tokens, 100))
    path = tokstream.write_tokens(tmp_path / "big", corpus, format)
    urls = proxied_bucket.upload(tmp_path)
    proxied_bucket.proxy.configure()
    opened = tokstream.open_tokens(urls[0])
    assert opened.num_tokens == tokens.size
    served = proxied_bucket.proxy.stats()["requests"]
    assert 0 < sum(r["body_bytes"] for r in served) < 16_384, (path, served)
