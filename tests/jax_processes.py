"""One process of a multi-process JAX run on this machine, for tests/test_jax.py.

``python tests/jax_processes.py PROCESS_ID NUM_PROCESSES PORT DEVICES JOB_JSON``: joins the
run (``jax.distributed.initialize`` on 127.0.0.1, ``DEVICES`` CPU devices a process), streams
the job's global batches, checks every shard this process holds against the one-process stream,
and prints one JSON line: its rows, its final state and the dataset share Grain gave it.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    process_id, num_processes, port, devices = map(int, sys.argv[1:5])
    job = json.loads(sys.argv[5])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    import jax

    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=num_processes,
            process_id=process_id,
        )
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    from tokstream import stream_token_source
    from tokstream.jax import global_batches

    tokens = np.random.default_rng(job["seed"]).integers(0, 50_000, job["tokens"])
    tokens = tokens.astype(np.uint16)
    mesh = Mesh(np.array(jax.devices()).reshape(job["mesh"]), tuple(job["axes"]))
    spec = PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in job["spec"]])
    options = job["options"]
    reads = job.get("reads")
    source = tokens if reads is None else _evicted_copy(tokens, reads, process_id)
    batches = global_batches(source, job["block"], job["global_batch_size"], mesh, spec, **options)
    reference = stream_token_source(
        tokens,
        job["block"],
        job["global_batch_size"],
        drop_last=True,
        out_dtype="int32",
        permutation="implicit",
        **options,
    )
    if job.get("state") is not None:
        batches.load_state_dict(job["state"])
        reference.load_state_dict(job["state"])
    steps = 0
    for batch, expected in zip(batches, reference, strict=True):
        arrays = (
            batch
            if isinstance(batch, dict)
            else dict(zip(("input_ids", "labels"), batch, strict=True))
        )
        if not isinstance(expected, dict):
            expected = dict(zip(("input_ids", "labels"), expected, strict=True))
        for name, array in arrays.items():
            assert array.shape[0] == job["global_batch_size"], (name, array.shape)
            for shard in array.addressable_shards:
                want = np.asarray(expected[name])[shard.index]
                np.testing.assert_array_equal(np.asarray(shard.data), want, err_msg=name)
        steps += 1
        if steps == job["steps"]:
            break

    try:
        from tokstream.grain import TokenIterDataset
    except ImportError:  # the grain extra is not installed: no Grain share to report
        share = None
    else:
        share = str(TokenIterDataset(tokens, job["block"], 4))
    report = {
        "process": jax.process_index(),
        "rows": batches.rows.tolist(),
        "steps": steps,
        "state": batches.state_dict(),
        "grain": share,
    }
    if job.get("reads") is not None:
        report["pages read"] = _pages_read(tokens, job, batches.rows, process_id)
    print(json.dumps(report))


def _evicted_copy(tokens, directory, process_id):
    """This process' own copy of the tokens as a raw file, out of the page cache, opened."""
    import numpy as np

    from tokstream import open_tokens

    path = os.path.join(directory, f"tokens_{process_id}.bin")
    tokens.tofile(path)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)
    return open_tokens(path, format="bin", dtype=np.uint16)


def _pages_read(tokens, job, rows, process_id):
    """How many resident pages of this process' copy its own rows' windows touch, and how many
    only the other rows' windows touch (anywhere in the run)."""
    import ctypes
    import mmap

    import numpy as np

    from tokstream import stream_token_source

    path = os.path.join(job["reads"], f"tokens_{process_id}.bin")
    mapped = np.memmap(path, np.uint8, "r")
    pages = (mapped.size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mincore(ctypes.c_void_p(mapped.ctypes.data), ctypes.c_size_t(mapped.size), vector):
        raise OSError(ctypes.get_errno(), "mincore")
    resident = np.frombuffer(bytes(vector), np.uint8) & 1 == 1
    held = np.zeros(job["global_batch_size"], np.bool_)
    held[rows] = True
    own, other = np.zeros(pages, np.bool_), np.zeros(pages, np.bool_)
    reference = stream_token_source(
        tokens,
        job["block"],
        job["global_batch_size"],
        drop_last=True,
        permutation="implicit",
        **{**job["options"], "extras": ["origin"]},
    )
    for batch in reference:
        first = batch["origin"][:, 1] * tokens.itemsize
        last = first + (job["block"] + 1) * tokens.itemsize - 1
        for mine, start, end in zip(
            held, first // mmap.PAGESIZE, last // mmap.PAGESIZE, strict=True
        ):
            (own if mine else other)[start : end + 1] = True
    other_only = other & ~own
    return {
        "own": int((resident & own).sum()),
        "other rows' only": int((resident & other_only).sum()),
        "pages of other rows only": int(other_only.sum()),
    }


if __name__ == "__main__":
    main()
