"""``tokstream tokenize`` against its encoder's own speed, by engine and worker count.

Real text (documentation and source files found on this machine, one document per file, as
JSON Lines; 5 MB, 200 MB with ``--bench-large``) tokenized with a GPT-2-style byte-level BPE
trained here on a tenth of it and, when tiktoken is installed, with tiktoken running the same BPE
(its ranks in a tiktoken cache of the run's own, as ``tests/tiktoken_offline.py`` builds it);
nothing is downloaded. Needs ``tokenizers`` (skipped without it). One group per (encoder,
workers), each with:

- ``N x encode_batch``: the encoder's own single-core rate (``encode_batch`` over the same
  documents in the job's own batches, ``TOKENIZERS_PARALLELISM=false``), times the workers;
- ``encode_batch x N processes at once`` (N > 1): the batches shared among N spawned processes
  that load the encoder, then start together: what the machine gives N encoders now, the
  ceiling of any engine on it (its rate from the first start to the last end);
- ``local`` (and ``ray`` when Ray is installed): ``tokenize_files`` with N workers. The summary
  prints its ratio to ``N x encode_batch`` (target: at least 0.9) and to the encoders at once.

Noted: the job's tokens per CPU second (every process below this one) over the encoder's, the
cores it kept busy, where a one-worker job's time goes stage by stage, and a worker's start-up
(a new interpreter importing the task module and loading the tokenizer). Every output is checked
byte-identical (sha256 of every file) to the first run's of its encoder.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per encoder, before tokenizers loads

TEXT_ROOTS = ("/usr/share/doc", "/usr/lib/python3", "/usr/share/man", "/usr/include")
SUFFIXES = {".txt", ".md", ".rst", ".py", ".h", ".c", ".html", ".1", ".README", ""}
ENCODERS = ["byte-level BPE", "tiktoken, the same BPE"]
WORKERS = [1, 2]


def gather_text(megabytes: float) -> list[str]:
    """Documents of real text, one per readable UTF-8 file, up to ``megabytes`` in all."""
    budget = int(megabytes * 1e6)
    documents: list[str] = []
    for root in TEXT_ROOTS:
        for directory, _, names in sorted(os.walk(root)):
            for name in sorted(names):
                path = Path(directory) / name
                if path.suffix not in SUFFIXES or not path.is_file() or path.is_symlink():
                    continue
                try:
                    text = path.read_bytes().decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if text.strip():
                    documents.append(text)
                    budget -= len(text.encode())
                    if budget <= 0:
                        return documents
    return documents


def train_tokenizer(documents: list[str], path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    tokenizer.save(str(path))


def offline_tiktoken(tokenizer_file: Path, scratch: Path) -> str:
    """tiktoken running the byte-level BPE ``tokenizer_file``: its name. Its cache and plugin
    reach this process, the spawned workers (``sys.path``) and processes started later
    (``PYTHONPATH``)."""
    pytest.importorskip("tiktoken")
    from tests.tiktoken_offline import NAME, look_for_plugins_again, write_encoding

    cache, plugins = write_encoding(tokenizer_file, scratch / "tiktoken")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    sys.path.insert(0, str(plugins))
    look_for_plugins_again()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return NAME


@pytest.fixture(scope="module")
def text(settings, tmp_path_factory) -> dict[str, Any]:
    """The JSON Lines corpus, its ranges' size and the trained tokenizer."""
    pytest.importorskip("tokenizers")
    megabytes = 200.0 if settings.large and not settings.tiny else settings.size(5, 0.3)
    documents = gather_text(megabytes)
    if not documents:
        pytest.skip(f"no text found under {', '.join(TEXT_ROOTS)}")
    scratch = tmp_path_factory.mktemp("tokenize")
    corpus = scratch / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for document in documents:
            f.write(json.dumps({"text": document}) + "\n")
    tokenizer_file = scratch / "tokenizer.json"
    vocab_size = settings.size(16_384, 1_024)
    train_tokenizer(documents[: max(len(documents) // 10, 1)], tokenizer_file, vocab_size)
    shards = settings.size(32, 4)
    return {
        "scratch": scratch,
        "corpus": corpus,
        "shard_bytes": -(-corpus.stat().st_size // shards),
        "bytes": sum(len(d.encode()) for d in documents),
        "tokenizer": tokenizer_file,
        "specs": {},
        "outputs": {},
        "description": f"{len(documents):,} documents, vocabulary {vocab_size:,}, {shards} ranges",
    }


def encoder_spec(text: dict[str, Any], label: str) -> str:
    if label not in text["specs"]:
        if label == "byte-level BPE":
            text["specs"][label] = str(text["tokenizer"])
        else:
            text["specs"][label] = offline_tiktoken(text["tokenizer"], text["scratch"])
    return text["specs"][label]


def job_batches(text: dict[str, Any], spec: str) -> list[list[str]]:
    """The documents as the job batches them (batch size changes encode_batch's rate)."""
    from tokstream.tokenize import task as tasks
    from tokstream.tokenize.encoders import Encoder

    encoder = Encoder(spec)
    plan = tasks.plan([text["corpus"]], text["shard_bytes"], "text", False)
    dtype = "uint16" if encoder.max_id < 65536 else "uint32"
    todo = [
        tasks.Task(i, tuple(map(tuple, spans)), size, ((0, str(text["corpus"])),),
                   str(text["scratch"]), spec, 0, "npy", dtype, "text", False)
        for i, (spans, size) in enumerate(plan)
    ]  # fmt: skip
    text.setdefault("tasks", {})[spec] = todo
    return [batch for one in todo for batch, _ in tasks.batches(one)]


def encode_all(encoder: Any, batches: list[list[str]]) -> int:
    return sum(len(ids) + 1 for batch in batches for ids in encoder.encode(batch))


_barrier = None


def _keep_barrier(barrier: object) -> None:
    global _barrier
    _barrier = barrier


def _encode_share(spec: str, batches: list[list[str]]) -> tuple[int, float, float, float]:
    from tokstream.tokenize.encoders import Encoder

    encoder = Encoder(spec)
    encoder.encode(batches[0][:1])  # warm
    _barrier.wait()  # type: ignore[attr-defined]  # set by the pool's initializer
    began, cpu = time.perf_counter(), time.process_time()
    tokens = sum(len(ids) + 1 for batch in batches for ids in encoder.encode(batch))
    return tokens, began, time.perf_counter(), time.process_time() - cpu


def encoders_at_once(spec: str, batches: list[list[str]], processes: int) -> tuple[int, float]:
    """``processes`` spawned processes encoding ``batches`` between them at once (each loads
    the encoder first; all start together): tokens, and seconds from the first start to the
    last end."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(processes)
    with context.Pool(processes, initializer=_keep_barrier, initargs=(start,)) as pool:
        shares = [(spec, batches[i::processes]) for i in range(processes)]
        results = pool.starmap(_encode_share, shares, chunksize=1)
    return sum(r[0] for r in results), max(r[2] for r in results) - min(r[1] for r in results)


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and every process below it, running or ended (from /proc;
    without it, this process's and its reaped children's)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
        ticks[int(stat.parent.name)] = sum(int(f) for f in fields[11:15])  # utime .. cstime
    if not ticks:
        times = os.times()
        return times.user + times.system + times.children_user + times.children_system
    tree = {os.getpid()}
    grown = True
    while grown:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    return sum(ticks[pid] for pid in tree if pid in ticks) / os.sysconf("SC_CLK_TCK")


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def stages(text: dict[str, Any], spec: str) -> str:
    """Where a one-worker job's time goes, the stages run one at a time in this process."""
    from tokstream.formats.writer import TokenFileWriter
    from tokstream.tokenize import task as tasks
    from tokstream.tokenize.encoders import Encoder

    encoder = Encoder(spec)
    seconds = dict.fromkeys(("read", "encode", "pack", "write"), 0.0)
    for task in text["tasks"][spec]:
        started = time.perf_counter()
        batches = [texts for texts, _ in tasks.batches(task)]
        seconds["read"] += time.perf_counter() - started
        arrays = []
        for texts in batches:
            started = time.perf_counter()
            encoded = encoder.encode(texts)
            seconds["encode"] += time.perf_counter() - started
            started = time.perf_counter()
            arrays.append(tasks.pack(encoded, task.eos)[0])
            seconds["pack"] += time.perf_counter() - started
        started = time.perf_counter()
        out = text["scratch"] / "stage.npy"
        with TokenFileWriter(out, "npy", np.dtype(task.dtype)) as writer:
            for array in arrays:
                writer.write(array)
        seconds["write"] += time.perf_counter() - started
    total = sum(seconds.values())
    code = "import sys\nfrom tokstream.tokenize import task\ntask.load(sys.argv[1])"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, spec], check=True)
    return (
        "one worker's stages: "
        + ", ".join(f"{k} {v / total:.1%}" for k, v in seconds.items())
        + f"; a worker's start-up {time.perf_counter() - started:.2f} s"
    )


@pytest.fixture(scope="module")
def ray_started() -> Any:
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=max(WORKERS), include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("side", ["encode_batch", "encoders at once", "local", "ray"])
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("label", ENCODERS)
def test_tokenize(measure, settings, text, request, label, workers, side) -> None:
    from tokstream.tokenize import tokenize_files
    from tokstream.tokenize.encoders import Encoder

    if side == "encoders at once" and workers == 1:
        pytest.skip("one encoder is the encode_batch side")
    if side == "ray":
        request.getfixturevalue("ray_started")
    spec = encoder_spec(text, label)
    batches = job_batches(text, spec)
    group = f"tokenize {label} workers={workers} ({text['description']})"
    if side == "encode_batch":
        encoder = Encoder(spec)
        tokens = encode_all(encoder, batches)
        measure(
            encode_all,
            args=(encoder, batches),
            group=group,
            side=f"{workers} x encode_batch",
            subject="local",
            units=workers * tokens,
            unit="Mtokens/s",
            rounds=settings.size(3, 1),
        )
        return
    if side == "encoders at once":
        measure(
            encoders_at_once,
            args=(spec, batches, workers),
            group=group,
            side=f"encode_batch x {workers} processes at once",
            subject="local",
            units=lambda result: result[0],
            rate_of=lambda result: result[0] / result[1] / 1e6,
            unit="Mtokens/s",
            rounds=settings.size(3, 1),
        )
        return
    runs = iter(range(10**6))
    cpu: list[float] = []

    def job() -> tuple[int, Path]:
        out = text["scratch"] / f"{label}_{side}_{workers}_{next(runs)}".replace(" ", "_")
        before = tree_cpu_seconds()
        result = tokenize_files(
            [str(text["corpus"])],
            spec,
            out,
            engine=side,
            workers=workers,
            shard_bytes=text["shard_bytes"],
        )
        cpu.append(tree_cpu_seconds() - before)
        return result.tokens, out

    produced, out = measure(
        job,
        group=group,
        side=side,
        subject="local",
        units=lambda result: result[0],
        unit="Mtokens/s",
        rounds=settings.size(3, 1),
    )
    found = hashes(out)
    expected = text["outputs"].setdefault(label, found)
    assert found == expected, f"{side} x {workers}: the output differs"
    if measure.benchmark.stats is not None:
        wall = measure.benchmark.stats.stats.median
        measure.note(
            group,
            f"{side}: cores busy {cpu[-1] / wall:.2f} (CPU seconds of every process below this "
            f"one over the wall seconds), {produced / cpu[-1] / 1e6:.3f} Mtokens per CPU second",
        )
    if side == "local" and workers == 1:
        measure.note(group, stages(text, spec))
