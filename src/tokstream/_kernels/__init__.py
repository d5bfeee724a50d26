"""The compiled kernels: small loops over validated, allocated buffers, one module per concern.

- ``gather``: copy a batch's windows out of token arrays (one segment, or a space of segments);
- ``documents``: the same with each row's position ids and loss mask; a batch's pieces;
- ``order``: the implicit permutation of one corpus's windows;
- ``mixture``: which window of which source each sample of a weighted mixture is;
- ``advice``: ``madvise``/``mincore`` read-ahead advice for memory-mapped corpora.

The ``.pxd`` files are the pieces several of them inline (``types``: the token type; ``copy``: a
window's cache prefetch and copy; ``segments``: a window's segment; ``permute``: the keyed
permutation); ``portable.h`` holds the compiler-specific parts. :data:`DEBUG_BUILD` says whether
they were compiled with bounds checks on (``TOKSTREAM_DEBUG=1`` at build time).
"""

from tokstream._kernels.gather import DEBUG_BUILD

__all__ = ["DEBUG_BUILD"]
