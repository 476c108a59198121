/*
 * tokenizer_spm.c — SentencePiece-style encoding, for tokenizer.ggml.model = "llama".
 *
 * The algorithm (llama.cpp's llm_tokenizer_spm, itself SentencePiece's BPE-by-score):
 *
 *   1. Escape: every space becomes U+2581 "▁", and a "▁" is put in front of the fragment when it
 *      starts the text or follows a special token (add_space_prefix).
 *   2. Cut the escaped bytes into symbols, one per UTF-8 character — judged only by the lead
 *      byte's length, truncated at the end, so stray bytes stand alone and broken sequences stay
 *      together — kept in a doubly linked list.
 *   3. Queue every adjacent pair whose concatenation is a token, keyed by that token's score.
 *   4. Repeatedly take the best pair (highest score; on ties the leftmost), skip it if either side
 *      has changed since it was queued (its byte size no longer matches), else merge the right
 *      symbol into the left one and queue the new pairs it forms with its neighbours.
 *   5. Emit each remaining symbol's token; a symbol that is not a token (only single characters
 *      can be) falls back to one byte token <0xNN> per byte, or to the unknown token.
 *
 * Each merge removes a symbol and queues at most two pairs, so the queue never holds more than
 * three entries per symbol and the whole run is O(n log n).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* UTF-8 of U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space. */
static const uint8_t spm_space[3] = {0xE2, 0x96, 0x81};

typedef struct spm_symbol {
    int32_t prev, next; /* neighbours in the list, -1 at the ends */
    uint32_t start;     /* byte offset in the escaped text */
    uint32_t len;       /* bytes; 0 once merged into its left neighbour */
    int32_t id;         /* token of the merged text, TOK_NONE while a single character */
} spm_symbol;

void tok__spm_load(tokenizer *t) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char piece[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        int32_t id = tok__lookup(t, piece, sizeof piece);
        if (id == TOK_NONE) {
            /* as llama.cpp: a vocabulary without byte tokens may hold the raw byte itself */
            uint8_t raw = (uint8_t)b;
            id = tok__lookup(t, &raw, 1);
        }
        t->byte_token[b] = id;
    }
}

static void spm_try_pair(const tokenizer *t, const uint8_t *text, const spm_symbol *sym,
                         int32_t left, int32_t right, tok_heap *heap) {
    if (left < 0 || right < 0) {
        return;
    }
    uint32_t size = sym[left].len + sym[right].len;
    int32_t id = tok__lookup(t, text + sym[left].start, size);
    if (id == TOK_NONE) {
        return;
    }
    tok__heap_push(
        heap,
        (tok_bigram){
            .priority = t->score[id], .left = left, .right = right, .size = size, .result = id});
}

static void spm_emit_bytes(const tokenizer *t, const uint8_t *bytes, size_t n, tok_sink *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_token[bytes[i]];
        if (id == TOK_NONE) {
            id = t->special[TOK_SPECIAL_UNK]; /* llama.cpp throws here; unk is the saner answer */
        }
        if (id != TOK_NONE) {
            tok__emit(out, id);
        }
    }
}

corral_status tok__spm_encode(const tokenizer *t, const uint8_t *text, size_t len, int prefix,
                              tok_work *w, tok_sink *out) {
    size_t n_spaces = 0;
    for (size_t i = 0; i < len; i++) {
        n_spaces += text[i] == ' ';
    }
    size_t esc_len = len + 2 * n_spaces + (prefix ? sizeof spm_space : 0);
    if (esc_len == 0) {
        return CORRAL_OK;
    }
    if (esc_len > UINT32_MAX / 4) {
        return CORRAL_RESOURCE_EXHAUSTED; /* offsets are 32-bit; 1 GiB of text is no prompt */
    }
    uint8_t *esc = tok__scratch(w, TOK_WORK_TEXT, esc_len);
    spm_symbol *sym = tok__scratch(w, TOK_WORK_SYMBOLS, esc_len * sizeof *sym);
    tok_heap heap = {.items = tok__scratch(w, TOK_WORK_HEAP, 3 * esc_len * sizeof(tok_bigram)),
                     .n = 0,
                     .cap = 3 * esc_len};
    if (!esc || !sym || !heap.items) {
        return CORRAL_OUT_OF_MEMORY;
    }

    size_t o = 0;
    if (prefix) {
        memcpy(esc, spm_space, sizeof spm_space);
        o = sizeof spm_space;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + o, spm_space, sizeof spm_space);
            o += sizeof spm_space;
        } else {
            esc[o++] = text[i];
        }
    }

    int32_t n = 0;
    for (size_t off = 0; off < esc_len;) {
        size_t l = tok__utf8_symbol_len(esc[off]);
        if (l > esc_len - off) {
            l = esc_len - off;
        }
        sym[n] = (spm_symbol){.prev = n - 1,
                              .next = off + l == esc_len ? -1 : n + 1,
                              .start = (uint32_t)off,
                              .len = (uint32_t)l,
                              .id = TOK_NONE};
        n++;
        off += l;
    }

    for (int32_t i = 1; i < n; i++) {
        spm_try_pair(t, esc, sym, i - 1, i, &heap);
    }
    while (heap.n > 0) {
        tok_bigram b = tok__heap_pop(&heap);
        spm_symbol *left = &sym[b.left], *right = &sym[b.right];
        if (left->len == 0 || right->len == 0 || left->len + right->len != b.size) {
            continue; /* one side was merged into something else meanwhile */
        }
        left->len += right->len;
        left->id = b.result;
        right->len = 0;
        left->next = right->next;
        if (right->next >= 0) {
            sym[right->next].prev = b.left;
        }
        spm_try_pair(t, esc, sym, left->prev, b.left, &heap);
        spm_try_pair(t, esc, sym, b.left, left->next, &heap);
    }

    for (int32_t i = 0; i != -1; i = sym[i].next) {
        int32_t id = sym[i].id;
        if (id == TOK_NONE) {
            id = tok__lookup(t, esc + sym[i].start, sym[i].len);
        }
        if (id != TOK_NONE) {
            tok__emit(out, id);
        } else {
            spm_emit_bytes(t, esc + sym[i].start, sym[i].len, out);
        }
    }
    return CORRAL_OK;
}
