/* The converting copies: tokens of one dtype written into an int32 or int64 batch; and the
 * runs a batch's extras are made of, a constant (padding, a piece's number) or a ramp (position
 * ids).
 *
 * tokstream_convert_FROM_TO(source, count, out) writes out[j] = (TO)source[j] for j < count and
 * returns nonzero when one of those tokens does not fit TO (the values written are then wrong:
 * the caller must not hand the batch out). Only int32 outputs of uint32, int64 and uint64 tokens
 * can lose one; every other pair widens or keeps the width and returns 0.
 *
 * The loops are plain C. Where GCC 12 or later builds for Linux x86-64 (the release's wheels,
 * CI), each is compiled three times, for the x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and baseline
 * instruction sets, and the loader picks the one the CPU runs (target_clones, an ifunc): the
 * baseline's 16-byte SSE2 steps spend more time narrowing int64 tokens than memcpy spends
 * copying them, where AVX-512 narrows eight in one instruction. Anything else, or
 * TOKSTREAM_PORTABLE_CONVERT (the tests compile both), gets the one plain-C function. */
#ifndef TOKSTREAM_CONVERT_H
#define TOKSTREAM_CONVERT_H

#include <stdint.h>

#if !defined(TOKSTREAM_PORTABLE_CONVERT) && defined(__GNUC__) && !defined(__clang__) &&          \
    __GNUC__ >= 12 && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define TOKSTREAM_CONVERT_CLONES                                                                 \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TOKSTREAM_CONVERT_CLONES
#endif
/* Each module that includes this uses a few of the pairs. */
#if defined(__GNUC__) || defined(__clang__)
#define TOKSTREAM_CONVERT_UNUSED __attribute__((unused))
#else
#define TOKSTREAM_CONVERT_UNUSED
#endif

/* What is ORed up over the tokens (branch-free, so the loops stay vectorised) and shifted at
 * the end: nonzero exactly when a token does not fit TO. */
#define TOKSTREAM_FITS_ALWAYS(v) 0
#define TOKSTREAM_FITS_ALWAYS_SHIFT 0
/* -2**31 <= v < 2**31 iff v + 2**31 (modulo 2**64) < 2**32. */
#define TOKSTREAM_SIGNED_INT32(v) ((uint64_t)(v) + 0x80000000u)
#define TOKSTREAM_SIGNED_INT32_SHIFT 32
/* 0 <= v < 2**31 for unsigned v iff v >> 31 == 0. */
#define TOKSTREAM_UNSIGNED_INT32(v) ((uint64_t)(v))
#define TOKSTREAM_UNSIGNED_INT32_SHIFT 31

#define TOKSTREAM_CONVERT(FROM, TO, RULE)                                                        \
    TOKSTREAM_CONVERT_CLONES TOKSTREAM_CONVERT_UNUSED static uint64_t tokstream_convert_##FROM##_##TO(                    \
        const FROM##_t *source, int64_t count, TO##_t *out) {                                    \
        uint64_t flags = 0;                                                                      \
        int64_t j;                                                                               \
        for (j = 0; j < count; j++) {                                                            \
            out[j] = (TO##_t)source[j];                                                          \
            flags |= RULE(source[j]);                                                            \
        }                                                                                        \
        return flags >> RULE##_SHIFT;                                                            \
    }

TOKSTREAM_CONVERT(int8, int32, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(int16, int32, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(int64, int32, TOKSTREAM_SIGNED_INT32)
TOKSTREAM_CONVERT(uint8, int32, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(uint16, int32, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(uint32, int32, TOKSTREAM_UNSIGNED_INT32)
TOKSTREAM_CONVERT(uint64, int32, TOKSTREAM_UNSIGNED_INT32)
TOKSTREAM_CONVERT(int8, int64, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(int16, int64, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(int32, int64, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(uint8, int64, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(uint16, int64, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(uint32, int64, TOKSTREAM_FITS_ALWAYS)
TOKSTREAM_CONVERT(uint64, int64, TOKSTREAM_FITS_ALWAYS)

/* tokstream_fill_TO(out, count, value): out[j] = value; tokstream_ramp_TO(out, count): out[j] = j
 * (count fits TO: the caller's guarantee), for j < count. The ramp counts in INDEX, as wide as
 * TO: an int32 ramp counted in int64 is vectorised as int64 values narrowed to int32, twice the
 * instructions (1.9x the time of the uint32 count with AVX2, 1.4x without, in L1). */
#define TOKSTREAM_RUNS(TO, INDEX)                                                                \
    TOKSTREAM_CONVERT_CLONES TOKSTREAM_CONVERT_UNUSED static void tokstream_fill_##TO(           \
        TO##_t *out, int64_t count, TO##_t value) {                                              \
        int64_t j;                                                                               \
        for (j = 0; j < count; j++) {                                                            \
            out[j] = value;                                                                      \
        }                                                                                        \
    }                                                                                            \
    TOKSTREAM_CONVERT_CLONES TOKSTREAM_CONVERT_UNUSED static void tokstream_ramp_##TO(           \
        TO##_t *out, int64_t count) {                                                            \
        INDEX j, end = count > 0 ? (INDEX)count : 0;                                             \
        for (j = 0; j < end; j++) {                                                              \
            out[j] = (TO##_t)j;                                                                  \
        }                                                                                        \
    }

TOKSTREAM_RUNS(int32, uint32_t)
TOKSTREAM_RUNS(int64, int64_t)

#endif
