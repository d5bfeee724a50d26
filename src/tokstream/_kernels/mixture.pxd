# The mixture kernel's records, one field per column (tokstream._schedule builds them as NumPy
# structured arrays of the same fields, in the same order).
from libc.stdint cimport int64_t, uint64_t

# An internal node of the schedule's tree: it sends its local sample k to ``left`` iff
# c(k + 1) > c(k), c(k) = floor((2 k p + q) / (2 q)); a child < 0 is the leaf of source
# -1 - child. The divisors of q and 2 q (magic, shift) replace the divisions.
ctypedef struct Node:
    int64_t p
    int64_t q
    int64_t left
    int64_t right
    uint64_t q_magic
    uint64_t q_shift
    uint64_t twice_q_magic
    uint64_t twice_q_shift

# A source in one stage of the schedule: its windows [first, first + windows) of the combined
# corpus, its permutation's domain (high_size << low_bits), its integer weight in the stage, the
# divisor of its window count, and ``offset``: its samples in the stages before (its local index
# at the stage's start, so that its epochs run on across stages).
ctypedef struct Source:
    int64_t first
    int64_t windows
    int64_t low_bits
    int64_t high_size
    int64_t weight
    uint64_t windows_magic
    uint64_t windows_shift
    int64_t offset

# A row of the period table: the source of that sample and its local index there.
ctypedef struct Row:
    int64_t source
    int64_t local

# A sample of the batch being filled (scratch): its source, that source's epoch, the position.
ctypedef struct Sample:
    int64_t source
    int64_t epoch
    int64_t position

# What the kernel remembers of a source between batches: the epoch of its last sample (-1:
# none) and that epoch's first local index; the epoch whose round keys it holds (-1: none).
# ``taken`` is scratch of one batch (its samples of the source, counted).
ctypedef struct SourceCache:
    int64_t epoch
    int64_t epoch_start
    int64_t key_epoch
    int64_t taken
