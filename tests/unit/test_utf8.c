/*
 * test_utf8.c — Check suite for the UTF-8 codec (base/include/corral/utf8.h).
 *
 * core: known encodings of each length, every scalar value through encode and decode and back,
 * the shape helpers, cutting and escaping well-formed text. limits: the ends of each length
 * class, sequences cut short by the end of the buffer, cuts at every position, escaping into
 * every output size. errors: each kind of ill-formed input (overlong forms, surrogates, values
 * past U+10FFFF, stray continuation bytes, bad continuations) with the maximal subpart Unicode
 * prescribes, the relaxations the tokenizer uses, and escaping of random bytes.
 */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "corral/utf8.h"
#include "testutil.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ck_assert records every passing check through a pipe; in long loops use this instead. */
#define EXPECT(cond, ...)                       \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

#define U8(lit) ((const uint8_t *)(lit))

/* Decode a literal and check status, length and (for UTF8_OK) the code point. */
static void expect_decode(const char *s, size_t n, utf8_status status, size_t len, uint32_t cp) {
    uint32_t got = 0xDEADBEEF;
    size_t got_len = 99;
    ck_assert_int_eq(utf8_decode(U8(s), n, &got, &got_len), status);
    ck_assert_uint_eq(got_len, len);
    if (status == UTF8_OK) {
        ck_assert_uint_eq(got, cp);
    } else {
        ck_assert_uint_eq(got, 0xDEADBEEF); /* untouched */
    }
}

/* ---- core ------------------------------------------------------------------------------------ */

START_TEST(test_decode_known) {
    expect_decode("A", 1, UTF8_OK, 1, 'A');
    expect_decode("\x00", 1, UTF8_OK, 1, 0);
    expect_decode("\xc3\xa9", 2, UTF8_OK, 2, 0xE9);            /* é */
    expect_decode("\xe2\x82\xac", 3, UTF8_OK, 3, 0x20AC);      /* € */
    expect_decode("\xe2\x96\x81", 3, UTF8_OK, 3, 0x2581);      /* ▁, SentencePiece's space */
    expect_decode("\xf0\x9f\x98\x80", 4, UTF8_OK, 4, 0x1F600); /* 😀 */
    expect_decode("\xc3\xa9xyz", 5, UTF8_OK, 2, 0xE9);         /* only the first character */
    size_t len;
    ck_assert_int_eq(utf8_decode(U8("\xe2\x82\xac"), 3, NULL, &len), UTF8_OK); /* cp optional */
    ck_assert_uint_eq(len, 3);
}
END_TEST

START_TEST(test_encode_known) {
    static const struct {
        uint32_t cp;
        const char *bytes;
    } known[] = {
        {'A', "A"},
        {0xE9, "\xc3\xa9"},
        {0x20AC, "\xe2\x82\xac"},
        {0xFFFD, "\xef\xbf\xbd"},
        {0x1F600, "\xf0\x9f\x98\x80"},
    };
    for (size_t i = 0; i < N_OF(known); i++) {
        uint8_t out[UTF8_SEQUENCE_MAX];
        const size_t n = utf8_encode(known[i].cp, out);
        ck_assert_uint_eq(n, strlen(known[i].bytes));
        ck_assert_mem_eq(out, known[i].bytes, n);
    }
    uint8_t nul[UTF8_SEQUENCE_MAX] = {0xFF};
    ck_assert_uint_eq(utf8_encode(0, nul), 1);
    ck_assert_uint_eq(nul[0], 0);
}
END_TEST

/* Every scalar value, one class after another (1, 2, 3 and 4 bytes; the surrogates are not
 * scalar values and are skipped): encoded, decoded back to itself, valid, never cut inside. */
START_TEST(test_round_trip_every_scalar_value) {
    size_t per_length[UTF8_SEQUENCE_MAX + 1] = {0};
    for (uint32_t cp = 0; cp <= UTF8_MAX_CODEPOINT; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        uint8_t buf[UTF8_SEQUENCE_MAX];
        const size_t n = utf8_encode(cp, buf);
        EXPECT(n >= 1 && n == utf8_codepoint_length(cp), "U+%04X: encoded in %zu bytes",
               (unsigned)cp, n);
        EXPECT(utf8_lead_length(buf[0]) == n, "U+%04X: lead byte %02X announces %zu", (unsigned)cp,
               buf[0], utf8_lead_length(buf[0]));
        uint32_t back;
        size_t len;
        EXPECT(utf8_decode(buf, n, &back, &len) == UTF8_OK && back == cp && len == n,
               "U+%04X: decodes as U+%04X (%zu bytes)", (unsigned)cp, (unsigned)back, len);
        EXPECT(utf8_validate(buf, n) == n, "U+%04X: not valid", (unsigned)cp);
        for (size_t max = 1; max < n; max++)
            EXPECT(utf8_cut(buf, n, max) == 0, "U+%04X: cut at %zu splits it", (unsigned)cp, max);
        per_length[n]++;
    }
    ck_assert_uint_eq(per_length[1], 0x80);
    ck_assert_uint_eq(per_length[2], 0x800 - 0x80);
    ck_assert_uint_eq(per_length[3], 0x10000 - 0x800 - 0x800); /* less the surrogates */
    ck_assert_uint_eq(per_length[4], 0x110000 - 0x10000);
}
END_TEST

/* The length each lead byte announces, and the length each code point takes, class by class. */
START_TEST(test_shapes) {
    static const struct {
        uint32_t first, last; /* bytes or code points, inclusive */
        size_t len;
    } leads[] = {{0x00, 0x7F, 1}, {0x80, 0xBF, 0}, {0xC0, 0xDF, 2}, /* C0, C1: the shape only */
                 {0xE0, 0xEF, 3}, {0xF0, 0xF7, 4}, {0xF8, 0xFF, 0}},
      lengths[] = {{0x0, 0x7F, 1},
                   {0x80, 0x7FF, 2},
                   {0x800, 0xFFFF, 3}, /* surrogates included: their shape is three bytes */
                   {0x10000, 0x10FFFF, 4},
                   {0x110000, 0xFFFFFFFF, 0}};
    for (size_t i = 0; i < N_OF(leads); i++)
        for (uint32_t b = leads[i].first; b <= leads[i].last; b++) {
            ck_assert_uint_eq(utf8_lead_length((uint8_t)b), leads[i].len);
            ck_assert_int_eq(utf8_is_continuation((uint8_t)b), b >= 0x80 && b <= 0xBF);
        }
    for (size_t i = 0; i < N_OF(lengths); i++) {
        ck_assert_uint_eq(utf8_codepoint_length(lengths[i].first), lengths[i].len);
        ck_assert_uint_eq(utf8_codepoint_length(lengths[i].last), lengths[i].len);
    }
    ck_assert_uint_eq(utf8_codepoint_length(0xD800), 3);
}
END_TEST

START_TEST(test_validate_text) {
    static const char text[] = "plain ASCII, caf\xc3\xa9, \xe2\x82\xac 5, \xf0\x9f\x98\x80!";
    ck_assert_uint_eq(utf8_validate(U8(text), sizeof text - 1), sizeof text - 1);
    ck_assert_uint_eq(utf8_validate(U8(""), 0), 0);
    ck_assert_uint_eq(utf8_validate(U8("a\0b"), 3), 3); /* U+0000 is a character */
}
END_TEST

/* "ab" + a sequence of each length + "z": a cut inside the sequence falls back to its start. */
START_TEST(test_cut_each_length) {
    static const char *const seqs[] = {"c", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    for (size_t k = 0; k < N_OF(seqs); k++) {
        char s[16];
        const size_t len = strlen(seqs[k]);
        snprintf(s, sizeof s, "ab%sz", seqs[k]);
        const size_t n = strlen(s);
        ck_assert_uint_eq(utf8_cut(U8(s), n, 0), 0);
        ck_assert_uint_eq(utf8_cut(U8(s), n, 1), 1);
        ck_assert_uint_eq(utf8_cut(U8(s), n, 2), 2);
        for (size_t max = 3; max < 2 + len; max++)
            ck_assert_msg(utf8_cut(U8(s), n, max) == 2, "length %zu, max %zu: cut at %zu", len, max,
                          utf8_cut(U8(s), n, max));
        ck_assert_uint_eq(utf8_cut(U8(s), n, 2 + len), 2 + len);
        ck_assert_uint_eq(utf8_cut(U8(s), n, n), n);
        ck_assert_uint_eq(utf8_cut(U8(s), n, n + 10), n);
    }
}
END_TEST

START_TEST(test_escape_leaves_text_alone) {
    static const char text[] = "caf\xc3\xa9 \\x41 \xf0\x9f\x98\x80\n";
    char out[64];
    ck_assert_uint_eq(utf8_escape(out, sizeof out, U8(text), sizeof text - 1), sizeof text - 1);
    ck_assert_str_eq(out, text);
    ck_assert_uint_eq(utf8_escape(out, sizeof out, U8(""), 0), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

START_TEST(test_class_boundaries) {
    expect_decode("\x7f", 1, UTF8_OK, 1, 0x7F);
    expect_decode("\xc2\x80", 2, UTF8_OK, 2, 0x80); /* the first two-byte form */
    expect_decode("\xdf\xbf", 2, UTF8_OK, 2, 0x7FF);
    expect_decode("\xe0\xa0\x80", 3, UTF8_OK, 3, 0x800);  /* the first three-byte form */
    expect_decode("\xed\x9f\xbf", 3, UTF8_OK, 3, 0xD7FF); /* just below the surrogates */
    expect_decode("\xee\x80\x80", 3, UTF8_OK, 3, 0xE000); /* just above them */
    expect_decode("\xef\xbf\xbf", 3, UTF8_OK, 3, 0xFFFF);
    expect_decode("\xf0\x90\x80\x80", 4, UTF8_OK, 4, 0x10000);  /* the first four-byte form */
    expect_decode("\xf4\x8f\xbf\xbf", 4, UTF8_OK, 4, 0x10FFFF); /* the last code point */
}
END_TEST

/* Every proper prefix of a sequence of each length, at the end of the buffer. */
START_TEST(test_truncated_at_end) {
    static const char *const seqs[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                       "\xf4\x8f\xbf\xbf"};
    for (size_t k = 0; k < N_OF(seqs); k++) {
        const size_t len = strlen(seqs[k]);
        for (size_t cut = 1; cut < len; cut++) {
            expect_decode(seqs[k], cut, UTF8_TRUNCATED, cut, 0);
            char s[16];
            snprintf(s, sizeof s, "ok %.*s", (int)cut, seqs[k]);
            ck_assert_uint_eq(utf8_validate(U8(s), strlen(s)), 3); /* where the sequence began */
            /* a broken tail is no character: the cut does not back off before it */
            ck_assert_uint_eq(utf8_cut(U8(s), strlen(s), strlen(s) - 1), strlen(s) - 1);
        }
    }
    expect_decode("", 0, UTF8_TRUNCATED, 0, 0);
}
END_TEST

/* Cut a mixed text at every length: never above max, never more than three bytes below it, the
 * kept part always valid, and the largest such cut. */
START_TEST(test_cut_every_position) {
    static const char text[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                               "b\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xc3\xa9z";
    const size_t n = sizeof text - 1;
    for (size_t max = 0; max <= n + 1; max++) {
        const size_t k = utf8_cut(U8(text), n, max);
        ck_assert_uint_le(k, max);
        ck_assert_uint_le(max < n ? max - k : 0, UTF8_SEQUENCE_MAX - 1);
        ck_assert_uint_eq(utf8_validate(U8(text), k), k);
        for (size_t bigger = k + 1; bigger <= max && bigger <= n; bigger++)
            ck_assert_uint_lt(utf8_validate(U8(text), bigger), bigger);
    }
}
END_TEST

START_TEST(test_cut_ill_formed) {
    /* Stray continuation bytes are one-byte units: a cut among them stays at max. */
    ck_assert_uint_eq(utf8_cut(U8("\x80\x80\x80\x80\x80\x80"), 6, 4), 4);
    ck_assert_uint_eq(utf8_cut(U8("ab\x80\x80\x80"), 5, 4), 4);
    /* A lead byte whose sequence is ill-formed is not a character either. */
    ck_assert_uint_eq(utf8_cut(U8("ab\xe2\x82Z"), 5, 3), 3);
    ck_assert_uint_eq(utf8_cut(U8("ab\xc0\x80"), 4, 3), 3);
    ck_assert_uint_eq(utf8_cut(U8("ab\xed\xa0\x80"), 5, 4), 4);
}
END_TEST

START_TEST(test_encode_limits) {
    uint8_t out[UTF8_SEQUENCE_MAX] = {0xAA, 0xAA, 0xAA, 0xAA};
    ck_assert_uint_eq(utf8_encode(0x110000, out), 0);
    ck_assert_uint_eq(utf8_encode(0xFFFFFFFF, out), 0);
    ck_assert_uint_eq(utf8_encode(0xD800, out), 0);
    ck_assert_uint_eq(utf8_encode(0xDFFF, out), 0);
    ck_assert_uint_eq(out[0], 0xAA); /* nothing written */
    ck_assert_uint_eq(utf8_encode(0x10FFFF, out), 4);
    ck_assert_mem_eq(out, "\xf4\x8f\xbf\xbf", 4);
    ck_assert_uint_eq(utf8_encode_relaxed(0xD800, UTF8_ALLOW_SURROGATE, out), 3);
    ck_assert_mem_eq(out, "\xed\xa0\x80", 3);
    ck_assert_uint_eq(utf8_encode_relaxed(0xDFFF, UTF8_ALLOW_SURROGATE, out), 3);
    ck_assert_mem_eq(out, "\xed\xbf\xbf", 3);
    ck_assert_uint_eq(utf8_encode_relaxed(0x110000, UTF8_ALLOW_SURROGATE, out), 0);
}
END_TEST

/* Escape into every output size: always NUL-terminated, always valid UTF-8, always a prefix of
 * the whole result made of whole pieces, and the same needed length returned each time. */
START_TEST(test_escape_every_size) {
    static const char in[] = "a\xff\xc3\xa9\xe2\x82\xac\x80z";
    static const char whole[] = "a\\xff\xc3\xa9\xe2\x82\xac\\x80z";
    /* the places where a cut result may end: between pieces */
    static const size_t ends[] = {0, 1, 5, 7, 10, 14, 15};
    char out[64];
    const size_t need = sizeof whole - 1;
    ck_assert_uint_eq(utf8_escape(NULL, 0, U8(in), sizeof in - 1), need);
    for (size_t cap = 1; cap <= need + 2; cap++) {
        memset(out, '#', sizeof out);
        ck_assert_uint_eq(utf8_escape(out, cap, U8(in), sizeof in - 1), need);
        const size_t len = strlen(out);
        ck_assert_uint_lt(len, cap);
        ck_assert_mem_eq(out, whole, len);
        ck_assert_uint_eq(utf8_validate(U8(out), len), len);
        size_t best = 0;
        for (size_t i = 0; i < N_OF(ends); i++)
            if (ends[i] < cap) best = ends[i];
        ck_assert_msg(len == best, "cap %zu: %zu bytes written, %zu fit", cap, len, best);
    }
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

START_TEST(test_overlong_rejected) {
    expect_decode("\xc0\x80", 2, UTF8_INVALID, 1, 0); /* U+0000 in two bytes */
    expect_decode("\xc0\xaf", 2, UTF8_INVALID, 1, 0); /* "/" in two bytes */
    expect_decode("\xc1\xbf", 2, UTF8_INVALID, 1, 0);
    expect_decode("\xe0\x80\x80", 3, UTF8_INVALID, 1, 0);
    expect_decode("\xe0\x9f\xbf", 3, UTF8_INVALID, 1, 0); /* U+07FF in three bytes */
    expect_decode("\xf0\x80\x80\x80", 4, UTF8_INVALID, 1, 0);
    expect_decode("\xf0\x8f\xbf\xbf", 4, UTF8_INVALID, 1, 0); /* U+FFFF in four bytes */
}
END_TEST

START_TEST(test_surrogates_rejected) {
    expect_decode("\xed\xa0\x80", 3, UTF8_INVALID, 1, 0); /* U+D800 */
    expect_decode("\xed\xb0\x80", 3, UTF8_INVALID, 1, 0); /* U+DC00 */
    expect_decode("\xed\xbf\xbf", 3, UTF8_INVALID, 1, 0); /* U+DFFF */
}
END_TEST

START_TEST(test_above_max_rejected) {
    expect_decode("\xf4\x90\x80\x80", 4, UTF8_INVALID, 1, 0); /* U+110000 */
    expect_decode("\xf4\xbf\xbf\xbf", 4, UTF8_INVALID, 1, 0);
    expect_decode("\xf5\x80\x80\x80", 4, UTF8_INVALID, 1, 0);
    expect_decode("\xf7\xbf\xbf\xbf", 4, UTF8_INVALID, 1, 0);
    expect_decode("\xf8\x88\x80\x80\x80", 5, UTF8_INVALID, 1, 0); /* old five-byte form */
    expect_decode("\xfc\x84\x80\x80\x80\x80", 6, UTF8_INVALID, 1, 0);
    expect_decode("\xfe", 1, UTF8_INVALID, 1, 0);
    expect_decode("\xff", 1, UTF8_INVALID, 1, 0);
}
END_TEST

START_TEST(test_lone_continuation_rejected) {
    for (unsigned b = 0x80; b <= 0xBF; b++) {
        const uint8_t s[2] = {(uint8_t)b, 'a'};
        size_t len;
        ck_assert_int_eq(utf8_decode(s, 2, NULL, &len), UTF8_INVALID);
        ck_assert_uint_eq(len, 1);
    }
}
END_TEST

START_TEST(test_bad_continuation_maximal_subpart) {
    expect_decode("\xc3\x41", 2, UTF8_INVALID, 1, 0);
    expect_decode("\xe2\x82\x41", 3, UTF8_INVALID, 2, 0);
    expect_decode("\xe2\x41\x82", 3, UTF8_INVALID, 1, 0);
    expect_decode("\xf0\x9f\x98\x41", 4, UTF8_INVALID, 3, 0);
    expect_decode("\xf0\x9f\xc3\xa9", 4, UTF8_INVALID, 2, 0); /* a new lead is no continuation */
    expect_decode("\xe2\x82\xe2\x82\xac", 5, UTF8_INVALID, 2, 0);
}
END_TEST

/* Unicode §3.9, Table 3-8: "61 F1 80 80 E1 80 C2 62 80 63 80 BF 64" reads as a, three U+FFFD, b,
 * one U+FFFD, c, two U+FFFD, d. Decoding step by step must find exactly those pieces. */
START_TEST(test_unicode_table_3_8) {
    static const uint8_t s[] = {0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2,
                                0x62, 0x80, 0x63, 0x80, 0xBF, 0x64};
    static const char want[] = "a???b?c??d";
    char got[sizeof want] = "";
    size_t o = 0;
    for (size_t i = 0; i < sizeof s;) {
        uint32_t cp;
        size_t len;
        const utf8_status st = utf8_decode(s + i, sizeof s - i, &cp, &len);
        ck_assert_uint_lt(o, sizeof want - 1);
        got[o++] = st == UTF8_OK ? (char)cp : '?';
        i += len;
    }
    got[o] = '\0';
    ck_assert_str_eq(got, want);
    ck_assert_uint_eq(utf8_validate(s, sizeof s), 1);
}
END_TEST

START_TEST(test_validate_names_first_bad_byte) {
    static const struct {
        const char *s;
        size_t first;
    } bad[] = {
        {"abc\xff", 3},
        {"\xc0\x80", 0},
        {"ok \xe0\x80\x80", 3},
        {"caf\xc3\xa9 \xed\xa0\x80", 6},
        {"caf\xc3\xa9 \xf4\x90\x80\x80", 6},
        {"a\x80z", 1},
        {"truncated \xe4\xb8", 10},
        {"\xe2\x82\xac\xf0\x9f\x98", 3},
    };
    for (size_t i = 0; i < N_OF(bad); i++)
        ck_assert_msg(utf8_validate(U8(bad[i].s), strlen(bad[i].s)) == bad[i].first,
                      "case %zu: first bad byte at %zu, expected %zu", i,
                      utf8_validate(U8(bad[i].s), strlen(bad[i].s)), bad[i].first);
}
END_TEST

/* What the tokenizer asks for to read text the way llama.cpp does. */
START_TEST(test_relaxed_decoding) {
    static const struct {
        const char *s;
        uint32_t allow;
        utf8_status status;
        size_t len;
        uint32_t cp;
    } cases[] = {
        {"\xc0\x80", UTF8_ALLOW_OVERLONG, UTF8_OK, 2, 0},
        {"\xc1\xbf", UTF8_ALLOW_OVERLONG, UTF8_OK, 2, 0x7F},
        {"\xe0\x80\x80", UTF8_ALLOW_OVERLONG, UTF8_OK, 3, 0},
        {"\xf0\x80\x80\x80", UTF8_ALLOW_OVERLONG, UTF8_OK, 4, 0},
        {"\xf0\x8f\xbf\xbf", UTF8_ALLOW_OVERLONG, UTF8_OK, 4, 0xFFFF},
        {"\xed\xa0\x80", UTF8_ALLOW_OVERLONG, UTF8_INVALID, 1, 0},
        {"\xed\xa0\x80", UTF8_ALLOW_SURROGATE, UTF8_OK, 3, 0xD800},
        {"\xed\xbf\xbf", UTF8_ALLOW_SURROGATE, UTF8_OK, 3, 0xDFFF},
        {"\xc0\x80", UTF8_ALLOW_SURROGATE, UTF8_INVALID, 1, 0},
        /* never above U+10FFFF, whatever is allowed */
        {"\xf4\x90\x80\x80", UTF8_ALLOW_OVERLONG | UTF8_ALLOW_SURROGATE, UTF8_INVALID, 1, 0},
        {"\xf5\x80\x80\x80", UTF8_ALLOW_OVERLONG | UTF8_ALLOW_SURROGATE, UTF8_INVALID, 1, 0},
        {"\x80", UTF8_ALLOW_OVERLONG | UTF8_ALLOW_SURROGATE, UTF8_INVALID, 1, 0},
        {"\xc0", UTF8_ALLOW_OVERLONG, UTF8_TRUNCATED, 1, 0},
        {"\xe0\x80", UTF8_ALLOW_OVERLONG, UTF8_TRUNCATED, 2, 0},
        {"\xc0\x41", UTF8_ALLOW_OVERLONG, UTF8_INVALID, 1, 0},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        uint32_t cp = 0xDEADBEEF;
        size_t len = 99;
        const utf8_status st =
            utf8_decode_relaxed(U8(cases[i].s), strlen(cases[i].s), cases[i].allow, &cp, &len);
        ck_assert_msg(st == cases[i].status && len == cases[i].len, "case %zu: status %d len %zu",
                      i, st, len);
        if (st == UTF8_OK) ck_assert_uint_eq(cp, cases[i].cp);
    }
}
END_TEST

START_TEST(test_escape_ill_formed) {
    static const struct {
        const char *in;
        size_t n;
        const char *out;
    } cases[] = {
        {"a\xff"
         "b",
         3, "a\\xffb"},
        {"\xc0\x80", 2, "\\xc0\\x80"},
        {"\xed\xa0\x80", 3, "\\xed\\xa0\\x80"},
        {"\xf4\x90\x80\x80", 4, "\\xf4\\x90\\x80\\x80"},
        {"cut \xe4\xb8", 6, "cut \\xe4\\xb8"},
        {"\xe2\x82\x41", 3, "\\xe2\\x82A"},
        {"nul\0here", 8, "nul\\x00here"},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        char out[64];
        const size_t need = utf8_escape(out, sizeof out, U8(cases[i].in), cases[i].n);
        ck_assert_str_eq(out, cases[i].out);
        ck_assert_uint_eq(need, strlen(cases[i].out));
    }
}
END_TEST

/* Random bytes (biased towards the bytes UTF-8 is made of) escaped into random output sizes:
 * the result is valid UTF-8 every time. */
START_TEST(test_escape_random_bytes_valid) {
    static const uint8_t alphabet[] = {'a',  0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xC2, 0xDF,
                                       0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0xA0};
    uint64_t rng = 42;
    for (int round = 0; round < 20000; round++) {
        uint8_t in[24];
        const size_t n = test_splitmix64(&rng) % sizeof in;
        for (size_t i = 0; i < n; i++) {
            const uint64_t r = test_splitmix64(&rng);
            in[i] = r & 1 ? alphabet[(r >> 1) % sizeof alphabet] : (uint8_t)(r >> 8);
        }
        char out[4 * sizeof in + 1];
        const size_t cap = test_splitmix64(&rng) % sizeof out + 1;
        const size_t need = utf8_escape(out, cap, in, n);
        const size_t len = strlen(out);
        EXPECT(len < cap && (need < cap ? len == need : 1), "round %d: %zu of %zu", round, len,
               need);
        EXPECT(utf8_validate(U8(out), len) == len, "round %d: escaped text is not UTF-8", round);
        EXPECT(utf8_cut(in, n, n / 2) <= n / 2, "round %d: cut beyond max", round);
    }
}
END_TEST

static Suite *utf8_suite(void) {
    Suite *s = suite_create("utf8");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_decode_known);
    tcase_add_test(core, test_encode_known);
    tcase_add_test(core, test_round_trip_every_scalar_value);
    tcase_add_test(core, test_shapes);
    tcase_add_test(core, test_validate_text);
    tcase_add_test(core, test_cut_each_length);
    tcase_add_test(core, test_escape_leaves_text_alone);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_class_boundaries);
    tcase_add_test(limits, test_truncated_at_end);
    tcase_add_test(limits, test_cut_every_position);
    tcase_add_test(limits, test_cut_ill_formed);
    tcase_add_test(limits, test_encode_limits);
    tcase_add_test(limits, test_escape_every_size);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_overlong_rejected);
    tcase_add_test(errors, test_surrogates_rejected);
    tcase_add_test(errors, test_above_max_rejected);
    tcase_add_test(errors, test_lone_continuation_rejected);
    tcase_add_test(errors, test_bad_continuation_maximal_subpart);
    tcase_add_test(errors, test_unicode_table_3_8);
    tcase_add_test(errors, test_validate_names_first_bad_byte);
    tcase_add_test(errors, test_relaxed_decoding);
    tcase_add_test(errors, test_escape_ill_formed);
    tcase_add_test(errors, test_escape_random_bytes_valid);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(utf8_suite)
