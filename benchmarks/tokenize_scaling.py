"""How close `tokstream tokenize` comes to the encoder's own speed, by engine and workers.

Real text (documentation and source files found on this machine, one document per file, as
JSON Lines) is tokenized with a GPT-2-style byte-level BPE trained here on part of it and, when
tiktoken is installed, with tiktoken: ``gpt2`` if tiktoken has it cached, else tiktoken running
the same BPE (its ranks written into a tiktoken cache of the run's own, as
tests/tiktoken_offline.py does); nothing is downloaded. For each encoder, in the same run:

- the encoder's own rate: ``encode_batch`` over the same documents in the job's own batches, on
  one core (``TOKENIZERS_PARALLELISM=false``, as the job's workers run it), the ids taken out,
  measured again just before each run of the job (the ratio compares the two);
- before each run of more than one worker, the same batches shared out among that many
  processes encoding at once (no job: each loads the encoder, then all start together): what
  this machine gives that many encoders now, the ceiling of any engine on it (cores shared
  with other jobs, or caches and memory shared between its own cores, show here);
- where a one-worker job's time goes: the same work done stage by stage in this process
  (reading and parsing the ranges, encoding, packing the ids into arrays, writing the shards);
- a worker's start-up, measured apart: a new interpreter importing tokstream's task module and
  loading the tokenizer (what each spawned worker does before its first range);
- ``tokenize_files`` with 1 and 2 workers under the local engine and, when Ray is installed, the
  Ray engine (on a Ray started once beforehand, its start-up timed apart).

Every output must be byte-identical (sha256 of every file) to the first before any figure is
printed. The ratio is the job's tokens/s over ``workers x`` the encoder's single-core rate
(target: at least 0.9); beside it, the job's rate over the encoders-at-once rate measured just
before it (how close the job comes to what the machine gave), the job's tokens per CPU second
(this process and every process below it: its pool's workers, or the Ray it started, daemons,
workers and actor included) over the encoder's (what the job costs beyond the encoder, whatever
the machine's load), and the cores it kept busy (CPU seconds over wall seconds). The load
average is printed with every row: on a shared machine a second worker only helps when a core
is free.

    python benchmarks/tokenize_scaling.py --megabytes 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per encoder, before tokenizers loads

from tokstream.formats.writer import TokenFileWriter  # noqa: E402
from tokstream.tokenize import task as tasks  # noqa: E402
from tokstream.tokenize import tokenize_files  # noqa: E402
from tokstream.tokenize.encoders import Encoder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the suite's offline tiktoken

from tests.tiktoken_offline import NAME, look_for_plugins_again, write_encoding  # noqa: E402

TEXT_ROOTS = ("/usr/share/doc", "/usr/lib/python3", "/usr/share/man", "/usr/include")
SUFFIXES = {".txt", ".md", ".rst", ".py", ".h", ".c", ".html", ".1", ".README", ""}


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


def cached_tiktoken() -> str | None:
    """A tiktoken encoding already in tiktoken's cache, or None (nothing is downloaded)."""
    try:
        Encoder("gpt2")
    except (ImportError, ValueError):
        return None
    return "gpt2"


def offline_tiktoken(tokenizer_file: Path, scratch: Path) -> str | None:
    """tiktoken running the byte-level BPE ``tokenizer_file`` (its name), or None without
    tiktoken. Its cache and plugin reach this process, the spawned workers (``sys.path``) and
    the processes started later (``PYTHONPATH``: the worker start-up probe, a Ray started after
    this)."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return None
    cache, plugins = write_encoding(tokenizer_file, scratch / "tiktoken")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    sys.path.insert(0, str(plugins))
    look_for_plugins_again()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return NAME


def encoder_rate(encoder: Encoder, batches: list[list[str]]) -> tuple[float, float, int]:
    """The encoder's own single-core tokens/s over the job's own batches of documents (its
    ``encode_batch``, the ids taken out): per wall second, per CPU second, and the tokens."""
    tokens = 0
    started, cpu = time.perf_counter(), cpu_seconds()
    for batch in batches:
        tokens += sum(len(ids) + 1 for ids in encoder.encode(batch))
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    return tokens / wall, tokens / cpu, tokens


def encoders_at_once(spec: str, batches: list[list[str]], processes: int) -> tuple[float, float]:
    """``processes`` spawned processes encoding ``batches`` between them at once (each loads
    the encoder first; all start together): their tokens per wall second, from the first start
    to the last end, and per CPU second."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(processes)
    with context.Pool(processes, initializer=_keep_barrier, initargs=(start,)) as pool:
        shares = [(spec, batches[i::processes]) for i in range(processes)]
        results = pool.starmap(_encode_share, shares, chunksize=1)
    tokens = sum(r[0] for r in results)
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    return tokens / wall, tokens / sum(r[3] for r in results)


_barrier = None


def _keep_barrier(barrier: object) -> None:
    global _barrier
    _barrier = barrier


def _encode_share(spec: str, batches: list[list[str]]) -> tuple[int, float, float, float]:
    encoder = Encoder(spec)
    encoder.encode(batches[0][:1])  # warm
    _barrier.wait()  # type: ignore[attr-defined]
    began, cpu = time.perf_counter(), time.process_time()
    tokens = sum(len(ids) + 1 for batch in batches for ids in encoder.encode(batch))
    return tokens, began, time.perf_counter(), time.process_time() - cpu


def start_up(spec: str) -> tuple[float, float]:
    """Wall and CPU seconds of a new interpreter importing the task module and loading the
    tokenizer ``spec``: what a spawned worker spends before its first range."""
    code = "import sys\nfrom tokstream.tokenize import task\ntask.load(sys.argv[1])"
    started, cpu = time.perf_counter(), cpu_seconds()
    subprocess.run([sys.executable, "-c", code, spec], check=True)
    return time.perf_counter() - started, cpu_seconds() - cpu


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that ended (a process pool's workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and of every process below it, running or ended (each
    process's own and its reaped children's, from /proc): with a Ray started here, its daemons,
    workers and the job's actor are all below this process. Without /proc, :func:`cpu_seconds`.
    """
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
        return cpu_seconds()
    tree = {os.getpid()}
    grown = True
    while grown:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    return sum(ticks[pid] for pid in tree if pid in ticks) / os.sysconf("SC_CLK_TCK")


def stages(todo: list[tasks.Task], encoder: Encoder, scratch: Path) -> dict[str, float]:
    """Seconds a one-worker job spends in each stage, measured one stage at a time: reading
    and parsing its ranges, the encoder, packing the ids into arrays, writing the shards."""
    seconds = dict.fromkeys(("read", "encode", "pack", "write"), 0.0)
    for task in todo:
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
        with TokenFileWriter(scratch / "stage.npy", "npy", np.dtype(task.dtype)) as writer:
            for array in arrays:
                writer.write(array)
        seconds["write"] += time.perf_counter() - started
    return seconds


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def load() -> str:
    return "{:.1f}/{:.1f}".format(*os.getloadavg()[:2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200.0, help="text to tokenize")
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--workers", default="1,2", help="worker counts to run")
    parser.add_argument("--shards", type=int, default=32, help="ranges the text is cut into")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    documents = gather_text(args.megabytes)
    text_bytes = sum(len(d.encode()) for d in documents)
    rows = []

    def add(row: tuple) -> None:
        """Keep ``row`` for the table; show it on stderr now (a long run on a busy host)."""
        rows.append(row)
        print(cells(row), file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        corpus = scratch / "corpus.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for document in documents:
                f.write(json.dumps({"text": document}) + "\n")
        shard_bytes = -(-corpus.stat().st_size // args.shards)
        tokenizer_file = scratch / "tokenizer.json"
        started = time.perf_counter()
        train_tokenizer(documents[: max(len(documents) // 10, 1)], tokenizer_file, args.vocab_size)
        print(
            f"{len(documents):,} documents, {text_bytes / 1e6:,.1f} MB of text "
            f"({corpus.stat().st_size / 1e6:,.1f} MB as JSON Lines, {args.shards} ranges); "
            f"byte-level BPE of {args.vocab_size:,} trained in "
            f"{time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        encoders = {"byte-level BPE": str(tokenizer_file)}
        # A cached gpt2 if there is one (the user's cache stays the workers' then), else tiktoken
        # running the BPE trained here, from a cache of the run's own.
        tiktoken_name = cached_tiktoken()
        if tiktoken_name:
            encoders[f"tiktoken {tiktoken_name}"] = tiktoken_name
        elif same_bpe := offline_tiktoken(tokenizer_file, scratch):
            encoders["tiktoken, the same BPE"] = same_bpe
        else:
            print("tiktoken is not installed: its rows are skipped", file=sys.stderr)

        engines = ["local"]
        if not args.no_ray:
            try:
                import ray
            except ImportError:
                print("ray is not installed: the Ray engine is skipped", file=sys.stderr)
            else:
                started = time.perf_counter()
                ray.init(
                    num_cpus=max(worker_counts),
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
                print(f"Ray started in {time.perf_counter() - started:.1f} s", file=sys.stderr)
                engines.append("ray")

        for label, spec in encoders.items():
            encoder = Encoder(spec)
            plan = tasks.plan([corpus], shard_bytes, "text", False)
            todo = [
                tasks.Task(i, tuple(map(tuple, spans)), size, ((0, str(corpus)),), str(scratch),
                           spec, 0, "npy", "uint16" if encoder.max_id < 65536 else "uint32",
                           "text", False)
                for i, (spans, size) in enumerate(plan)
            ]  # fmt: skip
            # The documents as the job batches them: batch size changes encode_batch's rate
            # (1,000 long documents at a time run slower than the hundred or so of a range).
            batches = [batch for one in todo for batch, _ in tasks.batches(one)]
            split = stages(todo, encoder, scratch)
            total = sum(split.values())
            print(
                f"{label}: one worker's stages, one at a time in this process: "
                + ", ".join(f"{k} {v:.2f} s ({v / total:.1%})" for k, v in split.items())
                + f" (load {load()})",
                file=sys.stderr,
            )
            wall, cpu = start_up(spec)
            print(
                f"{label}: a worker's start-up (a new interpreter importing the task module and "
                f"loading the tokenizer): {wall:.2f} s wall, {cpu:.2f} s CPU, "
                f"{cpu / split['encode']:.1%} of the encoder's own time over all ranges "
                f"(load {load()})",
                file=sys.stderr,
            )
            reference = None
            for engine in engines:
                for workers in worker_counts:
                    # The encoder's own rate just before each run: a shared machine's load
                    # drifts, so each ratio compares figures taken a few seconds apart.
                    single, single_cpu, tokens = encoder_rate(encoder, batches)
                    add(
                        (label, "encode_batch", 1, text_bytes * single / tokens, single, None, "",
                         "", "", load())
                    )  # fmt: skip
                    at_once = None
                    if workers > 1:
                        at_once, at_once_cpu = encoders_at_once(spec, batches, workers)
                        add(
                            (label, f"encode_batch x {workers} processes at once", workers,
                             text_bytes * at_once / tokens, at_once, at_once / (workers * single),
                             f"{at_once_cpu / single_cpu:.2f}", "", "", load())
                        )  # fmt: skip
                    out = scratch / f"{label}_{engine}_{workers}".replace(" ", "_")
                    started, cpu = time.perf_counter(), tree_cpu_seconds()
                    result = tokenize_files(
                        [str(corpus)],
                        spec,
                        out,
                        engine=engine,
                        workers=workers,
                        shard_bytes=shard_bytes,
                    )
                    elapsed, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
                    assert result.tokens == tokens, (result.tokens, tokens)
                    found = hashes(out)
                    reference = reference or found
                    assert found == reference, f"{engine} x {workers}: the output differs"
                    rate = result.tokens / elapsed
                    ratio = rate / (workers * single)
                    of_at_once = "" if at_once is None else f"{rate / at_once:.2f}"
                    # Every process below this one: the pool's workers, or the Ray started here
                    # (its daemons, workers and the job's actor).
                    per_cpu = f"{result.tokens / cpu / single_cpu:.2f}"
                    cores = f"{cpu / elapsed:.2f}"
                    add(
                        (label, engine, workers, text_bytes / elapsed, rate, ratio, per_cpu,
                         of_at_once, cores, load())
                    )  # fmt: skip
    print(
        "| encoder | run | workers | MB/s | Mtokens/s | / (workers x encode_batch) "
        "| tokens per CPU s / encode_batch's | / encoders at once | cores busy | load 1/5 min |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(cells(row))
    print(f"(load average at the end: {load()})")
    return 0


def cells(row: tuple) -> str:
    """One row of the table, as Markdown."""
    label, name, workers, mb, rate, ratio, per_cpu, of_at_once, cores, when = row
    shown = "" if ratio is None else f"{ratio:.2f}"
    values = [label, name, workers, f"{mb / 1e6:.2f}", f"{rate / 1e6:.3f}", shown, per_cpu,
              of_at_once, cores, when]  # fmt: skip
    return "| " + " | ".join(map(str, values)) + " |"


if __name__ == "__main__":
    sys.exit(main())
