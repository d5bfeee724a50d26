"""``tokstream inspect FILES --step S``: where each row of one batch of a run comes from.

The batch is the one a stream over the files with the given options yields as this rank's step
``S`` (found by :meth:`tokstream.TokenStream.seek`, without making the batches before it); each
row is printed with its file, shard, token offset in the shard and document index, from the
``"origin"`` extra.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

import numpy as np

from tokstream import files
from tokstream.bench.report import markdown_table
from tokstream.cli._common import UsageError, nonnegative, positive
from tokstream.stream import TokenStream


def add_arguments(inspect: argparse.ArgumentParser) -> None:
    """The step options of ``inspect``: the batch and the stream options that decide it."""
    step = inspect.add_argument_group(
        "one batch of a run (with --step): the stream's options as the run passed them"
    )
    step.add_argument("--step", type=nonnegative, default=None, metavar="S", help="the step")
    step.add_argument("--rank", type=nonnegative, default=0, metavar="R", help="default 0")
    step.add_argument("--world-size", type=positive, default=1, metavar="W", help="default 1")
    step.add_argument("--batch-size", type=positive, default=None, metavar="B")
    step.add_argument("--seed", type=nonnegative, default=0, help="default 0")
    step.add_argument("--stride", type=positive, default=1, help="default 1")
    step.add_argument(
        "--windows",
        choices=("cross", "within", "packed"),
        default="cross",
        help="packed (without --step): also report what windows='packed' makes of the documents",
    )
    step.add_argument(
        "--pad",
        type=int,
        default=None,
        metavar="ID",
        help="the token id padding --windows packed rows (default: --eos)",
    )
    step.add_argument("--permutation", choices=("materialized", "implicit"), default=None)
    step.add_argument("--no-shuffle", action="store_true", help="windows in corpus order")
    step.add_argument("--drop-last", action="store_true")


def run(args: argparse.Namespace, paths: list[str], stdout: TextIO) -> int:
    """Print the rows of step ``args.step`` of rank ``args.rank``."""
    if args.batch_size is None:
        raise UsageError("--step needs --batch-size, the run's windows per batch on each rank")
    read: dict[str, Any] = {"format": args.format, "column": args.column}
    shard_files = [
        path for path in paths for _ in files.open_tokens(path, args.dtype, **read).shards
    ]
    corpus = files.open_tokens(paths, args.dtype, **read)
    options: dict[str, Any] = {
        "rank": args.rank,
        "world_size": args.world_size,
        "seed": args.seed,
        "stride": args.stride,
        "windows": args.windows,
        "permutation": args.permutation,
        "shuffle": not args.no_shuffle,
        "drop_last": args.drop_last,
        "eos": args.eos,
        "extras": ("origin",),
    }
    if args.pad is not None:
        options["pad"] = args.pad
    per_epoch = TokenStream(corpus, args.block, args.batch_size, **options).batches_per_epoch
    if per_epoch == 0:
        raise ValueError(f"a stream over {', '.join(paths)} with these options has no batch")
    # Enough epochs for the step to exist: a run's epochs beyond it do not change it.
    epochs = args.step // per_epoch + 1
    stream = TokenStream(corpus, args.block, args.batch_size, epochs=epochs, **options)
    stream.seek(args.step)
    batch = next(stream)
    assert isinstance(batch, dict)  # a stream with extras yields dicts
    boundaries = (
        corpus.document_boundaries if args.eos is None else corpus.boundaries_with_eos(args.eos)
    )
    origin = batch["origin"]
    assert isinstance(origin, np.ndarray)
    starts = corpus.shard_starts[origin[:, 0]] + origin[:, 1]
    documents = np.searchsorted(boundaries, starts, side="right") - 1
    rows = [
        [str(row), shard_files[shard], str(shard), f"{offset:,}", f"{document:,}"]
        for row, ((shard, offset), document) in enumerate(
            zip(origin.tolist(), documents.tolist(), strict=True)
        )
    ]
    epoch, batch_in_epoch = divmod(args.step, per_epoch)
    print(
        f"step {args.step} (epoch {epoch}, batch {batch_in_epoch}) of rank {args.rank} of "
        f"{args.world_size}: {len(rows)} rows of {args.block} tokens",
        file=stdout,
    )
    header = ["row", "file", "shard", "token offset", "document"]
    print(markdown_table(header, rows, numeric_from=2), file=stdout)
    return 0
