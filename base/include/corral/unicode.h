/*
 * unicode.h — corral's one Unicode table: the General_Category and White_Space of every code
 * point, and the classes llama.cpp's pre-tokenizers see (letter, number, punctuation, ..., white
 * space). The tokenizer splits text by these classes; the invisible sanitizer removes the
 * control, format and private-use characters (Cc, Cf, Co) they name.
 *
 * Both come from two tables generated from the Unicode Character Database by
 * scripts/gen-unicode-tables (base/src/unicode_tables.c, committed): the General_Category of every
 * code point as runs, and the White_Space property. Lookups are binary searches over ~4000 runs.
 * Everything here is pure and thread-safe.
 */
#ifndef CORRAL_UNICODE_H
#define CORRAL_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* General_Category values. The generator writes the table with these names, so the order here
 * is free; it is append-only anyway. */
typedef enum unicode_gc {
    UNICODE_GC_CN = 0, /* unassigned */
    UNICODE_GC_LU = 1,
    UNICODE_GC_LL = 2,
    UNICODE_GC_LT = 3,
    UNICODE_GC_LM = 4,
    UNICODE_GC_LO = 5,
    UNICODE_GC_MN = 6,
    UNICODE_GC_MC = 7,
    UNICODE_GC_ME = 8,
    UNICODE_GC_ND = 9,
    UNICODE_GC_NL = 10,
    UNICODE_GC_NO = 11,
    UNICODE_GC_PC = 12,
    UNICODE_GC_PD = 13,
    UNICODE_GC_PS = 14,
    UNICODE_GC_PE = 15,
    UNICODE_GC_PI = 16,
    UNICODE_GC_PF = 17,
    UNICODE_GC_PO = 18,
    UNICODE_GC_SM = 19,
    UNICODE_GC_SC = 20,
    UNICODE_GC_SK = 21,
    UNICODE_GC_SO = 22,
    UNICODE_GC_ZS = 23,
    UNICODE_GC_ZL = 24,
    UNICODE_GC_ZP = 25,
    UNICODE_GC_CC = 26,
    UNICODE_GC_CF = 27,
    UNICODE_GC_CS = 28,
    UNICODE_GC_CO = 29,
    UNICODE_GC_COUNT
} unicode_gc;

/* Class flags of a code point. The first eight are exclusive (one per major category, the way
 * llama.cpp groups them: Cc/Cf/Cs/Co are CONTROL, Cn is UNASSIGNED); WHITESPACE is added on top
 * for White_Space code points. */
enum {
    UNICODE_FLAG_UNASSIGNED = 1u << 0,  /* Cn */
    UNICODE_FLAG_NUMBER = 1u << 1,      /* \p{N} */
    UNICODE_FLAG_LETTER = 1u << 2,      /* \p{L} */
    UNICODE_FLAG_SEPARATOR = 1u << 3,   /* \p{Z} */
    UNICODE_FLAG_MARK = 1u << 4,        /* \p{M} */
    UNICODE_FLAG_PUNCTUATION = 1u << 5, /* \p{P} */
    UNICODE_FLAG_SYMBOL = 1u << 6,      /* \p{S} */
    UNICODE_FLAG_CONTROL = 1u << 7,     /* \p{C} except Cn */
    UNICODE_FLAG_WHITESPACE = 1u << 8,  /* White_Space (\s) */
};

/* The General_Category of cpt; UNICODE_GC_CN above U+10FFFF. */
unicode_gc unicode_cpt_category(uint32_t cpt);

/* The UNICODE_FLAG_* bits of cpt (exactly one category bit, plus WHITESPACE). */
uint32_t unicode_cpt_flags(uint32_t cpt);

/* 1 if cpt has the White_Space property. */
int unicode_cpt_is_whitespace(uint32_t cpt);

/* ---- generated tables (unicode_tables.c) ----------------------------------------------------- */

typedef struct unicode_gc_run {
    uint32_t start; /* first code point of the run */
    uint8_t gc;     /* a unicode_gc */
} unicode_gc_run;

typedef struct unicode_range {
    uint32_t first, last; /* inclusive */
} unicode_range;

extern const char unicode_tables_version[]; /* "15.0.0" */
extern const size_t unicode_gc_run_count;
extern const unicode_gc_run unicode_gc_runs[]; /* sorted by start; runs[0].start == 0 */
extern const size_t unicode_white_space_count;
extern const unicode_range unicode_white_space[]; /* sorted, disjoint */

/* 1 if cpt lies in one of the n sorted, disjoint ranges r[0..n): a binary search. For the
 * generated White_Space table and for hand-made sets such as the pre-tokenizers' regex classes. */
int unicode_in_ranges(const unicode_range *r, size_t n, uint32_t cpt);

#endif /* CORRAL_UNICODE_H */
