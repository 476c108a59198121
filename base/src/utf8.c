/*
 * utf8.c — the UTF-8 codec (contract in utf8.h).
 *
 * Decoding follows the table of well-formed byte sequences in Unicode §3.9 (Table 3-7): the first
 * byte fixes the length and the range the second byte must fall in; every later byte is a plain
 * continuation byte 80..BF. The narrowed second-byte ranges are what rule out overlong forms (E0
 * needs A0..BF, F0 needs 90..BF), surrogates (ED needs 80..9F) and values above U+10FFFF (F4
 * needs 80..8F); C0, C1 and F5..FF never start a sequence. Checking byte by byte against that
 * table finds the maximal subpart for free: it is the bytes accepted before the first one that
 * is not. The relaxations only widen the ranges.
 */
#include "corral/utf8.h"

size_t utf8_lead_length(uint8_t b) {
    if (b < 0x80) return 1;
    if (b < 0xC0) return 0; /* a continuation byte */
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    if (b < 0xF8) return 4;
    return 0;
}

size_t utf8_codepoint_length(uint32_t cp) {
    if (cp < 0x80) return 1;
    if (cp < 0x800) return 2;
    if (cp < 0x10000) return 3;
    if (cp <= UTF8_MAX_CODEPOINT) return 4;
    return 0;
}

utf8_status utf8_decode_relaxed(const uint8_t *s, size_t n, uint32_t allow, uint32_t *cp,
                                size_t *len) {
    if (n == 0) {
        *len = 0;
        return UTF8_TRUNCATED;
    }
    const uint8_t b0 = s[0];
    if (b0 < 0x80) {
        if (cp) *cp = b0;
        *len = 1;
        return UTF8_OK;
    }
    const bool overlong = allow & UTF8_ALLOW_OVERLONG, surrogate = allow & UTF8_ALLOW_SURROGATE;
    size_t need;                  /* the length of the whole sequence */
    uint8_t lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
    } else if (b0 >= 0xC0 && b0 <= 0xC1 && overlong) {
        need = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        if (b0 == 0xE0 && !overlong) lo = 0xA0;
        if (b0 == 0xED && !surrogate) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        if (b0 == 0xF0 && !overlong) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *len = 1; /* a continuation byte, C0 / C1 (overlong), or F5..FF (above U+10FFFF) */
        return UTF8_INVALID;
    }
    uint32_t v = b0 & (0x7Fu >> need); /* the payload bits of the first byte */
    for (size_t i = 1; i < need; i++) {
        if (i == n) {
            *len = n;
            return UTF8_TRUNCATED;
        }
        const uint8_t b = s[i];
        if (b < lo || b > hi) {
            *len = i;
            return UTF8_INVALID;
        }
        v = (v << 6) | (b & 0x3Fu);
        lo = 0x80;
        hi = 0xBF;
    }
    if (cp) *cp = v;
    *len = need;
    return UTF8_OK;
}

utf8_status utf8_decode(const uint8_t *s, size_t n, uint32_t *cp, size_t *len) {
    return utf8_decode_relaxed(s, n, 0, cp, len);
}

size_t utf8_encode_relaxed(uint32_t cp, uint32_t allow, uint8_t out[UTF8_SEQUENCE_MAX]) {
    if (cp >= 0xD800 && cp <= 0xDFFF && !(allow & UTF8_ALLOW_SURROGATE)) return 0;
    const size_t n = utf8_codepoint_length(cp);
    if (n == 0) return 0;
    if (n == 1) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    /* Continuation bytes from the last one back, six bits each; the rest goes after the lead
     * byte's marker (110, 1110 or 11110). */
    static const uint8_t marker[UTF8_SEQUENCE_MAX + 1] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (size_t i = n - 1; i > 0; i--) {
        out[i] = (uint8_t)(0x80 | (cp & 0x3F));
        cp >>= 6;
    }
    out[0] = (uint8_t)(marker[n] | cp);
    return n;
}

size_t utf8_encode(uint32_t cp, uint8_t out[UTF8_SEQUENCE_MAX]) {
    return utf8_encode_relaxed(cp, 0, out);
}

size_t utf8_validate(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII needs no decoding, and most text is mostly ASCII. */
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        if (utf8_decode(s + i, n - i, NULL, &len) != UTF8_OK) return i;
        i += len;
    }
    return n;
}

size_t utf8_cut(const uint8_t *s, size_t n, size_t max) {
    if (n <= max) return n;
    /* A sequence that straddles max starts at most three bytes before it, and every byte between
     * its start and max is a continuation byte: so the only candidate is the last byte at or
     * before max that is not one. */
    size_t j = max;
    while (j > 0 && max - j < UTF8_SEQUENCE_MAX - 1 && utf8_is_continuation(s[j])) j--;
    if (j == max || utf8_is_continuation(s[j])) return max;
    size_t len;
    if (utf8_decode(s + j, n - j, NULL, &len) == UTF8_OK && j + len > max) return j;
    return max;
}

size_t utf8_escape(char *out, size_t cap, const uint8_t *s, size_t n) {
    size_t need = 0; /* the length of the whole result so far */
    size_t o = 0;    /* what has been written to out; stops growing at the first piece that
                        does not fit, so the output never ends in half a character */
    bool full = cap == 0;
    for (size_t i = 0; i < n;) {
        static const char hex[] = "0123456789abcdef";
        size_t len;
        const char *piece;
        size_t piece_len;
        char esc[4];
        if (s[i] != 0 && utf8_decode(s + i, n - i, NULL, &len) == UTF8_OK) {
            piece = (const char *)s + i;
            piece_len = len;
        } else {
            esc[0] = '\\';
            esc[1] = 'x';
            esc[2] = hex[s[i] >> 4];
            esc[3] = hex[s[i] & 0xF];
            piece = esc;
            piece_len = sizeof esc;
            len = 1; /* each byte of an ill-formed sequence is escaped on its own */
        }
        if (!full && o + piece_len < cap) {
            for (size_t k = 0; k < piece_len; k++) out[o++] = piece[k];
        } else {
            full = true;
        }
        need += piece_len;
        i += len;
    }
    if (cap > 0) out[o] = '\0';
    return need;
}
