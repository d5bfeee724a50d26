"""The directory a tokenize job writes: claimed, locked, and kept resumable document by document.

A directory becomes the job's only when it is known to be a tokenize output or empty; until
then nothing in it is touched (no temporary file removed, no lock file made). The job then
holds an exclusive lock on ``DIR/.tokstream.lock`` for as long as it runs, so a second run into
the same directory is refused. The lock is the operating system's (``flock``), released when
the process ends however it ends, so the file a killed run leaves behind blocks nobody.

The shard being filled lives in two hidden files (its tokens and its documents' lengths,
appended batch by batch); after each batch the manifest records how far they are valid and
which input position follows. A rerun after a kill truncates them to that record and goes on
from there, so at most one batch is encoded twice, and the finished shards are byte for byte
those of an uninterrupted run: a shard is made from these files only once it is full.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import files
from tokstream.formats import tokenized
from tokstream.formats.writer import TokenFileWriter

LOCK = ".tokstream.lock"
PARTIAL_TOKENS = ".partial.tokens"
PARTIAL_LENGTHS = ".partial.lengths"
#: The files a tokenize job writes (shards, document offsets, Megatron's pair, partial data).
OWN_FILE = re.compile(r"shard_\d{6,}(\.npy|\.bin|\.idx|\.documents\.npy)?|\.partial\.\w+")
#: The temporary files its writers leave when killed (formats._common.atomic_writer's names).
OWN_TEMPORARY = re.compile(r"\.(shard_\d{6,}\S*|tokstream\.json)\.[0-9a-f]+\.tmp")
#: Tokens copied from the partial file into a shard at a time.
COPY_TOKENS = 1 << 24


class Lock:
    """An exclusive, non-blocking lock on ``DIR/.tokstream.lock`` for the life of a job."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK
        # O_CREAT without O_TRUNC: an existing file is only opened, never changed.
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock(self.fd)
        except OSError:
            os.close(self.fd)
            raise ValueError(
                f"output {directory} is being written by another tokstream tokenize (it holds "
                f"the lock on {self.path}); wait for it to finish or choose another --output"
            ) from None

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = -1


def _lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _foreign_entries(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name != LOCK)


def _check_ours(directory: Path) -> bool:
    """True for a tokenize directory, False for an empty one; ValueError for anything else."""
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"output {directory} exists and is not a directory")
    if tokenized.is_directory(directory):
        tokenized.load(directory)  # a ValueError unless the manifest is a tokenize output's
        return True
    entries = _foreign_entries(directory) if directory.is_dir() else []
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ValueError(
            f"output {directory} is not empty ({shown}) and not a tokenize output; tokenize "
            "into a new or empty directory"
        )
    return False


def _remove_own_files(directory: Path, pattern: re.Pattern[str]) -> None:
    for name in os.listdir(directory):
        if pattern.fullmatch(name):
            (directory / name).unlink()


class Output:
    """A claimed output directory: its lock, its manifest and the shard being filled.

    :meth:`claim` makes one; :meth:`add` appends documents, :meth:`checkpoint` records them
    (and the input position after them) as done, :meth:`finish` closes the last shard and
    marks the directory complete. ``position`` is where the inputs are to be read from.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], lock: Lock) -> None:
        self.directory = directory
        self.manifest = manifest
        self.lock = lock
        self.format = manifest["format"]
        self.dtype = np.dtype(manifest["dtype"])
        self.complete = manifest.get("complete") is True
        shards = manifest["shards"]
        partial = manifest.get("partial") or {"tokens": 0, "documents": 0, "next": None}
        if not all(_is_record(record) for record in (*shards, partial)) or (
            partial["next"] is None and partial["documents"]
        ):
            raise ValueError(
                f"output {directory}: its manifest {tokenized.MANIFEST} is damaged; rerun with "
                "--overwrite to start over"
            )
        self.position: list[int] = partial["next"] or (shards[-1]["next"] if shards else [0, 0])
        self.shard_tokens = partial["tokens"]
        self.shard_documents = partial["documents"]
        self.resumed_documents = sum(s["documents"] for s in shards) + self.shard_documents
        self.documents = self.resumed_documents
        self.tokens = sum(s["tokens"] for s in shards) + self.shard_tokens
        self._tokens_file = self._lengths_file = None
        if not self.complete:
            self._tokens_file = self._open_partial(PARTIAL_TOKENS, self.shard_tokens, self.dtype)
            self._lengths_file = self._open_partial(PARTIAL_LENGTHS, self.shard_documents, np.int64)

    @classmethod
    def claim(cls, directory: Path, job: dict[str, Any], overwrite: bool) -> Output:
        """The directory ``directory`` made or resumed for ``job``; see the module docstring.

        A tokenize directory of another job is refused unless ``overwrite``, or unless its run
        failed or wrote nothing: then its files are replaced. Anything else is refused.
        """
        _check_ours(directory)  # before anything is created or removed in it
        directory.mkdir(parents=True, exist_ok=True)
        lock = Lock(directory)
        try:
            ours = _check_ours(directory)  # again: what counts is the state under the lock
            manifest = tokenized.load(directory) if ours else None
            _remove_own_files(directory, OWN_TEMPORARY)
            if manifest is not None and not _continues(manifest, job, overwrite, directory):
                manifest = None
            if manifest is None:
                _remove_own_files(directory, OWN_FILE)
                manifest = _new_manifest(job)
                tokenized.save(directory, manifest)
            elif manifest.pop("failed", None) is not None:
                tokenized.save(directory, manifest)
            return cls(directory, manifest, lock)
        except BaseException:
            lock.release()
            raise

    def _open_partial(self, name: str, count: int, dtype: Any) -> Any:
        path = self.directory / name
        f = open(path, "a+b")
        valid = count * np.dtype(dtype).itemsize
        if os.fstat(f.fileno()).st_size < valid:
            f.close()
            raise ValueError(
                f"output {self.directory}: {path} is shorter than its manifest records; the "
                "directory was changed behind tokstream's back: rerun with --overwrite"
            )
        f.truncate(valid)  # what a killed run appended after its last checkpoint
        return f

    def add(self, flat: np.ndarray, lengths: np.ndarray, end: list[int], limit: int) -> None:
        """Append one batch of documents (the last one followed by input position ``end``); a
        shard closes before a document that would take it past ``limit`` tokens."""
        if flat.shape[0] and (int(flat.min()) < 0 or int(flat.max()) > np.iinfo(self.dtype).max):
            raise ValueError(f"the tokenizer produced ids outside {self.dtype}")
        starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        first = 0
        for i, length in enumerate(lengths.tolist()):
            pending = self.shard_tokens + int(starts[i] - starts[first])
            if pending and pending + length > limit:
                self._append(flat[starts[first] : starts[i]], lengths[first:i])
                self._close_shard([end[0], end[1] - lengths.shape[0] + i])
                first = i
        self._append(flat[starts[first] :], lengths[first:])

    def _append(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self._tokens_file.write(np.ascontiguousarray(flat, dtype=self.dtype).tobytes())
        self._lengths_file.write(np.ascontiguousarray(lengths, dtype=np.int64).tobytes())
        self.shard_tokens += int(flat.shape[0])
        self.shard_documents += int(lengths.shape[0])
        self.documents += int(lengths.shape[0])
        self.tokens += int(flat.shape[0])

    def checkpoint(self, end: list[int]) -> None:
        """Record the documents appended so far as done, input position ``end`` next."""
        self._tokens_file.flush()
        self._lengths_file.flush()
        self.manifest["partial"] = {
            "tokens": self.shard_tokens,
            "documents": self.shard_documents,
            "next": end,
        }
        tokenized.save(self.directory, self.manifest)

    def _close_shard(self, end: list[int]) -> None:
        """Write the partial files out as the next shard and empty them."""
        if self.shard_documents == 0:
            return
        index = len(self.manifest["shards"])
        self._tokens_file.flush()
        self._lengths_file.flush()
        lengths = np.fromfile(self.directory / PARTIAL_LENGTHS, dtype=np.int64)
        offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        path = self.directory / tokenized.shard_file(index, self.format)
        tokens = np.memmap(self.directory / PARTIAL_TOKENS, dtype=self.dtype, mode="r")
        try:
            with TokenFileWriter(path, self.format, self.dtype) as writer:
                for start in range(0, tokens.shape[0], COPY_TOKENS):
                    writer.write(tokens[start : start + COPY_TOKENS])
                writer.document_offsets = offsets
        finally:
            del tokens
        if self.format != "megatron":
            files.write_tokens(
                self.directory / tokenized.documents_file(index),
                offsets,
                format="npy",
                dtype=np.int64,
            )
        self.manifest["shards"].append(
            {"tokens": self.shard_tokens, "documents": self.shard_documents, "next": end}
        )
        self.manifest["partial"] = None
        tokenized.save(self.directory, self.manifest)
        self._tokens_file.truncate(0)
        self._lengths_file.truncate(0)
        self.shard_tokens = self.shard_documents = 0

    def finish(self, end: list[int]) -> None:
        """Close the last shard and mark the directory complete (its partial files removed)."""
        self._close_shard(end)
        self.manifest.pop("partial", None)
        self.manifest["complete"] = True
        tokenized.save(self.directory, self.manifest)
        self._close_partial_files()
        for name in (PARTIAL_TOKENS, PARTIAL_LENGTHS):
            (self.directory / name).unlink(missing_ok=True)

    def fail(self, error: BaseException) -> None:
        """Record that the run stopped on ``error``, so that a changed rerun may start over."""
        self.manifest["failed"] = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError):  # the error being raised is the one to report
            tokenized.save(self.directory, self.manifest)

    def _close_partial_files(self) -> None:
        for f in (self._tokens_file, self._lengths_file):
            if f is not None:
                f.close()

    def release(self) -> None:
        self._close_partial_files()
        self.lock.release()


def _is_record(record: Any) -> bool:
    """A shard's or the partial shard's entry: counts and the input position after it."""
    if not isinstance(record, dict):
        return False
    counts = [record.get("tokens"), record.get("documents")]
    position = record.get("next")
    return all(type(n) is int and n >= 0 for n in counts) and (
        position is None
        or (
            isinstance(position, list)
            and len(position) == 2
            and all(type(n) is int and n >= 0 for n in position)
        )
    )


def _new_manifest(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": tokenized.KIND,
        "version": tokenized.VERSION,
        "format": job["format"],
        "dtype": job["dtype"],
        "complete": False,
        "job": job,
        "shards": [],
    }


def _continues(manifest: dict[str, Any], job: dict[str, Any], overwrite: bool, where: Path) -> bool:
    """Whether to continue the manifest's run; False starts over, a ValueError refuses."""
    if overwrite:
        return False
    if manifest.get("job") == job:
        return True
    partial = manifest.get("partial") or {}
    if manifest.get("failed") or not (manifest["shards"] or partial.get("documents")):
        return False  # a run that failed, or wrote nothing, is replaced
    changed = sorted(k for k in job if (manifest.get("job") or {}).get(k) != job[k])
    raise ValueError(
        f"output {where} holds the shards of another tokenization (it differs in "
        f"{', '.join(changed) or 'its record'}); choose another --output, or pass "
        "--overwrite to replace them"
    )
