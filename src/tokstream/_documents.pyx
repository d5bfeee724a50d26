"""The document kernel: where documents start inside each gathered window.

Called for the same windows as :func:`tokstream._windows.gather_windows`, right after it, so the
window's tokens are still in cache when the ``eos`` rule reads them. Nothing here validates or
allocates; the Python side (``tokstream._gather``) proves every index in range.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

ctypedef fused token_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t


cdef inline Py_ssize_t _first_above(const int64_t[::1] sorted_values, int64_t value) noexcept nogil:
    # Index of the first element > value (len if none): a binary search over O(documents).
    cdef Py_ssize_t low = 0, high = sorted_values.shape[0], middle
    while low < high:
        middle = (low + high) >> 1
        if sorted_values[middle] <= value:
            low = middle + 1
        else:
            high = middle
    return low


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def document_positions(
    const token_t[::1] tokens,
    const int64_t[:] starts,
    const int64_t[::1] document_starts,
    int64_t eos,
    bint use_eos,
    int64_t[:, ::1] position_ids,
    uint8_t[::1] label_continues,
    const int64_t[:] rows=None,
):
    """document_positions(const token_t[::1] tokens, const int64_t[:] starts, const int64_t[::1] document_starts, int64_t eos, bint use_eos, int64_t[:, ::1] position_ids, uint8_t[::1] label_continues, const int64_t[:] rows=None)

    Position ids of window ``i`` (``block = position_ids.shape[1]`` tokens from ``starts[i]``)
    into row ``rows[i]``, and whether the token after it belongs to the same document.

    A token starts a document when its index is in ``document_starts`` (sorted, local to
    ``tokens``, a start repeated for each empty document) or, with ``use_eos``, when the token
    before it equals ``eos``. Row ``r`` gets
    ``position_ids[r, 0] = 0``, then 0 at every document start and one more than the token before
    elsewhere; ``label_continues[r]`` is 0 when token ``starts[i] + block`` starts a document.

    The caller guarantees ``0 <= starts[i]`` and ``starts[i] + block < len(tokens)`` and every row
    below ``position_ids.shape[0]`` (and ``label_continues.shape[0]``).
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = position_ids.shape[1]
    cdef Py_ssize_t num_documents = document_starts.shape[0]
    cdef bint indirect = rows is not None
    cdef Py_ssize_t i, j, row, next_document
    cdef int64_t start, next_start, position
    cdef bint breaks
    with nogil:
        for i in range(count):
            # Validated on the Python side: start + block < len(tokens), row < shape[0].
            start = starts[i]
            row = rows[i] if indirect else i
            next_document = _first_above(document_starts, start)
            next_start = document_starts[next_document] if next_document < num_documents else -1
            position = 0
            position_ids[row, 0] = 0
            for j in range(1, block + 1):
                breaks = use_eos and tokens[start + j - 1] == eos
                if next_start == start + j:
                    breaks = True
                    # Empty documents repeat a start: step past every copy of this one.
                    while (
                        next_document < num_documents
                        and document_starts[next_document] == next_start
                    ):
                        next_document += 1
                    next_start = (
                        document_starts[next_document] if next_document < num_documents else -1
                    )
                if j == block:
                    label_continues[row] = not breaks
                else:
                    position = 0 if breaks else position + 1
                    position_ids[row, j] = position
