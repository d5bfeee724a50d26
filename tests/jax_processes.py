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
    batches = global_batches(tokens, job["block"], job["global_batch_size"], mesh, spec, **options)
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

    from tokstream.grain import TokenIterDataset

    share = str(TokenIterDataset(tokens, job["block"], 4))
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "rows": batches.rows.tolist(),
                "steps": steps,
                "state": batches.state_dict(),
                "grain": share,
            }
        )
    )


if __name__ == "__main__":
    main()
