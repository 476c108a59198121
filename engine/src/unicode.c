/*
 * unicode.c — code point classes and UTF-8 coding for the tokenizer (see unicode.h).
 *
 * The class of a code point is derived from its General_Category, looked up by binary search in
 * the generated run table, and from the White_Space ranges. Decoding deliberately follows
 * llama.cpp's lenient decoder rather than strict UTF-8, because the reference token ids depend on
 * it: overlong forms and surrogates decode to their value, and every byte that does not start a
 * well-formed shape becomes one U+FFFD.
 */
#include "unicode.h"

unicode_gc unicode_cpt_category(uint32_t cpt) {
    if (cpt > UNICODE_MAX_CODEPOINT) {
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

int unicode_cpt_is_whitespace(uint32_t cpt) {
    size_t lo = 0, hi = unicode_white_space_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cpt < unicode_white_space[mid].first) {
            hi = mid;
        } else if (cpt > unicode_white_space[mid].last) {
            lo = mid + 1;
        } else {
            return 1;
        }
    }
    return 0;
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

size_t unicode_utf8_lead_len(uint8_t lead) {
    static const uint8_t len_by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len_by_high_nibble[lead >> 4];
}

static int is_continuation(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

size_t unicode_utf8_decode(const uint8_t *s, size_t n, uint32_t *cpt) {
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cpt = b0;
        return 1;
    }
    size_t need;
    uint32_t value;
    if ((b0 & 0xE0) == 0xC0) {
        need = 2;
        value = b0 & 0x1Fu;
    } else if ((b0 & 0xF0) == 0xE0) {
        need = 3;
        value = b0 & 0x0Fu;
    } else if ((b0 & 0xF8) == 0xF0) {
        need = 4;
        value = b0 & 0x07u;
    } else { /* a continuation byte or 0xF8-0xFF */
        *cpt = UNICODE_REPLACEMENT;
        return 1;
    }
    if (need > n) {
        *cpt = UNICODE_REPLACEMENT;
        return 1;
    }
    for (size_t i = 1; i < need; i++) {
        if (!is_continuation(s[i])) {
            *cpt = UNICODE_REPLACEMENT;
            return 1;
        }
        value = (value << 6) | (s[i] & 0x3Fu);
    }
    if (value > UNICODE_MAX_CODEPOINT) {
        /* llama.cpp decodes this and then fails to re-encode it; one U+FFFD per byte is saner */
        *cpt = UNICODE_REPLACEMENT;
        return 1;
    }
    *cpt = value;
    return need;
}

size_t unicode_utf8_encode(uint32_t cpt, uint8_t out[4]) {
    if (cpt < 0x80) {
        out[0] = (uint8_t)cpt;
        return 1;
    }
    if (cpt < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cpt >> 6));
        out[1] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt > UNICODE_MAX_CODEPOINT) {
        cpt = UNICODE_REPLACEMENT;
    }
    if (cpt < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cpt >> 12));
        out[1] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cpt >> 18));
    out[1] = (uint8_t)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cpt & 0x3F));
    return 4;
}
