"""The options of a stream: every keyword, its default and its rule, defined once.

:class:`StreamOptions` is built by validating a call's keywords with the rules of
:mod:`tokstream._validate`; the signatures of :func:`tokstream.stream_token_source`,
:class:`tokstream.TokenStream` and :class:`tokstream.torch.TokenDataset` are generated from it.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, get_args, get_type_hints

import numpy as np

from tokstream._repetition import RepetitionFilter, instance_filter
from tokstream._validate import (
    INT32_MAX,
    choice,
    exact_bool,
    exact_int,
    names_from,
    nonnegative_int,
    out_dtype,
    positive_int,
    shown,
    stream_controls,
    token_id,
)

#: What a batch's targets are: the ``(b,)`` next tokens, or the windows shifted by one token.
Targets = Literal["next", "shifted"]
#: How a shuffled epoch's order is made: drawn as an array, or evaluated per position.
Permutation = Literal["materialized", "implicit"]
#: The window policy: where windows lie (across documents, inside one, or packed into rows).
WindowPolicy = Literal["cross", "within", "packed"]
#: The dtype a batch's tokens (windows, targets) and position ids are written in.
OutDtype = Literal["int64", "int32"]

TARGETS: tuple[Targets, ...] = get_args(Targets)
PERMUTATIONS: tuple[Permutation, ...] = get_args(Permutation)
WINDOW_POLICIES: tuple[WindowPolicy, ...] = get_args(WindowPolicy)
DOCUMENT_EXTRAS = ("position_ids", "loss_mask", "cu_seqlens")
#: Each token's piece within its row, for every window policy.
PIECE_EXTRAS = ("document_ids",)
MIXTURE_EXTRAS = ("source",)
#: Extras every stream gives: where each row comes from.
ROW_EXTRAS = ("origin",)


@dataclass(frozen=True)
class StreamOptions:
    """Every option of a stream, validated once and then immutable.

    The one definition of the stream's keyword arguments, their defaults and their rules: the
    signatures of :func:`tokstream.stream_token_source`, :class:`tokstream.TokenStream` and
    :class:`tokstream.torch.TokenDataset` are generated from it. Being frozen, nothing a caller
    assigns later can change the sizes the kernel was promised.
    """

    block: int
    batch_size: int
    epochs: int = 1
    shuffle: bool = True
    seed: int = 0
    targets: Targets = "next"
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    permutation: Permutation | None = None
    prefetch: int = 0
    reuse_buffers: int = 0
    stride: int = 1
    eos: int | None = None
    windows: WindowPolicy = "cross"
    extras: tuple[str, ...] = ()
    samples: int | None = None
    pad: int | None = None
    out_dtype: OutDtype = "int64"
    labels_ignore_index: int | None = None
    instance_filter: RepetitionFilter | None = None

    @classmethod
    def create(
        cls,
        block: Any,
        batch_size: Any,
        allowed_extras: tuple[str, ...] = DOCUMENT_EXTRAS,
        mixture: bool = False,
        token_dtype: np.dtype | None = None,
        reference_input: bool = True,
        **options: Any,
    ) -> StreamOptions:
        """Validate ``block``, ``batch_size`` and the keyword ``options`` (unknown ones: TypeError).

        ``allowed_extras`` are the ``extras`` names the token source can give; ``mixture`` says
        the source is a :func:`tokstream.mix` mixture, which also gives ``MIXTURE_EXTRAS``,
        takes ``samples`` and shuffles only with the implicit permutation. ``token_dtype`` is
        the corpus dtype, against which ``eos`` is checked (not checked when None).
        ``reference_input`` says ``token_ids`` is what the reference generator takes (an array
        or a sequence, not a :class:`~tokstream.Corpus` or a mixture): only then is its order
        the default (see :func:`default_permutation`).

        The reference generator's controls are checked first and in its order, so a call both
        paths accept or reject raises the same exception type.
        """
        unknown = sorted(options.keys() - KEYWORDS)
        if unknown:
            raise TypeError(f"got an unexpected keyword argument {unknown[0]!r}")
        values = {**KEYWORD_DEFAULTS, **options}
        block, batch_size, epochs, shuffle, seed = stream_controls(
            block, batch_size, values["epochs"], values["shuffle"], values["seed"]
        )
        # Checked in the order of the keywords (the fuzz model's); its default waits for windows.
        targets = choice(values["targets"], "targets", TARGETS) if "targets" in options else None
        world_size = positive_int(values["world_size"], "world_size")
        rank = nonnegative_int(values["rank"], "rank")
        if rank >= world_size:
            raise ValueError(f"rank must be below world_size={world_size}, got {shown(rank)}")
        drop_last = exact_bool(values["drop_last"], "drop_last")
        stride = positive_int(values["stride"], "stride")
        eos = None if values["eos"] is None else exact_int(values["eos"], "eos")
        windows = choice(values["windows"], "windows", WINDOW_POLICIES)
        packed = windows == "packed"
        # Packed rows are labelled by their shifted tokens: the default becomes "shifted".
        if targets is None:
            targets = "shifted" if packed else "next"
        if packed and targets == "next":
            raise ValueError(
                "targets='next' is not available with windows='packed': a packed row's labels "
                "are its tokens shifted by one (targets='shifted', the default there)"
            )
        extras = names_from(
            values["extras"], "extras", allowed_extras + ROW_EXTRAS + MIXTURE_EXTRAS + PIECE_EXTRAS
        )
        pad = None if values["pad"] is None else exact_int(values["pad"], "pad")
        if packed:
            pad = _packed_checks(pad, eos, stride, values["permutation"])
            # A packed batch always carries its loss mask.
            extras = tuple(dict.fromkeys(("loss_mask", *extras)))
        else:
            if pad is not None:
                raise ValueError("pad needs windows='packed'")
        if "cu_seqlens" in extras and batch_size * block > INT32_MAX:
            raise ValueError(
                "extras 'cu_seqlens' are int32 offsets into the flattened batch (flash-attention's "
                f"varlen interface), but batch_size * block = {batch_size} * {block} positions "
                "exceed 2**31 - 1"
            )
        samples = None if values["samples"] is None else positive_int(values["samples"], "samples")
        needs_mixture = {"samples": samples is not None, "extras 'source'": "source" in extras}
        for what, given in needs_mixture.items():
            if given and not mixture:
                raise ValueError(f"{what} needs a tokstream.mix() mixture as token_ids")
        permutation = values["permutation"]
        if permutation is None:
            permutation = default_permutation(
                reference_input and not mixture, stride == 1 and eos is None and windows == "cross"
            )
        permutation = choice(permutation, "permutation", PERMUTATIONS)
        if mixture and permutation == "materialized":
            raise ValueError(
                "permutation='materialized' is not available for a mixture: its sources are "
                "shuffled by the implicit permutation (permutation='implicit' or None)"
            )
        prefetch = nonnegative_int(values["prefetch"], "prefetch")
        reuse_buffers = nonnegative_int(values["reuse_buffers"], "reuse_buffers")
        if eos is not None and token_dtype is not None:
            eos = token_id(eos, token_dtype, "eos")
        output = out_dtype(values["out_dtype"])
        if output == "int32":
            _int32_checks(block, pad)
        ignore_index = values["labels_ignore_index"]
        if ignore_index is not None:
            ignore_index = exact_int(ignore_index, "labels_ignore_index")
            if not -INT32_MAX - 1 <= ignore_index <= INT32_MAX:
                raise ValueError(
                    f"labels_ignore_index={ignore_index} does not fit the labels' int32 or int64"
                )
            # The labels are written from the loss mask: the batch carries it.
            extras = tuple(dict.fromkeys(("loss_mask", *extras)))
        repetition = instance_filter(values["instance_filter"])
        if repetition is not None:
            # A filtered row's loss mask is cleared (OLMo-core's convention).
            extras = tuple(dict.fromkeys(("loss_mask", *extras)))
        return cls(
            block=block,
            batch_size=batch_size,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            targets=targets,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            permutation=permutation,
            prefetch=prefetch,
            reuse_buffers=reuse_buffers,
            stride=stride,
            eos=eos,
            windows=windows,
            extras=extras,
            samples=samples,
            pad=pad,
            out_dtype=output,
            labels_ignore_index=ignore_index,
            instance_filter=repetition,
        )

    @property
    def ring_size(self) -> int:
        """Batch buffers a ``reuse_buffers`` stream cycles through (0: fresh batches).

        With ``prefetch=p`` up to ``p`` batches wait in the queue and one is being assembled
        while the caller holds its last ``reuse_buffers``, so ``p + 1`` more buffers keep every
        held batch intact until the caller has received ``reuse_buffers`` more.
        """
        if not self.reuse_buffers:
            return 0
        return self.reuse_buffers + (self.prefetch + 1 if self.prefetch else 0)

    @property
    def global_batch_size(self) -> int:
        """Windows per global step, all ranks together."""
        return self.world_size * self.batch_size


def _packed_checks(pad: int | None, eos: int | None, stride: int, permutation: Any) -> int:
    """The rules of ``windows="packed"``; returns the padding token (``pad``, else ``eos``)."""
    if stride != 1:
        raise ValueError(
            f"stride={shown(stride)} does not apply to windows='packed': packed rows hold whole "
            "documents, and cut longer ones every block tokens"
        )
    if permutation == "materialized":
        raise ValueError(
            "permutation='materialized' is not available with windows='packed': packed epochs "
            "are ordered by keyed permutations of their groups (permutation='implicit' or None)"
        )
    if pad is None and eos is None:
        raise ValueError(
            "windows='packed' needs pad=, the token id written into the padding slots of a row "
            "(it defaults to eos= when that is given)"
        )
    return eos if pad is None else pad


def _int32_checks(block: int, pad: int | None) -> None:
    """What ``out_dtype="int32"`` needs of the other options: position ids (below ``block``)
    and the padding token must fit. Tokens read from the corpus are checked as each batch is
    copied (see :mod:`tokstream._batch`)."""
    if block > INT32_MAX + 1:
        raise ValueError(
            f"out_dtype='int32' holds position ids below 2**31, but block={block} positions "
            "do not fit: use out_dtype='int64'"
        )
    if pad is not None and not -INT32_MAX - 1 <= pad <= INT32_MAX:
        raise ValueError(f"pad={pad} does not fit out_dtype='int32' ([-2**31, 2**31 - 1])")


def default_permutation(reference_input: bool, reference_windows: bool) -> Permutation:
    """The order of ``permutation=None``: the reference generator's where it is at stake.

    That is an array or sequence (what the reference takes) streamed in the reference's windows
    (``stride=1``, ``windows="cross"``, no ``eos``): ``"materialized"``, byte-identical to the
    reference, at the price of one O(windows) draw per epoch (warned about when large, see
    :func:`tokstream._order.warn_if_slow_draw`). Everything else (a :class:`~tokstream.Corpus`,
    which :func:`tokstream.open_tokens` returns; a mixture; other windows) has no reference
    order to match and gets ``"implicit"``: no O(windows) memory, nothing to draw, a first
    batch at once.
    """
    return "materialized" if reference_input and reference_windows else "implicit"


KEYWORD_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(StreamOptions) if f.default is not MISSING
}
KEYWORDS = frozenset(KEYWORD_DEFAULTS)


def stream_signature(
    *leading: str, defaults: dict[str, Any] | None = None, **extra_keywords: Any
) -> inspect.Signature:
    """``(leading..., block, batch_size, *, <every stream keyword>)`` for ``__signature__``.

    ``defaults`` overrides a keyword's default where an entry point has its own (the torch
    adapter takes ``rank`` and ``world_size`` from the process group when they are None);
    ``extra_keywords`` (name=default) are an entry point's own keywords beyond the stream's.
    """
    defaults = {**KEYWORD_DEFAULTS, **(defaults or {})}
    types = get_type_hints(StreamOptions)
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY
    leading_parameters = [
        inspect.Parameter(name, positional, annotation="Any")
        if name != "self"
        else inspect.Parameter(name, positional)
        for name in leading
    ]
    return inspect.Signature(
        leading_parameters
        + [inspect.Parameter(n, positional, annotation="int") for n in ("block", "batch_size")]
        + [
            inspect.Parameter(name, keyword, default=defaults[name], annotation=types[name])
            for name in KEYWORD_DEFAULTS
        ]
        + [inspect.Parameter(n, keyword, default=d) for n, d in extra_keywords.items()]
    )


def expose_options(cls: type) -> type:
    """Give ``cls`` a read-only property per option, read from its ``_options``.

    Read-only because the kernel's buffers and bounds were sized from these values.
    """
    for name in KEYWORD_DEFAULTS.keys() | {"block", "batch_size"}:
        prop = property(
            lambda self, name=name: getattr(self._options, name),
            doc=f"The validated ``{name}`` (read-only).",
        )
        setattr(cls, name, prop)
    return cls
