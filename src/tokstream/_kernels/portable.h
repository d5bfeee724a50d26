/* Compiler-specific pieces of the window kernel, each with a portable fallback.
 *
 * GCC and Clang get their builtins, MSVC its intrinsics, anything else plain C; defining
 * TOKSTREAM_PORTABLE_MULHI forces the plain-C multiply (the tests compile it that way). */
#ifndef TOKSTREAM_PORTABLE_H
#define TOKSTREAM_PORTABLE_H

#include <stdint.h>

#if defined(_MSC_VER)
#include <intrin.h>
#endif

/* SSE2 for the equality searches below; TOKSTREAM_PORTABLE_SCAN forces their plain-C loops
 * (the tests compile both). */
#if (defined(__SSE2__) || defined(_M_X64)) && !defined(TOKSTREAM_PORTABLE_SCAN)
#define TOKSTREAM_SSE2 1
#include <emmintrin.h>
#endif

/* Ask the CPU to start loading the cache line at p; no effect on the program's meaning. */
#if defined(__GNUC__) || defined(__clang__)
#define TOKSTREAM_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 0)
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#define TOKSTREAM_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_NTA)
#else
#define TOKSTREAM_PREFETCH(p) ((void)(p))
#endif

#if defined(_MSC_VER) && !defined(__cplusplus)
#define TOKSTREAM_INLINE static __inline
#else
#define TOKSTREAM_INLINE static inline
#endif

/* The high 64 bits of the 128-bit product a * b. */
TOKSTREAM_INLINE uint64_t tokstream_mulhi64(uint64_t a, uint64_t b) {
#if defined(__SIZEOF_INT128__) && !defined(TOKSTREAM_PORTABLE_MULHI)
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_ARM64)) && !defined(TOKSTREAM_PORTABLE_MULHI)
    return __umulh(a, b);
#else
    /* Schoolbook on 32-bit halves: a * b = hi*2^64 + (cross terms)*2^32 + lo, carries kept. */
    uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
    uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
    uint64_t lo_lo = a_lo * b_lo;
    uint64_t hi_lo = a_hi * b_lo;
    uint64_t lo_hi = a_lo * b_hi;
    uint64_t hi_hi = a_hi * b_hi;
    uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
    return hi_hi + (hi_lo >> 32) + (middle >> 32);
#endif
}

/* The first j in [low, high) with values[j] == value, else high. With SSE2 (every x86-64) eight
 * values are compared a step: SSE2 compares 32-bit lanes, and a 64-bit value is equal when both
 * of its halves are (the lanes ANDed with their neighbours). Compilers do not vectorise a
 * 64-bit equality search themselves for baseline x86-64. */
TOKSTREAM_INLINE int64_t tokstream_first_equal64(const int64_t *values, int64_t low, int64_t high,
                                                 int64_t value) {
    int64_t j = low;
#if defined(TOKSTREAM_SSE2)
    const __m128i wanted = _mm_set1_epi64x(value);
    while (j + 8 <= high) {
        __m128i any = _mm_setzero_si128();
        int k;
        for (k = 0; k < 8; k += 2) {
            __m128i halves = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(values + j + k)),
                                             wanted);
            any = _mm_or_si128(any, _mm_and_si128(halves, _mm_shuffle_epi32(halves, 0xB1)));
        }
        if (_mm_movemask_epi8(any)) {
            break;
        }
        j += 8;
    }
#endif
    while (j < high && values[j] != value) {
        j++;
    }
    return j;
}

/* The first j in [low, high) with values[j] == value, else high, for 32-bit values (a batch
 * written with out_dtype="int32"): eight a step with SSE2, which compares 32-bit lanes. */
TOKSTREAM_INLINE int64_t tokstream_first_equal32(const int32_t *values, int64_t low, int64_t high,
                                                 int32_t value) {
    int64_t j = low;
#if defined(TOKSTREAM_SSE2)
    const __m128i wanted = _mm_set1_epi32(value);
    while (j + 8 <= high) {
        __m128i a = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(values + j)), wanted);
        __m128i b = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(values + j + 4)), wanted);
        if (_mm_movemask_epi8(_mm_or_si128(a, b))) {
            break;
        }
        j += 8;
    }
#endif
    while (j < high && values[j] != value) {
        j++;
    }
    return j;
}

#if defined(TOKSTREAM_SSE2)
/* Whether any of the sixteen 16-bit tokens at p equals the value broadcast in wanted. */
TOKSTREAM_INLINE int tokstream_any_equal16(const uint16_t *p, __m128i wanted) {
    __m128i a = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)p), wanted);
    __m128i b = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(p + 8)), wanted);
    return _mm_movemask_epi8(_mm_or_si128(a, b));
}
#endif

/* The first j in [low, high) with tokens[j] == value, else high; and the last, else low - 1:
 * 16-bit tokens (GPT-2's vocabulary in nanoGPT's and llm.c's files), sixteen a step with SSE2.
 * The document kernel runs them on a window while the copy has its tokens in cache. */
TOKSTREAM_INLINE int64_t tokstream_first_equal16(const uint16_t *tokens, int64_t low, int64_t high,
                                                 uint16_t value) {
    int64_t j = low;
#if defined(TOKSTREAM_SSE2)
    const __m128i wanted = _mm_set1_epi16((short)value);
    while (j + 16 <= high && !tokstream_any_equal16(tokens + j, wanted)) {
        j += 16;
    }
#endif
    while (j < high && tokens[j] != value) {
        j++;
    }
    return j;
}

TOKSTREAM_INLINE int64_t tokstream_last_equal16(const uint16_t *tokens, int64_t low, int64_t high,
                                                uint16_t value) {
    int64_t j = high;
#if defined(TOKSTREAM_SSE2)
    const __m128i wanted = _mm_set1_epi16((short)value);
    while (j - 16 >= low && !tokstream_any_equal16(tokens + j - 16, wanted)) {
        j -= 16;
    }
#endif
    while (j > low && tokens[j - 1] != value) {
        j--;
    }
    return j - 1;
}

#endif
