"""The repetition filter (OLMo-core's instance filter): its settings, and a batch filtered.

A sample holding one unit of ``p`` tokens repeated ``max_count`` times in a row (``p`` in
``[min_period, max_period]``) is filtered exactly as OLMo-core's ``find_periodic_sequences``
decides on the same tokens (``tokstream/_kernels/repetition.pyx``). Filtered follows OLMo-core's
convention: the batch keeps its shape, the row's loss mask is all False and the
``"instance_mask"`` extra is False for it. A sample is a row's ``block + 1`` tokens (its window
and the target after it); in packed rows each piece is a sample of its own, and a row with a
filtered piece is filtered (OLMo-core's interleaved instances: a row survives when all its
documents do), so padding and the seams between documents never count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from tokstream._kernels.repetition import filter_repeated
from tokstream._validate import exact_bool, positive_int, shown

#: The largest period and count the kernel takes.
LIMIT = 1 << 31

#: The kernel's specialisation per batch dtype, taken once: no batch pays the fused dispatch.
# (Cython's table of a fused function's specialisations, which the stub does not declare.)
_SPECIALISED: dict[str, Any] = filter_repeated.__signatures__  # type: ignore[attr-defined]
_KERNELS = {np.dtype(name): _SPECIALISED[f"{name}_t"] for name in ("int64", "int32")}


class RepetitionFilter(NamedTuple):
    """Validated settings: runs of a period in ``[min_period, max_period]`` repeated at least
    ``max_count`` times (and more than twice, as OLMo-core reports runs) filter their sample."""

    min_period: int = 1
    max_period: int = 13
    max_count: int = 32


def instance_filter(value: Any) -> RepetitionFilter | None:
    """``instance_filter=``: None or False (off), True (OLMo-core's defaults), or a dict of
    some of ``min_period``, ``max_period``, ``max_count`` (the others default)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return RepetitionFilter() if exact_bool(value, "instance_filter") else None
    if not isinstance(value, Mapping):
        raise TypeError(
            "instance_filter must be a bool or a dict of min_period, max_period and max_count, "
            f"got {type(value).__name__}"
        )
    fields = RepetitionFilter._fields
    for key in value:
        if key not in fields:
            raise ValueError(f"instance_filter[{key!r}] is no setting; the settings are {fields}")
    defaults = RepetitionFilter._field_defaults
    settings = RepetitionFilter(
        *(
            positive_int(value.get(name, defaults[name]), f"instance_filter[{name!r}]")
            for name in fields
        )
    )
    for name, setting in zip(fields, settings, strict=True):
        if setting > LIMIT:
            raise ValueError(
                f"instance_filter[{name!r}] must be at most 2**31, got {shown(setting)}"
            )
    if settings.max_period < settings.min_period:
        raise ValueError(
            f"instance_filter['max_period'] = {settings.max_period} must be at least "
            f"instance_filter['min_period'] = {settings.min_period}"
        )
    return settings


def filter_rows(
    settings: RepetitionFilter,
    input_ids: np.ndarray,
    labels: np.ndarray,
    loss_mask: np.ndarray,
    pieces: bool,
    instance_mask: np.ndarray,
) -> int:
    """Filter a filled batch in place: ``instance_mask`` (bool, ``(b,)``) says which rows
    survived, the others' ``loss_mask`` (uint8 flags, ``(b, block)`` or ``(b, 1)``) is cleared.
    ``labels`` are the batch's targets (next tokens or shifted windows). ``pieces``: split the
    rows where the loss mask is 0 (packed rows). Returns the rows filtered."""
    last_tokens = labels if labels.ndim == 1 else labels[:, -1]
    kernel = _KERNELS[input_ids.dtype]
    return int(
        kernel(input_ids, last_tokens, loss_mask, pieces, *settings, instance_mask.view(np.uint8))
    )
