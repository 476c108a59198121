/*
 * test_tokenizer.c — Check suite for the tokenizer (engine/include/corral/tokenizer.h).
 *
 * The reference is llama.cpp: every ggml-vocab-*.gguf in shared/vocab comes with inputs and the
 * ids llama.cpp gives them, and every case must match exactly; the directory is listed, so a
 * vocabulary added later is tested without a code change. stories260K's golden prompt and
 * generated text check BOS handling and decoding byte for byte. The rest checks properties that
 * do not need reference ids: round trips where the tokenizer is lossless, special-token parsing on
 * and off, the streaming decoder's UTF-8 holding, limits, and errors on crafted files.
 */
#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/tokenizer.h"
#include "testutil.h"

/* White-box: the pre-tokenizers, the Unicode classes and llama.cpp's reading of UTF-8 are checked
 * on their own too, beside the vocabularies that check them end to end (Llama 3's llama-bpe and
 * Qwen's qwen2 among them; shared/vocab has no DeepSeek LLM vocabulary). */
#include "../../engine/src/pretokenize.h"
#include "../../engine/src/tokenizer_impl.h"
#include "corral/unicode.h"
#include "corral/utf8.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        return NULL;
    }
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    ck_assert_ptr_nonnull(buf);
    size_t got = fread(buf, 1, (size_t)size, fp);
    fclose(fp);
    ck_assert_uint_eq(got, (size_t)size);
    buf[size] = '\0';
    *len = (size_t)size;
    return buf;
}

typedef struct vocab {
    gguf_file *file;
    tokenizer *tok;
} vocab;

static vocab vocab_open(const char *path) {
    corral_error err;
    vocab v = {0};
    v.file = gguf_open(path, &err);
    ck_assert_msg(v.file != NULL, "%s: %s", path, err.message);
    v.tok = tok_new_from_gguf(v.file, &err);
    ck_assert_msg(v.tok != NULL, "%s: %s", path, err.message);
    return v;
}

static vocab vocab_shared(const char *relative) {
    return vocab_open(test_shared_path(relative));
}

static void vocab_close(vocab *v) {
    tok_destroy(&v->tok);
    ck_assert_ptr_null(v->tok);
    gguf_destroy(&v->file);
}

/* Encode with a growing array; caller frees. */
static int32_t *encode(const tokenizer *t, const char *text, size_t len, uint32_t flags,
                       size_t *n) {
    corral_error err;
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    corral_status st = tok_encode(t, text, len, flags, ids, cap, n, &err);
    if (st == CORRAL_RESOURCE_EXHAUSTED) {
        ck_assert_uint_gt(*n, cap);
        cap = *n;
        ids = realloc(ids, cap * sizeof *ids);
        st = tok_encode(t, text, len, flags, ids, cap, n, &err);
    }
    ck_assert_msg(st == CORRAL_OK, "tok_encode: %s", err.message);
    ck_assert_uint_le(*n, cap);
    return ids;
}

static char *decode(const tokenizer *t, const int32_t *ids, size_t n, uint32_t flags, size_t *len) {
    corral_error err;
    size_t need = 0;
    corral_status st = tok_decode(t, ids, n, flags, NULL, 0, &need, &err);
    ck_assert_msg(st == CORRAL_OK || st == CORRAL_RESOURCE_EXHAUSTED, "%s", err.message);
    char *buf = malloc(need + 1);
    st = tok_decode(t, ids, n, flags, buf, need + 1, len, &err);
    ck_assert_msg(st == CORRAL_OK, "tok_decode: %s", err.message);
    ck_assert_uint_eq(*len, need);
    return buf;
}

/* Strict UTF-8 validity (the base codec, pinned byte for byte by unit.utf8). */
static int utf8_valid(const char *s, size_t n) {
    return utf8_validate((const uint8_t *)s, n) == n;
}

static void print_escaped(FILE *fp, const char *s, size_t n) {
    for (size_t i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            fputc(c, fp);
        } else {
            fprintf(fp, "\\x%02x", c);
        }
    }
    if (n > 120) {
        fputs("...", fp);
    }
}

static void print_ids(FILE *fp, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        fprintf(fp, "%s%d", i ? " " : "", ids[i]);
    }
}

/* Whitespace-separated integers in s[0..len); caller frees. */
static int32_t *parse_ids(const char *s, size_t len, size_t *n) {
    int32_t *ids = malloc((len / 2 + 2) * sizeof *ids);
    *n = 0;
    char *copy = strndup(s, len);
    char *save = NULL;
    for (char *tok = strtok_r(copy, " \t\r\n", &save); tok;
         tok = strtok_r(NULL, " \t\r\n", &save)) {
        ids[(*n)++] = (int32_t)strtol(tok, NULL, 10);
    }
    free(copy);
    return ids;
}

/* GPT-2's byte -> code point table, written independently: printable Latin-1 bytes stand for
 * themselves, the others for U+0100 upwards in byte order. Writes the UTF-8 and returns its
 * length (at most 2: every code point is below U+0800). */
static size_t gpt2_byte_char(unsigned b, char out[UTF8_SEQUENCE_MAX]) {
    unsigned extra = 0, cpt = 0;
    for (unsigned x = 0; x <= b; x++) {
        int printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        cpt = printable ? x : 0x100 + extra++;
    }
    return utf8_encode(cpt, (uint8_t *)out);
}

/* ---- the reference vectors ------------------------------------------------------------------- */

/* Run one .inp/.out pair; returns the number of mismatching cases (printed to stderr). */
static int run_vectors(const vocab *v, const char *name, const char *inp_path, const char *out_path,
                       int *n_cases, int *n_roundtrips) {
    size_t inp_len = 0, out_len = 0;
    char *inp = slurp(inp_path, &inp_len);
    char *out = slurp(out_path, &out_len);
    ck_assert_msg(inp && out, "%s: cannot read %s or %s", name, inp_path, out_path);

    const tokenizer *t = v->tok;
    int spm = tok_get_model(t) == TOK_MODEL_SPM;

    /* Byte-level BPE loses only bytes whose GPT-2 code point is not a token (falcon and
     * starcoder lack a few that valid UTF-8 rarely or never uses), and text that is not valid
     * UTF-8 (each bad byte becomes U+FFFD). */
    int byte_has_token[256];
    for (unsigned b = 0; b < 256; b++) {
        char c[UTF8_SEQUENCE_MAX];
        size_t l = gpt2_byte_char(b, c);
        byte_has_token[b] = tok_find_token(t, c, l) != TOK_NONE;
    }

    int32_t *user = malloc((size_t)tok_vocab_size(t) * sizeof *user);
    size_t n_user = 0;
    for (int32_t id = 0; id < tok_vocab_size(t); id++) {
        if (tok_token_type(t, id) == TOK_TYPE_USER_DEFINED) {
            user[n_user++] = id;
        }
    }

    static const char sep[] = "\n__ggml_vocab_test__\n";
    int failures = 0;
    const char *p = inp, *end = inp + inp_len;
    const char *line = out, *out_end = out + out_len;
    int index = 0;
    while (p < end) {
        const char *s = strstr(p, sep);
        ck_assert_msg(s != NULL, "%s: input %d is not terminated by the separator", inp_path,
                      index);
        size_t text_len = (size_t)(s - p);
        const char *nl = memchr(line, '\n', (size_t)(out_end - line));
        ck_assert_msg(nl != NULL, "%s: no output line for input %d", out_path, index);
        size_t n_expected = 0;
        int32_t *expected = parse_ids(line, (size_t)(nl - line), &n_expected);

        size_t n = 0;
        int32_t *ids = encode(t, p, text_len, 0, &n);
        int same = n == n_expected && memcmp(ids, expected, n * sizeof *ids) == 0;
        if (!same) {
            failures++;
            fprintf(stderr, "%s case %d \"", name, index);
            print_escaped(stderr, p, text_len);
            fputs("\"\n  expected: ", stderr);
            print_ids(stderr, expected, n_expected);
            fputs("\n  actual:   ", stderr);
            print_ids(stderr, ids, n);
            fputc('\n', stderr);
        }

        /* SPM is lossless once the prefix space is stripped, except for text that already holds
         * "▁" (it decodes as a space) or a user-defined piece (cut out before SPM runs, with
         * blanks after it dropped for Phi-3 and a new "▁" prefix after it). */
        int lossless;
        if (spm) {
            lossless = memmem(p, text_len, "\xe2\x96\x81", 3) == NULL;
            for (size_t k = 0; k < n_user && lossless; k++) {
                size_t l;
                const char *piece = tok_token_text(t, user[k], &l);
                lossless = l == 0 || memmem(p, text_len, piece, l) == NULL;
            }
        } else {
            lossless = utf8_valid(p, text_len);
            for (size_t i = 0; i < text_len && lossless; i++) {
                lossless = byte_has_token[(unsigned char)p[i]];
            }
        }
        if (same && lossless) {
            size_t back_len = 0;
            char *back = decode(t, ids, n, TOK_DECODE_STRIP_SPACE, &back_len);
            if (back_len != text_len || memcmp(back, p, text_len) != 0) {
                failures++;
                fprintf(stderr, "%s case %d does not decode back: \"", name, index);
                print_escaped(stderr, back, back_len);
                fputs("\"\n", stderr);
            }
            (*n_roundtrips)++;
            free(back);
        }
        free(ids);
        free(expected);
        (*n_cases)++;
        index++;
        p = s + strlen(sep);
        line = nl + 1;
    }
    ck_assert_msg(line == out_end, "%s has more lines than %s has inputs", out_path, inp_path);
    free(user);
    free(inp);
    free(out);
    return failures;
}

/* Phi-3's vocabulary is Llama 2's (ids, pieces and scores of the 32000 normal tokens) with
 * added control tokens, so llama.cpp's ids for the llama-spm extra inputs are Phi-3's ids too:
 * among them the literal "</s>" that Phi-3 stores as USER_DEFINED and must encode as plain text
 * ("▁</" "s" ">"), never as its end-of-sequence token 2. */
START_TEST(test_phi3_end_marker_text_is_plain_text) {
    vocab v = vocab_shared("vocab/ggml-vocab-phi-3.gguf");
    char inp[4096], out[4096];
    snprintf(inp, sizeof inp, "%s", test_shared_path("vocab/ggml-vocab-llama-spm.extra.inp"));
    snprintf(out, sizeof out, "%s", test_shared_path("vocab/ggml-vocab-llama-spm.extra.out"));
    int n_cases = 0, n_roundtrips = 0;
    ck_assert_int_eq(run_vectors(&v, "phi-3 on llama-spm.extra", inp, out, &n_cases, &n_roundtrips),
                     0);
    ck_assert_int_ge(n_cases, 60);
    size_t n;
    int32_t *ids = encode(v.tok, "</s>", 4, 0, &n);
    static const int32_t plain[] = {1533, 29879, 29958};
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(ids, plain, sizeof plain);
    free(ids);
    vocab_close(&v);
}
END_TEST

START_TEST(test_reference_vectors) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_shared_path("vocab"));
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    int n_vocabs = 0, n_sets = 0, n_cases = 0, n_roundtrips = 0, failures = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "ggml-vocab-", 11) != 0 || l < 5 ||
            strcmp(e->d_name + l - 5, ".gguf") != 0) {
            continue;
        }
        char path[4400], inp[4500], out[4500];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        vocab v = vocab_open(path);
        n_vocabs++;
        snprintf(inp, sizeof inp, "%s.inp", path);
        snprintf(out, sizeof out, "%s.out", path);
        if (access(inp, R_OK) == 0) {
            failures += run_vectors(&v, e->d_name, inp, out, &n_cases, &n_roundtrips);
            n_sets++;
        }
        /* ggml-vocab-NAME.extra.inp / .extra.out */
        snprintf(inp, sizeof inp, "%s/%.*s.extra.inp", dir, (int)(l - 5), e->d_name);
        snprintf(out, sizeof out, "%s/%.*s.extra.out", dir, (int)(l - 5), e->d_name);
        if (access(inp, R_OK) == 0) {
            failures += run_vectors(&v, inp + strlen(dir) + 1, inp, out, &n_cases, &n_roundtrips);
            n_sets++;
        }
        vocab_close(&v);
    }
    closedir(d);
    fprintf(stderr, "reference vectors: %d vocabularies, %d sets, %d cases, %d round trips\n",
            n_vocabs, n_sets, n_cases, n_roundtrips);
    ck_assert_int_ge(n_vocabs, 8); /* llama-bpe (Llama 3) and qwen2 (Qwen 2 and 3) among them */
    ck_assert_int_ge(n_sets, 10);
    ck_assert_int_gt(n_roundtrips, n_cases / 2);
    ck_assert_msg(failures == 0, "%d reference cases failed (details on stderr)", failures);
}
END_TEST

/* ---- pre-tokenizers and Unicode classes ------------------------------------------------------ */

/* Split text with a family and compare with the expected words (NULL-terminated), which were
 * worked out by hand from llama.cpp's regexes and its splitting rules (see pretokenize.c). */
static void check_split(pretok_kind kind, const char *text, const char *const *words) {
    size_t len = strlen(text);
    uint32_t *cpts = calloc(len + 1, sizeof *cpts);
    uint16_t *flags = calloc(len + 1, sizeof *flags);
    size_t *offs = malloc((len + 1) * sizeof *offs);
    size_t n = 0;
    for (size_t o = 0; o < len; n++) {
        offs[n] = o;
        o += tok__utf8_decode((const uint8_t *)text + o, len - o, &cpts[n]);
        flags[n] = (uint16_t)unicode_cpt_flags(cpts[n]);
    }
    offs[n] = len;
    size_t *ends = malloc((n + 1) * sizeof *ends), *scratch = malloc((n + 1) * sizeof *scratch);
    size_t n_words = pretok_split(kind, cpts, flags, n, ends, scratch);

    size_t n_expected = 0;
    while (words[n_expected]) {
        n_expected++;
    }
    int same = n_words == n_expected;
    for (size_t k = 0, start = 0; same && k < n_words; start = ends[k], k++) {
        size_t a = offs[start], b = offs[ends[k]];
        same = strlen(words[k]) == b - a && memcmp(words[k], text + a, b - a) == 0;
    }
    if (!same) {
        fprintf(stderr, "%s split of \"", pretok_kind_name(kind));
        print_escaped(stderr, text, len);
        fputs("\":", stderr);
        for (size_t k = 0, start = 0; k < n_words; start = ends[k], k++) {
            fputs(" [", stderr);
            print_escaped(stderr, text + offs[start], offs[ends[k]] - offs[start]);
            fputc(']', stderr);
        }
        fputc('\n', stderr);
    }
    ck_assert_msg(same, "%s: \"%s\" split wrongly (printed above)", pretok_kind_name(kind), text);
    free(cpts);
    free(flags);
    free(offs);
    free(ends);
    free(scratch);
}

#define SPLIT(kind, text, ...) check_split(kind, text, (const char *const[]){__VA_ARGS__, NULL})

START_TEST(test_pretokenizer_splits) {
    /* Llama 3: contractions in any case, letters with one leading non-letter, digits in threes,
     * punctuation runs with their newlines, blank runs giving their last blank to a word. */
    SPLIT(PRETOK_LLAMA3, "Hello world", "Hello", " world");
    SPLIT(PRETOK_LLAMA3, "I'M here, don't", "I", "'M", " here", ",", " don", "'t");
    SPLIT(PRETOK_LLAMA3, "12345", "123", "45");
    SPLIT(PRETOK_LLAMA3, "a  b", "a", " ", " b");
    SPLIT(PRETOK_LLAMA3, "x \n\n y", "x", " \n\n", " y");
    SPLIT(PRETOK_LLAMA3, "...\n\nx", "...\n\n", "x");
    SPLIT(PRETOK_LLAMA3, "  !!", " ", " !!");
    SPLIT(PRETOK_LLAMA3, "end  ", "end", "  ");
    /* Qwen 2: the same with single digits */
    SPLIT(PRETOK_QWEN2, "abc12345", "abc", "1", "2", "3", "4", "5");
    /* GPT-2: case-sensitive contractions, optional space before a class run, and a lone blank
     * before a non-blank stays on its own */
    SPLIT(PRETOK_GPT2, "Hello world  123", "Hello", " world", " ", " 123");
    SPLIT(PRETOK_GPT2, "I'M", "I", "'", "M");
    SPLIT(PRETOK_GPT2, "a\n\nb", "a", "\n", "\n", "b");
    SPLIT(PRETOK_GPT2, "caf\xc3\xa9 \xd9\xa3\xd9\xa4!", "caf\xc3\xa9", " \xd9\xa3\xd9\xa4", "!");
    /* the cascades: each regex refines the segments of the one before */
    SPLIT(PRETOK_DEEPSEEK_CODER, "foo(bar) 12", "foo", "(", "bar", ")", " ", "1", "2");
    SPLIT(PRETOK_FALCON, "a+=12345", "a", "+=", "123", "45");
    SPLIT(PRETOK_FALCON, " 3333", " ", "333", "3");
    SPLIT(PRETOK_STARCODER, "x 12", "x", " ", "1", "2");
    SPLIT(PRETOK_DEFAULT, "a`b 1234", "a", "`", "b", " ", "123", "4");
    SPLIT(PRETOK_DEEPSEEK_LLM, "Hello, \xe4\xb8\x96\xe7\x95\x8c 123  ", "Hello", ",", " ",
          "\xe4\xb8\x96\xe7\x95\x8c", " ", "123", "  ");
    /* U+3000 lies inside the CJK range of the literal class, but the wide regex sees every
     * non-ASCII blank as 0x0B, so it separates the two characters */
    SPLIT(PRETOK_DEEPSEEK_LLM, "\xe4\xb8\x96\xe3\x80\x80\xe7\x95\x8c", "\xe4\xb8\x96",
          "\xe3\x80\x80", "\xe7\x95\x8c");
    /* nothing at all */
    size_t ends[1], scratch[1];
    ck_assert_uint_eq(pretok_split(PRETOK_GPT2, NULL, NULL, 0, ends, scratch), 0);
}
END_TEST

START_TEST(test_unicode_classes) {
    ck_assert_str_eq(unicode_tables_version, "15.0.0");
    ck_assert_uint_eq(unicode_cpt_flags('A'), UNICODE_FLAG_LETTER);
    ck_assert_uint_eq(unicode_cpt_flags(0x0663), UNICODE_FLAG_NUMBER); /* ARABIC-INDIC DIGIT 3 */
    ck_assert_uint_eq(unicode_cpt_flags(0x00BD), UNICODE_FLAG_NUMBER); /* VULGAR FRACTION 1/2 */
    ck_assert_uint_eq(unicode_cpt_flags(0x0301), UNICODE_FLAG_MARK);   /* COMBINING ACUTE */
    ck_assert_uint_eq(unicode_cpt_flags(0x20AC), UNICODE_FLAG_SYMBOL); /* EURO SIGN */
    ck_assert_uint_eq(unicode_cpt_flags(0x300C), UNICODE_FLAG_PUNCTUATION);
    ck_assert_uint_eq(unicode_cpt_flags(0x00A0), UNICODE_FLAG_SEPARATOR | UNICODE_FLAG_WHITESPACE);
    ck_assert_uint_eq(unicode_cpt_flags('\n'), UNICODE_FLAG_CONTROL | UNICODE_FLAG_WHITESPACE);
    ck_assert_uint_eq(unicode_cpt_flags(0x001F), UNICODE_FLAG_CONTROL); /* not White_Space */
    ck_assert_uint_eq(unicode_cpt_flags(0x200B), UNICODE_FLAG_CONTROL); /* ZWSP is Cf */
    ck_assert_uint_eq(unicode_cpt_flags(0xE000), UNICODE_FLAG_CONTROL); /* private use */
    ck_assert_uint_eq(unicode_cpt_flags(0x0378), UNICODE_FLAG_UNASSIGNED);
    ck_assert_uint_eq(unicode_cpt_flags(0x4E00), UNICODE_FLAG_LETTER); /* in a First/Last range */
    ck_assert_uint_eq(unicode_cpt_flags(0x10FFFF), UNICODE_FLAG_UNASSIGNED);
    ck_assert_uint_eq(unicode_cpt_flags(0x110000), UNICODE_FLAG_UNASSIGNED);
}
END_TEST

/* llama.cpp's lenient reading of UTF-8 (tokenizer_impl.h, on the base codec's relaxations):
 * overlong and surrogate shapes decode to their value and encode back, every other ill-formed
 * byte is one U+FFFD; SPM symbols are cut by the lead byte's high nibble. */
START_TEST(test_llama_utf8_reading) {
    static const struct {
        const char *s;
        size_t len;     /* bytes consumed */
        uint32_t cpt;   /* what they decode to */
        const char *re; /* what tok__utf8_encode writes back */
    } cases[] = {
        {"\xc0\x80", 2, 0, "\x00"}, /* overlong U+0000, shortest form back */
        {"\xc1\xbf", 2, 0x7F, "\x7f"},
        {"\xe0\x80\xaf", 3, '/', "/"},
        {"\xf0\x80\x80\x80", 4, 0, "\x00"},
        {"\xed\xa0\x80", 3, 0xD800, "\xed\xa0\x80"}, /* a surrogate round-trips */
        {"\xed\xbf\xbf", 3, 0xDFFF, "\xed\xbf\xbf"},
        {"\xe4\xbd", 1, UTF8_REPLACEMENT, "\xef\xbf\xbd"},  /* truncated */
        {"\xe4\xbdx", 1, UTF8_REPLACEMENT, "\xef\xbf\xbd"}, /* bad continuation */
        {"\x80", 1, UTF8_REPLACEMENT, "\xef\xbf\xbd"},      /* stray continuation */
        {"\xf7\xbf\xbf\xbf", 1, UTF8_REPLACEMENT, "\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", 1, UTF8_REPLACEMENT, "\xef\xbf\xbd"}, /* above U+10FFFF */
        {"\xf8\x88\x80\x80\x80", 1, UTF8_REPLACEMENT, "\xef\xbf\xbd"},
        {"\xf0\x9f\x99\x82", 4, 0x1F642, "\xf0\x9f\x99\x82"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t c = 0;
        const size_t n = strlen(cases[i].s);
        ck_assert_uint_eq(tok__utf8_decode((const uint8_t *)cases[i].s, n, &c), cases[i].len);
        ck_assert_uint_eq(c, cases[i].cpt);
        uint8_t out[UTF8_SEQUENCE_MAX];
        const size_t m = tok__utf8_encode(c, out);
        const size_t want = strlen(cases[i].re) ? strlen(cases[i].re) : 1; /* "\x00" */
        ck_assert_uint_eq(m, want);
        ck_assert_mem_eq(out, cases[i].re, m);
    }
    uint8_t out[UTF8_SEQUENCE_MAX];
    ck_assert_uint_eq(tok__utf8_encode(0x110000, out), 3); /* never produced; U+FFFD if asked */
    ck_assert_mem_eq(out, "\xef\xbf\xbd", 3);
    static const struct {
        uint8_t lead;
        size_t len;
    } symbols[] = {{0x41, 1}, {0x80, 1}, {0xBF, 1}, {0xC0, 2}, {0xDF, 2}, {0xE0, 3},
                   {0xEF, 3}, {0xF0, 4}, {0xF7, 4}, {0xF8, 4}, {0xFF, 4}};
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
        ck_assert_uint_eq(tok__utf8_symbol_len(symbols[i].lead), symbols[i].len);
}
END_TEST

/* ---- stories260K: the golden prompt and generation ------------------------------------------- */

START_TEST(test_stories_prompt_and_generation) {
    vocab v = vocab_shared("models/stories260K.gguf");
    const tokenizer *t = v.tok;
    ck_assert_int_eq(tok_vocab_size(t), 512);
    ck_assert_int_eq(tok_get_model(t), TOK_MODEL_SPM);
    /* the file stores separator and padding ids as 4294967295: "none", not an error */
    ck_assert_int_eq(tok_special_id(t, TOK_SPECIAL_SEP), TOK_NONE);
    ck_assert_int_eq(tok_special_id(t, TOK_SPECIAL_PAD), TOK_NONE);
    ck_assert_int_eq(tok_bos(t), 1);
    ck_assert_int_eq(tok_eos(t), 2);
    ck_assert(tok_is_eog(t, 2));

    size_t len;
    char *txt = slurp(test_shared_path("reference/stories260K.greedy.prompt_ids.txt"), &len);
    ck_assert_ptr_nonnull(txt);
    size_t n_prompt;
    int32_t *prompt = parse_ids(txt, len, &n_prompt);
    free(txt);

    static const char prompt_text[] = "Once upon a time";
    size_t n;
    int32_t *ids = encode(t, prompt_text, strlen(prompt_text), TOK_ADD_SPECIAL, &n);
    ck_assert_uint_eq(n, n_prompt);
    ck_assert_mem_eq(ids, prompt, n * sizeof *ids);
    free(ids);

    txt = slurp(test_shared_path("reference/stories260K.greedy.ids.txt"), &len);
    ck_assert_ptr_nonnull(txt);
    size_t n_gen;
    int32_t *gen = parse_ids(txt, len, &n_gen);
    free(txt);
    ck_assert_uint_gt(n_gen, 100);

    /* greedy.txt is the generated text alone: the pieces of the generated ids, nothing stripped */
    size_t golden_len;
    char *golden = slurp(test_shared_path("reference/stories260K.greedy.txt"), &golden_len);
    size_t out_len;
    char *out = decode(t, gen, n_gen, 0, &out_len);
    ck_assert_uint_eq(out_len, golden_len);
    ck_assert_mem_eq(out, golden, golden_len);
    free(out);

    /* greedy.full.txt is the prompt text followed by it: prompt ids + generated ids, with BOS
     * rendering as nothing and the prefix space of "▁Once" stripped */
    size_t full_len;
    char *full = slurp(test_shared_path("reference/stories260K.greedy.full.txt"), &full_len);
    ck_assert_uint_eq(full_len, strlen(prompt_text) + golden_len);
    ck_assert_mem_eq(full, prompt_text, strlen(prompt_text));
    int32_t *all = malloc((n_prompt + n_gen) * sizeof *all);
    memcpy(all, prompt, n_prompt * sizeof *all);
    memcpy(all + n_prompt, gen, n_gen * sizeof *all);
    out = decode(t, all, n_prompt + n_gen, TOK_DECODE_STRIP_SPACE, &out_len);
    ck_assert_uint_eq(out_len, full_len);
    ck_assert_mem_eq(out, full, full_len);
    free(out);

    /* the same text through the streaming decoder, one id at a time */
    corral_error err;
    tok_decoder *d = tok_decoder_new(t, 0, &err);
    ck_assert_ptr_nonnull(d);
    char *streamed = malloc(golden_len + 16);
    size_t streamed_len = 0;
    for (size_t i = 0; i < n_gen; i++) {
        const char *chunk;
        size_t chunk_len;
        ck_assert_int_eq(tok_decoder_feed(d, gen[i], &chunk, &chunk_len, &err), CORRAL_OK);
        ck_assert_uint_le(streamed_len + chunk_len, golden_len);
        memcpy(streamed + streamed_len, chunk, chunk_len);
        streamed_len += chunk_len;
    }
    const char *tail;
    size_t tail_len;
    tok_decoder_flush(d, &tail, &tail_len);
    ck_assert_uint_eq(tail_len, 0);
    ck_assert_uint_eq(streamed_len, golden_len);
    ck_assert_mem_eq(streamed, golden, golden_len);
    tok_decoder_destroy(&d);
    ck_assert_ptr_null(d);

    free(streamed);
    free(all);
    free(full);
    free(golden);
    free(gen);
    free(prompt);
    vocab_close(&v);
}
END_TEST

/* ---- special tokens -------------------------------------------------------------------------- */

static void assert_no_control(const tokenizer *t, const int32_t *ids, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(tok_token_type(t, ids[i]) != TOK_TYPE_CONTROL,
                      "%s: control token %d at position %zu without TOK_PARSE_SPECIAL", what,
                      ids[i], i);
    }
}

START_TEST(test_parse_special_spm) {
    vocab v = vocab_shared("vocab/ggml-vocab-llama-spm.gguf");
    const tokenizer *t = v.tok;
    static const char text[] = "<s>Hello</s> world <|im_start|>user\n<|endoftext|>";
    size_t n_off, n_on;
    int32_t *off = encode(t, text, strlen(text), 0, &n_off);
    assert_no_control(t, off, n_off, "llama-spm");
    int32_t *on = encode(t, text, strlen(text), TOK_PARSE_SPECIAL, &n_on);
    ck_assert_uint_lt(n_on, n_off);

    /* On: <s> and </s> become ids 1 and 2, and the text between and after is encoded as
     * fragments of its own (each starting with the "▁" prefix, as after any special token). */
    size_t n_hello, n_rest;
    int32_t *hello = encode(t, "Hello", 5, 0, &n_hello);
    const char *rest = " world <|im_start|>user\n<|endoftext|>";
    int32_t *tail = encode(t, rest, strlen(rest), 0, &n_rest);
    ck_assert_uint_eq(n_on, 2 + n_hello + n_rest);
    ck_assert_int_eq(on[0], tok_bos(t));
    ck_assert_mem_eq(on + 1, hello, n_hello * sizeof *on);
    ck_assert_int_eq(on[1 + n_hello], tok_eos(t));
    ck_assert_mem_eq(on + 2 + n_hello, tail, n_rest * sizeof *on);

    /* decoding renders control tokens only when asked */
    size_t len;
    char *plain = decode(t, on, n_on, TOK_DECODE_STRIP_SPACE, &len);
    ck_assert(memmem(plain, len, "<s>", 3) == NULL);
    free(plain);
    char *shown = decode(t, on, n_on, TOK_DECODE_SPECIAL | TOK_DECODE_STRIP_SPACE, &len);
    ck_assert(len >= 3 && memcmp(shown, "<s>", 3) == 0);
    free(shown);

    /* ADD_SPECIAL adds BOS (add_bos_token is true) and no EOS */
    size_t n_add;
    int32_t *add = encode(t, "Hello", 5, TOK_ADD_SPECIAL, &n_add);
    ck_assert_uint_eq(n_add, n_hello + 1);
    ck_assert_int_eq(add[0], 1);
    ck_assert_mem_eq(add + 1, hello, n_hello * sizeof *add);
    free(add);

    free(hello);
    free(tail);
    free(off);
    free(on);
    vocab_close(&v);
}
END_TEST

START_TEST(test_parse_special_bpe) {
    vocab v = vocab_shared("vocab/ggml-vocab-gpt-2.gguf");
    const tokenizer *t = v.tok;
    int32_t eot = tok_find_token(t, "<|endoftext|>", 13);
    ck_assert_int_eq(eot, 50256);
    ck_assert_int_eq(tok_token_type(t, eot), TOK_TYPE_CONTROL);
    ck_assert(tok_is_eog(t, eot));

    static const char text[] = "<s>Hello</s> world<|endoftext|><|im_start|>user";
    size_t n_off, n_on;
    int32_t *off = encode(t, text, strlen(text), 0, &n_off);
    assert_no_control(t, off, n_off, "gpt-2");
    int32_t *on = encode(t, text, strlen(text), TOK_PARSE_SPECIAL, &n_on);
    /* on: the text before and after <|endoftext|> is encoded on its own */
    const char *cut = strstr(text, "<|endoftext|>");
    size_t n_left, n_right;
    int32_t *left = encode(t, text, (size_t)(cut - text), 0, &n_left);
    int32_t *right = encode(t, cut + 13, strlen(cut + 13), 0, &n_right);
    ck_assert_uint_eq(n_on, n_left + 1 + n_right);
    ck_assert_mem_eq(on, left, n_left * sizeof *on);
    ck_assert_int_eq(on[n_left], eot);
    ck_assert_mem_eq(on + n_left + 1, right, n_right * sizeof *on);

    size_t n_alone;
    int32_t *alone = encode(t, "<|endoftext|>", 13, TOK_PARSE_SPECIAL, &n_alone);
    ck_assert_uint_eq(n_alone, 1);
    ck_assert_int_eq(alone[0], eot);
    free(alone);
    alone = encode(t, "<|endoftext|>", 13, 0, &n_alone);
    ck_assert_uint_gt(n_alone, 1);
    assert_no_control(t, alone, n_alone, "gpt-2 <|endoftext|>");
    free(alone);

    free(left);
    free(right);
    free(off);
    free(on);
    vocab_close(&v);
}
END_TEST

/* User-defined tokens are cut out of the text even without TOK_PARSE_SPECIAL (llama.cpp's rule:
 * they are text the vocabulary keeps whole), and Phi-3 drops the blanks after its special tokens.
 */
START_TEST(test_user_defined_always_matched) {
    vocab v = vocab_shared("vocab/ggml-vocab-deepseek-coder.gguf");
    const tokenizer *t = v.tok;
    int32_t oe = tok_find_token(t, "\xc3\xb6", 2); /* "ö" is user-defined in this vocabulary */
    ck_assert_int_eq(tok_token_type(t, oe), TOK_TYPE_USER_DEFINED);
    size_t n, n_left, n_right;
    int32_t *ids = encode(t, "sch\xc3\xb6n", 6, 0, &n);
    int32_t *left = encode(t, "sch", 3, 0, &n_left);
    int32_t *right = encode(t, "n", 1, 0, &n_right);
    ck_assert_uint_eq(n, n_left + 1 + n_right);
    ck_assert_mem_eq(ids, left, n_left * sizeof *ids);
    ck_assert_int_eq(ids[n_left], oe);
    ck_assert_mem_eq(ids + n_left + 1, right, n_right * sizeof *ids);
    free(ids);
    free(left);
    free(right);
    vocab_close(&v);

    /* Phi-3's "</s>" is stored USER_DEFINED but ends generation: a control token, matched only
     * when special tokens are parsed, and then with the blanks after it dropped. */
    v = vocab_shared("vocab/ggml-vocab-phi-3.gguf");
    t = v.tok;
    int32_t eos_text = tok_find_token(t, "</s>", 4);
    ck_assert_int_eq(eos_text, 2);
    ck_assert_int_eq(tok_token_type(t, eos_text), TOK_TYPE_CONTROL);
    ck_assert(tok_is_eog(t, eos_text));
    ids = encode(t, "</s>  \n x", 9, TOK_PARSE_SPECIAL, &n);
    right =
        encode(t, "x", 1, 0, &n_right); /* "x" after a special token: prefixed like text start */
    ck_assert_uint_eq(n, 1 + n_right);
    ck_assert_int_eq(ids[0], eos_text);
    ck_assert_mem_eq(ids + 1, right, n_right * sizeof *ids);
    free(ids);
    ids = encode(t, "</s>  \n x", 9, 0, &n);
    for (size_t i = 0; i < n; i++) ck_assert_int_ne(ids[i], eos_text);
    free(ids);
    free(right);
    vocab_close(&v);
}
END_TEST

/* Every end-of-generation token of every shared vocabulary (the EOS/EOT/EOM ids and the tokens
 * named like an end) is a control token, whatever type its file gives it: user text that spells
 * it out encodes as plain text, with no end-of-generation id in it, and only parsing special
 * tokens (a template's scaffold) gives the token. */
static int check_eog_tokens(const char *path) {
    vocab v = vocab_open(path);
    const tokenizer *t = v.tok;
    int n_eog = 0;
    for (int32_t id = 0; id < tok_vocab_size(t); id++) {
        if (!tok_is_eog(t, id)) continue;
        n_eog++;
        ck_assert_msg(tok_token_type(t, id) == TOK_TYPE_CONTROL, "%s: end token %d is type %d",
                      path, id, tok_token_type(t, id));
        size_t len, n;
        const char *text = tok_token_text(t, id, &len);
        int32_t *ids = encode(t, text, len, 0, &n);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(!tok_is_eog(t, ids[i]) && tok_token_type(t, ids[i]) != TOK_TYPE_CONTROL,
                          "%s: the text of end token %d encodes to control token %d", path, id,
                          ids[i]);
        free(ids);
        ids = encode(t, text, len, TOK_PARSE_SPECIAL, &n);
        ck_assert_msg(n == 1 && tok_is_eog(t, ids[0]), "%s: end token %d not parsed back", path,
                      id);
        free(ids);
    }
    ck_assert_msg(n_eog > 0, "%s: no end-of-generation token", path);
    /* Whatever its type, a token spelt like a known end marker ends generation. */
    static const char *const ends[] = {
        "</s>",          "<|eot_id|>",    "<|im_end|>",      "<|end|>",
        "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<|eom_id|>"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        const int32_t id = tok_find_token(t, ends[i], strlen(ends[i]));
        ck_assert_msg(id == TOK_NONE || tok_is_eog(t, id), "%s: %s (%d) does not end generation",
                      path, ends[i], id);
    }
    vocab_close(&v);
    return n_eog;
}

START_TEST(test_eog_tokens_never_from_user_text) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_shared_path("vocab"));
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n_vocabs = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "ggml-vocab-", 11) != 0 || strcmp(e->d_name + l - 5, ".gguf") != 0)
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        const int n = check_eog_tokens(path);
        fprintf(stderr, "  %-32s %d end-of-generation tokens\n", e->d_name, n);
        n_vocabs++;
    }
    closedir(d);
    check_eog_tokens(test_shared_path("models/stories260K.gguf"));
    ck_assert_int_ge(n_vocabs, 8);
}
END_TEST

START_TEST(test_eog_and_special_ids) {
    vocab v = vocab_shared("vocab/ggml-vocab-phi-3.gguf");
    const tokenizer *t = v.tok;
    int32_t end = tok_find_token(t, "<|end|>", 7);
    int32_t eot = tok_find_token(t, "<|endoftext|>", 13);
    int32_t user = tok_find_token(t, "<|user|>", 8);
    ck_assert_int_ge(end, 0);
    ck_assert_int_eq(tok_token_type(t, end), TOK_TYPE_CONTROL);
    ck_assert(tok_is_eog(t, end));
    ck_assert_int_eq(tok_eos(t), eot);
    ck_assert(tok_is_eog(t, eot));
    ck_assert(!tok_is_eog(t, user));
    ck_assert(!tok_is_eog(t, tok_find_token(t, "\xe2\x96\x81the", 5)));
    ck_assert(!tok_is_eog(t, -1));
    ck_assert(!tok_is_eog(t, tok_vocab_size(t)));
    /* the file names no EOT: the first control token named like one is taken */
    ck_assert_int_eq(tok_eot(t), end);
    vocab_close(&v);

    v = vocab_shared("vocab/ggml-vocab-deepseek-coder.gguf");
    ck_assert_str_eq(tok_pre_name(v.tok), "deepseek-coder");
    ck_assert_int_eq(tok_bos(v.tok), 32013);
    ck_assert_int_eq(tok_eos(v.tok), 32014);
    ck_assert(tok_adds_bos(v.tok));
    ck_assert(!tok_adds_eos(v.tok));
    ck_assert(tok_is_eog(v.tok, 32014));
    vocab_close(&v);
}
END_TEST

START_TEST(test_token_queries) {
    vocab v = vocab_shared("vocab/ggml-vocab-llama-spm.gguf");
    const tokenizer *t = v.tok;
    for (int32_t id = 0; id < tok_vocab_size(t); id += 97) {
        size_t len;
        const char *piece = tok_token_text(t, id, &len);
        ck_assert_ptr_nonnull(piece);
        ck_assert_int_eq(tok_find_token(t, piece, len), id);
    }
    size_t len = 99;
    ck_assert_ptr_null(tok_token_text(t, -5, &len));
    ck_assert_uint_eq(len, 0);
    ck_assert_int_eq(tok_find_token(t, "no such piece, surely", 21), TOK_NONE);
    ck_assert_int_eq(tok_token_type(t, 1), TOK_TYPE_CONTROL);
    ck_assert_int_eq(tok_token_type(t, 0), TOK_TYPE_UNKNOWN);
    ck_assert_int_eq(tok_token_type(t, tok_find_token(t, "<0x0A>", 6)), TOK_TYPE_BYTE);
    ck_assert_int_eq(tok_token_type(t, 1 << 30), TOK_TYPE_UNDEFINED);
    ck_assert_str_eq(tok_pre_name(t), "");
    ck_assert(tok_token_score(t, 1000) < 0.0f);
    ck_assert_uint_ge(tok_max_piece_len(t), 6);

    /* one piece: "▁" renders as a space (stripped on request), byte tokens as their byte */
    char buf[64];
    size_t n;
    corral_error err;
    int32_t the = tok_find_token(t, "\xe2\x96\x81the", 6);
    ck_assert_int_ge(the, 0);
    ck_assert_int_eq(tok_decode_piece(t, the, 0, buf, sizeof buf, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_mem_eq(buf, " the", 4);
    ck_assert_int_eq(tok_decode_piece(t, the, TOK_DECODE_STRIP_SPACE, buf, sizeof buf, &n, &err),
                     CORRAL_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(
        tok_decode_piece(t, tok_find_token(t, "<0x0A>", 6), 0, buf, sizeof buf, &n, &err),
        CORRAL_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(buf[0], '\n');
    ck_assert_int_eq(tok_decode_piece(t, 1, 0, buf, sizeof buf, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 0);
    vocab_close(&v);
}
END_TEST

/* ---- streaming decoder ----------------------------------------------------------------------- */

/* Feed ids one at a time: every chunk must be valid UTF-8, the chunks must concatenate to the full
 * decode, and at least one token must end inside a character (so holding back was exercised). */
static void check_streaming(const char *vocab_path, const char *text) {
    vocab v = vocab_shared(vocab_path);
    const tokenizer *t = v.tok;
    size_t n;
    int32_t *ids = encode(t, text, strlen(text), 0, &n);
    size_t full_len;
    char *full = decode(t, ids, n, TOK_DECODE_STRIP_SPACE, &full_len);
    ck_assert_msg(utf8_valid(full, full_len), "%s: full decode is not valid UTF-8", vocab_path);

    corral_error err;
    tok_decoder *d = tok_decoder_new(t, TOK_DECODE_STRIP_SPACE, &err);
    ck_assert_ptr_nonnull(d);
    char *streamed = malloc(full_len + 1);
    size_t streamed_len = 0;
    int split_pieces = 0;
    for (size_t i = 0; i < n; i++) {
        char piece[256];
        size_t piece_len;
        ck_assert_int_eq(tok_decode_piece(t, ids[i], 0, piece, sizeof piece, &piece_len, &err),
                         CORRAL_OK);
        split_pieces += !utf8_valid(piece, piece_len);
        const char *chunk;
        size_t chunk_len;
        ck_assert_int_eq(tok_decoder_feed(d, ids[i], &chunk, &chunk_len, &err), CORRAL_OK);
        ck_assert_msg(utf8_valid(chunk, chunk_len), "%s: chunk %zu is not valid UTF-8", vocab_path,
                      i);
        ck_assert_uint_le(streamed_len + chunk_len, full_len);
        memcpy(streamed + streamed_len, chunk, chunk_len);
        streamed_len += chunk_len;
    }
    const char *tail;
    size_t tail_len;
    tok_decoder_flush(d, &tail, &tail_len);
    ck_assert_uint_eq(tail_len, 0);
    ck_assert_uint_eq(streamed_len, full_len);
    ck_assert_mem_eq(streamed, full, full_len);
    ck_assert_mem_eq(full, text, strlen(text));
    ck_assert_msg(split_pieces > 0, "%s: no character was split across tokens", vocab_path);
    tok_decoder_destroy(&d);
    free(streamed);
    free(full);
    free(ids);
    vocab_close(&v);
}

START_TEST(test_streaming_decoder) {
    /* stories260K's 512 tokens spell most non-ASCII characters with byte tokens */
    check_streaming("models/stories260K.gguf", "h\xc3\xa9llo w\xc3\xb6rld \xe4\xbd\xa0\xe5\xa5\xbd "
                                               "\xf0\x9f\x99\x82 ok");
    /* byte-level BPE splits rare characters across tokens */
    check_streaming("vocab/ggml-vocab-gpt-2.gguf", "na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd "
                                                   "\xf0\x9f\xa6\x99 \xe1\x9e\x80\xe1\x9e\xb6");
}
END_TEST

START_TEST(test_streaming_decoder_invalid) {
    vocab v = vocab_shared("models/stories260K.gguf");
    const tokenizer *t = v.tok;
    int32_t e4 = tok_find_token(t, "<0xE4>", 6), bd = tok_find_token(t, "<0xBD>", 6);
    int32_t a = tok_find_token(t, "<0x61>", 6), ff = tok_find_token(t, "<0xFF>", 6);
    ck_assert(e4 >= 0 && bd >= 0 && a >= 0 && ff >= 0);
    corral_error err;
    tok_decoder *d = tok_decoder_new(t, 0, &err);
    const char *s;
    size_t n;

    /* a lead byte followed by ASCII: U+FFFD, then the ASCII */
    ck_assert_int_eq(tok_decoder_feed(d, e4, &s, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(tok_decoder_feed(d, a, &s, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_mem_eq(s,
                     "\xef\xbf\xbd"
                     "a",
                     4);

    /* 0xFF can never appear: U+FFFD at once */
    ck_assert_int_eq(tok_decoder_feed(d, ff, &s, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(s, "\xef\xbf\xbd", 3);

    /* a truncated sequence at the end: one U+FFFD from flush */
    ck_assert_int_eq(tok_decoder_feed(d, e4, &s, &n, &err), CORRAL_OK);
    ck_assert_int_eq(tok_decoder_feed(d, bd, &s, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 0);
    tok_decoder_flush(d, &s, &n);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(s, "\xef\xbf\xbd", 3);
    tok_decoder_flush(d, &s, &n);
    ck_assert_uint_eq(n, 0);

    /* One U+FFFD per maximal subpart across pieces, each byte its own byte token, in order (the
     * decoder carries what a row leaves open into the next). */
    static const struct {
        const char *bytes, *last; /* fed one by one; what the last feed gives */
    } subparts[] = {
        {"\xe4\xbd"
         "a",
         "\xef\xbf\xbd"
         "a"},                                    /* E4 BD is one subpart: one U+FFFD, not two */
        {"\xe4\xe4", "\xef\xbf\xbd"},             /* a new lead byte ends the open sequence ... */
        {"\xbd\xa0", "\xe4\xbd\xa0"},             /* ... and starts its own */
        {"\xe0\x80", "\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong: E0 alone, then the stray 80 */
    };
    for (size_t i = 0; i < sizeof subparts / sizeof subparts[0]; i++) {
        for (const char *b = subparts[i].bytes; *b; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (unsigned char)*b);
            const int32_t id = tok_find_token(t, name, 6);
            ck_assert_msg(id >= 0, "no byte token %s", name);
            ck_assert_int_eq(tok_decoder_feed(d, id, &s, &n, &err), CORRAL_OK);
        }
        ck_assert_uint_eq(n, strlen(subparts[i].last));
        ck_assert_mem_eq(s, subparts[i].last, n);
    }

    /* a bad id changes nothing */
    ck_assert_int_eq(tok_decoder_feed(d, e4, &s, &n, &err), CORRAL_OK);
    ck_assert_int_eq(tok_decoder_feed(d, 100000, &s, &n, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(tok_decoder_feed(d, bd, &s, &n, &err), CORRAL_OK);
    ck_assert_int_eq(tok_decoder_feed(d, tok_find_token(t, "<0xA0>", 6), &s, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(s, "\xe4\xbd\xa0", 3);

    tok_decoder_destroy(&d);
    tok_decoder_destroy(&d); /* NULL-safe */
    vocab_close(&v);
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

static const char *const all_vocabs[] = {
    "models/stories260K.gguf",
    "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-phi-3.gguf",
    "vocab/ggml-vocab-gpt-2.gguf",
    "vocab/ggml-vocab-falcon.gguf",
    "vocab/ggml-vocab-starcoder.gguf",
    "vocab/ggml-vocab-deepseek-coder.gguf",
};

static void assert_ids_valid(const tokenizer *t, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(ids[i] >= 0 && ids[i] < tok_vocab_size(t), "id %d out of range", ids[i]);
    }
}

START_TEST(test_empty_and_single_byte) {
    vocab v = vocab_shared(all_vocabs[_i]);
    const tokenizer *t = v.tok;
    size_t n = 7;
    corral_error err;
    ck_assert_int_eq(tok_encode(t, NULL, 0, 0, NULL, 0, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(tok_encode(t, "", 0, TOK_PARSE_SPECIAL, NULL, 0, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, 0);
    int32_t one[4];
    ck_assert_int_eq(tok_encode(t, "", 0, TOK_ADD_SPECIAL, one, 4, &n, &err), CORRAL_OK);
    ck_assert_uint_eq(n, (size_t)tok_adds_bos(t) + (size_t)tok_adds_eos(t));
    if (tok_adds_bos(t)) {
        ck_assert_int_eq(one[0], tok_bos(t));
    }
    for (unsigned b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t *ids = encode(t, &c, 1, 0, &n);
        assert_ids_valid(t, ids, n);
        if (tok_get_model(t) == TOK_MODEL_SPM) { /* byte fallback: every byte comes back */
            size_t len;
            char *back = decode(t, ids, n, TOK_DECODE_STRIP_SPACE, &len);
            ck_assert_uint_eq(len, 1);
            ck_assert_int_eq(back[0], c);
            free(back);
        }
        free(ids);
    }
    vocab_close(&v);
}
END_TEST

START_TEST(test_long_repeated_text) {
    vocab v = vocab_shared(all_vocabs[_i]);
    const tokenizer *t = v.tok;
    const size_t len = 64 * 1024;
    char *text = malloc(len);
    static const char fills[] = {'a', ' ', '\n', '7', '!'};
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(text, fills[f], len);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        size_t n;
        int32_t *ids = encode(t, text, len, 0, &n);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        assert_ids_valid(t, ids, n);
        ck_assert_uint_gt(n, 0);
        size_t back_len;
        char *back = decode(t, ids, n, TOK_DECODE_STRIP_SPACE, &back_len);
        ck_assert_uint_eq(back_len, len);
        ck_assert_mem_eq(back, text, len);
        if (f == 0) {
            fprintf(stderr, "%s: 64 KiB of 'a' -> %zu ids in %.1f ms\n", all_vocabs[_i], n,
                    (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                        (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
        }
        free(back);
        free(ids);
    }
    free(text);
    vocab_close(&v);
}
END_TEST

START_TEST(test_all_bytes_invalid_utf8_and_nul) {
    vocab v = vocab_shared(all_vocabs[_i]);
    const tokenizer *t = v.tok;
    int spm = tok_get_model(t) == TOK_MODEL_SPM;
    char all[256];
    for (int b = 0; b < 256; b++) {
        all[b] = (char)b;
    }
    /* SPM cuts symbols by the lead byte's claimed length, so a broken sequence right before a
     * space swallows part of its "▁" and the space comes back as those raw bytes (as in
     * llama.cpp); without such a space every byte comes back. */
    static const char invalid[] = "ok\xff\xfe..\x80-half\xe4\xbd-end\xc3(\xed\xa0\x80.\xf8\x88";
    static const char invalid_spaced[] = "ok \xff\xfe \x80 half \xe4\xbd end \xc3( \xf8";
    static const char nul[] = "a\0b\0\0c";
    const struct {
        const char *s;
        size_t len;
        int exact; /* 1: SPM only, 2: every model */
    } cases[] = {
        {all, sizeof all, 1},
        {invalid, sizeof invalid - 1, 1},
        {invalid_spaced, sizeof invalid_spaced - 1, 0},
        {nul, sizeof nul - 1, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n;
        int32_t *ids = encode(t, cases[c].s, cases[c].len, TOK_PARSE_SPECIAL, &n);
        assert_ids_valid(t, ids, n);
        size_t len;
        char *back = decode(t, ids, n, TOK_DECODE_STRIP_SPACE, &len);
        if (cases[c].exact == 2 || (cases[c].exact == 1 && spm)) {
            ck_assert_uint_eq(len, cases[c].len);
            ck_assert_mem_eq(back, cases[c].s, len);
        }
        free(back);
        free(ids);
    }
    vocab_close(&v);
}
END_TEST

/* BPE: llama.cpp turns each byte that does not start a well-formed sequence into U+FFFD before
 * pre-tokenizing, so the ids must be those of the text with the replacement written out. */
START_TEST(test_bpe_invalid_utf8_is_replacement) {
    vocab v = vocab_shared("vocab/ggml-vocab-gpt-2.gguf");
    static const struct {
        const char *bad, *good;
    } cases[] = {
        {"a\xff"
         "b",
         "a\xef\xbf\xbd"
         "b"},
        {"x \x80\x80 y", "x \xef\xbf\xbd\xef\xbf\xbd y"},
        {"end \xe4\xbd", "end \xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc3(", "\xef\xbf\xbd("},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n_bad, n_good;
        int32_t *bad = encode(v.tok, cases[c].bad, strlen(cases[c].bad), 0, &n_bad);
        int32_t *good = encode(v.tok, cases[c].good, strlen(cases[c].good), 0, &n_good);
        ck_assert_uint_eq(n_bad, n_good);
        ck_assert_mem_eq(bad, good, n_bad * sizeof *bad);
        free(bad);
        free(good);
    }
    vocab_close(&v);
}
END_TEST

START_TEST(test_small_buffers) {
    vocab v = vocab_shared("vocab/ggml-vocab-gpt-2.gguf");
    const tokenizer *t = v.tok;
    static const char text[] = "Hello world, this is a sentence of several tokens.";
    size_t n_full;
    int32_t *full = encode(t, text, strlen(text), 0, &n_full);
    ck_assert_uint_gt(n_full, 5);
    int32_t small[3];
    size_t n = 0;
    corral_error err;
    ck_assert_int_eq(tok_encode(t, text, strlen(text), 0, small, 3, &n, &err),
                     CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_uint_eq(n, n_full);
    ck_assert_mem_eq(small, full, sizeof small);
    ck_assert_int_eq(tok_encode(t, text, strlen(text), 0, NULL, 0, &n, &err),
                     CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_uint_eq(n, n_full);

    char buf[4];
    ck_assert_int_eq(tok_decode(t, full, n_full, 0, buf, sizeof buf, &n, &err),
                     CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_uint_eq(n, strlen(text));
    ck_assert_mem_eq(buf, text, sizeof buf);
    free(full);
    vocab_close(&v);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

static char tmpdir[64];

/* An unchecked fixture: runs in Check's parent process, so the folder goes away even when a test
 * fails in its forked child. */
static void tmpdir_setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/corral-tok-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        tmpdir[0] = '\0'; /* the tests then fail writing their files */
    }
}

static void tmpdir_teardown(void) {
    if (!tmpdir[0]) {
        return;
    }
    char path[512];
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", tmpdir, e->d_name);
            unlink(path);
        }
    }
    if (d) closedir(d);
    rmdir(tmpdir);
}

typedef void (*edit_fn)(gguf_builder *b, const gguf_file *src);

/* Copy every key of a shared vocabulary except `drop`, apply edit, write, and try to load a
 * tokenizer from the result: it must fail with `status` and a message containing `needle`. */
static void expect_rejected(const char *source, const char *drop, edit_fn edit,
                            corral_status status, const char *needle) {
    corral_error err;
    gguf_file *src = gguf_open(test_shared_path(source), &err);
    ck_assert_msg(src != NULL, "%s", err.message);
    gguf_builder *b = gguf_builder_new();
    ck_assert_ptr_nonnull(b);
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        if (drop && gguf_str_eq(gguf_kv_key(src, i), drop)) {
            continue;
        }
        ck_assert_int_eq(gguf_builder_copy_kv(b, src, i), CORRAL_OK);
    }
    if (edit) {
        edit(b, src);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/crafted.gguf", tmpdir);
    ck_assert_msg(gguf_builder_write(b, path, &err) == CORRAL_OK, "%s", err.message);
    gguf_builder_destroy(&b);
    gguf_destroy(&src);

    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    tokenizer *t = tok_new_from_gguf(f, &err);
    ck_assert_msg(t == NULL, "a tokenizer was built despite: %s", needle);
    ck_assert_msg(err.status == status, "status %s, expected %s (%s)",
                  corral_status_name(err.status), corral_status_name(status), err.message);
    ck_assert_msg(strstr(err.message, needle) != NULL, "message \"%s\" does not name \"%s\"",
                  err.message, needle);
    gguf_destroy(&f);
}

static void edit_model_unknown(gguf_builder *b, const gguf_file *src) {
    (void)src;
    gguf_builder_set_str(b, "tokenizer.ggml.model", "wordpiece-ng");
}

static void edit_pre_unknown(gguf_builder *b, const gguf_file *src) {
    (void)src;
    gguf_builder_set_str(b, "tokenizer.ggml.pre", "no-such-pre-tokenizer");
}

static void edit_scores_short(gguf_builder *b, const gguf_file *src) {
    uint64_t n = 0;
    gguf_type type;
    ck_assert_int_eq(gguf_get_array(src, "tokenizer.ggml.scores", &type, &n, NULL), CORRAL_OK);
    float *scores = calloc(n, sizeof *scores);
    gguf_builder_set_array(b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, n - 1);
    free(scores);
}

static void edit_types_long(gguf_builder *b, const gguf_file *src) {
    uint64_t n = 0;
    gguf_type type;
    ck_assert_int_eq(gguf_get_array(src, "tokenizer.ggml.tokens", &type, &n, NULL), CORRAL_OK);
    int32_t *types = malloc((n + 1) * sizeof *types);
    for (uint64_t i = 0; i <= n; i++) {
        types[i] = 1;
    }
    gguf_builder_set_array(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n + 1);
    free(types);
}

/* The first 64 merges of the file, then one that names a token the vocabulary lacks. */
static void edit_merges_unknown(gguf_builder *b, const gguf_file *src) {
    int64_t kv = gguf_find_key(src, "tokenizer.ggml.merges");
    ck_assert_int_ge(kv, 0);
    char *merges[65];
    for (int i = 0; i < 64; i++) {
        gguf_str s = gguf_array_str(src, (uint64_t)kv, (uint64_t)i);
        merges[i] = strndup(s.data, s.len);
    }
    merges[64] = strdup("\xc4\xa0the qqqxyzzyqqq");
    gguf_builder_set_str_array(b, "tokenizer.ggml.merges", (const char *const *)merges, 65);
    for (int i = 0; i < 65; i++) {
        free(merges[i]);
    }
}

static void edit_merge_without_space(gguf_builder *b, const gguf_file *src) {
    (void)src;
    const char *merges[] = {"\xc4\xa0 t", "nospace"};
    gguf_builder_set_str_array(b, "tokenizer.ggml.merges", merges, 2);
}

static void edit_add_bos_without_bos(gguf_builder *b, const gguf_file *src) {
    (void)src;
    gguf_builder_set_bool(b, "tokenizer.ggml.add_bos_token", 1);
    gguf_builder_set_u32(b, "tokenizer.ggml.bos_token_id", 4294967295u);
}

static void edit_duplicate_token(gguf_builder *b, const gguf_file *src) {
    int64_t kv = gguf_find_key(src, "tokenizer.ggml.tokens");
    uint64_t n = 0;
    gguf_type type;
    ck_assert_int_eq(gguf_get_array(src, "tokenizer.ggml.tokens", &type, &n, NULL), CORRAL_OK);
    char **toks = malloc(n * sizeof *toks);
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_array_str(src, (uint64_t)kv, i);
        toks[i] = strndup(s.data, s.len);
    }
    free(toks[n - 1]);
    toks[n - 1] = strdup(toks[n - 2]);
    gguf_builder_set_str_array(b, "tokenizer.ggml.tokens", (const char *const *)toks, n);
    for (uint64_t i = 0; i < n; i++) {
        free(toks[i]);
    }
    free(toks);
}

static void edit_bad_byte_token(gguf_builder *b, const gguf_file *src) {
    int64_t kv = gguf_find_key(src, "tokenizer.ggml.tokens");
    uint64_t n = 0;
    gguf_type type;
    ck_assert_int_eq(gguf_get_array(src, "tokenizer.ggml.tokens", &type, &n, NULL), CORRAL_OK);
    char **toks = malloc(n * sizeof *toks);
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_array_str(src, (uint64_t)kv, i);
        toks[i] = strndup(s.data, s.len);
    }
    free(toks[3]); /* <0x00> in the stories vocabulary, a byte token */
    toks[3] = strdup("<0xZZ>");
    gguf_builder_set_str_array(b, "tokenizer.ggml.tokens", (const char *const *)toks, n);
    for (uint64_t i = 0; i < n; i++) {
        free(toks[i]);
    }
    free(toks);
}

START_TEST(test_rejects_bad_vocabularies) {
    expect_rejected("models/stories260K.gguf", "tokenizer.ggml.tokens", NULL, CORRAL_NOT_FOUND,
                    "tokenizer.ggml.tokens");
    expect_rejected("models/stories260K.gguf", "tokenizer.ggml.model", NULL, CORRAL_NOT_FOUND,
                    "tokenizer.ggml.model");
    expect_rejected("models/stories260K.gguf", NULL, edit_model_unknown, CORRAL_UNSUPPORTED,
                    "tokenizer.ggml.model");
    expect_rejected("models/stories260K.gguf", NULL, edit_scores_short, CORRAL_FORMAT,
                    "tokenizer.ggml.scores");
    expect_rejected("models/stories260K.gguf", NULL, edit_types_long, CORRAL_FORMAT,
                    "tokenizer.ggml.token_type");
    expect_rejected("models/stories260K.gguf", NULL, edit_add_bos_without_bos, CORRAL_FORMAT,
                    "tokenizer.ggml.bos_token_id");
    expect_rejected("models/stories260K.gguf", NULL, edit_duplicate_token, CORRAL_FORMAT,
                    "duplicate");
    expect_rejected("models/stories260K.gguf", NULL, edit_bad_byte_token, CORRAL_FORMAT, "<0xZZ>");
    expect_rejected("vocab/ggml-vocab-gpt-2.gguf", NULL, edit_pre_unknown, CORRAL_UNSUPPORTED,
                    "tokenizer.ggml.pre");
    expect_rejected("vocab/ggml-vocab-gpt-2.gguf", NULL, edit_pre_unknown, CORRAL_UNSUPPORTED,
                    "no-such-pre-tokenizer");
    expect_rejected("vocab/ggml-vocab-gpt-2.gguf", NULL, edit_merges_unknown, CORRAL_FORMAT,
                    "tokenizer.ggml.merges");
    expect_rejected("vocab/ggml-vocab-gpt-2.gguf", NULL, edit_merges_unknown, CORRAL_FORMAT,
                    "qqqxyzzyqqq");
    expect_rejected("vocab/ggml-vocab-gpt-2.gguf", NULL, edit_merge_without_space, CORRAL_FORMAT,
                    "tokenizer.ggml.merges");
    expect_rejected("vocab/ggml-vocab-gpt-2.gguf", "tokenizer.ggml.merges", NULL, CORRAL_NOT_FOUND,
                    "tokenizer.ggml.merges");
}
END_TEST

START_TEST(test_bad_arguments) {
    vocab v = vocab_shared("models/stories260K.gguf");
    const tokenizer *t = v.tok;
    corral_error err;
    size_t n;
    int32_t ids[4];
    ck_assert_int_eq(tok_encode(NULL, "a", 1, 0, ids, 4, &n, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(tok_encode(t, NULL, 3, 0, ids, 4, &n, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(tok_encode(t, "a", 1, 0, NULL, 4, &n, &err), CORRAL_INVALID_ARGUMENT);
    int32_t bad[] = {5, 512};
    char buf[16];
    ck_assert_int_eq(tok_decode(t, bad, 2, 0, buf, sizeof buf, &n, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert(strstr(err.message, "512") != NULL);
    ck_assert_int_eq(tok_decode_piece(t, -1, 0, buf, sizeof buf, &n, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_null(tok_new_from_gguf(NULL, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    tokenizer *none = NULL;
    tok_destroy(&none);
    tok_destroy(NULL);
    vocab_close(&v);
}
END_TEST

static Suite *tokenizer_suite(void) {
    Suite *s = suite_create("tokenizer");
    const int n_vocabs = (int)(sizeof all_vocabs / sizeof all_vocabs[0]);

    TCase *core = tcase_create("core");
    tcase_add_test(core, test_reference_vectors);
    tcase_add_test(core, test_phi3_end_marker_text_is_plain_text);
    tcase_add_test(core, test_eog_tokens_never_from_user_text);
    tcase_add_test(core, test_pretokenizer_splits);
    tcase_add_test(core, test_unicode_classes);
    tcase_add_test(core, test_llama_utf8_reading);
    tcase_add_test(core, test_stories_prompt_and_generation);
    tcase_add_test(core, test_parse_special_spm);
    tcase_add_test(core, test_parse_special_bpe);
    tcase_add_test(core, test_user_defined_always_matched);
    tcase_add_test(core, test_eog_and_special_ids);
    tcase_add_test(core, test_token_queries);
    tcase_add_test(core, test_streaming_decoder);
    tcase_add_test(core, test_streaming_decoder_invalid);
    suite_add_tcase(s, core);

    TCase *limits = tcase_create("limits");
    tcase_add_loop_test(limits, test_empty_and_single_byte, 0, n_vocabs);
    tcase_add_loop_test(limits, test_long_repeated_text, 0, n_vocabs);
    tcase_add_loop_test(limits, test_all_bytes_invalid_utf8_and_nul, 0, n_vocabs);
    tcase_add_test(limits, test_bpe_invalid_utf8_is_replacement);
    tcase_add_test(limits, test_small_buffers);
    suite_add_tcase(s, limits);

    TCase *errors = tcase_create("errors");
    tcase_add_unchecked_fixture(errors, tmpdir_setup, tmpdir_teardown);
    tcase_add_test(errors, test_rejects_bad_vocabularies);
    tcase_add_test(errors, test_bad_arguments);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(tokenizer_suite)
