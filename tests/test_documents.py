"""Documents in a corpus: boundaries recorded by Corpus.from_documents and by readers."""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import Corpus


def test_from_documents_joins_the_documents_and_records_their_boundaries():
    docs = [np.array([1, 2, 3], np.uint16), np.array([], np.uint16), np.array([4, 5], np.uint16)]
    corpus = Corpus.from_documents(docs)
    assert len(corpus.shards) == 1 and corpus.dtype == np.uint16
    assert corpus.shards[0].tolist() == [1, 2, 3, 4, 5]
    assert corpus.document_lengths.tolist() == [3, 0, 2]
    assert corpus.document_boundaries.tolist() == [0, 3, 3, 5]
    assert corpus.has_documents


def test_from_documents_accepts_lists_and_validates_each_document_by_name():
    corpus = Corpus.from_documents([[1, 2], [3]])
    assert corpus.shards[0].tolist() == [1, 2, 3]
    assert corpus.document_lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match=r"documents\[1\]"):
        Corpus.from_documents([[1, 2], [3.5]])
    with pytest.raises(TypeError, match=r"documents\[0\]"):
        Corpus.from_documents([[True, 2], [3]])


@pytest.mark.parametrize(
    ("documents", "error", "match"),
    [
        (np.arange(5), TypeError, "documents must be a sequence"),
        ("abc", TypeError, "documents must be a sequence"),
        ([], ValueError, "at least one document"),
        ([np.arange(3, dtype=np.uint16), np.arange(3, dtype=np.int32)], ValueError, "mix token"),
    ],
)
def test_from_documents_rejects_bad_input(documents, error, match):
    with pytest.raises(error, match=match):
        Corpus.from_documents(documents)


def test_from_documents_over_a_million_documents_needs_no_loop_per_token():
    docs = np.split(np.arange(3_000_000, dtype=np.uint16), np.arange(3, 3_000_000, 3))
    corpus = Corpus.from_documents(docs)
    assert corpus.document_lengths.shape == (1_000_000,)
    assert int(corpus.document_lengths.sum()) == 3_000_000


def test_shards_without_recorded_documents_are_one_document_each():
    corpus = Corpus([np.arange(5), np.arange(3)])
    assert not corpus.has_documents
    assert corpus.document_lengths.tolist() == [5, 3]


def test_readers_record_documents_per_shard_and_they_are_checked():
    arrays = [np.arange(5), np.arange(4)]
    corpus = Corpus._from_arrays(arrays, ["a", "b"], "files", [np.array([0, 2, 5]), None])
    assert corpus.document_boundaries.tolist() == [0, 2, 5, 9]
    assert corpus.document_lengths.tolist() == [2, 3, 4]
    for offsets, match in [
        (np.array([1, 5]), "rise from 0"),
        (np.array([0, 4]), "rise from 0"),
        (np.array([0, 3, 2, 5]), "decrease"),
        (np.array([0.0, 5.0]), "integer array"),
        (np.array([5]), "at least 2"),
    ]:
        with pytest.raises(ValueError, match=match):
            Corpus._from_arrays(arrays, ["a", "b"], "files", [offsets, None])
