/*
 * unicode.c — General_Category, White_Space and the tokenizer's classes of a code point (see
 * corral/unicode.h).
 *
 * The class of a code point is derived from its General_Category, looked up by binary search in
 * the generated run table, and from the White_Space ranges. UTF-8 is the codec's (utf8.h); the
 * tokenizer's llama.cpp-compatible reading of it is in engine/src/tokenizer_impl.h.
 */
#include "corral/unicode.h"

#include "corral/utf8.h"

unicode_gc unicode_cpt_category(uint32_t cpt) {
    if (cpt > UTF8_MAX_CODEPOINT) {
        return UNICODE_GC_CN;
    }
    /* Last run whose start is <= cpt; runs[0].start is 0, so one always exists. */
    size_t lo = 0, hi = unicode_gc_run_count;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_gc_runs[mid].start <= cpt) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return (unicode_gc)unicode_gc_runs[lo].gc;
}

int unicode_in_ranges(const unicode_range *r, size_t n, uint32_t cpt) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cpt < r[mid].first) {
            hi = mid;
        } else if (cpt > r[mid].last) {
            lo = mid + 1;
        } else {
            return 1;
        }
    }
    return 0;
}

int unicode_cpt_is_whitespace(uint32_t cpt) {
    return unicode_in_ranges(unicode_white_space, unicode_white_space_count, cpt);
}

/* Major-category flag of each General_Category, grouped the way llama.cpp groups them. */
static const uint16_t gc_flag[UNICODE_GC_COUNT] = {
    [UNICODE_GC_CN] = UNICODE_FLAG_UNASSIGNED,  [UNICODE_GC_LU] = UNICODE_FLAG_LETTER,
    [UNICODE_GC_LL] = UNICODE_FLAG_LETTER,      [UNICODE_GC_LT] = UNICODE_FLAG_LETTER,
    [UNICODE_GC_LM] = UNICODE_FLAG_LETTER,      [UNICODE_GC_LO] = UNICODE_FLAG_LETTER,
    [UNICODE_GC_MN] = UNICODE_FLAG_MARK,        [UNICODE_GC_MC] = UNICODE_FLAG_MARK,
    [UNICODE_GC_ME] = UNICODE_FLAG_MARK,        [UNICODE_GC_ND] = UNICODE_FLAG_NUMBER,
    [UNICODE_GC_NL] = UNICODE_FLAG_NUMBER,      [UNICODE_GC_NO] = UNICODE_FLAG_NUMBER,
    [UNICODE_GC_PC] = UNICODE_FLAG_PUNCTUATION, [UNICODE_GC_PD] = UNICODE_FLAG_PUNCTUATION,
    [UNICODE_GC_PS] = UNICODE_FLAG_PUNCTUATION, [UNICODE_GC_PE] = UNICODE_FLAG_PUNCTUATION,
    [UNICODE_GC_PI] = UNICODE_FLAG_PUNCTUATION, [UNICODE_GC_PF] = UNICODE_FLAG_PUNCTUATION,
    [UNICODE_GC_PO] = UNICODE_FLAG_PUNCTUATION, [UNICODE_GC_SM] = UNICODE_FLAG_SYMBOL,
    [UNICODE_GC_SC] = UNICODE_FLAG_SYMBOL,      [UNICODE_GC_SK] = UNICODE_FLAG_SYMBOL,
    [UNICODE_GC_SO] = UNICODE_FLAG_SYMBOL,      [UNICODE_GC_ZS] = UNICODE_FLAG_SEPARATOR,
    [UNICODE_GC_ZL] = UNICODE_FLAG_SEPARATOR,   [UNICODE_GC_ZP] = UNICODE_FLAG_SEPARATOR,
    [UNICODE_GC_CC] = UNICODE_FLAG_CONTROL,     [UNICODE_GC_CF] = UNICODE_FLAG_CONTROL,
    [UNICODE_GC_CS] = UNICODE_FLAG_CONTROL,     [UNICODE_GC_CO] = UNICODE_FLAG_CONTROL,
};

uint32_t unicode_cpt_flags(uint32_t cpt) {
    uint32_t flags = gc_flag[unicode_cpt_category(cpt)];
    if (unicode_cpt_is_whitespace(cpt)) {
        flags |= UNICODE_FLAG_WHITESPACE;
    }
    return flags;
}
