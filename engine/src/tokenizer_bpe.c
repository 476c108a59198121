/*
 * tokenizer_bpe.c — byte-level BPE encoding, for tokenizer.ggml.model = "gpt2".
 *
 * The algorithm (llama.cpp's llm_tokenizer_bpe, after GPT-2):
 *
 *   1. Decode the fragment to code points (each byte that does not start a well-formed sequence
 *      becomes U+FFFD) and cut it into words with the pre-tokenizer (pretokenize.c).
 *   2. Re-encode each word as UTF-8 and start with one symbol per byte. GPT-2 maps every byte to a
 *      printable code point (0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves, the other 68
 *      bytes for U+0100.. in order), and the vocabulary is written in those code points, so the
 *      symbol of byte b is the token whose text is b's code point.
 *   3. Queue every adjacent pair of symbols that tokenizer.ggml.merges lists, keyed by the merge's
 *      rank; repeatedly take the lowest rank (ties: leftmost), skip it when a side has changed
 *      since, merge, and queue the two new neighbour pairs — as in the SPM algorithm, with ranks
 *      for scores.
 *   4. Emit the token of each symbol. (A merge whose concatenation is not a token leaves a symbol
 *      without one; llama.cpp then looks up each byte of its text as a one-byte token.)
 *
 * Merges are kept by token-id pair in a hash table, which load guarantees is equivalent to
 * llama.cpp's lookup by text: every merge's two sides must be tokens. With ignore_merges (Llama 3),
 * a word that is a token as a whole is emitted without merging.
 */
#include <stdlib.h>
#include <string.h>

#include "corral/unicode.h"
#include "tokenizer_impl.h"

typedef struct bpe_symbol {
    int32_t prev, next;
    uint32_t start, len; /* bytes of the word */
    int32_t id;          /* token of the symbol's text, TOK_NONE when it is none */
} bpe_symbol;

static size_t merge_hash(int32_t left, int32_t right) {
    uint64_t x = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x ^ (x >> 29));
}

static const tok_merge *merge_find(const tokenizer *t, int32_t left, int32_t right) {
    for (size_t i = merge_hash(left, right) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const tok_merge *m = &t->merges[i];
        if (m->left == TOK_NONE) {
            return NULL;
        }
        if (m->left == left && m->right == right) {
            return m;
        }
    }
}

/* GPT-2's byte table. */
static void bpe_build_byte_map(tokenizer *t) {
    for (size_t c = 0; c < sizeof t->char_byte / sizeof t->char_byte[0]; c++) {
        t->char_byte[c] = -1;
    }
    uint32_t next_extra = 0x100;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cpt = printable ? (uint32_t)b : next_extra++;
        uint8_t utf8[UTF8_SEQUENCE_MAX];
        size_t n = tok__utf8_encode(cpt, utf8);
        memcpy(t->byte_char[b], utf8, n); /* n <= 2: cpt < 0x800 */
        t->byte_char_len[b] = (uint8_t)n;
        t->char_byte[cpt] = (int16_t)b;
        t->byte_token[b] = tok__lookup(t, utf8, n);
    }
}

corral_status tok__bpe_load(tokenizer *t, const gguf_file *f, corral_error *err) {
    static const char key[] = "tokenizer.ggml.merges";
    bpe_build_byte_map(t);

    int64_t kv = gguf_find_key(f, key);
    if (kv < 0) {
        return corral_error_set(err, CORRAL_NOT_FOUND, "%s: BPE vocabulary without %s",
                                gguf_path(f), key);
    }
    gguf_type elem;
    uint64_t count;
    corral_status st = gguf_get_array(f, key, &elem, &count, err);
    if (st != CORRAL_OK) {
        return st;
    }
    if (elem != GGUF_TYPE_STRING) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: %s must be an array of strings, not of %s",
                                gguf_path(f), key, gguf_type_name(elem));
    }
    if (count > INT32_MAX / 4) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: %s has %llu entries, too many",
                                gguf_path(f), key, (unsigned long long)count);
    }
    size_t cap = 16;
    while (cap < 2 * count) {
        cap *= 2;
    }
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) {
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory for %llu merges",
                                gguf_path(f), (unsigned long long)count);
    }
    for (size_t i = 0; i < cap; i++) {
        t->merges[i].left = TOK_NONE;
    }
    t->merge_mask = cap - 1;

    char *joined = NULL; /* left + right, to find the merged token */
    size_t joined_cap = 0;
    char q1[200], q2[200];
    for (uint64_t i = 0; i < count; i++) {
        gguf_str s = gguf_array_str(f, (uint64_t)kv, i);
        /* "left right": the separator is the first space after the first byte, as in llama.cpp */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(joined);
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s: %s[%llu] = %s has no space between "
                                    "its two tokens",
                                    gguf_path(f), key, (unsigned long long)i,
                                    tok__quote(q1, sizeof q1, s.data, s.len));
        }
        size_t llen = (size_t)(sp - s.data), rlen = s.len - llen - 1;
        int32_t left = tok__lookup(t, s.data, llen);
        int32_t right = tok__lookup(t, sp + 1, rlen);
        if (left == TOK_NONE || right == TOK_NONE) {
            free(joined);
            const char *bad = left == TOK_NONE ? s.data : sp + 1;
            size_t bad_len = left == TOK_NONE ? llen : rlen;
            return corral_error_set(err, CORRAL_FORMAT,
                                    "%s: %s[%llu] = %s refers to %s, which is not in "
                                    "tokenizer.ggml.tokens",
                                    gguf_path(f), key, (unsigned long long)i,
                                    tok__quote(q1, sizeof q1, s.data, s.len),
                                    tok__quote(q2, sizeof q2, bad, bad_len));
        }
        if (llen + rlen > joined_cap) {
            joined_cap = 2 * (llen + rlen);
            char *grown = realloc(joined, joined_cap);
            if (!grown) {
                free(joined);
                return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory reading %s",
                                        gguf_path(f), key);
            }
            joined = grown;
        }
        memcpy(joined, s.data, llen);
        memcpy(joined + llen, sp + 1, rlen);
        int32_t result = tok__lookup(t, joined, llen + rlen);

        size_t slot = merge_hash(left, right) & t->merge_mask;
        while (t->merges[slot].left != TOK_NONE &&
               !(t->merges[slot].left == left && t->merges[slot].right == right)) {
            slot = (slot + 1) & t->merge_mask;
        }
        if (t->merges[slot].left == TOK_NONE) { /* a repeated pair keeps its first rank */
            t->merges[slot] =
                (tok_merge){.left = left, .right = right, .rank = (int32_t)i, .result = result};
        }
    }
    free(joined);
    return CORRAL_OK;
}

size_t tok__bpe_unmap(const tokenizer *t, const char *s, size_t len, char *out) {
    const uint8_t *u = (const uint8_t *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cpt;
        size_t n = tok__utf8_decode(u + i, len - i, &cpt);
        if (cpt < sizeof t->char_byte / sizeof t->char_byte[0] && t->char_byte[cpt] >= 0) {
            out[o++] = (char)t->char_byte[cpt];
        } else {
            memcpy(out + o, s + i, n); /* not from the byte table: keep it as it is */
            o += n;
        }
        i += n;
    }
    return o;
}

static void bpe_try_pair(const tokenizer *t, const bpe_symbol *sym, int32_t left, int32_t right,
                         tok_heap *heap) {
    if (left < 0 || right < 0 || sym[left].id == TOK_NONE || sym[right].id == TOK_NONE) {
        return;
    }
    const tok_merge *m = merge_find(t, sym[left].id, sym[right].id);
    if (!m) {
        return;
    }
    tok__heap_push(heap, (tok_bigram){.priority = -(double)m->rank,
                                      .left = left,
                                      .right = right,
                                      .size = sym[left].len + sym[right].len,
                                      .result = m->result});
}

/* Merge one word (raw bytes) and emit its tokens. sym and heap have room for len and 3 * len. */
static void bpe_encode_word(const tokenizer *t, const uint8_t *word, size_t len, bpe_symbol *sym,
                            tok_heap *heap, uint8_t *mapped, tok_sink *out) {
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < len; i++) {
            memcpy(mapped + m, t->byte_char[word[i]], t->byte_char_len[word[i]]);
            m += t->byte_char_len[word[i]];
        }
        int32_t id = tok__lookup(t, mapped, m);
        if (id != TOK_NONE) {
            tok__emit(out, id);
            return;
        }
    }

    int32_t n = (int32_t)len;
    for (int32_t i = 0; i < n; i++) {
        sym[i] = (bpe_symbol){.prev = i - 1,
                              .next = i + 1 == n ? -1 : i + 1,
                              .start = (uint32_t)i,
                              .len = 1,
                              .id = t->byte_token[word[i]]};
    }
    heap->n = 0;
    for (int32_t i = 1; i < n; i++) {
        bpe_try_pair(t, sym, i - 1, i, heap);
    }
    while (heap->n > 0) {
        tok_bigram b = tok__heap_pop(heap);
        bpe_symbol *left = &sym[b.left], *right = &sym[b.right];
        if (left->len == 0 || right->len == 0 || left->len + right->len != b.size) {
            continue;
        }
        left->len += right->len;
        left->id = b.result;
        right->len = 0;
        left->next = right->next;
        if (right->next >= 0) {
            sym[right->next].prev = b.left;
        }
        bpe_try_pair(t, sym, left->prev, b.left, heap);
        bpe_try_pair(t, sym, b.left, left->next, heap);
    }

    for (int32_t i = 0; i != -1; i = sym[i].next) {
        if (sym[i].id != TOK_NONE) {
            tok__emit(out, sym[i].id);
            continue;
        }
        /* No token: llama.cpp looks up each byte of the mapped text as a one-byte piece. */
        for (uint32_t k = sym[i].start; k < sym[i].start + sym[i].len; k++) {
            for (size_t j = 0; j < t->byte_char_len[word[k]]; j++) {
                int32_t id = tok__lookup(t, &t->byte_char[word[k]][j], 1);
                if (id != TOK_NONE) {
                    tok__emit(out, id);
                }
            }
        }
    }
}

corral_status tok__bpe_encode(const tokenizer *t, const uint8_t *text, size_t len, tok_work *w,
                              tok_sink *out) {
    if (len == 0) {
        return CORRAL_OK;
    }
    if (len > UINT32_MAX / 8) {
        return CORRAL_RESOURCE_EXHAUSTED;
    }
    uint32_t *cpts = tok__scratch(w, TOK_WORK_CPTS, len * sizeof *cpts);
    uint16_t *flags = tok__scratch(w, TOK_WORK_FLAGS, len * sizeof *flags);
    if (!cpts || !flags) {
        return CORRAL_OUT_OF_MEMORY;
    }
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        off += tok__utf8_decode(text + off, len - off, &cpts[n]);
        flags[n] = (uint16_t)unicode_cpt_flags(cpts[n]);
    }

    size_t *ends = tok__scratch(w, TOK_WORK_ENDS, n * sizeof *ends);
    size_t *split = tok__scratch(w, TOK_WORK_SPLIT, n * sizeof *split);
    if (!ends || !split) {
        return CORRAL_OUT_OF_MEMORY;
    }
    size_t n_words = pretok_split(t->pre, cpts, flags, n, ends, split);

    /* Size the per-word buffers for the longest word (in UTF-8 bytes). */
    size_t longest = 0, start = 0;
    for (size_t k = 0; k < n_words; k++) {
        size_t bytes = 0;
        for (size_t i = start; i < ends[k]; i++) {
            bytes += utf8_codepoint_length(cpts[i]); /* cpts[i] <= U+10FFFF: never 0 */
        }
        if (bytes > longest) {
            longest = bytes;
        }
        start = ends[k];
    }
    /* the word, then its mapped text (2 bytes per byte at most) */
    uint8_t *word = tok__scratch(w, TOK_WORK_TEXT, 3 * longest);
    bpe_symbol *sym = tok__scratch(w, TOK_WORK_SYMBOLS, longest * sizeof *sym);
    tok_heap heap = {.items = tok__scratch(w, TOK_WORK_HEAP, 3 * longest * sizeof(tok_bigram)),
                     .n = 0,
                     .cap = 3 * longest};
    if (!word || !sym || !heap.items) {
        return CORRAL_OUT_OF_MEMORY;
    }

    start = 0;
    for (size_t k = 0; k < n_words; k++) {
        size_t bytes = 0;
        for (size_t i = start; i < ends[k]; i++) {
            bytes += tok__utf8_encode(cpts[i], word + bytes);
        }
        bpe_encode_word(t, word, bytes, sym, &heap, word + longest, out);
        start = ends[k];
    }
    return CORRAL_OK;
}
