"""The window kernel: copy a batch's context windows (and the token after each, or each window
shifted by one token) out of token arrays into its buffers.

Where the windows are is said one of two ways. :func:`gather_windows` takes start positions in
one array (one segment: a window's first token is an affine function of its index).
:func:`lookup_windows` finds each window's segment in a space of segments (shards, documents, a
mixture's sources) and writes its first token's position and address; :func:`gather_at` (and
the document kernel) then copy from those addresses, every shard in one call.

Nothing here validates or allocates. The Python side (``tokstream._batch``) hands in
C-contiguous output buffers of the right shapes, int64 or int32 (``out_t``: the stream's
``out_dtype``, written directly by the copy), and windows it has proven to be in range; the
release build then runs with bounds checks off, the debug build (``TOKSTREAM_DEBUG=1`` at build
time) with them on. The copies return whether every token fitted the output dtype (only a
32-bit output of uint32, int64 or uint64 tokens can fail to), so that no batch holding a
wrapped-around token is ever handed out.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from tokstream._kernels.copy cimport copy_window, prefetch_window
from tokstream._kernels.segments cimport find_segments
from tokstream._kernels.types cimport out_t, token_t

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG

#: True when this module was compiled with bounds checks on (``TOKSTREAM_DEBUG=1``).
DEBUG_BUILD = bool(TOKSTREAM_DEBUG)


# Cython embeds the signature of a fused function's dispatcher ("signatures, args, kwargs,
# defaults"), not this one; the docstring states it instead.
@cython.embedsignature(False)
def gather_windows(
    const token_t[::1] tokens,
    const int64_t[:] starts,
    out_t[:, ::1] input_ids,
    out_t[::1] next_tokens=None,
    out_t[:, ::1] targets=None,
    Py_ssize_t cache_ahead=0,
    int64_t stride=1,
    int64_t offset=0,
):
    """gather_windows(const token_t[::1] tokens, const int64_t[:] starts, out_t[:, ::1] input_ids, out_t[::1] next_tokens=None, out_t[:, ::1] targets=None, Py_ssize_t cache_ahead=0, int64_t stride=1, int64_t offset=0) -> bool

    Copy window ``i`` (``block`` tokens from ``s = offset + stride * starts[i]``) into row
    ``i`` of ``input_ids``: ``stride`` and ``offset`` map window indices of one segment to their
    first tokens here, so that no batch builds that array (both default to tokens already).

    ``block`` is ``input_ids.shape[1]``. With ``next_tokens`` the token after each window goes
    to ``next_tokens[i]``; with ``targets`` the window shifted by one token goes to
    ``targets[i]``; exactly one of the two is given. With ``cache_ahead=d > 0`` every cache
    line of window ``i + d`` is requested (a software prefetch) before window ``i`` is copied
    (:func:`tokstream._space.cache_ahead` chooses ``d``); 0 requests none, for consecutive
    windows, which the hardware prefetcher already streams.

    Returns False when a token of a window (or its next token) does not fit the output dtype;
    the buffers then hold wrapped values and must not be handed out.

    The caller guarantees ``0 <= s`` and ``s + block < len(tokens)`` for every window and
    buffers of ``len(starts)`` rows (the targets of width ``block``).
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = input_ids.shape[1]
    cdef bint shifted = targets is not None
    cdef Py_ssize_t i
    cdef int64_t start, checked = 0
    cdef uint64_t outside = 0
    with nogil:
        for i in range(count):
            if cache_ahead > 0 and cache_ahead < count - i:
                # starts[i + cache_ahead] maps to a validated window start, so every address
                # from its first token to its last lies inside ``tokens``.
                prefetch_window(&tokens[offset + stride * starts[i + cache_ahead]], block)
            # Validated on the Python side: start + block < len(tokens), i < input_ids.shape[0].
            start = offset + stride * starts[i]
            if TOKSTREAM_DEBUG:
                checked += tokens[start + block]
            outside |= copy_window(
                &tokens[start],
                block,
                &input_ids[i, 0],
                &targets[i, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[i],
            )
    return outside == 0


def lookup_windows(
    const int64_t[:] windows_index,
    const int64_t[::1] offsets,
    const int64_t[::1] segment_starts,
    const uint64_t[::1] segment_addresses,
    const int64_t[::1] segment_lengths,
    const int64_t[::1] bucket_segments,
    int shift,
    int probes,
    int64_t stride,
    Py_ssize_t itemsize,
    Py_ssize_t block,
    int64_t[::1] starts,
    uint64_t[::1] addresses=None,
):
    """Where each window of a space of segments starts: its first token in the shards laid
    end to end (``starts[i]``) and, given ``addresses``, that token's address.

    Window ``w`` of segment ``j`` (``offsets[j] <= w < offsets[j + 1]``) starts ``(w -
    offsets[j]) * stride`` tokens after the segment's first token, which is token
    ``segment_starts[j]``, at address ``segment_addresses[j]`` (a segment lies inside one
    array of ``itemsize``-byte tokens). ``bucket_segments[b]`` is the segment of window ``b <<
    shift`` (its last entry the last segment), so a window's segment is searched among the few
    of its bucket, in ``probes`` steps when no bucket spans more than ``2**probes`` segments.
    The lookups of a batch are independent of each other, so their cache misses overlap.

    The caller guarantees ``0 <= w < offsets[-1]`` for every window, ``len(segment_starts) ==
    len(segment_addresses) == len(segment_lengths) == len(offsets) - 1 >= 1``,
    ``len(bucket_segments) == (offsets[-1] - 1 >> shift) + 2`` with entries valid segments,
    ``starts`` and ``addresses`` of at least ``len(windows_index)`` entries, and that every
    address points at a live array holding the segment's ``segment_lengths[j]`` tokens, of
    which each window's ``block + 1`` are; the debug build checks the last.
    """
    cdef Py_ssize_t count = windows_index.shape[0], i, segment
    cdef bint with_addresses = addresses is not None
    cdef int64_t window, local
    if count == 0:
        return
    with nogil:
        # Each window's segment first, then (a pass of independent loads) where it starts.
        find_segments(
            <const char *>&windows_index[0], windows_index.strides[0], count, &offsets[0],
            &bucket_segments[0], shift, probes, &starts[0],
        )
        for i in range(count):
            window = windows_index[i]
            # find_segments wrote a segment holding the window: offsets[segment] <= window.
            segment = starts[i]
            local = (window - offsets[segment]) * stride
            if TOKSTREAM_DEBUG and not (
                offsets[segment] <= window < offsets[segment + 1]
                and local + block < segment_lengths[segment]
            ):
                with gil:
                    raise IndexError(f"window {window} does not lie inside its segment")
            starts[i] = segment_starts[segment] + local
            if with_addresses:
                addresses[i] = segment_addresses[segment] + <uint64_t>(local * itemsize)


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def gather_at(
    const token_t[::1] anchor,
    const uint64_t[::1] addresses,
    out_t[:, ::1] input_ids,
    out_t[::1] next_tokens=None,
    out_t[:, ::1] targets=None,
    Py_ssize_t cache_ahead=0,
):
    """gather_at(const token_t[::1] anchor, const uint64_t[::1] addresses, out_t[:, ::1] input_ids, out_t[::1] next_tokens=None, out_t[:, ::1] targets=None, Py_ssize_t cache_ahead=0) -> bool

    :func:`gather_windows` for windows given by the address of their first token
    (:func:`lookup_windows`): row ``i`` from ``addresses[i]``. ``anchor`` is any array of the
    tokens' dtype (it only selects the specialisation). Returns False as
    :func:`gather_windows` does.

    The caller guarantees that each address is a window's first token whose ``block + 1``
    tokens lie in a live token array (:func:`lookup_windows` checks it in the debug build) and
    buffers of ``len(addresses)`` rows.
    """
    cdef Py_ssize_t count = addresses.shape[0]
    cdef Py_ssize_t block = input_ids.shape[1]
    cdef bint shifted = targets is not None
    cdef Py_ssize_t i
    cdef uint64_t outside = 0
    with nogil:
        for i in range(count):
            if cache_ahead > 0 and cache_ahead < count - i:
                # i + cache_ahead < count: a looked-up window's first token.
                prefetch_window(<const token_t *><size_t>addresses[i + cache_ahead], block)
            # Every window's block + 1 tokens lie in its segment (lookup_windows' guarantee);
            # input_ids has a row per address (_batch.check_shapes checks the buffers).
            outside |= copy_window(
                <const token_t *><size_t>addresses[i],
                block,
                &input_ids[i, 0],
                &targets[i, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[i],
            )
    return outside == 0
