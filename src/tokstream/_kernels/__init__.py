"""The compiled loops beside the window kernel (:mod:`tokstream._windows`), one module per concern,
each over validated, allocated buffers:

- ``documents``: a batch's windows with each row's position ids and loss mask; a batch's pieces;
- ``order``: the implicit permutation of one corpus's windows;
- ``mixture``: which window of which source each sample of a weighted mixture is;
- ``pack``: best fit (which piece of a packed stream goes in which row);
- ``packed_copy``: packed rows copied into a batch;
- ``advice``: ``madvise``/``mincore`` read-ahead advice for memory-mapped corpora;
- ``repetition``: which samples of a batch hold a long periodic run of tokens (the repetition
  filter).

The ``.pxd`` files are the pieces several kernels inline, ``_windows`` among them (``types``: the
token and output types; ``copy``: a window's cache prefetch and copy; ``segments``: a window's
segment; ``permute``: the keyed permutation; ``mixture``: the mixture's records);
``portable.h`` holds the compiler-specific parts, ``convert.h`` the converting copies.
"""
