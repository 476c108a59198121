/*
 * fuzz_tokenizer.c — bytes in, ids out, text back, for a SentencePiece vocabulary
 * (ggml-vocab-llama-spm.gguf, 32000 tokens) and a byte-level BPE one (ggml-vocab-gpt-2.gguf),
 * both loaded once from the shared test data.
 *
 * Input: the first byte chooses the vocabulary (bit 0: BPE), whether control tokens are parsed
 * (bit 1) and BOS/EOS added (bit 2), and where the text is cut in two for tok_encode_segments
 * (bits 3-7, in 32ths); the rest is the text. The invariants are the ones the project asserts in
 * tests/unit/test_tokenizer.c, applied to every input:
 *   - every id is inside the vocabulary, and the count asked for first is the count written;
 *   - without TOK_PARSE_SPECIAL no control token comes out of text (BOS/EOS added on request
 *     excepted): user text cannot spell <s> or <|endoftext|>;
 *   - encoding the text as two segments gives the ids of encoding it whole (segments only decide
 *     where control tokens may be parsed);
 *   - BPE round trip: decoding gives the input bytes exactly when they are valid UTF-8, and in
 *     general the input as llama.cpp reads it: overlong forms and surrogates decoded to their value
 *     and written back in shortest form, U+FFFD for each byte that starts no such sequence;
 *   - SPM round trip: decoding (the prefix space stripped) gives valid UTF-8 input back exactly,
 *     unless the text holds "▁" itself (it decodes as a space). Ill-formed input is not lossless,
 *     as in llama.cpp: spaces become "▁" before the text is cut into symbols by lead bytes alone,
 *     so a stray F0 before a space swallows part of that "▁" and the byte-fallback tokens bring
 *     its bytes back instead of a space;
 *   - the streaming decoder's pieces concatenate to valid UTF-8, equal to tok_decode's bytes when
 *     those are valid.
 */
#include "corral/gguf.h"
#include "corral/tokenizer.h"
#include "corral/utf8.h"
#include "fuzz.h"

typedef struct vocab {
    const char *rel;
    gguf_file *file;
    tokenizer *tok;
} vocab;

static vocab vocabs[2] = {
    {.rel = "vocab/ggml-vocab-llama-spm.gguf"},
    {.rel = "vocab/ggml-vocab-gpt-2.gguf"},
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < 2; i++) {
        corral_error err = {0};
        const char *path = fuzz_shared_path(vocabs[i].rel);
        vocabs[i].file = gguf_open(path, &err);
        if (vocabs[i].file) vocabs[i].tok = tok_new_from_gguf(vocabs[i].file, &err);
        if (!vocabs[i].tok) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s (set CORRAL_SHARED_DIR)\n", path, err.message);
            exit(1);
        }
    }
    return 0;
}

static int32_t *encode_all(const tokenizer *t, const tok_segment *segs, size_t n_segs,
                           uint32_t flags, size_t *n) {
    corral_error err = {0};
    size_t need = 0;
    corral_status st = tok_encode_segments(t, segs, n_segs, flags, NULL, 0, &need, &err);
    FUZZ_CHECK(st == CORRAL_OK || st == CORRAL_RESOURCE_EXHAUSTED, "encode: %s", err.message);
    FUZZ_CHECK(st == CORRAL_OK || need > 0, "cap 0 too small for 0 ids");
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    FUZZ_CHECK(ids != NULL, "out of memory");
    size_t got = 0;
    st = tok_encode_segments(t, segs, n_segs, flags, ids, need, &got, &err);
    FUZZ_CHECK(st == CORRAL_OK && got == need, "second encode: %s, %zu of %zu ids", err.message,
               got, need);
    *n = got;
    return ids;
}

static char *decode_all(const tokenizer *t, const int32_t *ids, size_t n, uint32_t flags,
                        size_t *len) {
    corral_error err = {0};
    size_t need = 0;
    corral_status st = tok_decode(t, ids, n, flags, NULL, 0, &need, &err);
    FUZZ_CHECK(st == CORRAL_OK || st == CORRAL_RESOURCE_EXHAUSTED, "decode: %s", err.message);
    char *text = malloc(need + 1);
    FUZZ_CHECK(text != NULL, "out of memory");
    size_t got = 0;
    st = tok_decode(t, ids, n, flags, text, need, &got, &err);
    FUZZ_CHECK(st == CORRAL_OK && got == need, "second decode: %s, %zu of %zu bytes", err.message,
               got, need);
    *len = got;
    return text;
}

/* The text byte-level BPE sees: llama.cpp's lenient reading, written back as UTF-8. */
static char *bpe_reading(const uint8_t *s, size_t n, size_t *len) {
    char *out = malloc(3 * n + 1);
    FUZZ_CHECK(out != NULL, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l;
        if (utf8_decode_relaxed(s + i, n - i, UTF8_ALLOW_OVERLONG | UTF8_ALLOW_SURROGATE, &cp,
                                &l) != UTF8_OK) {
            cp = UTF8_REPLACEMENT;
            l = 1;
        }
        o += utf8_encode_relaxed(cp, UTF8_ALLOW_SURROGATE, (uint8_t *)out + o);
        i += l;
    }
    *len = o;
    return out;
}

static void check_stream(const tokenizer *t, const int32_t *ids, size_t n, uint32_t flags,
                         const char *whole, size_t whole_len) {
    corral_error err = {0};
    tok_decoder *d = tok_decoder_new(t, flags, &err);
    FUZZ_CHECK(d != NULL, "decoder: %s", err.message);
    char *out = malloc(3 * whole_len + 8);
    FUZZ_CHECK(out != NULL, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t len;
        if (i < n) {
            corral_status st = tok_decoder_feed(d, ids[i], &piece, &len, &err);
            FUZZ_CHECK(st == CORRAL_OK, "feed %d: %s", ids[i], err.message);
        } else {
            tok_decoder_flush(d, &piece, &len);
        }
        FUZZ_CHECK(o + len <= 3 * whole_len + 8, "stream longer than 3x the decoded bytes");
        if (len) memcpy(out + o, piece, len);
        o += len;
    }
    FUZZ_CHECK(utf8_validate((const uint8_t *)out, o) == o, "stream output is not valid UTF-8");
    if (utf8_validate((const uint8_t *)whole, whole_len) == whole_len)
        FUZZ_CHECK(o == whole_len && memcmp(out, whole, o) == 0,
                   "stream (%zu bytes) differs from tok_decode (%zu)", o, whole_len);
    free(out);
    tok_decoder_destroy(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t sel = data[0];
    const int bpe = sel & 1, parse = (sel >> 1) & 1, add = (sel >> 2) & 1;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const tokenizer *t = vocabs[bpe].tok;
    const int32_t n_vocab = tok_vocab_size(t);

    tok_segment whole = {.text = text, .len = len, .parse_special = parse};
    size_t n = 0;
    int32_t *ids = encode_all(t, &whole, 1, add ? TOK_ADD_SPECIAL : 0, &n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "id %d at %zu outside %d", ids[i], i, n_vocab);
        if (!parse && tok_token_type(t, ids[i]) == TOK_TYPE_CONTROL)
            FUZZ_CHECK(add && ((i == 0 && ids[i] == tok_bos(t) && tok_adds_bos(t)) ||
                               (i == n - 1 && ids[i] == tok_eos(t) && tok_adds_eos(t))),
                       "control token %d at %zu from plain text", ids[i], i);
    }

    if (!parse) {
        const size_t cut = (size_t)(sel >> 3) * len / 32;
        tok_segment two[2] = {{.text = text, .len = cut}, {.text = text + cut, .len = len - cut}};
        size_t n2 = 0;
        int32_t *ids2 = encode_all(t, two, 2, add ? TOK_ADD_SPECIAL : 0, &n2);
        FUZZ_CHECK(n2 == n && memcmp(ids, ids2, n * sizeof *ids) == 0,
                   "segments cut at %zu give %zu ids, the whole text %zu", cut, n2, n);
        free(ids2);
    }

    const uint32_t dflags = bpe ? 0 : TOK_DECODE_STRIP_SPACE;
    size_t back_len = 0;
    char *back = decode_all(t, ids, n, dflags, &back_len);
    if (!parse) {
        if (bpe) {
            size_t want_len = 0;
            char *want = bpe_reading((const uint8_t *)text, len, &want_len);
            FUZZ_CHECK(back_len == want_len && memcmp(back, want, want_len) == 0,
                       "BPE round trip: %zu bytes back, %zu expected", back_len, want_len);
            free(want);
        } else if (utf8_validate((const uint8_t *)text, len) == len &&
                   !memmem(text, len, "\xe2\x96\x81", 3)) {
            FUZZ_CHECK(back_len == len && memcmp(back, text, len) == 0,
                       "SPM round trip: %zu bytes back from %zu", back_len, len);
        }
    }
    check_stream(t, ids, n, dflags, back, back_len);
    free(back);
    free(ids);
    return 0;
}
