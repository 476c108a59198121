/*
 * tokenizer_impl.h — the tokenizer's private structure, shared by tokenizer.c (loading, special
 * tokens, decoding), tokenizer_spm.c and tokenizer_bpe.c (the two merge algorithms).
 */
#ifndef CORRAL_TOKENIZER_IMPL_H
#define CORRAL_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "corral/tokenizer.h"
#include "corral/utf8.h"
#include "pretokenize.h"

/* Per-token attribute bits (tokenizer.attr). */
enum {
    TOK_ATTR_EOG = 1u << 0,    /* ends generation */
    TOK_ATTR_RSTRIP = 1u << 1, /* when matched as a special token, blanks after it are dropped */
};

/* One BPE merge: the pair (left, right) of token ids, its rank (its index in
 * tokenizer.ggml.merges: lower merges first) and the token the merged text is (TOK_NONE when the
 * concatenation is not in the vocabulary). left == TOK_NONE marks an empty hash slot. */
typedef struct tok_merge {
    int32_t left, right;
    int32_t rank;
    int32_t result;
} tok_merge;

struct tokenizer {
    tok_model model;
    pretok_kind pre; /* BPE only */
    int32_t n_vocab;

    /* Per token, indexed by id. Texts are borrowed from the gguf_file's mapping. */
    gguf_str *text;
    float *score;
    uint8_t *type;       /* tok_type */
    uint8_t *attr;       /* TOK_ATTR_* */
    int16_t *byte_value; /* the byte a TOK_TYPE_BYTE token "<0xNN>" stands for; -1 otherwise */

    int32_t special[TOK_SPECIAL_COUNT];
    uint8_t add_bos, add_eos;
    uint8_t add_space_prefix; /* SPM: put "▁" in front of text that starts a fragment */
    uint8_t ignore_merges;    /* BPE: a word that is a whole token skips merging */

    /* Exact text -> id: open addressing, linear probing, TOK_NONE = empty. */
    int32_t *slots;
    size_t slot_mask;

    /* BPE merges by (left, right): open addressing, linear probing. */
    tok_merge *merges;
    size_t merge_mask;

    /* byte_token[b]: SPM: the token of byte b (<0xNN>, else the one-byte piece), TOK_NONE if
     * none. BPE: the token of the GPT-2 code point that stands for byte b. */
    int32_t byte_token[256];
    /* BPE: the UTF-8 of the GPT-2 code point of each byte, and the inverse map. */
    uint8_t byte_char[256][2];
    uint8_t byte_char_len[256];
    int16_t char_byte[0x144]; /* code point -> byte, -1 where none (all mapped cpts < 0x144) */

    /* Tokens that may be matched literally in text (control, user-defined, unknown types), longest
     * text first, ties by id. */
    int32_t *specials;
    size_t n_specials;

    size_t max_piece;
};

/* The id whose piece is exactly s[0..len), or TOK_NONE. */
int32_t tok__lookup(const tokenizer *t, const void *s, size_t len);

/* Where encoded ids go: written while they fit, always counted. */
typedef struct tok_sink {
    int32_t *ids;
    size_t cap;
    size_t n;
} tok_sink;

static inline void tok__emit(tok_sink *sink, int32_t id) {
    if (sink->n < sink->cap) {
        sink->ids[sink->n] = id;
    }
    sink->n++;
}

/* Scratch slots used by the algorithms (tok_work.buf indices). */
enum {
    TOK_WORK_TEXT = 0,    /* SPM escaped text / BPE word bytes */
    TOK_WORK_SYMBOLS = 1, /* symbol arrays */
    TOK_WORK_HEAP = 2,
    TOK_WORK_CPTS = 3,  /* BPE code points */
    TOK_WORK_FLAGS = 4, /* BPE code point flags */
    TOK_WORK_ENDS = 5,  /* BPE word ends */
    TOK_WORK_SPLIT = 6, /* BPE pre-tokenizer scratch */
    TOK_WORK_FRAGS = 7, /* special-token fragments (tokenizer.c), and the next list */
    TOK_WORK_FRAGS_NEXT = 8,
    TOK_WORK_JOINED = 9, /* the segments of tok_encode_segments, side by side */
    TOK_WORK_SLOTS
};

/* Growable scratch memory for one tok_encode call. */
typedef struct tok_work {
    void *buf[TOK_WORK_SLOTS];
    size_t cap[TOK_WORK_SLOTS]; /* in bytes */
} tok_work;

/* Ensure slot i of w holds at least bytes; returns it or NULL when out of memory. The old
 * contents are not kept. */
void *tok__scratch(tok_work *w, int i, size_t bytes);
void tok__work_free(tok_work *w);

/* The merge queue shared by both algorithms: a binary max-heap of candidate merges ordered by
 * priority, then by leftmost position. */
typedef struct tok_bigram {
    double priority; /* SPM: the merged token's score; BPE: -rank */
    int32_t left, right;
    uint32_t size;  /* bytes of left + right when queued: stale entries are recognised by it */
    int32_t result; /* the merged token */
} tok_bigram;

typedef struct tok_heap {
    tok_bigram *items;
    size_t n, cap;
} tok_heap;

void tok__heap_push(tok_heap *h, tok_bigram b); /* cap must suffice (callers size it) */
tok_bigram tok__heap_pop(tok_heap *h);          /* h->n > 0 */

/* Model-specific parts of loading, called by tok_new_from_gguf once the vocabulary, its types and
 * the text -> id table are in place. tok__bpe_load reads tokenizer.ggml.merges. */
void tok__spm_load(tokenizer *t);
corral_status tok__bpe_load(tokenizer *t, const gguf_file *f, corral_error *err);

/* ---- text as llama.cpp reads it ---------------------------------------------------------------
 * The reference token ids depend on llama.cpp's lenient reading of UTF-8, so the tokenizer keeps
 * it, built on the base codec: overlong forms and surrogates decode to their value (and
 * surrogates encode back), and each byte that does not start such a shape is one U+FFFD. */

#define TOK_UTF8_LENIENT (UTF8_ALLOW_OVERLONG | UTF8_ALLOW_SURROGATE)

/* Decode one code point from s[0..n) (n >= 1) the way llama.cpp does: a well-formed 1-4 byte
 * shape gives its value, overlong forms and surrogates included; anything else — a stray
 * continuation byte, a truncated sequence, a bad continuation, a lead byte F5-FF, a value above
 * U+10FFFF — gives U+FFFD and consumes one byte. Returns the bytes consumed. */
static inline size_t tok__utf8_decode(const uint8_t *s, size_t n, uint32_t *cpt) {
    size_t len;
    if (utf8_decode_relaxed(s, n, TOK_UTF8_LENIENT, cpt, &len) == UTF8_OK) return len;
    *cpt = UTF8_REPLACEMENT;
    return 1;
}

/* Encode a code point that tok__utf8_decode gave (surrogates included) into out; anything above
 * U+10FFFF is written as U+FFFD. Returns 1-4. */
static inline size_t tok__utf8_encode(uint32_t cpt, uint8_t out[UTF8_SEQUENCE_MAX]) {
    const size_t n = utf8_encode_relaxed(cpt, UTF8_ALLOW_SURROGATE, out);
    return n ? n : utf8_encode(UTF8_REPLACEMENT, out);
}

/* The length of the symbol a byte starts when llama.cpp cuts text into symbols before SPM
 * merging, judged by the high nibble only: 00-BF give 1 (so a stray continuation byte stands
 * alone), C0-DF 2, E0-EF 3, F0-FF 4. */
static inline size_t tok__utf8_symbol_len(uint8_t lead) {
    const size_t n = utf8_lead_length(lead);
    return n ? n : lead < 0xC0 ? 1 : 4; /* 0 for continuation bytes and F8-FF */
}

/* Undo GPT-2's byte table for the text of a normal BPE token: writes at most len bytes to out and
 * returns how many. A code point outside the table is copied as its UTF-8. */
size_t tok__bpe_unmap(const tokenizer *t, const char *s, size_t len, char *out);

/* Render up to 48 bytes of s[0..len) printably into buf (escapes as \xNN), for error messages. */
const char *tok__quote(char *buf, size_t size, const char *s, size_t len);

/* Encode one fragment of raw text (no special tokens inside). */
corral_status tok__spm_encode(const tokenizer *t, const uint8_t *text, size_t len, int prefix,
                              tok_work *w, tok_sink *out);
corral_status tok__bpe_encode(const tokenizer *t, const uint8_t *text, size_t len, tok_work *w,
                              tok_sink *out);


#endif /* CORRAL_TOKENIZER_IMPL_H */
