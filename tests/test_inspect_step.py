"""``tokstream inspect FILES --step S --rank R --world-size W``: one batch's rows, located."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tokstream import cli, open_tokens, stream_token_source


def run(*argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = cli.main(["inspect", *argv], stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def table_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


@pytest.fixture
def two_files(tmp_path):
    # Token 0 ends a document every 37 tokens; file b's tokens are 10000 + offset.
    a = np.where(np.arange(3000) % 37 == 36, 0, np.arange(3000) + 1).astype(np.int32)
    b = (10_000 + np.arange(2000)).astype(np.int32)
    paths = [tmp_path / "a.npy", tmp_path / "b.npy"]
    np.save(paths[0], a)
    np.save(paths[1], b)
    return [str(p) for p in paths], [a, b]


@pytest.mark.parametrize(("step", "rank", "world"), [(0, 0, 1), (5, 1, 2), (40, 2, 3)])
def test_the_rows_of_a_step_are_the_streams_own_and_located(two_files, step, rank, world):
    paths, arrays = two_files
    code, out, err = run(
        *paths, "--block", "16", "--batch-size", "4", "--eos", "0", "--seed", "3",
        "--step", str(step), "--rank", str(rank), "--world-size", str(world),
    )  # fmt: skip
    assert code == 0, err
    stream = stream_token_source(
        open_tokens(paths), 16, 4, seed=3, eos=0, rank=rank, world_size=world, epochs=50
    )
    for _ in range(step):
        next(stream)
    windows = next(stream)[0]
    rows = table_rows(out)
    assert len(rows) == windows.shape[0]
    boundaries = open_tokens(paths).boundaries_with_eos(0)
    for (_, file, shard, offset, document), window in zip(rows, windows, strict=True):
        shard, offset = int(shard), int(offset.replace(",", ""))
        assert file == paths[shard]
        np.testing.assert_array_equal(arrays[shard][offset : offset + 16], window)
        start = [0, 3000][shard] + offset
        assert int(document.replace(",", "")) == np.searchsorted(boundaries, start, "right") - 1


@pytest.mark.parametrize("eos", [None, "0"])
def test_a_packed_step_locates_each_rows_first_piece(two_files, eos):
    paths, arrays = two_files
    eos_args = ("--eos", eos) if eos else ()
    code, out, err = run(
        *paths, "--block", "16", "--batch-size", "3", "--windows", "packed", "--pad", "7",
        "--step", "4", "--seed", "2", *eos_args,
    )  # fmt: skip
    assert code == 0, err
    stream = stream_token_source(
        open_tokens(paths), 16, 3, seed=2, windows="packed", pad=7, eos=eos and int(eos)
    )
    stream.seek(4)
    rows, windows = table_rows(out), next(stream)["input_ids"]
    assert len(rows) == windows.shape[0] == 3
    for (_, file, shard, offset, _), window in zip(rows, windows, strict=True):
        shard, offset = int(shard), int(offset.replace(",", ""))
        assert file == paths[shard] and arrays[shard][offset] == window[0]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (("--step", "0", "--batch-size", "4", "--windows", "packed"), 1, "needs pad="),
        (("--step", "0", "--batch-size", "4", "--pad", "3"), 1, "pad needs windows='packed'"),
        (("--step", "0", "--batch-size", "4", "--windows", "packed", "--pad", "x"), 2, "--pad"),
        (("--step", "2"), 2, "--step needs --batch-size"),
        (("--step", "-1", "--batch-size", "4"), 2, "expected an integer >= 0"),
        (("--step", "0", "--batch-size", "4", "--rank", "2", "--world-size", "2"), 1, "rank"),
        (("--step", "0", "--batch-size", "4", "--block", "5000"), 1, "no batch"),
    ],
)
def test_bad_step_arguments_are_one_line_errors(two_files, argv, code, message):
    paths, _ = two_files
    got, _, err = run(*paths, *argv)
    assert got == code and message in err
