/*
 * test_constraint.c — Check suite for regex-constrained output (policies/include/corral/
 * constraint.h): the pattern compiler, the token masks, the matcher as a sampler processor inside
 * real generations, and the cache.
 *
 * The oracle is PCRE2 (a test-only dependency), never corral's own automaton: patterns are
 * compiled by PCRE2 in its JavaScript-compatible mode (\uXXXX, \u{...}); where ECMAScript and PCRE2
 * define a construct differently (`.`, `\s`), the corpus spells out the ECMAScript definition
 * for the oracle. Full matches use `(?:P)\z` anchored; "can this prefix still match?" uses PCRE2's
 * hard partial matching.
 *
 * Soundness (the issue's acceptance): every corpus pattern x SOUND_SAMPLES generations at
 * temperature 1.0 (no top-k/top-p/min-p: the widest sampling) on stories260K (512 tokens) and on a
 * 32000-token model made at test time with the llama-spm vocabulary; every output must match in
 * full and end by the constraint or end-of-generation. The sanitizer build runs fewer samples
 * (CORRAL_SANITIZE: it is several times slower, and the code paths are the same).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <check.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corral/constraint.h"
#include "corral/generate.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/synth.h"
#include "corral/utf8.h"
#include "regex.h" /* policies/src: the compiler's limits and cost counters */
#include "testutil.h"

#ifdef CORRAL_SANITIZE
#define SOUND_SAMPLES 8
#else
#define SOUND_SAMPLES 50
#endif
#define SOUND_MAX_TOKENS 160 /* above the longest match of any corpus pattern, in bytes */

/* ck_assert_msg records every passing check through a pipe: far too slow inside loops that run
 * millions of times. This fails the same way and costs nothing when the check passes. */
#define EXPECT(cond, ...)                       \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* ---- the corpus ------------------------------------------------------------------------------ */

typedef struct corpus_entry {
    const char *pattern;
    const char *oracle; /* the PCRE2 spelling when it differs; NULL: the same */
} corpus_entry;

/* ECMAScript's \s, written out for PCRE2 (whose \s without UCP is ASCII only). */
#define ES_SPACE \
    "\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"

static const corpus_entry corpus[] = {
    /* dates and times */
    {"\\d{4}-\\d{2}-\\d{2}", NULL},
    {"(19|20)\\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])", NULL},
    {"(0?[1-9]|[12]\\d|3[01])/(0?[1-9]|1[0-2])/\\d{4}", NULL},
    {"([01]\\d|2[0-3]):[0-5]\\d", NULL},
    {"([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d", NULL},
    {"(1[0-2]|0?[1-9]):[0-5]\\d ?(AM|PM|am|pm)", NULL},
    {"P\\d{1,3}D(T\\d{1,2}H)?", NULL},
    /* phone numbers */
    {"\\+?1?[ -]?\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}", NULL},
    {"\\+\\d{1,3} \\d{2,4} \\d{3,4} \\d{3,4}", NULL},
    {"0\\d{2,3}-\\d{7,8}", NULL},
    {"1[3-9]\\d{9}", NULL},
    /* enums of intents, yes/no */
    {"(turn_on|turn_off|set_temperature|play_music|stop|weather|timer)", NULL},
    {"greet|goodbye|affirm|deny|mood_great|mood_unhappy|bot_challenge", NULL},
    {"yes|no", NULL},
    {"(Yes|No)\\.", NULL},
    {"(true|false|null)", NULL},
    /* numbers */
    {"-?\\d{1,9}", NULL},
    {"-?(0|[1-9]\\d{0,8})", NULL},
    {"-?\\d{1,6}\\.\\d{1,4}", NULL},
    {"[+-]?(\\d{1,5}(\\.\\d{0,3})?|\\.\\d{1,3})", NULL},
    {"\\d{1,3}(,\\d{3}){0,3}", NULL},
    {"\\d{5}(-\\d{4})?", NULL},
    /* Chinese and punctuation, other scripts, emoji */
    {"[\\u4e00-\\u9fa5，。！？]{1,12}", NULL},
    {"[\\u4e00-\\u9fa5]{2,4}[，。！？]", NULL},
    {"[\\u00c0-\\u00ff]{1,5}", NULL},
    {"(\\u{1F600}|\\u{1F642}|\\u{1F622}){1,3}", NULL},
    /* flat JSON objects with fixed keys */
    {"\\{\"name\": \"[a-z]{1,10}\", \"age\": \\d{1,3}\\}", NULL},
    {"\\{\"intent\": \"(on|off|up|down)\", \"room\": \"[A-Za-z ]{1,12}\", \"level\": "
     "(\\d|[1-9]\\d|100)\\}",
     NULL},
    {"\\{\"ok\": (true|false), \"count\": -?\\d{1,4}, \"note\": \"[^\"\\\\\\n]{0,16}\"\\}", NULL},
    /* identifiers and formats */
    {"[a-z]{1,8}@[a-z]{1,8}\\.(com|org|net)", NULL},
    {"#[0-9a-fA-F]{6}", NULL},
    {"(\\d{1,3}\\.){3}\\d{1,3}", NULL},
    {"[A-Z][a-z]{1,10}( [A-Z][a-z]{1,10}){0,2}", NULL},
    {"\\w{1,10}", NULL},
    {"(Once|Lily|Tom)( [a-z]{1,8}){1,5}\\.", NULL},
    /* the constructs ECMAScript and PCRE2 define differently */
    {".{1,12}", "[^\\n\\r\\u2028\\u2029]{1,12}"},
    {"\\S{1,8}", "[^" ES_SPACE "]{1,8}"},
    {"[a-z]{1,6}\\s[a-z]{1,6}", "[a-z]{1,6}[" ES_SPACE "][a-z]{1,6}"},
};
#define N_CORPUS (sizeof corpus / sizeof corpus[0])

/* ---- the oracle ------------------------------------------------------------------------------ */

typedef struct oracle {
    pcre2_code *re;
    pcre2_match_data *md;
} oracle;

static void oracle_open(oracle *o, const corpus_entry *e) {
    const char *p = e->oracle ? e->oracle : e->pattern;
    char wrapped[1024];
    snprintf(wrapped, sizeof wrapped, "(?:%s)\\z", p);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
    int code;
    PCRE2_SIZE off;
    o->re = pcre2_compile((PCRE2_SPTR)wrapped, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_ALT_BSUX | PCRE2_ANCHORED, &code, &off, cc);
    pcre2_compile_context_free(cc);
    ck_assert_msg(o->re != NULL, "PCRE2 cannot compile %s (error %d at %zu)", wrapped, code,
                  (size_t)off);
    o->md = pcre2_match_data_create_from_pattern(o->re, NULL);
}

static void oracle_close(oracle *o) {
    pcre2_match_data_free(o->md);
    pcre2_code_free(o->re);
}

/* 1 if s[0..n) matches in full; 0 otherwise (invalid UTF-8 included). */
static int oracle_full(oracle *o, const char *s, size_t n) {
    return pcre2_match(o->re, (PCRE2_SPTR)s, n, 0, 0, o->md, NULL) >= 0;
}

/* 1 if s[0..n), which must be complete UTF-8, is a prefix of some match. */
static int oracle_viable_complete(oracle *o, const char *s, size_t n) {
    const int rc = pcre2_match(o->re, (PCRE2_SPTR)s, n, 0, PCRE2_PARTIAL_HARD, o->md, NULL);
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL;
}

/* Split s[0..n) into complete UTF-8 and an incomplete last character (the first 1-3 bytes of a
 * well-formed sequence). Returns the tail length (0 if none), or -1 for invalid UTF-8. */
static int utf8_tail(const unsigned char *s, size_t n) {
    for (size_t i = 0, len; i < n; i += len) {
        switch (utf8_decode(s + i, n - i, NULL, &len)) {
            case UTF8_OK:
                break;
            case UTF8_TRUNCATED:
                return (int)len;
            case UTF8_INVALID:
                return -1;
        }
    }
    return 0;
}

/* Prefix viability for any bytes: an incomplete last character is viable when some character it
 * can start is (enumerated; 0 when the character would need more than 4096 candidates: the
 * caller skips those). Returns 1, 0, or -1 for "not decided". */
static int oracle_viable(oracle *o, const char *s, size_t n) {
    const int tail = utf8_tail((const unsigned char *)s, n);
    if (tail < 0) return 0;
    if (tail == 0) return oracle_viable_complete(o, s, n);
    const unsigned char *t = (const unsigned char *)s + n - tail;
    const int len = (int)utf8_lead_length(t[0]);
    const int missing = len - tail;
    if (missing == 3) return -1; /* a lone 4-byte lead: 2^18 candidates */
    char buf[512];
    EXPECT(n + 3 < sizeof buf, "prefix too long");
    memcpy(buf, s, n);
    const uint32_t combos = 1u << (6 * missing);
    for (uint32_t v = 0; v < combos; v++) {
        for (int k = 0; k < missing; k++)
            buf[n + k] = (char)(0x80 | ((v >> (6 * (missing - 1 - k))) & 0x3F));
        if (utf8_tail((const unsigned char *)buf, n + missing) != 0) continue;
        if (oracle_viable_complete(o, buf, n + missing)) return 1;
    }
    return 0;
}

/* ---- helpers --------------------------------------------------------------------------------- */

static char tmp_dir[64];
static char synth32k_path[128];

static void make_synth32k(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/corral-constraint-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
    snprintf(synth32k_path, sizeof synth32k_path, "%s/synth32k.gguf", tmp_dir);
    synth_params p = synth_params_default();
    p.n_embd = 32;
    p.n_layer = 1;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 64;
    p.n_vocab = 32000;
    p.n_ctx = 256;
    p.seed = 7;
    p.n_threads = 1;
    p.vocab_from = test_shared_path("vocab/ggml-vocab-llama-spm.gguf");
    corral_error err;
    ck_assert_msg(synth_write(&p, synth32k_path, NULL, &err) == CORRAL_OK, "%s", err.message);
}

static void remove_synth32k(void) {
    unlink(synth32k_path);
    rmdir(tmp_dir);
}

static model *load(const char *path) {
    corral_error err;
    model *m = model_load(path, NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    return m;
}

static tokenizer *open_vocab(const char *rel, gguf_file **f) {
    corral_error err;
    *f = gguf_open(test_shared_path(rel), &err);
    ck_assert_msg(*f != NULL, "%s", err.message);
    tokenizer *t = tok_new_from_gguf(*f, &err);
    ck_assert_msg(t != NULL, "%s", err.message);
    return t;
}

static constraint *compile(constraint_index *ix, const char *pattern) {
    corral_error err;
    constraint *c = constraint_compile(ix, pattern, strlen(pattern), &err);
    ck_assert_msg(c != NULL, "%s: %s", pattern, err.message);
    return c;
}

/* ---- compiler: DFA language against PCRE2 -----------------------------------------------------
 */

/* Random strings over an alphabet built from the pattern's own characters, digits, letters,
 * punctuation, some non-ASCII text and raw bytes (invalid UTF-8 must never match). */
START_TEST(test_language_matches_pcre2) {
    gguf_file *f;
    tokenizer *t = open_vocab("vocab/ggml-vocab-llama-spm.gguf", &f);
    corral_error err;
    constraint_index *ix = constraint_index_new(t, &err);
    ck_assert_msg(ix != NULL, "%s", err.message);
    static const char *extra[] = {
        "0",  "1", "5", "9",    "a",        "z",    "A",        "Z",           "_",  " ",
        "-",  ".", ",", ":",    "\"",       "{",    "}",        "\n",          "\t", "好",
        "。", "é", "😀", "\xc3", "\xe4\xb8", "\xff", "\xc0\xaf", "\xed\xa0\x80"};
    uint64_t seed = 12345;
    for (size_t i = 0; i < N_CORPUS; i++) {
        constraint *c = compile(ix, corpus[i].pattern);
        oracle o;
        oracle_open(&o, &corpus[i]);
        /* The alphabet: every UTF-8 character of the pattern text, plus the extras. */
        const char *alpha[256];
        size_t alen[256], n_alpha = 0;
        const char *p = corpus[i].pattern;
        for (size_t k = 0; p[k] && n_alpha < 200;) {
            size_t len = 1;
            while (p[k + len] && utf8_is_continuation((uint8_t)p[k + len])) len++;
            alpha[n_alpha] = p + k;
            alen[n_alpha++] = len;
            k += len;
        }
        for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
            alpha[n_alpha] = extra[k];
            alen[n_alpha++] = strlen(extra[k]);
        }
        int matched = 0;
        for (int trial = 0; trial < 3000; trial++) {
            char s[256];
            size_t n = 0;
            const int len = (int)(test_splitmix64(&seed) % 24);
            for (int k = 0; k < len; k++) {
                const size_t a = test_splitmix64(&seed) % n_alpha;
                memcpy(s + n, alpha[a], alen[a]);
                n += alen[a];
            }
            const int want = oracle_full(&o, s, n), got = constraint_match(c, s, n);
            matched += want;
            EXPECT(want == got, "%s on \"%.*s\": PCRE2 %d, corral %d", corpus[i].pattern, (int)n, s,
                   want, got);
        }
        (void)matched;
        oracle_close(&o);
        constraint_destroy(&c);
    }
    constraint_index_destroy(&ix);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

/* The same comparison on strings built to be near-matches: the outputs of the soundness corpus
 * are checked elsewhere; here hand-written cases pin down the trickier constructs. */
START_TEST(test_constructs) {
    gguf_file *f;
    tokenizer *t = open_vocab("vocab/ggml-vocab-llama-spm.gguf", &f);
    constraint_index *ix = constraint_index_new(t, NULL);
    static const struct {
        const char *pattern, *text;
        int match;
    } cases[] = {
        {"a{2,3}", "aa", 1},
        {"a{2,3}", "aaaa", 0},
        {"a{2,}", "aaaaaaa", 1},
        {"a{0}b", "b", 1},
        {"x{,2}", "x{,2}", 1},
        {"a{", "a{", 1},
        {"a}", "a}", 1},
        {"]", "]", 1},
        {"[]]|]", "]", 1},
        {"[^]", "é", 1},
        {"[^]", "", 0},
        {"(?:ab)+", "ababab", 1},
        {"(?<year>\\d{4})", "2024", 1},
        {"a|", "", 1},
        {"^a$|^b$", "b", 1},
        {"a*?", "aaa", 1},
        {"a+?b", "aab", 1},
        {"\\x41\\u0042\\u{43}", "ABC", 1},
        {"\\uD83D\\uDE00", "😀", 1},
        {"[\\uD83D\\uDE00-\\uD83D\\uDE02]", "😁", 1},
        {"\\cJ", "\n", 1},
        {"\\0", "\0", 1},
        {"[\\b]", "\b", 1},
        {"[a-c-e]", "-", 1},
        {"[\\d-]", "-", 1},
        {"\\D", "é", 1},
        {"\\W", "\xe2\x80\x8b", 1},
        {"\\s", "\xe3\x80\x80", 1},
        {"\\s", "\xc2\x85", 0},
        {".", "\n", 0},
        {".", "\r", 0},
        {".", "\xe2\x80\xa8", 0},
        {".", "\xf4\x8f\xbf\xbf", 1},
        {".", "\xed\xa0\x80", 0},
        {"\\.", ".", 1},
        {"\\/", "/", 1},
        {"\\-", "-", 1},
        {"[\\-]", "-", 1},
        {"\\é", "é", 1},
        {"[^a]", "\xff", 0},
        {"(a|ab)(c|bcd)", "abcd", 1},
        {"", "", 1},
        {"", "x", 0},
        {"a?", "", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        constraint *c = compile(ix, cases[i].pattern);
        const size_t n =
            cases[i].text[0] || strcmp(cases[i].pattern, "\\0") ? strlen(cases[i].text) : 1;
        ck_assert_msg(constraint_match(c, cases[i].text, n) == cases[i].match,
                      "/%s/ on \"%s\": expected %d", cases[i].pattern, cases[i].text,
                      cases[i].match);
        constraint_destroy(&c);
    }
    constraint_index_destroy(&ix);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

START_TEST(test_unsupported_and_bad_syntax_named) {
    gguf_file *f;
    tokenizer *t = open_vocab("vocab/ggml-vocab-llama-spm.gguf", &f);
    constraint_index *ix = constraint_index_new(t, NULL);
    static const struct {
        const char *pattern, *says;
        corral_status status;
    } cases[] = {
        {"(a)\\1", "backreferences (\\1)", CORRAL_INVALID_ARGUMENT},
        {"(?<x>a)\\k<x>", "backreferences (\\k<name>)", CORRAL_INVALID_ARGUMENT},
        {"a(?=b)", "lookahead (?=", CORRAL_INVALID_ARGUMENT},
        {"a(?!b)", "lookahead (?!", CORRAL_INVALID_ARGUMENT},
        {"(?<=a)b", "lookbehind (?<=", CORRAL_INVALID_ARGUMENT},
        {"(?<!a)b", "lookbehind (?<!", CORRAL_INVALID_ARGUMENT},
        {"\\bword", "word-boundary", CORRAL_INVALID_ARGUMENT},
        {"a\\B", "word-boundary", CORRAL_INVALID_ARGUMENT},
        {"\\p{L}", "Unicode property escapes", CORRAL_INVALID_ARGUMENT},
        {"(?i)abc", "unsupported group syntax", CORRAL_INVALID_ARGUMENT},
        {"a^b", "'^' is supported only", CORRAL_INVALID_ARGUMENT},
        {"a$b", "'$' is supported only", CORRAL_INVALID_ARGUMENT},
        {"(a$)", "'$' is supported only", CORRAL_INVALID_ARGUMENT},
        {"*a", "nothing to repeat", CORRAL_INVALID_ARGUMENT},
        {"a**", "cannot follow another quantifier", CORRAL_INVALID_ARGUMENT},
        {"a{2}{3}", "cannot follow another quantifier", CORRAL_INVALID_ARGUMENT},
        {"(ab", "missing ')'", CORRAL_INVALID_ARGUMENT},
        {"ab)", "unmatched ')'", CORRAL_INVALID_ARGUMENT},
        {"[ab", "missing ']'", CORRAL_INVALID_ARGUMENT},
        {"[z-a]", "range out of order", CORRAL_INVALID_ARGUMENT},
        {"[a-\\d]", "class escape", CORRAL_INVALID_ARGUMENT},
        {"a{3,2}", "out of order", CORRAL_INVALID_ARGUMENT},
        {"\\q", "unknown escape \\q", CORRAL_INVALID_ARGUMENT},
        {"\\x4", "two hex digits", CORRAL_INVALID_ARGUMENT},
        {"\\u12", "four hex digits", CORRAL_INVALID_ARGUMENT},
        {"\\uD800", "lone surrogate", CORRAL_INVALID_ARGUMENT},
        {"\\u{110000}", "above U+10FFFF", CORRAL_INVALID_ARGUMENT},
        {"\\012", "octal", CORRAL_INVALID_ARGUMENT},
        {"abc\\", "lone backslash", CORRAL_INVALID_ARGUMENT},
        {"a\xff", "invalid UTF-8", CORRAL_INVALID_ARGUMENT},
        {"[]", "matches nothing", CORRAL_INVALID_ARGUMENT},
        {"a[^\\s\\S]b", "matches nothing", CORRAL_INVALID_ARGUMENT},
        {"a{1001}", "limit of 1000 (REGEX_MAX_REPEAT)", CORRAL_RESOURCE_EXHAUSTED},
        {"(a|b)*a(a|b){20}", "more than 10000 states (limit REGEX_MAX_DFA_STATES)",
         CORRAL_RESOURCE_EXHAUSTED},
        {"((((a{1000}){1000})))", "too large: the repetition {1000} at offset 12",
         CORRAL_RESOURCE_EXHAUSTED},
        {"((a|b){0,12}){0,1000}", "(limit REGEX_MAX_COMPILE_WORK)", CORRAL_RESOURCE_EXHAUSTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        corral_error err;
        constraint *c = constraint_compile(ix, cases[i].pattern, strlen(cases[i].pattern), &err);
        ck_assert_msg(c == NULL, "/%s/ compiled", cases[i].pattern);
        ck_assert_msg(err.status == cases[i].status, "/%s/: status %s (%s)", cases[i].pattern,
                      corral_status_name(err.status), err.message);
        ck_assert_msg(strstr(err.message, cases[i].says) != NULL, "/%s/: \"%s\" lacks \"%s\"",
                      cases[i].pattern, err.message, cases[i].says);
    }
    /* nesting and length limits */
    char deep[400];
    memset(deep, '(', 200);
    memset(deep + 200, ')', 200);
    corral_error err;
    ck_assert_ptr_null(constraint_compile(ix, deep, sizeof deep, &err));
    ck_assert_int_eq(err.status, CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_ptr_nonnull(strstr(err.message, "nested deeper than 128 (limit REGEX_MAX_DEPTH)"));
    char *longp = malloc(9000);
    memset(longp, 'a', 9000);
    ck_assert_ptr_null(constraint_compile(ix, longp, 9000, &err));
    ck_assert_ptr_nonnull(strstr(err.message, "limit is 8192 (REGEX_MAX_PATTERN)"));
    free(longp);
    constraint_index_destroy(&ix);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

/* ---- masks against the oracle -------------------------------------------------------------------
 */

/* For prefixes reached by walking a pattern with random tokens, every token's verdict (through
 * `allowed` before the state's set exists, through the mask, and through `allowed` after) must
 * equal the oracle's "prefix + token bytes can still match" (end-of-generation tokens: "prefix
 * matches in full"; tokens that add no bytes: never). */
static void check_masks(const char *vocab_rel, const size_t *which, size_t n_which, int walks) {
    gguf_file *f;
    tokenizer *t = open_vocab(vocab_rel, &f);
    corral_error err;
    constraint_index *ix = constraint_index_new(t, &err);
    ck_assert_msg(ix != NULL, "%s", err.message);
    const int32_t n_vocab = tok_vocab_size(t);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    char *piece = malloc(tok_max_piece_len(t) + 8);
    uint64_t seed = 99;
    int undecided = 0;
    for (size_t w = 0; w < n_which; w++) {
        const corpus_entry *e = &corpus[which[w]];
        constraint *c = compile(ix, e->pattern);
        oracle o;
        oracle_open(&o, e);
        for (int walk = 0; walk < walks; walk++) {
            constraint_matcher *m = constraint_matcher_new(c, &err);
            char prefix[256];
            size_t n_prefix = 0;
            for (int step = 0; step < 6 && constraint_matcher_finished(m) == 0; step++) {
                /* verdicts before the mask exists (DFA walk), from the mask, and after */
                for (int32_t id = 0; id < n_vocab; id++) logits[id] = 0.0f;
                int *before = malloc((size_t)n_vocab * sizeof *before);
                for (int32_t id = 0; id < n_vocab; id++)
                    before[id] = constraint_matcher_allowed(m, id);
                constraint_matcher_mask(m, logits, n_vocab);
                int32_t n_allowed = 0, pick = -1;
                for (int32_t id = 0; id < n_vocab; id++) {
                    const int masked = logits[id] == -INFINITY ? 0 : 1;
                    const int after = constraint_matcher_allowed(m, id);
                    EXPECT(before[id] == masked && after == masked,
                           "/%s/ token %d: allowed %d, mask %d, allowed again %d", e->pattern, id,
                           before[id], masked, after);
                    int want;
                    size_t n = 0;
                    if (tok_is_eog(t, id)) {
                        want = oracle_full(&o, prefix, n_prefix);
                    } else {
                        tok_decode_piece(t, id, 0, piece, tok_max_piece_len(t) + 8, &n, NULL);
                        if (n == 0 || n_prefix + n > 200) {
                            want = n == 0 ? 0 : masked;
                        } else {
                            memcpy(prefix + n_prefix, piece, n);
                            want = oracle_viable(&o, prefix, n_prefix + n);
                        }
                    }
                    if (want < 0) {
                        undecided++;
                        want = masked;
                    }
                    EXPECT(want == masked,
                           "/%s/ after \"%.*s\": token %d (\"%.*s\") oracle %d, mask %d",
                           e->pattern, (int)n_prefix, prefix, id, (int)n, piece, want, masked);
                    if (masked && !tok_is_eog(t, id) &&
                        (pick < 0 || test_splitmix64(&seed) % 4 == 0))
                        pick = id;
                    n_allowed += masked;
                }
                free(before);
                ck_assert_int_gt(n_allowed, 0);
                if (pick < 0) break; /* only end-of-generation is left */
                size_t n = 0;
                tok_decode_piece(t, pick, 0, piece, tok_max_piece_len(t) + 8, &n, NULL);
                ck_assert_int_eq(constraint_matcher_accept(m, pick), CORRAL_OK);
                memcpy(prefix + n_prefix, piece, n);
                n_prefix += n;
            }
            constraint_matcher_destroy(&m);
        }
        oracle_close(&o);
        constraint_destroy(&c);
    }
    /* lone 4-byte lead bytes are the only undecided verdicts: a handful per state */
    ck_assert_int_lt(undecided, 20 * (int)n_which * walks * 6);
    free(logits);
    free(piece);
    constraint_index_destroy(&ix);
    tok_destroy(&t);
    gguf_destroy(&f);
}

START_TEST(test_masks_exact_stories_vocab) {
    size_t all[N_CORPUS];
    for (size_t i = 0; i < N_CORPUS; i++) all[i] = i;
    check_masks("models/stories260K.gguf", all, N_CORPUS, 2);
}
END_TEST

START_TEST(test_masks_exact_32k_vocab) {
    static const size_t some[] = {0, 5, 8, 13, 18, 22, 25, 28, 35, 36};
#ifdef CORRAL_SANITIZE
    check_masks("vocab/ggml-vocab-llama-spm.gguf", some, 4, 1);
#else
    check_masks("vocab/ggml-vocab-llama-spm.gguf", some, sizeof some / sizeof some[0], 1);
#endif
}
END_TEST

/* ---- soundness in real generations ----------------------------------------------------------- */

typedef struct sound_stats {
    int runs, eog, constraint, diverse; /* diverse: patterns with >= 2 distinct outputs */
} sound_stats;

static void soundness_on(const char *path, int samples, sound_stats *stats) {
    model *m = load(path);
    const tokenizer *t = model_get_tokenizer(m);
    corral_error err;
    constraint_cache *cc = constraint_cache_new(t, 0, &err);
    EXPECT(cc != NULL, "%s", err.message);
    kv_cache *kv = kv_cache_new(m, 256, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    ck_assert_ptr_nonnull(kv);
    ck_assert_ptr_nonnull(r);
    int32_t *prompt;
    size_t n_prompt;
    const char *text = "Once upon a time";
    ck_assert_int_eq(prompt_tokenize_text(t, text, strlen(text), &prompt, &n_prompt, &err),
                     CORRAL_OK);
    char *outputs = malloc((size_t)samples * 512);
    for (size_t i = 0; i < N_CORPUS; i++) {
        const corpus_entry *e = &corpus[i];
        constraint *c = constraint_compile_cached(cc, e->pattern, strlen(e->pattern), &err);
        EXPECT(c != NULL, "%s: %s", e->pattern, err.message);
        oracle o;
        oracle_open(&o, e);
        int distinct = 0;
        for (int s = 0; s < samples; s++) {
            constraint_matcher *mt = constraint_matcher_new(c, &err);
            sampler_processor proc = constraint_matcher_processor(mt);
            gen_params gp = gen_params_default();
            gp.sampling.temperature = 1.0f;
            gp.sampling.top_k = 0;
            gp.sampling.top_p = 1.0f;
            gp.sampling.min_p = 0.0f;
            gp.sampling.seed = 1000003ull * i + (uint64_t)s;
            gp.max_tokens = SOUND_MAX_TOKENS;
            gp.processor = &proc;
            kv_cache_truncate(kv, 0);
            generator *g = gen_new(m, r, kv, &gp, &err);
            EXPECT(g != NULL, "%s", err.message);
            EXPECT(gen_prefill(g, prompt, (uint32_t)n_prompt, &err) == CORRAL_OK, "%s",
                   err.message);
            char out[512];
            size_t len = 0;
            int32_t ids[SOUND_MAX_TOKENS + 1];
            int n_ids = 0;
            gen_token tk;
            do {
                EXPECT(gen_next(g, &tk, &err) == CORRAL_OK, "/%s/: %s", e->pattern, err.message);
                if (tk.id >= 0 && !tok_is_eog(t, tk.id)) ids[n_ids++] = tk.id;
                EXPECT(len + tk.len < sizeof out, "output too long");
                memcpy(out + len, tk.text, tk.len);
                len += tk.len;
            } while (tk.stop == GEN_STOP_NONE);
            EXPECT(tk.stop == GEN_STOP_CONSTRAINT || tk.stop == GEN_STOP_EOG,
                   "/%s/ sample %d stopped by %s: \"%.*s\"", e->pattern, s, gen_stop_name(tk.stop),
                   (int)len, out);
            stats->eog += tk.stop == GEN_STOP_EOG;
            stats->constraint += tk.stop == GEN_STOP_CONSTRAINT;
            EXPECT(oracle_full(&o, out, len), "/%s/ sample %d: \"%.*s\" does not match", e->pattern,
                   s, (int)len, out);
            /* the streamed text is exactly the tokens' bytes */
            char dec[512];
            size_t n_dec = 0;
            EXPECT(tok_decode(t, ids, (size_t)n_ids, 0, dec, sizeof dec, &n_dec, &err) == CORRAL_OK,
                   "%s", err.message);
            EXPECT(n_dec == len && memcmp(dec, out, len) == 0,
                   "/%s/: the streamed text is not the tokens' bytes", e->pattern);
            EXPECT(constraint_matcher_is_accepting(mt), "/%s/: the matcher does not accept",
                   e->pattern);
            /* diversity: sampling at temperature 1 must explore */
            int seen = 0;
            for (int k = 0; k < s && !seen; k++)
                seen = strlen(outputs + (size_t)k * 512) == len &&
                       memcmp(outputs + (size_t)k * 512, out, len) == 0;
            distinct += !seen;
            memcpy(outputs + (size_t)s * 512, out, len);
            outputs[(size_t)s * 512 + len] = '\0';
            stats->runs++;
            gen_destroy(&g);
            constraint_matcher_destroy(&mt);
        }
        stats->diverse += distinct >= 2;
        oracle_close(&o);
        constraint_destroy(&c);
    }
    uint64_t hits, misses;
    constraint_cache_stats(cc, &hits, &misses);
    ck_assert_uint_eq(misses, N_CORPUS);
    free(outputs);
    free(prompt);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    constraint_cache_destroy(&cc);
    model_destroy(&m);
}

START_TEST(test_soundness_stories260K) {
    sound_stats st = {0};
    soundness_on(test_shared_path("models/stories260K.gguf"), SOUND_SAMPLES, &st);
    ck_assert_int_eq(st.runs, (int)N_CORPUS * SOUND_SAMPLES);
    /* Both ways of ending happen, and sampling explores: most patterns get several different
     * outputs (a few, like (Yes|No)\., may meet a model that always prefers one). */
    ck_assert_int_gt(st.eog, 0);
    ck_assert_int_gt(st.constraint, 0);
    ck_assert_int_ge(st.diverse, (int)N_CORPUS * 3 / 4);
}
END_TEST

START_TEST(test_soundness_32k_vocab) {
    sound_stats st = {0};
    soundness_on(synth32k_path, SOUND_SAMPLES, &st);
    ck_assert_int_eq(st.runs, (int)N_CORPUS * SOUND_SAMPLES);
    ck_assert_int_gt(st.constraint, 0);
    ck_assert_int_ge(st.diverse, (int)N_CORPUS * 3 / 4);
}
END_TEST

/* ---- matcher and generator behaviour ----------------------------------------------------------
 */

START_TEST(test_matcher_states_and_eog) {
    model *m = load(test_shared_path("models/stories260K.gguf"));
    const tokenizer *t = model_get_tokenizer(m);
    corral_error err;
    constraint_index *ix = constraint_index_new(t, &err);
    ck_assert_uint_gt(constraint_index_n_tokens(ix), 400);
    ck_assert_uint_gt(constraint_index_n_nodes(ix), constraint_index_n_tokens(ix) / 2);
    constraint *c = compile(ix, "ab?");
    constraint_matcher *mt = constraint_matcher_new(c, &err);
    const int32_t eos = tok_eos(t), bos = tok_bos(t);
    const int32_t a = tok_find_token(t, "a", 1), b = tok_find_token(t, "b", 1);
    ck_assert_int_ge(a, 0);
    ck_assert_int_ge(b, 0);
    ck_assert(!constraint_matcher_allowed(mt, eos)); /* "" does not match */
    ck_assert(!constraint_matcher_allowed(mt, bos)); /* adds no bytes */
    ck_assert(!constraint_matcher_allowed(mt, -1));
    ck_assert(!constraint_matcher_allowed(mt, 1 << 20));
    ck_assert_int_eq(constraint_matcher_accept(mt, b), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(constraint_matcher_accept(mt, eos), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(constraint_matcher_finished(mt), 0);
    ck_assert_int_eq(constraint_matcher_accept(mt, a), CORRAL_OK);
    ck_assert(constraint_matcher_is_accepting(mt));
    ck_assert_int_eq(constraint_matcher_finished(mt), 0); /* "ab" is still possible */
    ck_assert(constraint_matcher_allowed(mt, eos));
    ck_assert(constraint_matcher_allowed(mt, b));
    ck_assert_int_eq(constraint_matcher_accept(mt, eos), CORRAL_OK);
    ck_assert_int_eq(constraint_matcher_finished(mt), 1);
    ck_assert(!constraint_matcher_allowed(mt, b));
    constraint_matcher_reset(mt);
    ck_assert_int_eq(constraint_matcher_accept(mt, a), CORRAL_OK);
    ck_assert_int_eq(constraint_matcher_accept(mt, b), CORRAL_OK);
    ck_assert_int_eq(constraint_matcher_finished(mt), 1); /* accepting, no way on */
    /* The masks were built lazily, never more than the DFA's states. */
    ck_assert_uint_le(constraint_n_masks_built(c), constraint_n_states(c));
    ck_assert_str_eq(constraint_pattern(c), "ab?");
    constraint_matcher_destroy(&mt);
    constraint_matcher_destroy(&mt); /* NULL-safe */
    constraint_destroy(&c);
    constraint_index_destroy(&ix);
    model_destroy(&m);
}
END_TEST

/* The empty pattern ends a generation before any token; a pattern the vocabulary cannot spell
 * fails it with an error. */
START_TEST(test_generation_edges) {
    model *m = load(test_shared_path("models/stories260K.gguf"));
    const tokenizer *t = model_get_tokenizer(m);
    corral_error err;
    constraint_index *ix = constraint_index_new(t, NULL);
    kv_cache *kv = kv_cache_new(m, 64, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    const int32_t bos = tok_bos(t);
    /* "" */
    constraint *c = compile(ix, "");
    constraint_matcher *mt = constraint_matcher_new(c, &err);
    sampler_processor proc = constraint_matcher_processor(mt);
    gen_params gp = gen_params_default();
    gp.processor = &proc;
    generator *g = gen_new(m, r, kv, &gp, &err);
    ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_OK);
    gen_token tk;
    ck_assert_int_eq(gen_next(g, &tk, &err), CORRAL_OK);
    ck_assert_int_eq(tk.stop, GEN_STOP_CONSTRAINT);
    ck_assert_int_eq(tk.id, -1);
    ck_assert_uint_eq(tk.len, 0);
    gen_destroy(&g);
    constraint_matcher_destroy(&mt);
    constraint_destroy(&c);
    /* NUL bytes: the stories vocabulary has a byte token <0x00>, so \0 can be produced... */
    c = compile(ix, "\\0x");
    mt = constraint_matcher_new(c, &err);
    proc = constraint_matcher_processor(mt);
    gp.processor = &proc;
    kv_cache_truncate(kv, 0);
    g = gen_new(m, r, kv, &gp, &err);
    ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_OK);
    char out[16];
    size_t len = 0;
    do {
        ck_assert_int_eq(gen_next(g, &tk, &err), CORRAL_OK);
        memcpy(out + len, tk.text, tk.len);
        len += tk.len;
    } while (tk.stop == GEN_STOP_NONE);
    ck_assert_int_eq(tk.stop, GEN_STOP_CONSTRAINT);
    ck_assert_uint_eq(len, 2);
    ck_assert(out[0] == 0 && out[1] == 'x');
    gen_destroy(&g);
    constraint_matcher_destroy(&mt);
    constraint_destroy(&c);
    constraint_index_destroy(&ix);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
}
END_TEST

/* A vocabulary that cannot spell what a pattern needs next: the matcher reports the stuck state
 * (the generator turns it into an error: test_generate covers that path). The vocabulary is
 * written here: <unk>, <s>, </s>, "a", "b" and no byte tokens. */
START_TEST(test_stuck_state_is_reported) {
    char dir[] = "/tmp/corral-constraint-vocab-XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    gguf_builder *b = gguf_builder_new();
    const char *toks[] = {"<unk>", "<s>", "</s>", "a", "b"};
    const float scores[] = {0, 0, 0, -1, -2};
    const int32_t types[] = {2, 3, 3, 1, 1};
    gguf_builder_set_str(b, "tokenizer.ggml.model", "llama");
    gguf_builder_set_str_array(b, "tokenizer.ggml.tokens", toks, 5);
    gguf_builder_set_array(b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 5);
    gguf_builder_set_array(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 5);
    gguf_builder_set_u32(b, "tokenizer.ggml.bos_token_id", 1);
    gguf_builder_set_u32(b, "tokenizer.ggml.eos_token_id", 2);
    gguf_builder_set_u32(b, "tokenizer.ggml.unknown_token_id", 0);
    corral_error err;
    ck_assert_msg(gguf_builder_write(b, path, &err) == CORRAL_OK, "%s", err.message);
    gguf_builder_destroy(&b);
    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    tokenizer *t = tok_new_from_gguf(f, &err);
    ck_assert_msg(t != NULL, "%s", err.message);
    unlink(path);
    rmdir(dir);

    constraint_index *ix = constraint_index_new(t, &err);
    ck_assert_uint_eq(constraint_index_n_tokens(ix), 2);
    constraint *c = compile(ix, "ac|b");
    constraint_matcher *m = constraint_matcher_new(c, &err);
    float logits[5] = {0, 0, 0, 0, 0};
    ck_assert_int_eq(constraint_matcher_accept(m, 3), CORRAL_OK); /* "a" */
    ck_assert_int_eq(constraint_matcher_finished(m), 0);          /* not known before a mask */
    constraint_matcher_mask(m, logits, 5);
    for (int i = 0; i < 5; i++) ck_assert(logits[i] == -INFINITY);
    ck_assert_int_eq(constraint_matcher_finished(m), CORRAL_FAILED_PRECONDITION);
    /* the same through a sampler: no token can be drawn */
    constraint_matcher_reset(m);
    ck_assert_int_eq(constraint_matcher_accept(m, 3), CORRAL_OK);
    sampler_params sp = sampler_params_default();
    sampler *smp = sampler_new(&sp, 5, &err);
    sampler_processor proc = constraint_matcher_processor(m);
    sampler_set_processor(smp, &proc);
    for (int i = 0; i < 5; i++) logits[i] = 0;
    ck_assert_int_eq(sampler_sample(smp, logits), CORRAL_FAILED_PRECONDITION);
    ck_assert_int_eq(sampler_finished(smp), CORRAL_FAILED_PRECONDITION);
    /* an accepting state with nothing allowed is complete instead: "b" then nothing (no EOS
     * would still be allowed there; here </s> is the EOS and is allowed, so use a mask check) */
    constraint_matcher_reset(m);
    ck_assert_int_eq(sampler_accept(smp, 4), CORRAL_OK); /* "b" via the processor's accept */
    ck_assert_int_eq(sampler_finished(smp), 1);          /* accepting, no way on */
    sampler_destroy(&smp);
    constraint_matcher_destroy(&m);
    constraint_destroy(&c);
    constraint_index_destroy(&ix);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

/* ---- cache ----------------------------------------------------------------------------------- */

START_TEST(test_cache_hits_evicts_and_outlives) {
    gguf_file *f;
    tokenizer *t = open_vocab("vocab/ggml-vocab-llama-spm.gguf", &f);
    corral_error err;
    constraint_cache *cc = constraint_cache_new(t, 2, &err);
    constraint *a = constraint_compile_cached(cc, "yes|no", 6, &err);
    constraint *a2 = constraint_compile_cached(cc, "yes|no", 6, &err);
    ck_assert_ptr_eq(a, a2);
    constraint *b = constraint_compile_cached(cc, "\\d+", 3, &err);
    constraint *c = constraint_compile_cached(cc, "[a-z]", 5, &err); /* evicts yes|no */
    constraint *a3 = constraint_compile_cached(cc, "yes|no", 6, &err);
    ck_assert_ptr_ne(a3, a); /* recompiled */
    ck_assert_ptr_null(constraint_compile_cached(cc, "(", 1, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    uint64_t hits, misses;
    constraint_cache_stats(cc, &hits, &misses);
    ck_assert_uint_eq(hits, 1);
    ck_assert_uint_eq(misses, 4);
    /* constraints outlive the cache (and its index) */
    constraint_cache_destroy(&cc);
    ck_assert_ptr_null(cc);
    constraint_matcher *m = constraint_matcher_new(a, &err);
    const int32_t yes = tok_find_token(t, "\xe2\x96\x81yes", 4);
    ck_assert_int_ge(yes, 0); /* "▁yes": decodes to " yes", which yes|no does not allow */
    ck_assert(!constraint_matcher_allowed(m, yes));
    const int32_t y = tok_find_token(t, "y", 1);
    ck_assert(constraint_matcher_allowed(m, y));
    constraint_matcher_destroy(&m);
    constraint_destroy(&a);
    constraint_destroy(&a2);
    constraint_destroy(&a3);
    constraint_destroy(&b);
    constraint_destroy(&c);
    constraint_cache_destroy(&cc);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

START_TEST(test_bad_arguments) {
    corral_error err;
    ck_assert_ptr_null(constraint_index_new(NULL, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_null(constraint_compile(NULL, "a", 1, &err));
    ck_assert_ptr_null(constraint_cache_new(NULL, 0, &err));
    ck_assert_ptr_null(constraint_compile_cached(NULL, "a", 1, &err));
    ck_assert_ptr_null(constraint_matcher_new(NULL, &err));
    constraint_index_destroy(NULL);
    constraint_destroy(NULL);
    constraint_cache_destroy(NULL);
    constraint_matcher_destroy(NULL);
    ck_assert_ptr_null(constraint_pattern(NULL));
    ck_assert_uint_eq(constraint_n_states(NULL), 0);
}
END_TEST

/* ---- the compile budget ---------------------------------------------------------------------- */

/* Pattern texts too long to write out, built into buf (at least REGEX_MAX_PATTERN + 1 bytes);
 * each returns its length. */

/* n bytes of prose with no metacharacters: a literal. */
static size_t gen_text(char *buf, size_t n) {
    static const char words[] = "the quick brown fox jumps over the lazy dog, 0123456789; ";
    for (size_t i = 0; i < n; i++) buf[i] = words[(i * 7 + i / 57) % (sizeof words - 1)];
    return n;
}

/* n bytes of 'a': a literal that is its own longest border (the worst case for a search). */
static size_t gen_same(char *buf, size_t n) {
    memset(buf, 'a', n);
    return n;
}

/* Up to n bytes of six-letter words joined by '|'. */
static size_t gen_words(char *buf, size_t n) {
    size_t len = 0;
    for (uint32_t i = 0;; i++) {
        uint32_t v = i * 7919u + 13u;
        if (len + (i ? 7 : 6) > n) break;
        if (i) buf[len++] = '|';
        for (int k = 0; k < 6; k++, v /= 26) buf[len++] = (char)('a' + v % 26);
    }
    return len;
}

/* A class of up to n bytes of separate code points \uXXXX, then `tail` (a quantifier). */
static size_t gen_class(char *buf, size_t n, const char *tail) {
    size_t len = 0;
    buf[len++] = '[';
    for (uint32_t i = 0; len + 7 + strlen(tail) < n; i++)
        len += (size_t)snprintf(buf + len, 8, "\\u%04X", 0x100u + 3u * i);
    buf[len++] = ']';
    memcpy(buf + len, tail, strlen(tail));
    return len + strlen(tail);
}

/* Groups nested as deep as allowed around "a", each with quantifier q, repeated up to n bytes. */
static size_t gen_nested(char *buf, size_t n, const char *q) {
    const size_t d = REGEX_MAX_DEPTH, ql = strlen(q), one = d + 1 + d * (1 + ql);
    size_t len = 0;
    while (len + one <= n) {
        memset(buf + len, '(', d);
        len += d;
        buf[len++] = 'a';
        for (size_t i = 0; i < d; i++) {
            buf[len++] = ')';
            memcpy(buf + len, q, ql);
            len += ql;
        }
    }
    return len;
}

/* The counters never pass their limits, whatever happened. */
static void expect_within_limits(const regex_stats *st, const char *what) {
    EXPECT(st->work <= REGEX_MAX_COMPILE_WORK, "%s: %llu steps", what,
           (unsigned long long)st->work);
    EXPECT(st->peak_bytes <= REGEX_MAX_COMPILE_BYTES, "%s: %llu bytes", what,
           (unsigned long long)st->peak_bytes);
    EXPECT(st->nfa_states <= REGEX_MAX_NFA_STATES && st->nfa_edges <= REGEX_MAX_NFA_EDGES,
           "%s: %u NFA states, %u edges", what, st->nfa_states, st->nfa_edges);
    EXPECT(st->dfa_states <= REGEX_MAX_DFA_STATES, "%s: %u DFA states", what, st->dfa_states);
}

enum { GEN_NONE, GEN_TEXT, GEN_SAME, GEN_WORDS, GEN_CLASS, GEN_NESTED, GEN_DEEP };

typedef struct hostile {
    const char *pattern; /* or the argument of the generator */
    int gen;
    size_t gen_len;
    uint32_t flags;
    const char *limit, *says; /* the limit named, and more of the message (or NULL) */
} hostile;

/* Every shape that made the compiler run for seconds or gigabytes is refused, quickly, with the
 * limit it hit named and every counter within its limit; the ASan build checks that nothing
 * leaks on the way out. Without the work limit, the issue's reproducer would run for a minute
 * and then fail at another limit, so the message check catches a budget that was taken out. */
START_TEST(test_hostile_patterns_refused_within_budget) {
    static const hostile cases[] = {
        /* the issue's reproducer: 12001 DFA states, each a subset of some 10^5 NFA states */
        {"((a|b){0,12}){0,1000}", GEN_NONE, 0, 0, "REGEX_MAX_COMPILE_WORK", "steps"},
        {"(.?){1000}", GEN_NONE, 0, 0, "REGEX_MAX_COMPILE_WORK", NULL},
        {"([\\s\\S]?){1000}", GEN_NONE, 0, 0, "REGEX_MAX_COMPILE_WORK", NULL},
        /* nested counted repetitions: refused at the outer one, before it is expanded */
        {"((a{0,100}){0,100}){0,100}", GEN_NONE, 0, 0, "REGEX_MAX_NFA_STATES",
         "the repetition {0,100} at offset 19"},
        {"((((a{1000}){1000})))", GEN_NONE, 0, 0, "REGEX_MAX_NFA_STATES",
         "the repetition {1000} at offset 12"},
        /* DFA blow-ups */
        {"(a|b)*a(a|b){20}", GEN_NONE, 0, 0, "REGEX_MAX_DFA_STATES", "more than 10000 states"},
        {".*a.{20}", GEN_NONE, 0, 0, "REGEX_MAX_DFA_STATES", NULL},
        {"[\\s\\S]{1000}", GEN_NONE, 0, 0, "REGEX_MAX_DFA_STATES", NULL},
        {"(a|b)*a(a|b){20}", GEN_NONE, 0, REGEX_SEARCH, "REGEX_MAX_DFA_STATES", NULL},
        /* a huge class repeated; groups nested to the limit, each counted */
        {"{1000}", GEN_CLASS, REGEX_MAX_PATTERN, 0, "REGEX_MAX_NFA_STATES",
         "the repetition {1000}"},
        {"{2}", GEN_NESTED, REGEX_MAX_PATTERN, 0, "REGEX_MAX_NFA_STATES", "the repetition {2}"},
        {"", GEN_NESTED, REGEX_MAX_PATTERN, REGEX_SEARCH, NULL, NULL}, /* compiles: see below */
        /* searches for 8 KiB of text that overlaps itself, and for 8 KiB of alternatives */
        {NULL, GEN_SAME, REGEX_MAX_PATTERN, REGEX_SEARCH, "REGEX_MAX_COMPILE_WORK", NULL},
        {NULL, GEN_WORDS, REGEX_MAX_PATTERN, REGEX_SEARCH, "REGEX_MAX_COMPILE_WORK", NULL},
        /* the syntax limits */
        {"a{1001}", GEN_NONE, 0, 0, "REGEX_MAX_REPEAT", "limit of 1000"},
        {NULL, GEN_DEEP, REGEX_MAX_DEPTH + 1, 0, "REGEX_MAX_DEPTH", "nested deeper than 128"},
        {NULL, GEN_TEXT, REGEX_MAX_PATTERN + 1, 0, "REGEX_MAX_PATTERN", "limit is 8192"},
    };
    char *buf = malloc(REGEX_MAX_PATTERN + 64);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hostile *h = &cases[i];
        size_t len = 0;
        switch (h->gen) {
            case GEN_NONE:
                len = strlen(h->pattern);
                memcpy(buf, h->pattern, len);
                break;
            case GEN_TEXT:
                len = gen_text(buf, h->gen_len);
                break;
            case GEN_SAME:
                len = gen_same(buf, h->gen_len);
                break;
            case GEN_WORDS:
                len = gen_words(buf, h->gen_len);
                break;
            case GEN_CLASS:
                len = gen_class(buf, h->gen_len, h->pattern);
                break;
            case GEN_NESTED:
                len = gen_nested(buf, h->gen_len, h->pattern);
                break;
            case GEN_DEEP: /* gen_len groups, one inside the other */
                memset(buf, '(', h->gen_len);
                buf[h->gen_len] = 'a';
                memset(buf + h->gen_len + 1, ')', h->gen_len);
                len = 2 * h->gen_len + 1;
                break;
        }
        regex_dfa d;
        regex_stats st;
        corral_error err;
        const corral_status rc = regex__compile(buf, len, h->flags, &d, &st, &err);
        char what[96];
        snprintf(what, sizeof what, "case %zu /%.40s/ (%zu bytes, flags %u)", i, buf, len,
                 (unsigned)h->flags);
        expect_within_limits(&st, what);
        if (!h->limit) { /* nested groups in a search: small, bounded, fine */
            ck_assert_msg(rc == CORRAL_OK, "%s: %s", what, err.message);
            regex__free(&d);
            continue;
        }
        ck_assert_msg(rc == CORRAL_RESOURCE_EXHAUSTED, "%s: %s (%s)", what, corral_status_name(rc),
                      rc ? err.message : "compiled");
        ck_assert_msg(strstr(err.message, h->limit), "%s: \"%s\" does not name %s", what,
                      err.message, h->limit);
        ck_assert_msg(!h->says || strstr(err.message, h->says), "%s: \"%s\" lacks \"%s\"", what,
                      err.message, h->says);
        ck_assert_ptr_null(d.next); /* nothing handed back */
    }
    free(buf);
}
END_TEST

/* The issue's reproducer through the public API: the same error, and the constraint layer does
 * not hide it. */
START_TEST(test_issue_reproducer_through_constraint_compile) {
    gguf_file *f;
    tokenizer *t = open_vocab("vocab/ggml-vocab-llama-spm.gguf", &f);
    constraint_index *ix = constraint_index_new(t, NULL);
    const char *p = "((a|b){0,12}){0,1000}";
    corral_error err;
    ck_assert_ptr_null(constraint_compile(ix, p, strlen(p), &err));
    ck_assert_int_eq(err.status, CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_ptr_nonnull(strstr(err.message, "limit REGEX_MAX_COMPILE_WORK"));
    constraint_index_destroy(&ix);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

/* Patterns of real uses compile, with at least half of every limit to spare. */
START_TEST(test_typical_patterns_within_budget) {
    static const struct {
        const char *pattern;
        uint32_t flags;
    } cases[] = {
        {"[A-Za-z ]{1,200}", 0},
        {"[A-Za-z ]{1,1000}", 0},
        {"\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d{1,6})?(Z|[+-]\\d{2}:\\d{2})", 0},
        {"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", 0},
        {"[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9.-]{1,63}\\.[a-zA-Z]{2,24}", 0},
        {"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}", 0},
        {"(red|green|blue|cyan|magenta|yellow|black|white|orange|purple)", 0},
        {"\\{\"name\": \"[^\"\\\\]{0,50}\", \"age\": \\d{1,3}, \"tags\": \\[(\"[a-z]{1,10}\"(, "
         "\"[a-z]{1,10}\"){0,4})?\\]\\}",
         0},
        {"\\{(\"[a-z_]{1,20}\": (\"[^\"]{0,40}\"|-?\\d{1,10}|true|false|null)(, )?){1,10}\\}", 0},
        {"(https?://)?([a-z0-9-]{1,63}\\.){1,5}[a-z]{2,10}(/[A-Za-z0-9._~%-]{0,50}){0,10}", 0},
        {"(Yes|No|Maybe)(, because [a-z ,.]{10,300})?\\.", 0},
        {"(\\S+\\s){0,100}", 0},
        {"[\\u4e00-\\u9fa5]{1,500}", 0},
        {".{0,300}", 0},
        {"(a?){1000}", 0},
        /* deny rules */
        {"ignore\\s+(all\\s+)?previous\\s+instructions", REGEX_SEARCH | REGEX_CASELESS},
        {"-----BEGIN [A-Z ]{1,20}PRIVATE KEY-----", REGEX_SEARCH},
        {"(api[_-]?key|secret|password|token)\\s*[:=]\\s*\\S{8}", REGEX_SEARCH | REGEX_CASELESS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regex_dfa d;
        regex_stats st;
        corral_error err;
        const corral_status rc = regex__compile(cases[i].pattern, strlen(cases[i].pattern),
                                                cases[i].flags, &d, &st, &err);
        ck_assert_msg(rc == CORRAL_OK, "/%s/: %s", cases[i].pattern, err.message);
        EXPECT(st.work <= REGEX_MAX_COMPILE_WORK / 2, "/%s/: %llu steps", cases[i].pattern,
               (unsigned long long)st.work);
        EXPECT(st.peak_bytes <= REGEX_MAX_COMPILE_BYTES / 2, "/%s/: %llu bytes", cases[i].pattern,
               (unsigned long long)st.peak_bytes);
        /* the bytes counted include at least the finished table */
        EXPECT(st.peak_bytes >= (uint64_t)d.n_states * d.n_classes * sizeof *d.next,
               "/%s/: %llu bytes counted", cases[i].pattern, (unsigned long long)st.peak_bytes);
        regex__free(&d);
    }
    /* and 8 KiB of text, as a constraint and as a deny rule */
    char *buf = malloc(REGEX_MAX_PATTERN);
    const size_t len = gen_text(buf, REGEX_MAX_PATTERN);
    regex_dfa d;
    corral_error err;
    ck_assert_int_eq(regex__compile(buf, len, 0, &d, NULL, &err), CORRAL_OK);
    ck_assert_uint_eq(d.n_states, REGEX_MAX_PATTERN + 1);
    ck_assert(regex__match(&d, buf, len));
    ck_assert(!regex__match(&d, buf, len - 1));
    regex__free(&d);
    ck_assert_int_eq(regex__compile(buf, len, REGEX_SEARCH, &d, NULL, &err), CORRAL_OK);
    regex__free(&d);
    free(buf);
}
END_TEST

/* Compile work grows linearly with the length of a literal, an alternation and a class (the
 * counter, not a timing: 4x the length must cost about 4x, not 16x as Moore's refinement on a
 * literal did). */
START_TEST(test_compile_work_linear_in_length) {
    static const struct {
        int gen;
        uint32_t flags;
        const char *what;
    } shapes[] = {
        {GEN_TEXT, 0, "literal"},
        {GEN_TEXT, REGEX_SEARCH, "literal, searched"},
        {GEN_WORDS, 0, "alternation"},
        {GEN_CLASS, 0, "class"},
    };
    char *buf = malloc(REGEX_MAX_PATTERN + 64);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        uint64_t work[2];
        const size_t sizes[2] = {2048, 8192};
        for (int k = 0; k < 2; k++) {
            const size_t len = shapes[i].gen == GEN_TEXT    ? gen_text(buf, sizes[k])
                               : shapes[i].gen == GEN_WORDS ? gen_words(buf, sizes[k])
                                                            : gen_class(buf, sizes[k], "");
            regex_dfa d;
            regex_stats st;
            corral_error err;
            ck_assert_msg(regex__compile(buf, len, shapes[i].flags, &d, &st, &err) == CORRAL_OK,
                          "%s of %zu bytes: %s", shapes[i].what, len, err.message);
            work[k] = st.work;
            regex__free(&d);
        }
        const double ratio = (double)work[1] / (double)work[0];
        ck_assert_msg(ratio <= 4.5, "%s: %llu steps at 2 KiB, %llu at 8 KiB (x%.2f)",
                      shapes[i].what, (unsigned long long)work[0], (unsigned long long)work[1],
                      ratio);
    }
    free(buf);
}
END_TEST

/* REGEX_SEARCH (the deny sanitizer's mode) finds a match anywhere exactly when PCRE2's unanchored
 * search does: its DFA reaches an accepting state on some prefix of the text. */
START_TEST(test_search_matches_pcre2) {
    static const char *extra[] = {"a",  "b", "0", "1",  " ",  "-", ".", ":",
                                  "\"", "{", "}", "\n", "好", "é", "😀"};
    uint64_t seed = 777;
    int found = 0, tried = 0;
    for (size_t i = 0; i < N_CORPUS; i++) {
        const corpus_entry *e = &corpus[i];
        regex_dfa d;
        corral_error err;
        ck_assert_msg(regex__compile(e->pattern, strlen(e->pattern), REGEX_SEARCH, &d, NULL,
                                     &err) == CORRAL_OK,
                      "/%s/: %s", e->pattern, err.message);
        int code;
        PCRE2_SIZE off;
        pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
        pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)(e->oracle ? e->oracle : e->pattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_ALT_BSUX, &code, &off, cc);
        pcre2_compile_context_free(cc);
        ck_assert_ptr_nonnull(re);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        /* text from the pattern's own characters and the extras, so that matches happen */
        const char *alpha[256];
        size_t alen[256], n_alpha = 0;
        for (size_t k = 0; e->pattern[k] && n_alpha < 200;) {
            size_t len = 1;
            while (((unsigned char)e->pattern[k + len] & 0xC0) == 0x80) len++;
            alpha[n_alpha] = e->pattern + k;
            alen[n_alpha++] = len;
            k += len;
        }
        for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
            alpha[n_alpha] = extra[k];
            alen[n_alpha++] = strlen(extra[k]);
        }
        for (int trial = 0; trial < 1000; trial++) {
            char s[256];
            size_t n = 0;
            const int len = (int)(test_splitmix64(&seed) % 40);
            for (int k = 0; k < len; k++) {
                const size_t c = test_splitmix64(&seed) % n_alpha;
                memcpy(s + n, alpha[c], alen[c]);
                n += alen[c];
            }
            const int want = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
            int got = 0;
            for (size_t k = 0, q = 0; k < n && !got; k++) {
                q = (size_t)regex__step(&d, (int32_t)q, (uint8_t)s[k]);
                if ((int32_t)q == REGEX_DEAD) break; /* cannot happen in a search */
                got = d.accepting[q];
            }
            EXPECT(want == got, "search /%s/ in \"%.*s\": PCRE2 %d, corral %d", e->pattern, (int)n,
                   s, want, got);
            found += want;
            tried++;
        }
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        regex__free(&d);
    }
    ck_assert_int_gt(found, tried / 10); /* not a comparison of misses only */
}
END_TEST

static Suite *constraint_suite(void) {
    Suite *s = suite_create("constraint");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_language_matches_pcre2);
    tcase_add_test(core, test_constructs);
    tcase_add_test(core, test_matcher_states_and_eog);
    tcase_add_test(core, test_generation_edges);
    tcase_add_test(core, test_stuck_state_is_reported);
    tcase_add_test(core, test_cache_hits_evicts_and_outlives);
    tcase_add_test(core, test_search_matches_pcre2);
    suite_add_tcase(s, core);

    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_hostile_patterns_refused_within_budget);
    tcase_add_test(limits, test_issue_reproducer_through_constraint_compile);
    tcase_add_test(limits, test_typical_patterns_within_budget);
    tcase_add_test(limits, test_compile_work_linear_in_length);
    suite_add_tcase(s, limits);

    TCase *masks = tcase_create("masks");
    tcase_add_test(masks, test_masks_exact_stories_vocab);
    tcase_add_test(masks, test_masks_exact_32k_vocab);
    suite_add_tcase(s, masks);

    TCase *sound = tcase_create("soundness");
    tcase_add_unchecked_fixture(sound, make_synth32k, remove_synth32k);
    tcase_add_test(sound, test_soundness_stories260K);
    tcase_add_test(sound, test_soundness_32k_vocab);
    suite_add_tcase(s, sound);

    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_unsupported_and_bad_syntax_named);
    tcase_add_test(errors, test_bad_arguments);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(constraint_suite)
