"""JAX adapter: global ``jax.Array`` batches over a device mesh, each process reading its rows.

Only this module needs JAX (the ``tokstream[jax]`` extra); ``import tokstream`` never imports it.

Global step ``k`` of :func:`global_batches` is batch ``k`` of ``stream_token_source(token_ids,
block, global_batch_size, drop_last=True, **options)`` (one process, ``world_size=1``), row for
row, placed with ``NamedSharding(mesh, spec)``: the batch axis is split over the mesh axes
``spec[0]`` names, so the devices along them hold consecutive runs of rows. A process makes its
part with :func:`jax.make_array_from_process_local_data` from the rows its addressable devices
hold, and reads only those: row ``j`` of every global step is rank ``j`` of ``world_size =
global_batch_size`` of that stream with one row a batch (the sharding rule of
:mod:`tokstream.stream`), so a process that holds every row streams the global batch itself, and
one that holds some streams those ranks. Nothing is gathered across hosts.

The state is the global stream's (:meth:`tokstream.TokenStream.state_dict`): the same on every
process, so process 0 saves it, and it loads into a run of any process count or global batch
size, the global sequence of samples going on unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tokstream._extras import install_hint

try:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without jax
    raise ImportError(
        "tokstream.jax needs JAX, which could not be imported; install the extra with "
        f"{install_hint('jax')}. Original error: {exc}"
    ) from exc

from tokstream import stream_token_source

__all__ = ["GlobalBatches", "global_batches"]

# Options global batches decide themselves: the rows' ranks come from the mesh, a global batch is
# always whole, and a batch's host memory may stay referenced by the arrays made from it.
_REFUSED = {
    "rank": "each process reads the rows its addressable devices hold in the mesh",
    "world_size": "each process reads the rows its addressable devices hold in the mesh",
    "drop_last": "a global batch is always whole: each epoch's last partial batch is dropped",
    "reuse_buffers": "jax.Array batches may keep referring to the host memory they came from",
}

# Arrays of a dict batch that hold one entry (or a few) per row, not one per token.
_ROW_ARRAYS = ("origin", "source")


class GlobalBatches(Iterator[Any]):
    """An iterator of global ``jax.Array`` batches with a resumable cursor.

    Made by :func:`global_batches`, which documents it. ``len()`` is the global steps of the
    run; :meth:`state_dict` and :meth:`load_state_dict` are those of the global stream.
    """

    def __init__(
        self,
        token_ids: Any,
        block: Any,
        global_batch_size: Any,
        mesh: Any,
        spec: Any,
        options: dict[str, Any],
    ) -> None:
        for name, reason in _REFUSED.items():
            if name in options and not (name == "drop_last" and options[name] is True):
                raise ValueError(f"global_batches takes no {name}: {reason}")
        if "cu_seqlens" in (options.get("extras") or ()):
            raise ValueError(
                "global_batches cannot shard the extra 'cu_seqlens' (one ragged array for the "
                "whole batch); give attention the rows' pieces with extras=('document_ids',) "
                "or ('position_ids',) as segment ids"
            )
        options.setdefault("permutation", "implicit")
        if not jax.config.jax_enable_x64:
            # JAX would hold int64 tokens as int32: the kernel writes them so, at no extra copy.
            options.setdefault("out_dtype", "int32")
        options["drop_last"] = True
        # The global stream: checks every argument, and its cursor is the state of the run.
        self._global = stream_token_source(token_ids, block, global_batch_size, **options)
        size = self._global.options.batch_size
        self.global_batch_size = size
        self.block = self._global.options.block
        self._batch_sharding, self._token_sharding = _shardings(mesh, spec, size)
        rows = _process_rows(self._batch_sharding, size, self.block)
        self.rows = rows
        self._fully_addressable = bool(self._token_sharding.is_fully_addressable)
        if len(rows) == size:
            self._streams = [self._global]
        else:
            self._streams = [
                stream_token_source(token_ids, block, 1, rank=int(row), world_size=size, **options)
                for row in rows
            ]

    def __len__(self) -> int:
        return len(self._global)

    def __iter__(self) -> GlobalBatches:
        return self

    def __next__(self) -> Any:
        parts = [next(stream) for stream in self._streams]
        local = parts[0] if len(parts) == 1 else _concatenate(parts)
        if isinstance(local, Mapping):
            arrays = {k: v for k, v in local.items() if isinstance(v, np.ndarray)}
            tokens = {k: v.ndim == 2 and k not in _ROW_ARRAYS for k, v in arrays.items()}
        else:
            arrays = dict(zip(("windows", "targets"), local, strict=True))
            tokens = {"windows": True, "targets": local[1].ndim == 2}
        shardings = {k: self._token_sharding if tokens[k] else self._batch_sharding for k in arrays}
        if self._fully_addressable:
            # Every device is this process': one transfer of the whole batch. The batch is fresh
            # memory nothing else refers to (reuse_buffers is refused), so JAX may keep it.
            placed = jax.device_put(arrays, shardings, may_alias=True)
        else:
            placed = {
                k: jax.make_array_from_process_local_data(
                    shardings[k], v, (self.global_batch_size, *v.shape[1:])
                )
                for k, v in arrays.items()
            }
        if isinstance(local, Mapping):
            return placed
        return placed["windows"], placed["targets"]

    def state_dict(self) -> dict[str, Any]:
        """The global stream's cursor after the last global batch: the same on every process."""
        if self._streams[0] is not self._global:
            # Every row's stream stands at the same global position; the global stream reports
            # it in its own shape.
            self._global.load_state_dict(self._streams[0].state_dict())
        return self._global.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of any process count or global
        batch size), with the errors of :meth:`tokstream.TokenStream.load_state_dict`; a
        rejected state changes nothing."""
        self._global.load_state_dict(state)  # checked here first
        for stream in self._streams:
            if stream is not self._global:
                stream.load_state_dict(copy.deepcopy(state))

    def close(self) -> None:
        """Stop every stream of this process (and their prefetch threads, if any)."""
        for stream in {id(s): s for s in (self._global, *self._streams)}.values():
            stream.close()

    def __repr__(self) -> str:
        return (
            f"GlobalBatches(global_batch_size={self.global_batch_size}, block={self.block}, "
            f"rows of this process={len(self.rows)}, steps={len(self)})"
        )


def global_batches(
    token_ids: Any,
    block: Any,
    global_batch_size: Any,
    mesh: Any,
    spec: Any = None,
    **options: Any,
) -> GlobalBatches:
    """Global ``jax.Array`` batches of ``global_batch_size`` rows, sharded over ``mesh``.

    Parameters
    ----------
    token_ids, block
        As :func:`tokstream.stream_token_source` takes them.
    global_batch_size
        Rows of every global batch, all processes together; a multiple of the data-parallel
        size (the product of the mesh axes ``spec[0]`` names).
    mesh
        A ``jax.sharding.Mesh``.
    spec
        A ``PartitionSpec`` (default ``PartitionSpec("data")``): its first entry names the mesh
        axis (or a tuple of axes) the batch rows are split over; the whole spec places the
        ``(rows, block)`` token arrays (``PartitionSpec("data", "sequence")`` splits each row
        too), and other arrays (``(rows,)`` next tokens, ``source``, ``origin``) are split by
        rows only.
    options
        Every keyword of :func:`tokstream.stream_token_source` but ``rank`` and ``world_size``
        (the mesh decides which rows a process reads), ``drop_last`` (always true: a global
        batch is whole) and ``reuse_buffers``; ``permutation`` defaults to ``"implicit"``
        (the first batch at once, nothing drawn per epoch), and ``out_dtype`` to ``"int32"`` unless
        ``jax_enable_x64`` is on (what JAX would convert int64 to). ``extras`` but
        ``"cu_seqlens"``.

    Returns
    -------
    GlobalBatches
        An iterator of ``(windows, targets)`` global arrays, or with ``extras``, a packed stream
        or a mixture a dict of them (without ``max_seqlen``), with ``len()``, ``state_dict()``
        and ``load_state_dict()``.

    Raises
    ------
    TypeError
        ``mesh`` is not a ``Mesh`` or ``spec`` not a ``PartitionSpec``; or a stream argument of
        the wrong kind.
    ValueError
        ``spec`` names an axis the mesh does not have; ``global_batch_size`` is not a multiple
        of the data-parallel size; a refused option; or a stream argument's bad value.
    """
    if spec is None:
        spec = PartitionSpec("data")
    return GlobalBatches(token_ids, block, global_batch_size, mesh, spec, dict(options))


def _shardings(mesh: Any, spec: Any, global_batch_size: int) -> tuple[Any, Any]:
    """``(rows only, whole spec)`` shardings, after checking ``spec`` against ``mesh``."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"spec must be a jax.sharding.PartitionSpec, got {type(spec).__name__}")
    axes = mesh.axis_names
    data_parallel = 1
    for entry in spec:
        for name in () if entry is None else (entry,) if isinstance(entry, str) else entry:
            if name not in axes:
                raise ValueError(
                    f"spec {spec} names the axis {name!r}, which the mesh does not have "
                    f"(its axes: {list(axes)})"
                )
    batch_entry = spec[0] if len(spec) else None
    batch_axes = (
        ()
        if batch_entry is None
        else (batch_entry,)
        if isinstance(batch_entry, str)
        else batch_entry
    )
    for name in batch_axes:
        data_parallel *= mesh.shape[name]
    if global_batch_size % data_parallel:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a multiple of the data-parallel size "
            f"{data_parallel} (mesh axes {list(batch_axes)} of spec {spec})"
        )
    rows_only = NamedSharding(mesh, PartitionSpec(batch_entry))
    return rows_only, NamedSharding(mesh, spec)


def _process_rows(sharding: Any, global_batch_size: int, block: int) -> np.ndarray:
    """The rows of a global batch this process' devices hold, ascending (each once)."""
    held = np.zeros(global_batch_size, np.bool_)
    for index in sharding.addressable_devices_indices_map((global_batch_size, block)).values():
        held[index[0]] = True
    return np.flatnonzero(held)


def _concatenate(parts: list[Any]) -> Any:
    """One local batch of the one-row batches of the rows' streams, in row order."""
    if isinstance(parts[0], Mapping):
        return {
            name: np.concatenate([part[name] for part in parts])
            for name, value in parts[0].items()
            if isinstance(value, np.ndarray)
        }
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(2))
