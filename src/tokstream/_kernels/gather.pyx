"""The window kernels: copy context windows (and the token after each, or the shifted windows)
out of token arrays into a batch's buffers.

Nothing here validates or allocates. The Python side (``tokstream._validate``,
``tokstream.corpus`` and ``tokstream.stream``) hands in C-contiguous int64 output buffers of the
right shapes and start positions it has proven to be in range; the release build then runs with
bounds checks off, the debug build (``TOKSTREAM_DEBUG=1`` at build time) with them on.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from tokstream._kernels.copy cimport copy_window, prefetch_window
from tokstream._kernels.segments cimport find_segments
from tokstream._kernels.types cimport token_t

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG

#: True when this module was compiled with bounds checks on (``TOKSTREAM_DEBUG=1``).
DEBUG_BUILD = bool(TOKSTREAM_DEBUG)

# ---------------------------------------------------------------------------------------------
# Window gather


# Cython embeds the signature of a fused function's dispatcher ("signatures, args, kwargs,
# defaults"), not this one; the docstring states it instead.
@cython.embedsignature(False)
def gather_windows(
    const token_t[::1] tokens,
    const int64_t[:] starts,
    int64_t[:, ::1] windows,
    int64_t[::1] next_tokens=None,
    int64_t[:, ::1] targets=None,
    const int64_t[:] rows=None,
    Py_ssize_t prefetch=0,
    int64_t stride=1,
    int64_t offset=0,
):
    """gather_windows(const token_t[::1] tokens, const int64_t[:] starts, int64_t[:, ::1] windows, int64_t[::1] next_tokens=None, int64_t[:, ::1] targets=None, const int64_t[:] rows=None, Py_ssize_t prefetch=0, int64_t stride=1, int64_t offset=0)

    Copy window ``i`` (``block`` tokens from ``s = offset + stride * starts[i]``) into row
    ``rows[i]``: ``stride`` and ``offset`` map window indices of one segment to their first
    tokens here, so that no batch builds that array (both default to tokens already).

    ``block`` is ``windows.shape[1]``. With ``next_tokens`` the token after each window goes to
    ``next_tokens[row]``; with ``targets`` the window shifted by one token goes to
    ``targets[row]``; exactly one of the two is given. ``rows`` defaults to ``0, 1, 2, ...``.
    With ``prefetch=d > 0`` every cache line of window ``i + d`` is prefetched before window
    ``i`` is copied (:func:`tokstream._gather.prefetch_distance` chooses ``d``); 0 skips the
    software prefetch, for consecutive windows, which the hardware prefetcher already streams.

    The caller guarantees ``0 <= s`` and ``s + block < len(tokens)`` for every window, that
    every row index is below ``windows.shape[0]``, and that the target buffer has the matching
    shape.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef bint shifted = targets is not None
    cdef bint indirect = rows is not None
    cdef Py_ssize_t i, row
    cdef int64_t start, checked = 0
    with nogil:
        for i in range(count):
            if prefetch > 0 and prefetch < count - i:
                # starts[i + prefetch] maps to a validated window start, so every address from
                # its first token to its last lies inside ``tokens``.
                prefetch_window(&tokens[offset + stride * starts[i + prefetch]], block)
            # Validated on the Python side: start + block < len(tokens), row < windows.shape[0].
            start = offset + stride * starts[i]
            row = rows[i] if indirect else i
            if TOKSTREAM_DEBUG:
                checked += tokens[start + block]
            copy_window(
                &tokens[start],
                block,
                &windows[row, 0],
                &targets[row, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[row],
            )


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def gather_segments(
    const token_t[::1] anchor,
    const int64_t[:] windows_index,
    const int64_t[::1] offsets,
    const uint64_t[::1] segment_addresses,
    const int64_t[::1] segment_lengths,
    const int64_t[::1] bucket_segments,
    int shift,
    int probes,
    int64_t stride,
    int64_t[::1] sources,
    int64_t[:, ::1] windows,
    int64_t[::1] next_tokens=None,
    int64_t[:, ::1] targets=None,
    Py_ssize_t prefetch=0,
):
    """gather_segments(const token_t[::1] anchor, const int64_t[:] windows_index, const int64_t[::1] offsets, const uint64_t[::1] segment_addresses, const int64_t[::1] segment_lengths, const int64_t[::1] bucket_segments, int shift, int probes, int64_t stride, int64_t[::1] sources, int64_t[:, ::1] windows, int64_t[::1] next_tokens=None, int64_t[:, ::1] targets=None, Py_ssize_t prefetch=0)

    :func:`gather_windows` for windows given by their index in a space of segments (shards,
    documents, a mixture's sources), row ``i`` from window ``windows_index[i]``, in one call.

    Window ``w`` of segment ``j`` (``offsets[j] <= w < offsets[j + 1]``) starts ``(w -
    offsets[j]) * stride`` tokens after the segment's first token, which is at address
    ``segment_addresses[j]`` (a segment lies inside one array; ``anchor`` is any of them, for
    the dtype). ``bucket_segments[b]`` is the segment of window ``b << shift`` (its last entry
    the last segment), so a window's segment is searched among the few of its bucket, in
    ``probes`` steps when no bucket spans more than ``2**probes`` segments. First
    every window's address goes to ``sources`` (scratch, at least ``len(windows_index)``): the
    lookups are independent, so their cache misses overlap; then the copy loop prefetches
    ``prefetch`` windows ahead.

    The caller guarantees ``0 <= w < offsets[-1]`` for every window, ``len(segment_addresses)
    == len(segment_lengths) == len(offsets) - 1 >= 1``, ``len(bucket_segments) ==
    (offsets[-1] - 1 >> shift) + 2`` with entries valid segments, and that every address
    points at a live array of ``token_t`` holding the segment's ``segment_lengths[j]`` tokens,
    of which each window's ``block + 1`` are; the debug build checks the last.
    """
    cdef Py_ssize_t count = windows_index.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef bint shifted = targets is not None
    cdef Py_ssize_t i, low
    cdef int64_t window, start
    if count == 0:
        return
    with nogil:
        # Each window's segment, then (a pass of independent loads) its address.
        find_segments(
            <const char *>&windows_index[0], windows_index.strides[0], count, &offsets[0],
            &bucket_segments[0], shift, probes, &sources[0],
        )
        for i in range(count):
            window = windows_index[i]
            low = sources[i]
            start = (window - offsets[low]) * stride
            if TOKSTREAM_DEBUG and not (
                offsets[low] <= window < offsets[low + 1]
                and start + block < segment_lengths[low]
            ):
                with gil:
                    raise IndexError(f"window {window} does not lie inside its segment")
            sources[i] = <int64_t>(segment_addresses[low] + <uint64_t>start * sizeof(token_t))
        for i in range(count):
            if prefetch > 0 and prefetch < count - i:
                prefetch_window(<const token_t *><size_t>sources[i + prefetch], block)
            # Every window's block + 1 tokens lie in its segment (checked above in debug builds).
            copy_window(
                <const token_t *><size_t>sources[i],
                block,
                &windows[i, 0],
                &targets[i, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[i],
            )
