"""The repetition filter: which samples of a batch hold a long periodic run of tokens.

OLMo-core's instance filter drops a training instance when ``find_periodic_sequences`` finds in
it a run of some period ``p`` in ``[min_period, max_period]`` repeated ``times >= max_count``
(it reports only runs repeated more than twice). Its run of period ``p`` is a maximal stretch
where ``t[i] == t[i - p]`` holding an aligned block of ``p`` such ``i``; a stretch of ``m``
of them spans ``m + p`` tokens and is reported ``floor(m / p) + 1`` times. So a sample is
filtered exactly when, for some ``p``, ``t[i] == t[i - p]`` holds for ``(T - 1) p`` consecutive
``i`` with ``T = max(max_count, 3)`` (such a stretch always holds an aligned block). This module
finds such a stretch by looking at every ``(T - 1) min_period``-th ``i`` only (every stretch that
long holds one of them), there against every period at once, and measuring the stretch around a
hit, so a sample of ``n`` tokens costs about ``n / (T - 1)`` short vectorised passes unless it
repeats. ``tests/test_repetition.py``
holds it to OLMo-core's own function.

Nothing here allocates; the Python side (``tokstream._repetition``) validates the periods and
the count, and the buffers are the batch's own, their shapes checked here before anything is
read.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memchr, memset

from tokstream._kernels.types cimport out_t


cdef inline int64_t _token(const out_t *row, out_t last, Py_ssize_t block, Py_ssize_t slot) noexcept nogil:
    # Slot ``slot`` of a sample's block + 1 slots: the window's tokens, then its last target.
    # slot <= block: the callers loop over a piece inside [0, block].
    if slot < block:
        return <int64_t>row[slot]
    return <int64_t>last


cdef inline bint _stretch(
    const out_t *row, out_t last, Py_ssize_t block, Py_ssize_t first, Py_ssize_t length,
    Py_ssize_t p, Py_ssize_t i, Py_ssize_t span,
) noexcept nogil:
    # Whether the stretch of t[j] == t[j - p] (p <= j < length, relative to ``first``) around
    # i, where it holds, is at least ``span`` long. Every slot read lies in the piece.
    cdef Py_ssize_t low = i, high = i + 1
    while low > p and _token(row, last, block, first + low - 1) == _token(
        row, last, block, first + low - 1 - p
    ):
        low -= 1
    while high < length and high - low < span and _token(
        row, last, block, first + high
    ) == _token(row, last, block, first + high - p):
        high += 1
    return high - low >= span


cdef inline bint _repeats(
    const out_t *row, out_t last, Py_ssize_t block, Py_ssize_t first, Py_ssize_t length,
    Py_ssize_t min_period, Py_ssize_t max_period, Py_ssize_t least,
) noexcept nogil:
    # Whether slots [first, first + length) hold, for some period p, ``least * p`` consecutive
    # i (relative to ``first``, i >= p) with t[i] == t[i - p]. Such a stretch holds some
    # i = k span - 1 (span = least * p, k >= 1): those i are compared first in a branch-free
    # pass (independent loads, no mispredictions), and only a period with a match is walked
    # again, each match's stretch measured.
    cdef Py_ssize_t p, i, span, end
    cdef const out_t *slots
    cdef bint hit
    for p in range(min_period, max_period + 1):
        span = least * p
        if span + p > length:
            # Periods ascend: no longer one fits either.
            return False
        # The i below the window's end compare within ``row``; the last slot (block) apart.
        end = length if first + length <= block else block - first
        slots = row + first
        hit = False
        i = span - 1
        while i < end:
            hit |= slots[i] == slots[i - p]
            i += span
        if end < length and length % span == 0:
            # The last slot (the row's last target, beyond ``row``) is one of the i.
            hit |= <int64_t>last == <int64_t>slots[length - 1 - p]
        if not hit:
            continue
        i = span - 1
        while i < length:
            if _token(row, last, block, first + i) == _token(row, last, block, first + i - p):
                if _stretch(row, last, block, first, length, p, i, span):
                    return True
            i += span
    return False


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def filter_repeated(
    const out_t[:, ::1] input_ids,
    const out_t[:] last_tokens,
    uint8_t[:, ::1] loss_mask,
    bint pieces,
    Py_ssize_t min_period,
    Py_ssize_t max_period,
    Py_ssize_t max_count,
    uint8_t[::1] instance_mask,
):
    """filter_repeated(const out_t[:, ::1] input_ids, const out_t[:] last_tokens, uint8_t[:, ::1] loss_mask, bint pieces, Py_ssize_t min_period, Py_ssize_t max_period, Py_ssize_t max_count, uint8_t[::1] instance_mask) -> int

    Row ``r``'s sample is its ``block + 1`` slots: ``input_ids[r]`` then ``last_tokens[r]`` (the
    target after the window). With ``pieces`` the row is split where ``loss_mask[r, j]`` is 0
    (slot ``j + 1`` does not continue the piece of slot ``j``: packed rows), and each piece is a
    sample of its own; else the whole row is one. A row any of whose samples holds a run of some
    period in ``[min_period, max_period]`` repeated at least ``max(max_count, 3)`` times, as
    OLMo-core's ``find_periodic_sequences`` counts them, is filtered: ``instance_mask[r]`` is
    set to 0 (else 1) and, when ``loss_mask`` is given, its row to 0.

    Returns the number of rows filtered. Raises ValueError, before anything is written, when a
    buffer is not the batch's shape (``loss_mask`` is ``(b, block)``, or ``(b, 1)`` without
    ``pieces``; it may be None without ``pieces``), or ``min_period < 1``, ``max_period < 1``
    or ``max_count > 2**31``, ``max_period > 2**31``.
    """
    cdef Py_ssize_t rows = input_ids.shape[0], block = input_ids.shape[1]
    cdef Py_ssize_t r, first, end, width = 0, filtered = 0
    cdef Py_ssize_t least
    cdef bint repeated
    cdef const out_t *row
    cdef const uint8_t *links
    cdef const void *found
    if loss_mask is not None:
        width = loss_mask.shape[1]
    if not (
        last_tokens.shape[0] == rows
        and instance_mask.shape[0] == rows
        and block >= 1
        and (loss_mask is None or (loss_mask.shape[0] == rows and (width == block or width == 1)))
        and (not pieces or (loss_mask is not None and width == block))
    ):
        raise ValueError(
            f"filter_repeated: the buffers are not one batch of {rows} rows of {block} slots"
        )
    if not (1 <= min_period <= 1 << 31 and 1 <= max_period <= 1 << 31 and max_count <= 1 << 31):
        raise ValueError(
            f"filter_repeated: periods [{min_period}, {max_period}] and count {max_count} out of "
            "range"
        )
    # OLMo-core reports a run only when it repeats more than twice.
    least = (max_count if max_count > 3 else 3) - 1
    with nogil:
        for r in range(rows):
            row = &input_ids[r, 0]
            repeated = False
            if not pieces:
                repeated = _repeats(
                    row, last_tokens[r], block, 0, block + 1, min_period, max_period, least
                )
            else:
                links = &loss_mask[r, 0]
                first = 0
                while first <= block and not repeated:
                    # The piece ends at the first slot j >= first whose link to j + 1 is 0.
                    end = block + 1
                    if first < block:
                        found = memchr(links + first, 0, <size_t>(block - first))
                        if found != NULL:
                            end = <Py_ssize_t>(<const uint8_t *>found - links) + 1
                    repeated = _repeats(
                        row, last_tokens[r], block, first, end - first, min_period, max_period,
                        least,
                    )
                    first = end
            instance_mask[r] = not repeated
            if repeated:
                filtered += 1
                if loss_mask is not None:
                    memset(&loss_mask[r, 0], 0, <size_t>width)
    return filtered
