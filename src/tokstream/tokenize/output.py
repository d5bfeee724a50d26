"""The directory a tokenize job writes: claimed, locked, and resumable shard by shard.

A directory becomes the job's only when it is known to be a tokenize output or empty; until
then nothing in it is touched (no temporary file removed, no lock file made). The job then
holds an exclusive lock on ``DIR/.tokstream.lock`` for as long as it runs, so a second run into
the same directory is refused. The lock is the operating system's (``flock``), released when
the process ends however it ends, so the file a killed run leaves behind blocks nobody.
A job's worker processes hold a shared lock on ``DIR/.tokstream.writers`` while each runs a
task; a new claim of the directory takes it exclusively before it removes anything, so the
workers of a killed run (which end when they see their job gone) have stopped writing before
another run cleans up after them. Holding it, the claim writes the run's token into that file
(emptied again when the run ends), and every task compares its own with it once it holds the
shared lock: a task of a run that no longer owns the directory (a killed job's, started late by
a pool or a Ray cluster that has not yet seen its job die) writes nothing.

Shards are made in any order (:mod:`tokstream.tokenize.task`); each one finished is recorded
by a line appended to ``DIR/.partial.shards`` (its index and manifest entry), so recording is
O(1) however many shards there are. A rerun after a kill keeps every shard recorded there and
makes only the others; the last line, if the kill cut it, is dropped. When every shard is
made, the manifest lists them in order and is marked complete, the record is removed, and
``DIR/manifest.json`` (:mod:`tokstream.manifest`) is written last: what ``open_tokens(DIR)``
reads instead of every shard. It exists only in a complete directory (a rerun of a complete one
finishes what a kill after its marking left undone: removes the record, writes the contents).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokstream.formats import tokenized
from tokstream.manifest import MANIFEST_NAME, write_manifest

LOCK = ".tokstream.lock"
WRITERS = ".tokstream.writers"
#: Seconds a claim waits for the workers of a killed run to stop writing (each ends within
#: moments of its job) before it calls the directory busy.
WRITERS_SECONDS = 60.0
FINISHED = ".partial.shards"
#: The files a tokenize job writes (shards, document offsets, Megatron's pair, its record, the
#: table of contents).
OWN_FILE = re.compile(
    r"shard_\d{6,}(\.npy|\.bin|\.idx|\.documents\.npy|\.loss_mask\.npy)?|\.partial\.\w+"
    r"|manifest(\.json|\.documents\.npy)"
)
#: The temporary files its writers leave when killed (formats.common.atomic_writer's names).
OWN_TEMPORARY = re.compile(r"\.(shard_\d{6,}\S*|tokstream\.json|manifest\S*)\.[0-9a-f]+\.tmp")


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
    if sys.platform == "win32":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class RunSuperseded(RuntimeError):
    """A task of a run that no longer owns its output directory (see the module docstring)."""


@contextlib.contextmanager
def writing(directory: str | os.PathLike[str], run: str) -> Iterator[None]:
    """Held by a worker process while it runs a task of run ``run`` writing into ``directory``:
    a shared lock on ``DIR/.tokstream.writers``, which a new claim of the directory waits for.
    :class:`RunSuperseded`, before anything is written, if the directory is no longer run
    ``run``'s."""
    fd = os.open(Path(directory) / WRITERS, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(ImportError):  # Windows: the job's own lock only
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_SH)
        if not run or _read_token(fd) != run:
            raise RunSuperseded(
                f"output {directory} is no longer this run's (another run of tokstream tokenize "
                "has taken it over): this task of the earlier run writes nothing"
            )
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _read_token(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 64).decode("ascii", "replace")


def _write_token(fd: int, token: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, token.encode("ascii"))


def _take_writers(directory: Path) -> str:
    """Wait until no worker process of an earlier run holds ``DIR/.tokstream.writers``, then,
    holding it, write a new run's token into it and return the token.

    Called under the job's lock, so no live job's worker can take it meanwhile; a killed
    job's workers end within moments, and a claim waits for them rather than clean up files
    they are still writing. A ValueError after :data:`WRITERS_SECONDS`.
    """
    token = os.urandom(8).hex()
    fd = os.open(directory / WRITERS, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:
            _write_token(fd, token)
            return token
        deadline = time.monotonic() + WRITERS_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _write_token(fd, token)
                return token
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ValueError(
                        f"output {directory} is still being written by worker processes of an "
                        f"earlier run (they hold the lock on {directory / WRITERS}); wait for "
                        "them to end or choose another --output"
                    ) from None
                time.sleep(0.02)
    finally:
        os.close(fd)


def _end_run(directory: Path) -> None:
    """Empty ``DIR/.tokstream.writers`` as the run ends: no task of it writes from now on, and
    a finished directory is the same, byte for byte, whichever runs made it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory / WRITERS, os.O_WRONLY)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)


def _foreign_entries(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name not in (LOCK, WRITERS))


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
    """A claimed output directory: its lock, its manifest and the shards already made.

    :meth:`claim` makes one; :meth:`record` notes a shard as made, :meth:`finish` writes the
    complete manifest. ``finished`` maps each shard made (by this or an earlier run) to its
    manifest entry.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], lock: Lock, run: str) -> None:
        self.directory = directory
        self.manifest = manifest
        self.lock = lock
        #: This run's token: its tasks write only while the directory holds it.
        self.run = run
        self.complete = manifest.get("complete") is True
        self.finished: dict[int, dict[str, Any]] = {}
        self._record: io.BufferedRandom | None = None
        if self.complete:
            if not all(_is_record(entry) for entry in manifest["shards"]):
                raise ValueError(
                    f"output {directory}: its manifest {tokenized.MANIFEST} is damaged; rerun "
                    "with --overwrite to start over"
                )
            self.finished = dict(enumerate(manifest["shards"]))
        else:
            self._record = self._open_record()
        self.resumed_documents = sum(entry["documents"] for entry in self.finished.values())

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
            run = _take_writers(directory)
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
            out = cls(directory, manifest, lock, run)
            if out.complete:  # what a run killed after marking it complete left undone
                (directory / FINISHED).unlink(missing_ok=True)
                if not (directory / MANIFEST_NAME).is_file():
                    _write_contents(directory)
            return out
        except BaseException:
            _end_run(directory)
            lock.release()
            raise

    def _open_record(self) -> io.BufferedRandom:
        """The record of shards made, read (a line cut by a kill dropped) and open to append."""
        f = open(self.directory / FINISHED, "a+b")
        f.seek(0)
        valid = 0
        for line in f:
            try:
                index, entry = json.loads(line)
            except ValueError:
                break  # a kill cut the last line short
            if not (line.endswith(b"\n") and type(index) is int and _is_record(entry)):
                break
            self.finished[index] = entry
            valid += len(line)
        f.truncate(valid)
        f.seek(valid)
        return f

    def record(self, index: int, entry: dict[str, Any]) -> None:
        """Note shard ``index`` as made, with its manifest entry."""
        if self._record is None:
            raise RuntimeError(f"output {self.directory}: complete or released, nothing to record")
        self._record.write(json.dumps([index, entry]).encode("utf-8") + b"\n")
        self._record.flush()
        self.finished[index] = entry

    def finish(self, shards: int) -> None:
        """List the ``shards`` shards in order in the manifest and mark the directory complete."""
        self.manifest["shards"] = [self.finished[index] for index in range(shards)]
        self.manifest["complete"] = True
        tokenized.save(self.directory, self.manifest)
        self.complete = True
        self._close_record()
        (self.directory / FINISHED).unlink(missing_ok=True)
        _write_contents(self.directory)

    def fail(self, error: BaseException) -> None:
        """Record that the run stopped on ``error``, so that a changed rerun may start over."""
        self.manifest["failed"] = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError):  # the error being raised is the one to report
            tokenized.save(self.directory, self.manifest)

    def _close_record(self) -> None:
        if self._record is not None:
            self._record.close()
            self._record = None

    def release(self) -> None:
        self._close_record()
        _end_run(self.directory)
        self.lock.release()


def _write_contents(directory: Path) -> None:
    """``DIR/manifest.json``: the table of contents ``open_tokens(DIR)`` reads (one file, shards
    mapped on first read) instead of opening every shard."""
    write_manifest(directory, directory / MANIFEST_NAME)


def _is_record(record: Any) -> bool:
    """A shard's manifest entry: its token and document counts."""
    return isinstance(record, dict) and all(
        type(record.get(key)) is int and record[key] >= 0 for key in ("tokens", "documents")
    )


def _new_manifest(job: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "kind": tokenized.KIND,
        "version": tokenized.VERSION,
        "format": job["format"],
        "dtype": job["dtype"],
        "complete": False,
        "job": job,
        "shards": [],
    }
    if "chat" in job:
        manifest["loss_mask"] = True  # formats.tokenized.has_loss_masks
    return manifest


def _continues(manifest: dict[str, Any], job: dict[str, Any], overwrite: bool, where: Path) -> bool:
    """Whether to continue the manifest's run; False starts over, a ValueError refuses."""
    if overwrite:
        return False
    if manifest.get("job") == job:
        return True
    record = where / FINISHED
    made = bool(manifest["shards"]) or (record.is_file() and record.stat().st_size > 0)
    if manifest.get("failed") or not made:
        return False  # a run that failed, or wrote nothing, is replaced
    changed = sorted(k for k in job if (manifest.get("job") or {}).get(k) != job[k])
    raise ValueError(
        f"output {where} holds the shards of another tokenization (it differs in "
        f"{', '.join(changed) or 'its record'}); choose another --output, or pass "
        "--overwrite to replace them"
    )
