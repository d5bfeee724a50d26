"""PyTorch adapter: a token stream as an ``IterableDataset``, sharded over ranks and workers.

Only this module needs PyTorch (the ``tokstream[torch]`` extra); ``import tokstream`` never
imports it.

Sharding. On rank ``r`` of ``W`` (given explicitly; else from a ``process_group`` or a
``device_mesh`` dimension, so that tensor- or pipeline-parallel peers share one rank; else from
the default ``torch.distributed`` process group when one is initialized), a
``DataLoader(dataset, batch_size=None, num_workers=K)`` runs ``K`` copies of the dataset, and
worker ``w`` streams as the effective
rank ``r * K + w`` of an effective world of ``W * K`` (``K = 1`` without workers). So the whole
job sees every window once per epoch less the tail of :mod:`tokstream.stream` for that effective
world (the last ``n % (W * K)`` positions of each epoch's order); every worker yields the same
number of batches, so the DataLoader's round-robin over its workers never runs dry on one
worker early, and every rank yields the same number of batches, as DDP needs.

Resume. :meth:`TokenDataset.state_dict` is the cursor of the stream of the calling process or
worker (after its last batch, the finished cursor: a worker that is done stays done, and a
finished run loaded with more ``epochs`` continues with the next epoch), in the form
torchdata's ``StatefulDataLoader`` expects of a dataset: it calls it inside each worker and
hands each worker its own state back through
:meth:`TokenDataset.load_state_dict` before the next ``iter()``. Without workers
(``num_workers=0``) call the two methods yourself. Since the effective world is ``W * K``, a
state resumes on any ``(W', K', batch_size')`` with ``W' * K' * batch_size' == W * K *
batch_size`` (``StatefulDataLoader`` itself also insists on the same ``K``); every rank holds
the same state, so saving rank 0's is enough. With workers, the cursors live in the workers:
a plain ``DataLoader`` cannot collect them, so the main process' :meth:`TokenDataset.state_dict`
refuses to answer once workers have streamed a copy of the dataset.

Length. ``len(dataset)`` (and so ``len(DataLoader(dataset, batch_size=None, ...))``, which
learning-rate schedulers use) is the number of batches one rank's DataLoader yields per
``iter()``: pass the DataLoader's ``num_workers`` to the dataset, since ``K`` workers each stream
a share of their own and together yield slightly more or fewer batches than one process.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import mmap
import multiprocessing.context
from collections.abc import Iterator
from typing import Any, TypeAlias

import numpy as np

from tokstream._extras import install_hint

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without torch
    raise ImportError(
        "tokstream.torch needs PyTorch, which could not be imported; install the extra with "
        f"{install_hint('torch')}. Original error: {exc}"
    ) from exc

from tokstream import _validate
from tokstream._options import stream_signature
from tokstream.shards.source import reads_object_storage
from tokstream.stream import TokenStream, stream_source

__all__ = ["TensorBatch", "TokenDataset", "block_mask", "data_loader"]

#: A batch as the dataset yields it: ``(windows, targets)`` tensors of ``out_dtype`` (int64 by
#: default, ``torch.int32`` with ``out_dtype="int32"``), or with ``extras``
#: (or over a mixture) a dict of tensors by name plus the int ``max_seqlen`` for ``cu_seqlens``.
TensorBatch: TypeAlias = tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor | int]


def _signature(
    signature: inspect.Signature, annotations: dict[str, str], **extra_keywords: str
) -> inspect.Signature:
    """``signature`` with the ``annotations`` given and keywords (name=annotation, default None)
    added at its end."""
    parameters = [
        p.replace(annotation=annotations.get(p.name, p.annotation))
        for p in signature.parameters.values()
    ]
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters += [
        inspect.Parameter(name, keyword, default=None, annotation=annotation)
        for name, annotation in extra_keywords.items()
    ]
    return signature.replace(parameters=parameters)


class TokenDataset(IterableDataset):  # type: ignore[misc]  # torch is Any to mypy
    """Batches of ``(windows, targets)`` tensors (int64, or ``out_dtype``'s) from a
    :class:`tokstream.TokenStream`.

    The arguments are those of :func:`tokstream.stream_token_source`, checked when the dataset
    is built; ``rank`` and ``world_size`` default to the initialized ``torch.distributed``
    process group (one process without one), so build the dataset after
    ``init_process_group``. Under model parallelism the replicas that must see the same data
    share one data-parallel rank: pass their data-parallel group as ``process_group`` (rank and
    size within it), or ``device_mesh=mesh, mesh_dim="dp"`` (this process' coordinate along that
    dimension of a ``DeviceMesh``, and its size; ``mesh_dim`` may be omitted for a 1-D mesh).
    Giving ``rank``/``world_size`` too, or both a group and a mesh, is a ValueError.

    Each batch is already whole: use ``DataLoader(dataset, batch_size=None)``. The tensors
    share memory with the stream's fresh NumPy arrays (``torch.from_numpy``, no copy) and
    belong to the caller.

    Each ``iter()`` is one pass over all ``epochs`` epochs, from the start or, after
    :meth:`load_state_dict`, from the loaded cursor.

    ``num_workers`` is the ``num_workers`` of the DataLoader that will iterate the dataset; only
    ``len()`` needs it, and iterating with another number of workers is then a ValueError (as it
    is after ``len()`` counted for a number of workers the DataLoader does not run).
    """

    def __init__(
        self,
        token_ids: Any,
        block: Any,
        batch_size: Any,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int | None = None,
        process_group: Any = None,
        device_mesh: Any = None,
        mesh_dim: str | int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        rank, world_size = _distributed_share(
            rank, world_size, process_group, device_mesh, mesh_dim
        )
        # Every argument is checked now, once; workers derive their share from these options.
        # No parity with the reference generator is at stake here: the default order needs no
        # O(windows) array in the main process or in any DataLoader worker.
        options.setdefault("permutation", "implicit")
        # A corpus of token_ids, or a tokstream.mix() mixture.
        self.corpus, self.options = stream_source(
            token_ids, block, batch_size, rank=rank, world_size=world_size, **options
        )
        self.rank, self.world_size = self.options.rank, self.options.world_size
        self.num_workers = (
            None if num_workers is None else _validate.nonnegative_int(num_workers, "num_workers")
        )
        self._stream: TokenStream | None = None
        self._resume_state: dict[str, Any] | None = None
        self._resume_share: tuple[int, int] | None = None
        # The number of DataLoader workers len() counted batches for (None: len() not called).
        self._len_workers: int | None = None
        # One byte shared with forked DataLoader workers (an anonymous MAP_SHARED mapping, which
        # a fork shares): a worker sets it when it starts streaming, so that the main process
        # knows its own cursor is not the one that matters. A spawned worker gets a pickled copy
        # instead, and pickling for a new process sets it here (see __getstate__).
        self._streamed_in_workers = mmap.mmap(-1, 1)

    __init__.__signature__ = _signature(  # type: ignore[attr-defined]
        stream_signature(
            "self",
            "token_ids",
            defaults={"rank": None, "world_size": None, "permutation": "implicit"},
        ),
        {"rank": "int | None", "world_size": "int | None"},
        num_workers="int | None",
        process_group="torch.distributed.ProcessGroup | None",
        device_mesh="torch.distributed.device_mesh.DeviceMesh | None",
        mesh_dim="str | int | None",
    )

    def _new_stream(self, rank: int, world_size: int) -> TokenStream:
        options = dataclasses.replace(self.options, rank=rank, world_size=world_size)
        return TokenStream._over(self.corpus, options)

    def _share(self) -> tuple[int, int]:
        """``(effective rank, effective world size)`` of the calling process or worker."""
        info = get_worker_info()
        if info is None:
            return self.rank, self.world_size
        return self.rank * info.num_workers + info.id, self.world_size * info.num_workers

    def num_batches(self, num_workers: int = 0) -> int:
        """Batches one rank's ``DataLoader`` with ``num_workers`` workers yields per ``iter()``."""
        workers = max(_validate.nonnegative_int(num_workers, "num_workers"), 1)
        stream = self._new_stream(self.rank * workers, self.world_size * workers)
        return workers * len(stream)

    def __len__(self) -> int:
        """Batches one ``iter()`` yields: of this worker's stream inside a DataLoader worker;
        else of this rank's DataLoader with ``num_workers`` workers (given to the constructor)."""
        info = get_worker_info()
        if info is not None:
            return len(self._new_stream(*self._share()))
        workers = 0 if self.num_workers is None else self.num_workers
        self._len_workers = workers
        return self.num_batches(workers)

    def _check_workers(self) -> None:
        info = get_worker_info()
        workers = 0 if info is None else info.num_workers
        expected = self.num_workers if self.num_workers is not None else self._len_workers
        if expected is not None and expected != workers:
            said = (
                f"TokenDataset(num_workers={expected})"
                if self.num_workers is not None
                else f"len(dataset) counted the batches of num_workers={expected}"
            )
            raise ValueError(
                f"{said}, but a DataLoader with num_workers={workers} iterates it; each worker "
                f"streams a share of its own, so pass TokenDataset(..., num_workers={workers})"
            )
        self._streamed_in_workers[0] = info is not None

    def __iter__(self) -> Iterator[TensorBatch]:
        # Not a generator function: the loaded state is taken (or refused) by iter() itself,
        # so an iterator that is made and dropped unstarted (as StatefulDataLoader does when it
        # loads a finished state and then begins a new pass) leaves no state for the next one.
        self._check_workers()
        share = self._share()
        stream = self._new_stream(*share)
        if self._resume_state is not None:
            loaded = self._resume_share
            if loaded is not None and share != loaded:
                raise ValueError(
                    f"a state was loaded as rank {loaded[0]} of "
                    f"{loaded[1]} (rank * num_workers + worker of world_size * "
                    f"num_workers), but is iterated as {share[0]} of {share[1]}; with DataLoader "
                    "workers, load each worker's own state through torchdata's "
                    "StatefulDataLoader, or use num_workers=0"
                )
            stream.load_state_dict(self._resume_state)
            self._resume_state = self._resume_share = None
        self._stream = stream
        return _tensors(stream)

    def state_dict(self) -> dict[str, Any]:
        """The cursor of this process' (or worker's) stream, a small JSON-serialisable dict.

        Before any ``iter()`` it is the start; after the stream's last batch it is the finished
        cursor, which resumes to no batches (or, loaded into a dataset of more ``epochs``, to the
        next epoch). A new ``iter()`` without a loaded state begins a new pass from the first
        epoch; torchdata's ``StatefulDataLoader`` does so after a pass that ran to its end.

        Raises
        ------
        RuntimeError
            Called in the main process after DataLoader workers streamed copies of this dataset:
            the cursors are theirs, and this process' would silently be the start. torchdata's
            ``StatefulDataLoader`` collects them (call its ``state_dict()``).
        """
        if get_worker_info() is None and self._streamed_in_workers[0]:
            raise RuntimeError(
                "TokenDataset.state_dict() was called in the main process, but DataLoader "
                "workers stream copies of this dataset and hold the cursors; use "
                "torchdata.stateful_dataloader.StatefulDataLoader and call its state_dict()"
            )
        if self._resume_state is not None:
            return copy.deepcopy(self._resume_state)
        stream = self._stream if self._stream is not None else self._new_stream(*self._share())
        return stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter()`` continue from ``state`` (from :meth:`state_dict`).

        Checked now, against the calling process' or worker's share, with the errors of
        :meth:`tokstream.TokenStream.load_state_dict`.
        """
        share = self._share()
        self._new_stream(*share).load_state_dict(state)
        self._resume_state, self._resume_share = copy.deepcopy(state), share

    def __getstate__(self) -> dict[str, Any]:
        # Spawned DataLoader workers receive a pickled copy; a running stream (and its lock)
        # stays behind, a loaded state travels with it.
        state = self.__dict__.copy()
        state["_stream"] = None
        # The shared byte cannot be pickled, and a copy made for a new process (spawn or
        # forkserver DataLoader workers) is one the main process will not see streaming.
        state["_streamed_in_workers"] = None
        if multiprocessing.context.get_spawning_popen() is not None:
            self._streamed_in_workers[0] = 1
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._streamed_in_workers = mmap.mmap(-1, 1)

    def __repr__(self) -> str:
        return (
            f"TokenDataset(rank={self.rank}/{self.world_size}, windows="
            f"{self.corpus.num_windows(self.options.block)}, {self.options})"
        )


def data_loader(
    dataset: TokenDataset,
    *,
    num_workers: int | None = None,
    multiprocessing_context: Any = None,
    loader_class: Any = None,
    **kwargs: Any,
) -> Any:
    """A ``DataLoader(dataset, batch_size=None, ...)`` whose workers can read the dataset.

    ``num_workers`` defaults to the dataset's own (0 when it was given none). A corpus in object
    storage cannot be read in a worker forked from this process (the client's runtime does not
    survive ``fork()``), so for such a corpus with workers and no ``multiprocessing_context``,
    the workers are spawned: each unpickles the dataset (the corpus' URLs and headers), sees
    this process' environment as it is then (credentials, endpoint) and fetches on its own
    (``"forkserver"`` workers would see the environment of the first time a forkserver was
    started instead). A local corpus keeps
    PyTorch's default (``fork`` on Linux). ``loader_class`` is ``torch.utils.data.DataLoader``
    unless given (torchdata's ``StatefulDataLoader`` for resumable loading); ``kwargs`` go to it.

    Raises
    ------
    ValueError
        ``multiprocessing_context`` is ``"fork"`` (or a fork context) for a corpus in object
        storage with workers.
    """
    if loader_class is None:
        loader_class = torch.utils.data.DataLoader
    if num_workers is None:
        num_workers = dataset.num_workers or 0
    if num_workers and reads_object_storage(dataset.corpus):
        if multiprocessing_context is None:
            multiprocessing_context = "spawn"
        method = getattr(multiprocessing_context, "get_start_method", lambda: None)()
        if (method or multiprocessing_context) == "fork":
            raise ValueError(
                "multiprocessing_context='fork' cannot serve a corpus in object storage: the "
                "client's runtime does not survive fork(), so forked workers could not read it; "
                "leave it None (spawn is chosen) or pass 'spawn' or 'forkserver'"
            )
    return loader_class(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context=multiprocessing_context,
        **kwargs,
    )


def _tensors(stream: TokenStream) -> Iterator[TensorBatch]:
    """The stream's batches with their arrays as tensors sharing memory (no copy)."""
    for batch in stream:
        if isinstance(batch, dict):
            yield {
                k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()
            }
        else:
            yield torch.from_numpy(batch[0]), torch.from_numpy(batch[1])


def _distributed_share(
    rank: int | None,
    world_size: int | None,
    process_group: Any,
    device_mesh: Any,
    mesh_dim: str | int | None,
) -> tuple[int, int]:
    """``(rank, world_size)``: explicit ones win; else ``process_group``'s or ``device_mesh``'s
    along ``mesh_dim``; else the default process group's; else one process."""
    explicit = [n for n, v in (("rank", rank), ("world_size", world_size)) if v is not None]
    given = [
        name
        for name, value in (("process_group", process_group), ("device_mesh", device_mesh))
        if value is not None
    ]
    if len(given) == 2 or (given and explicit):
        other = given[1] if len(given) == 2 else explicit[0]
        raise ValueError(
            f"{given[0]} and {other} both say which share of the data this process streams; "
            f"give one of them"
        )
    if mesh_dim is not None and device_mesh is None:
        raise ValueError(f"mesh_dim={mesh_dim!r} needs device_mesh (the DeviceMesh it names)")
    if process_group is not None:
        return _group_share(process_group)
    if device_mesh is not None:
        return _mesh_share(device_mesh, mesh_dim)
    default_rank, default_world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        default_rank = torch.distributed.get_rank()
        default_world = torch.distributed.get_world_size()
    world_size = default_world if world_size is None else world_size
    rank = default_rank if rank is None else rank
    return rank, world_size


def _group_share(process_group: Any) -> tuple[int, int]:
    """This process' rank in ``process_group`` and the group's size."""
    # What dist.new_group returns to a process outside the group it makes.
    outside = getattr(getattr(torch.distributed, "GroupMember", None), "NON_GROUP_MEMBER", None)
    if process_group is outside and outside is not None:
        raise ValueError(
            "process_group does not include this process (dist.new_group returned "
            "GroupMember.NON_GROUP_MEMBER); pass the data-parallel group this process belongs to"
        )
    if not torch.distributed.is_available() or not isinstance(
        process_group, torch.distributed.ProcessGroup
    ):
        raise TypeError(
            "process_group must be a torch.distributed.ProcessGroup (such as "
            f"dist.new_group(...) or mesh.get_group('dp')), got {type(process_group).__name__}"
        )
    rank = torch.distributed.get_rank(process_group)
    if rank < 0:
        raise ValueError(
            "process_group does not include this process; pass the data-parallel group this "
            "process belongs to"
        )
    return rank, torch.distributed.get_world_size(process_group)


def _mesh_share(device_mesh: Any, mesh_dim: str | int | None) -> tuple[int, int]:
    """This process' coordinate along ``mesh_dim`` of ``device_mesh`` and that dimension's size."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(
            "device_mesh must be a torch.distributed.device_mesh.DeviceMesh, got "
            f"{type(device_mesh).__name__}"
        )
    names = tuple(device_mesh.mesh_dim_names or ())
    if mesh_dim is None:
        if device_mesh.ndim != 1:
            raise ValueError(
                f"mesh_dim must name the data-parallel dimension of a {device_mesh.ndim}-D "
                f"device_mesh (its dimensions: {list(names) or list(range(device_mesh.ndim))})"
            )
        dim = 0
    elif isinstance(mesh_dim, str):
        if mesh_dim not in names:
            raise ValueError(
                f"mesh_dim={mesh_dim!r} is not a dimension of device_mesh, whose dimensions are "
                f"named {list(names)}"
            )
        dim = names.index(mesh_dim)
    elif isinstance(mesh_dim, int) and not isinstance(mesh_dim, bool):
        if not 0 <= mesh_dim < device_mesh.ndim:
            raise ValueError(
                f"mesh_dim={mesh_dim} is not a dimension of the {device_mesh.ndim}-D device_mesh"
            )
        dim = mesh_dim
    else:
        raise TypeError(f"mesh_dim must be a str or an int, got {type(mesh_dim).__name__}")
    local_rank = device_mesh.get_local_rank(dim)
    if local_rank is None or local_rank < 0:
        raise ValueError("device_mesh does not include this process")
    return local_rank, device_mesh.size(dim)


def block_mask(batch: dict[str, Any]) -> Any:
    """A flex_attention ``BlockMask`` for a dict batch: causal attention within each piece.

    Query ``q`` of row ``b`` sees key ``k`` when both lie in the same piece of the row (the
    same ``"document_ids"`` entry, or with only ``"position_ids"`` the same run counted from
    each 0) and ``k <= q``: the block-diagonal causal mask of packed training, without the
    ``(b, block, block)`` dense mask. Pass it to
    ``torch.nn.attention.flex_attention.flex_attention(q, k, v, block_mask=...)`` with ``q``,
    ``k``, ``v`` of shape ``(b, heads, block, dim)`` on the batch's device.

    Raises
    ------
    TypeError
        ``batch`` is not a dict batch (a stream with ``extras``).
    ValueError
        It holds neither ``"document_ids"`` nor ``"position_ids"``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if not isinstance(batch, dict):
        raise TypeError(
            f"batch must be a dict batch (a stream with extras), got {type(batch).__name__}"
        )
    if "document_ids" in batch:
        documents = torch.as_tensor(batch["document_ids"])
    elif "position_ids" in batch:
        documents = torch.cumsum(torch.as_tensor(batch["position_ids"]) == 0, dim=1)
    else:
        raise ValueError(
            "batch holds neither 'document_ids' nor 'position_ids': stream it with "
            "extras=('document_ids',) (packed) or extras=('position_ids',)"
        )

    def causal_within_pieces(b: Any, h: Any, q: Any, k: Any) -> Any:
        return (documents[b, q] == documents[b, k]) & (k <= q)

    rows, block = documents.shape
    return create_block_mask(
        causal_within_pieces, rows, None, block, block, device=str(documents.device)
    )
