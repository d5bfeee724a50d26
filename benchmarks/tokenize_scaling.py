"""How close `tokstream tokenize` comes to the encoder's own speed, by engine and workers.

Real text (documentation and source files found on this machine, one document per file) is
tokenized with a GPT-2-style byte-level BPE trained here on part of it. The encoder's own rate
is measured first in the same run: ``Tokenizer.encode_batch`` over the same documents in the
job's batches, on one core (``TOKENIZERS_PARALLELISM=false``, as the job's workers run it). Then
``tokenize_files`` runs with 1 and 2 workers under the local engine and, when Ray is installed,
the Ray engine (on a Ray started once beforehand, its start-up timed apart). Every output must
be byte-identical to the first before any figure is printed. The ratio is the job's tokens/s
over ``workers x`` the encoder's single-core tokens/s (target: at least 0.9).

    python benchmarks/tokenize_scaling.py --megabytes 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per encoder, before tokenizers loads

from tokstream.tokenize import job, tokenize_files  # noqa: E402

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


def encoder_rate(tokenizer_file: Path, documents: list[str]) -> tuple[float, int]:
    """The encoder's own single-core tokens/s over ``documents`` in the job's batches."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.encode_special_tokens = True
    tokens = 0
    started = time.perf_counter()
    for i in range(0, len(documents), job.BATCH_DOCUMENTS):
        batch = documents[i : i + job.BATCH_DOCUMENTS]
        tokens += sum(len(e.ids) + 1 for e in tokenizer.encode_batch(batch))
    return tokens / (time.perf_counter() - started), tokens


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200.0, help="text to tokenize")
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--workers", default="1,2", help="worker counts to run")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    documents = gather_text(args.megabytes)
    text_bytes = sum(len(d.encode()) for d in documents)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        corpus = scratch / "corpus.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for document in documents:
                f.write(json.dumps({"text": document}) + "\n")
        tokenizer_file = scratch / "tokenizer.json"
        started = time.perf_counter()
        train_tokenizer(documents[: max(len(documents) // 10, 1)], tokenizer_file, args.vocab_size)
        print(
            f"{len(documents):,} documents, {text_bytes / 1e6:,.1f} MB of text "
            f"({corpus.stat().st_size / 1e6:,.1f} MB as JSON Lines); byte-level BPE of "
            f"{args.vocab_size:,} trained in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        single, tokens = encoder_rate(tokenizer_file, documents)
        rows = [("encode_batch", 1, text_bytes / (tokens / single), single, None)]

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
        reference = None
        for engine in engines:
            for workers in worker_counts:
                out = scratch / f"{engine}_{workers}"
                started = time.perf_counter()
                result = tokenize_files(
                    [str(corpus)], str(tokenizer_file), out, engine=engine, workers=workers
                )
                elapsed = time.perf_counter() - started
                assert result.tokens == tokens, (result.tokens, tokens)
                found = hashes(out)
                reference = reference or found
                assert found == reference, f"{engine} x {workers}: the output differs"
                rate = result.tokens / elapsed
                rows.append(
                    (engine, workers, text_bytes / elapsed, rate, rate / (workers * single))
                )
    print("| run | workers | MB/s | Mtokens/s | / (workers x encode_batch) |")
    print("|---|---|---|---|---|")
    for name, workers, mb, rate, ratio in rows:
        shown = "" if ratio is None else f"{ratio:.2f}"
        print(f"| {name} | {workers} | {mb / 1e6:.2f} | {rate / 1e6:.3f} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
