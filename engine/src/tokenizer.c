/*
 * tokenizer.c — the tokenizer object: loading a vocabulary from GGUF metadata, special tokens,
 * the encode entry point and everything about decoding. The merge algorithms live in
 * tokenizer_spm.c and tokenizer_bpe.c, the BPE pre-tokenizers in pretokenize.c.
 *
 * Loading follows llama.cpp's llama_vocab::load where it decides what ids come out (defaults of
 * the special ids and flags, which tokens may be matched in text, the Phi-3 strip rule), and is
 * stricter where it would accept a broken file (arrays whose lengths disagree, merges that name
 * unknown tokens, malformed byte tokens are errors naming the key).
 *
 * Encoding a text:
 *   1. Special tokens are cut out first. Candidates are tried longest text first; each one splits
 *      every remaining raw fragment at all its occurrences (llama.cpp's tokenizer_st_partition).
 *      Control and unknown tokens are candidates only with TOK_PARSE_SPECIAL; user-defined ones
 *      always.
 *   2. Each raw fragment is encoded on its own by the model's algorithm. For SPM a fragment that
 *      starts the text or follows a special token gets the "▁" prefix.
 *   3. BOS / EOS are added around the result when asked and the vocabulary wants them.
 * Ids are written straight into the caller's array while they fit and counted always, so a too
 * small array costs one extra call and no copy.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/log.h"
#include "tokenizer_impl.h"

/* ---- small helpers --------------------------------------------------------------------------- */

const char *tok__quote(char *buf, size_t size, const char *s, size_t len) {
    size_t o = 0;
    if (size < 8) {
        if (size) buf[0] = '\0';
        return buf;
    }
    buf[o++] = '\'';
    for (size_t i = 0; i < len && i < 48 && o + 6 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
            buf[o++] = (char)c;
        } else if (c >= 0x80) {
            buf[o++] = (char)c; /* UTF-8 stays readable in logs */
        } else {
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
        }
    }
    if (len > 48 && o + 5 < size) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

static uint64_t text_hash(const void *s, size_t len) {
    const uint8_t *p = s;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h ^ (h >> 32);
}

int32_t tok__lookup(const tokenizer *t, const void *s, size_t len) {
    for (size_t i = text_hash(s, len) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slots[i];
        if (id == TOK_NONE) {
            return TOK_NONE;
        }
        if (t->text[id].len == len && memcmp(t->text[id].data, s, len) == 0) {
            return id;
        }
    }
}

void *tok__scratch(tok_work *w, int i, size_t bytes) {
    if (bytes == 0) {
        bytes = 1;
    }
    if (w->cap[i] < bytes) {
        free(w->buf[i]);
        w->buf[i] = malloc(bytes);
        w->cap[i] = w->buf[i] ? bytes : 0;
    }
    return w->buf[i];
}

void tok__work_free(tok_work *w) {
    for (size_t i = 0; i < sizeof w->buf / sizeof w->buf[0]; i++) {
        free(w->buf[i]);
        w->buf[i] = NULL;
        w->cap[i] = 0;
    }
}

/* a comes out of the heap before b */
static int bigram_before(const tok_bigram *a, const tok_bigram *b) {
    return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

void tok__heap_push(tok_heap *h, tok_bigram b) {
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->items[parent])) {
            break;
        }
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = b;
}

tok_bigram tok__heap_pop(tok_heap *h) {
    tok_bigram top = h->items[0];
    tok_bigram last = h->items[--h->n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= h->n) {
            break;
        }
        if (child + 1 < h->n && bigram_before(&h->items[child + 1], &h->items[child])) {
            child++;
        }
        if (!bigram_before(&h->items[child], &last)) {
            break;
        }
        h->items[i] = h->items[child];
        i = child;
    }
    if (h->n > 0) {
        h->items[i] = last;
    }
    return top;
}

/* ---- loading --------------------------------------------------------------------------------- */

#define KEY_MODEL  "tokenizer.ggml.model"
#define KEY_PRE    "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_TYPES  "tokenizer.ggml.token_type"

/* Metadata keys of the special roles, in tok_special order. The deprecated FIM spellings are read
 * after the current ones and only fill roles still unset. */
static const char *const special_keys[TOK_SPECIAL_COUNT] = {
    [TOK_SPECIAL_BOS] = "tokenizer.ggml.bos_token_id",
    [TOK_SPECIAL_EOS] = "tokenizer.ggml.eos_token_id",
    [TOK_SPECIAL_EOT] = "tokenizer.ggml.eot_token_id",
    [TOK_SPECIAL_EOM] = "tokenizer.ggml.eom_token_id",
    [TOK_SPECIAL_UNK] = "tokenizer.ggml.unknown_token_id",
    [TOK_SPECIAL_SEP] = "tokenizer.ggml.seperator_token_id", /* sic, as written by converters */
    [TOK_SPECIAL_PAD] = "tokenizer.ggml.padding_token_id",
    [TOK_SPECIAL_MASK] = "tokenizer.ggml.mask_token_id",
    [TOK_SPECIAL_FIM_PRE] = "tokenizer.ggml.fim_pre_token_id",
    [TOK_SPECIAL_FIM_SUF] = "tokenizer.ggml.fim_suf_token_id",
    [TOK_SPECIAL_FIM_MID] = "tokenizer.ggml.fim_mid_token_id",
    [TOK_SPECIAL_FIM_PAD] = "tokenizer.ggml.fim_pad_token_id",
    [TOK_SPECIAL_FIM_REP] = "tokenizer.ggml.fim_rep_token_id",
    [TOK_SPECIAL_FIM_SEP] = "tokenizer.ggml.fim_sep_token_id",
};

static const struct {
    tok_special role;
    const char *key;
} deprecated_special_keys[] = {
    {TOK_SPECIAL_FIM_PRE, "tokenizer.ggml.prefix_token_id"},
    {TOK_SPECIAL_FIM_SUF, "tokenizer.ggml.suffix_token_id"},
    {TOK_SPECIAL_FIM_MID, "tokenizer.ggml.middle_token_id"},
};

/* Texts that mark the end of a turn (llama.cpp's lists). When the file names no EOT, the token
 * with the first of eot_texts present becomes EOT (llama.cpp takes whichever its hash map yields
 * first); tokens among eog_texts stop generation. */
static const char *const eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    ("<\xef\xbd\x9c" /* <｜end▁of▁sentence｜> (DeepSeek); split so \x9c does not eat "end" */
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    "<end_of_utterance>",
};

static const char *const eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    ("<\xef\xbd\x9c" /* <｜end▁of▁sentence｜> */
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    "[e~[",
};

static int32_t find_cstr(const tokenizer *t, const char *s) {
    return tok__lookup(t, s, strlen(s));
}

/* Read a special id: absent keeps *id; 4294967295 (or -1) means none; an id outside the
 * vocabulary is ignored with a warning, as llama.cpp does. */
static corral_status read_special_id(const gguf_file *f, const tokenizer *t, const char *key,
                                     int32_t *id, corral_error *err) {
    if (gguf_find_key(f, key) < 0) {
        return CORRAL_OK;
    }
    uint64_t v = 0;
    corral_status st = gguf_get_u64(f, key, &v, NULL);
    if (st != CORRAL_OK) {
        int32_t neg = 0;
        st = gguf_get_i32(f, key, &neg, err);
        if (st != CORRAL_OK) {
            return st;
        }
        if (neg != -1) {
            return corral_error_set(err, CORRAL_FORMAT, "%s: %s = %d is not a token id",
                                    gguf_path(f), key, neg);
        }
        v = UINT32_MAX;
    }
    if (v == UINT32_MAX) {
        *id = TOK_NONE;
    } else if (v >= (uint64_t)t->n_vocab) {
        log_warn("special token id outside the vocabulary, ignored", LOG_STR("file", gguf_path(f)),
                 LOG_STR("key", key), LOG_UINT("id", v), LOG_INT("n_vocab", t->n_vocab));
    } else {
        *id = (int32_t)v;
    }
    return CORRAL_OK;
}

static corral_status read_bool(const gguf_file *f, const char *key, uint8_t *out,
                               corral_error *err) {
    if (gguf_find_key(f, key) < 0) {
        return CORRAL_OK;
    }
    int v = 0;
    corral_status st = gguf_get_bool(f, key, &v, err);
    if (st == CORRAL_OK) {
        *out = v != 0;
    }
    return st;
}

/* Token texts, the text -> id table, and byte tokens. */
static corral_status load_tokens(tokenizer *t, const gguf_file *f, corral_error *err) {
    int64_t kv = gguf_find_key(f, KEY_TOKENS);
    if (kv < 0) {
        return corral_error_set(err, CORRAL_NOT_FOUND, "%s: no vocabulary: key %s is missing",
                                gguf_path(f), KEY_TOKENS);
    }
    gguf_type elem;
    uint64_t count;
    corral_status st = gguf_get_array(f, KEY_TOKENS, &elem, &count, err);
    if (st != CORRAL_OK) {
        return st;
    }
    if (elem != GGUF_TYPE_STRING) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: %s must be an array of strings, not of %s",
                                gguf_path(f), KEY_TOKENS, gguf_type_name(elem));
    }
    if (count == 0 || count > (uint64_t)INT32_MAX / 4) {
        return corral_error_set(err, CORRAL_FORMAT, "%s: %s has %llu tokens", gguf_path(f),
                                KEY_TOKENS, (unsigned long long)count);
    }
    t->n_vocab = (int32_t)count;
    size_t n = (size_t)count;
    size_t slots = 16;
    while (slots < 2 * n) {
        slots *= 2;
    }
    t->text = calloc(n, sizeof *t->text);
    t->score = calloc(n, sizeof *t->score);
    t->type = malloc(n);
    t->attr = calloc(n, 1);
    t->byte_value = malloc(n * sizeof *t->byte_value);
    t->slots = malloc(slots * sizeof *t->slots);
    if (!t->text || !t->score || !t->type || !t->attr || !t->byte_value || !t->slots) {
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory for %zu tokens",
                                gguf_path(f), n);
    }
    t->slot_mask = slots - 1;
    for (size_t i = 0; i < slots; i++) {
        t->slots[i] = TOK_NONE;
    }

    char q[200];
    for (size_t i = 0; i < n; i++) {
        gguf_str s = gguf_array_str(f, (uint64_t)kv, i);
        t->text[i] = s;
        t->type[i] = TOK_TYPE_NORMAL;
        t->byte_value[i] = -1;
        if (s.len > t->max_piece) {
            t->max_piece = s.len;
        }
        if (s.len == 0) {
            continue; /* an empty piece can never be matched; llama.cpp renames it */
        }
        size_t slot = text_hash(s.data, s.len) & t->slot_mask;
        for (; t->slots[slot] != TOK_NONE; slot = (slot + 1) & t->slot_mask) {
            const gguf_str *o = &t->text[t->slots[slot]];
            if (o->len == s.len && memcmp(o->data, s.data, s.len) == 0) {
                return corral_error_set(err, CORRAL_FORMAT,
                                        "%s: %s: duplicate token %s at ids %d and %zu",
                                        gguf_path(f), KEY_TOKENS,
                                        tok__quote(q, sizeof q, s.data, s.len), t->slots[slot], i);
            }
        }
        t->slots[slot] = (int32_t)i;
    }

    if (gguf_find_key(f, KEY_SCORES) >= 0) {
        gguf_type st_elem;
        uint64_t n_scores;
        st = gguf_get_array(f, KEY_SCORES, &st_elem, &n_scores, err);
        if (st != CORRAL_OK) {
            return st;
        }
        if (n_scores != count) {
            return corral_error_set(err, CORRAL_FORMAT, "%s: %s has %llu entries but %s has %llu",
                                    gguf_path(f), KEY_SCORES, (unsigned long long)n_scores,
                                    KEY_TOKENS, (unsigned long long)count);
        }
        if (st_elem == GGUF_TYPE_INT32) { /* llama.cpp accepts integer scores too */
            int32_t *tmp = malloc(n * sizeof *tmp);
            if (!tmp) {
                return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory for %s",
                                        gguf_path(f), KEY_SCORES);
            }
            st = gguf_array_copy_i32(f, KEY_SCORES, tmp, count, err);
            for (size_t i = 0; st == CORRAL_OK && i < n; i++) {
                t->score[i] = (float)tmp[i];
            }
            free(tmp);
        } else {
            st = gguf_array_copy_f32(f, KEY_SCORES, t->score, count, err);
        }
        if (st != CORRAL_OK) {
            return st;
        }
        for (size_t i = 0; i < n; i++) {
            if (isnan(t->score[i])) {
                t->score[i] = -INFINITY; /* keeps the merge queue's order total */
            }
        }
    }

    if (gguf_find_key(f, KEY_TYPES) >= 0) {
        gguf_type ty_elem;
        uint64_t n_types;
        st = gguf_get_array(f, KEY_TYPES, &ty_elem, &n_types, err);
        if (st != CORRAL_OK) {
            return st;
        }
        if (n_types != count) {
            return corral_error_set(err, CORRAL_FORMAT, "%s: %s has %llu entries but %s has %llu",
                                    gguf_path(f), KEY_TYPES, (unsigned long long)n_types,
                                    KEY_TOKENS, (unsigned long long)count);
        }
        int32_t *tmp = malloc(n * sizeof *tmp);
        if (!tmp) {
            return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory for %s", gguf_path(f),
                                    KEY_TYPES);
        }
        st = gguf_array_copy_i32(f, KEY_TYPES, tmp, count, err);
        for (size_t i = 0; st == CORRAL_OK && i < n; i++) {
            /* values llama.cpp does not know are "undefined" there too */
            t->type[i] =
                tmp[i] >= 0 && tmp[i] < TOK_TYPE_COUNT ? (uint8_t)tmp[i] : TOK_TYPE_UNDEFINED;
        }
        free(tmp);
        if (st != CORRAL_OK) {
            return st;
        }
    }

    /* Byte tokens must read <0xNN>: they are how bytes get back out. */
    for (size_t i = 0; i < n; i++) {
        if (t->type[i] != TOK_TYPE_BYTE) {
            continue;
        }
        const gguf_str *s = &t->text[i];
        unsigned v = 0;
        int ok = s->len == 6 && memcmp(s->data, "<0x", 3) == 0 && s->data[5] == '>';
        for (size_t k = 3; ok && k < 5; k++) {
            int c = (unsigned char)s->data[k];
            ok = isxdigit(c);
            v = v * 16 + (unsigned)(isdigit(c) ? c - '0' : (tolower(c) - 'a' + 10));
        }
        if (!ok) {
            return corral_error_set(
                err, CORRAL_FORMAT, "%s: %s[%zu] is a byte token but reads %s, not <0xNN>",
                gguf_path(f), KEY_TOKENS, i, tok__quote(q, sizeof q, s->data, s->len));
        }
        t->byte_value[i] = (int16_t)v;
    }
    return CORRAL_OK;
}

/* Model, pre-tokenizer, flags and special ids. */
static corral_status load_settings(tokenizer *t, const gguf_file *f, corral_error *err) {
    char q[200];
    gguf_str model;
    corral_status st = gguf_get_str(f, KEY_MODEL, &model, err);
    if (st != CORRAL_OK) {
        return st == CORRAL_NOT_FOUND
                   ? corral_error_set(err, st, "%s: no tokenizer: key %s is missing", gguf_path(f),
                                      KEY_MODEL)
                   : st;
    }
    if (gguf_str_eq(model, "llama")) {
        t->model = TOK_MODEL_SPM;
    } else if (gguf_str_eq(model, "gpt2")) {
        t->model = TOK_MODEL_BPE;
    } else {
        return corral_error_set(
            err, CORRAL_UNSUPPORTED, "%s: %s = %s is not supported (only \"llama\" and \"gpt2\")",
            gguf_path(f), KEY_MODEL, tok__quote(q, sizeof q, model.data, model.len));
    }

    if (t->model == TOK_MODEL_BPE) {
        t->pre = PRETOK_DEFAULT;
        if (gguf_find_key(f, KEY_PRE) < 0) {
            log_warn("BPE vocabulary without a pre-tokenizer type, using llama.cpp's default; "
                     "tokenization will be poor",
                     LOG_STR("file", gguf_path(f)), LOG_STR("key", KEY_PRE));
        } else {
            gguf_str pre;
            st = gguf_get_str(f, KEY_PRE, &pre, err);
            if (st != CORRAL_OK) {
                return st;
            }
            const pretok_name *p = pretok_find(pre.data, (size_t)pre.len);
            if (!p) {
                return corral_error_set(err, CORRAL_UNSUPPORTED,
                                        "%s: unknown pre-tokenizer %s = %s", gguf_path(f), KEY_PRE,
                                        tok__quote(q, sizeof q, pre.data, pre.len));
            }
            t->pre = p->kind;
            t->ignore_merges = p->ignore_merges;
            t->add_bos = p->add_bos;
        }
    }

    /* Defaults are llama.cpp's, except that a BPE file without ids gets none rather than 11. */
    for (int r = 0; r < TOK_SPECIAL_COUNT; r++) {
        t->special[r] = TOK_NONE;
    }
    if (t->model == TOK_MODEL_SPM) {
        t->special[TOK_SPECIAL_BOS] = t->n_vocab > 1 ? 1 : TOK_NONE;
        t->special[TOK_SPECIAL_EOS] = t->n_vocab > 2 ? 2 : TOK_NONE;
        t->special[TOK_SPECIAL_UNK] = 0;
        t->add_space_prefix = 1;
        t->add_bos = 1;
    }
    for (int r = 0; r < TOK_SPECIAL_COUNT; r++) {
        st = read_special_id(f, t, special_keys[r], &t->special[r], err);
        if (st != CORRAL_OK) {
            return st;
        }
    }
    for (size_t i = 0; i < sizeof deprecated_special_keys / sizeof deprecated_special_keys[0];
         i++) {
        int32_t *slot = &t->special[deprecated_special_keys[i].role];
        if (*slot == TOK_NONE) {
            st = read_special_id(f, t, deprecated_special_keys[i].key, slot, err);
            if (st != CORRAL_OK) {
                return st;
            }
        }
    }

    /* the space prefix is an SPM notion: llama.cpp's BPE path never adds one */
    if ((t->model == TOK_MODEL_SPM &&
         (st = read_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err))) ||
        (st = read_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err))) {
        return st;
    }
    if (t->add_bos && t->special[TOK_SPECIAL_BOS] == TOK_NONE) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tokenizer.ggml.add_bos_token is true but "
                                "tokenizer.ggml.bos_token_id is not set",
                                gguf_path(f));
    }
    if (t->add_eos && t->special[TOK_SPECIAL_EOS] == TOK_NONE) {
        return corral_error_set(err, CORRAL_FORMAT,
                                "%s: tokenizer.ggml.add_eos_token is true but "
                                "tokenizer.ggml.eos_token_id is not set",
                                gguf_path(f));
    }
    return CORRAL_OK;
}

/* An end-of-generation token is a control token whatever type the file gives it (llama.cpp
 * overrides the type the same way): it must never come out of user text, which is encoded
 * without control tokens. The Phi-3 and Gemma 3 vocabularies store SentencePiece's "</s>" as
 * USER_DEFINED, which would make a user's literal "</s>" the end of the sequence. */
static void make_control(tokenizer *t, int32_t id) {
    if (t->type[id] == TOK_TYPE_CONTROL) return;
    log_debug("end-of-generation token typed otherwise; treated as a control token",
              LOG_INT("id", id), LOG_INT("type", t->type[id]));
    t->type[id] = TOK_TYPE_CONTROL;
}

/* End-of-generation tokens, found as llama.cpp finds them: EOS, EOT and EOM by id, the first
 * token named like a turn's end as EOT and <|eom_id|> as EOM when the file names none, and every
 * token named like an end (eog_texts). All of them become control tokens (make_control). */
static void mark_eog(tokenizer *t) {
    if (t->special[TOK_SPECIAL_EOT] == TOK_NONE) {
        for (size_t i = 0; i < sizeof eot_texts / sizeof eot_texts[0]; i++) {
            int32_t id = find_cstr(t, eot_texts[i]);
            if (id != TOK_NONE) {
                t->special[TOK_SPECIAL_EOT] = id;
                break;
            }
        }
    }
    if (t->special[TOK_SPECIAL_EOM] == TOK_NONE)
        t->special[TOK_SPECIAL_EOM] = find_cstr(t, "<|eom_id|>");
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = find_cstr(t, eog_texts[i]);
        if (id != TOK_NONE) {
            t->attr[id] |= TOK_ATTR_EOG;
            make_control(t, id);
        }
    }
    const tok_special roles[] = {TOK_SPECIAL_EOS, TOK_SPECIAL_EOT, TOK_SPECIAL_EOM};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        if (t->special[roles[i]] != TOK_NONE) {
            t->attr[t->special[roles[i]]] |= TOK_ATTR_EOG;
            make_control(t, t->special[roles[i]]);
        }
    }
    /* gpt-oss: with <|return|> and <|call|> present, <|end|> only ends a message, not the turn
     * (llama.cpp applies this last, over everything above) */
    int32_t ret = find_cstr(t, "<|return|>"), call = find_cstr(t, "<|call|>");
    int32_t end = find_cstr(t, "<|end|>");
    if (ret != TOK_NONE && call != TOK_NONE && end != TOK_NONE && (t->attr[ret] & TOK_ATTR_EOG) &&
        (t->attr[call] & TOK_ATTR_EOG)) {
        t->attr[end] &= (uint8_t)~TOK_ATTR_EOG;
    }
}

static int is_matchable_type(uint8_t type) {
    return type == TOK_TYPE_CONTROL || type == TOK_TYPE_USER_DEFINED || type == TOK_TYPE_UNKNOWN;
}

/* Sort key of a special token: longer texts are tried first, ties by id. */
typedef struct special_key {
    uint64_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) {
        return x->len > y->len ? -1 : 1;
    }
    return (x->id > y->id) - (x->id < y->id);
}

static int name_contains(gguf_str name, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= name.len; i++) {
        size_t k = 0;
        while (k < n && tolower((unsigned char)name.data[i + k]) == needle[k]) {
            k++;
        }
        if (k == n) {
            return 1;
        }
    }
    return 0;
}

static corral_status build_specials(tokenizer *t, const gguf_file *f, corral_error *err) {
    size_t count = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        count += is_matchable_type(t->type[i]) && t->text[i].len > 0;
    }
    t->specials = malloc((count ? count : 1) * sizeof *t->specials);
    special_key *keys = malloc((count ? count : 1) * sizeof *keys);
    if (!t->specials || !keys) {
        free(keys);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory", gguf_path(f));
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (is_matchable_type(t->type[i]) && t->text[i].len > 0) {
            keys[t->n_specials++] = (special_key){t->text[i].len, i};
        }
    }
    qsort(keys, t->n_specials, sizeof *keys, cmp_special);
    for (size_t i = 0; i < t->n_specials; i++) {
        t->specials[i] = keys[i].id;
    }
    free(keys);

    /* Phi-3 (llama.cpp keys this on general.name): blanks after its special tokens are dropped,
     * except after <unk>, <s> and <|endoftext|>; </s> is stripped too. */
    gguf_str name = {NULL, 0};
    if (gguf_find_key(f, "general.name") >= 0 &&
        gguf_get_str(f, "general.name", &name, NULL) == CORRAL_OK &&
        (name_contains(name, "phi-3") || name_contains(name, "phi3"))) {
        for (size_t i = 0; i < t->n_specials; i++) {
            t->attr[t->specials[i]] |= TOK_ATTR_RSTRIP;
        }
        int32_t id = find_cstr(t, "</s>");
        if (id != TOK_NONE) {
            t->attr[id] |= TOK_ATTR_RSTRIP;
        }
        const char *keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
            id = find_cstr(t, keep[i]);
            if (id != TOK_NONE) {
                t->attr[id] &= (uint8_t)~TOK_ATTR_RSTRIP;
            }
        }
    }
    return CORRAL_OK;
}

tokenizer *tok_new_from_gguf(const gguf_file *f, corral_error *err) {
    if (!f) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tok_new_from_gguf: no file");
        return NULL;
    }
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: no memory for a tokenizer", gguf_path(f));
        return NULL;
    }
    corral_status st = load_tokens(t, f, err);
    if (st == CORRAL_OK) {
        st = load_settings(t, f, err);
    }
    if (st == CORRAL_OK) {
        if (t->model == TOK_MODEL_SPM) {
            tok__spm_load(t);
        } else {
            st = tok__bpe_load(t, f, err);
        }
    }
    if (st == CORRAL_OK) {
        mark_eog(t);
        st = build_specials(t, f, err);
    }
    if (st != CORRAL_OK) {
        tok_destroy(&t);
        return NULL;
    }
    if (t->max_piece == 0) {
        t->max_piece = 1;
    }
    return t;
}

void tok_destroy(tokenizer **tp) {
    if (!tp || !*tp) {
        return;
    }
    tokenizer *t = *tp;
    free(t->text);
    free(t->score);
    free(t->type);
    free(t->attr);
    free(t->byte_value);
    free(t->slots);
    free(t->merges);
    free(t->specials);
    free(t);
    *tp = NULL;
}

/* ---- queries --------------------------------------------------------------------------------- */

static int valid_id(const tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab;
}

int32_t tok_vocab_size(const tokenizer *t) {
    return t ? t->n_vocab : 0;
}

tok_model tok_get_model(const tokenizer *t) {
    return t ? t->model : TOK_MODEL_SPM;
}

const char *tok_pre_name(const tokenizer *t) {
    return t && t->model == TOK_MODEL_BPE ? pretok_kind_name(t->pre) : "";
}

int32_t tok_special_id(const tokenizer *t, tok_special role) {
    return t && (unsigned)role < TOK_SPECIAL_COUNT ? t->special[role] : TOK_NONE;
}

int32_t tok_bos(const tokenizer *t) {
    return tok_special_id(t, TOK_SPECIAL_BOS);
}

int32_t tok_eos(const tokenizer *t) {
    return tok_special_id(t, TOK_SPECIAL_EOS);
}

int32_t tok_eot(const tokenizer *t) {
    return tok_special_id(t, TOK_SPECIAL_EOT);
}

int32_t tok_unk(const tokenizer *t) {
    return tok_special_id(t, TOK_SPECIAL_UNK);
}

int tok_adds_bos(const tokenizer *t) {
    return t ? t->add_bos : 0;
}

int tok_adds_eos(const tokenizer *t) {
    return t ? t->add_eos : 0;
}

int tok_is_eog(const tokenizer *t, int32_t id) {
    return valid_id(t, id) && (t->attr[id] & TOK_ATTR_EOG) != 0;
}

tok_type tok_token_type(const tokenizer *t, int32_t id) {
    return valid_id(t, id) ? (tok_type)t->type[id] : TOK_TYPE_UNDEFINED;
}

float tok_token_score(const tokenizer *t, int32_t id) {
    return valid_id(t, id) ? t->score[id] : 0.0f;
}

const char *tok_token_text(const tokenizer *t, int32_t id, size_t *len) {
    if (!valid_id(t, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = (size_t)t->text[id].len;
    return t->text[id].data;
}

int32_t tok_find_token(const tokenizer *t, const char *text, size_t len) {
    if (!t || (!text && len)) {
        return TOK_NONE;
    }
    return len ? tok__lookup(t, text, len) : TOK_NONE;
}

size_t tok_max_piece_len(const tokenizer *t) {
    return t ? t->max_piece : 0;
}

/* ---- encoding -------------------------------------------------------------------------------- */

/* A stretch of the input: raw text [off, off+len) when token is TOK_NONE, else a special token.
 * `parse_special` records whether control tokens may be matched in it (its segment allows it). */
typedef struct fragment {
    size_t off, len;
    int32_t token;
    int parse_special;
} fragment;

static int is_blank(uint8_t c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Split every raw fragment that may contain special token id (control tokens only in fragments
 * whose segment allows special parsing) at each occurrence. in/out have room for cap. Blanks
 * after right-stripping tokens are dropped later, once fragments are merged across segments. */
static size_t split_at_special(const tokenizer *t, const uint8_t *text, const fragment *in,
                               size_t n_in, int32_t id, fragment *out) {
    const uint8_t *needle = (const uint8_t *)t->text[id].data;
    size_t nlen = (size_t)t->text[id].len;
    int needs_parse = t->type[id] != TOK_TYPE_USER_DEFINED;
    size_t n = 0;
    for (size_t k = 0; k < n_in; k++) {
        if (in[k].token != TOK_NONE || (needs_parse && !in[k].parse_special)) {
            out[n++] = in[k];
            continue;
        }
        const int ps = in[k].parse_special;
        size_t pos = in[k].off, end = in[k].off + in[k].len;
        while (pos < end) {
            const uint8_t *hit = NULL;
            for (size_t from = pos; from + nlen <= end;) {
                const uint8_t *c = memchr(text + from, needle[0], end - nlen + 1 - from);
                if (!c) {
                    break;
                }
                if (memcmp(c, needle, nlen) == 0) {
                    hit = c;
                    break;
                }
                from = (size_t)(c - text) + 1;
            }
            if (!hit) {
                out[n++] = (fragment){pos, end - pos, TOK_NONE, ps};
                break;
            }
            size_t m = (size_t)(hit - text);
            if (m > pos) {
                out[n++] = (fragment){pos, m - pos, TOK_NONE, ps};
            }
            out[n++] = (fragment){m, nlen, id, ps};
            pos = m + nlen;
        }
    }
    return n;
}

corral_status tok_encode(const tokenizer *t, const char *text, size_t len, uint32_t flags,
                         int32_t *ids, size_t cap, size_t *n_ids, corral_error *err) {
    if (n_ids) *n_ids = 0;
    if (!t || !n_ids || (!text && len) || (!ids && cap)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tok_encode: bad arguments");
    }
    const tok_segment seg = {.text = text, .len = len,
                             .parse_special = (flags & TOK_PARSE_SPECIAL) != 0};
    return tok_encode_segments(t, &seg, 1, flags & TOK_ADD_SPECIAL, ids, cap, n_ids, err);
}

corral_status tok_encode_segments(const tokenizer *t, const tok_segment *segs, size_t n_segs,
                                  uint32_t flags, int32_t *ids, size_t cap, size_t *n_ids,
                                  corral_error *err) {
    if (n_ids) *n_ids = 0;
    if (!t || !n_ids || (!segs && n_segs) || (!ids && cap) || (flags & TOK_PARSE_SPECIAL)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tok_encode_segments: bad arguments");
    }
    tok_sink sink = {.ids = ids, .cap = cap, .n = 0};
    tok_work work = {0};
    corral_status st = CORRAL_OK;

    /* One text: the segments side by side (no copy for a single segment). */
    size_t len = 0;
    for (size_t i = 0; i < n_segs; i++) {
        if (!segs[i].text && segs[i].len) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "tok_encode_segments: segment %zu has no text", i);
        }
        len += segs[i].len;
    }
    const uint8_t *u = n_segs == 1 ? (const uint8_t *)segs[0].text : NULL;
    if (n_segs > 1 && len > 0) {
        uint8_t *joined = tok__scratch(&work, TOK_WORK_JOINED, len);
        if (!joined) {
            st = CORRAL_OUT_OF_MEMORY;
            goto done;
        }
        size_t off = 0;
        for (size_t i = 0; i < n_segs; i++) {
            if (segs[i].len) memcpy(joined + off, segs[i].text, segs[i].len);
            off += segs[i].len;
        }
        u = joined;
    }

    /* The text as fragments, one per non-empty segment to begin with. A split leaves at most one
     * raw fragment before each special one, so 2 * len + n_segs + 1 is enough. */
    size_t frag_cap = 2 * len + n_segs + 1;
    fragment *frags = tok__scratch(&work, TOK_WORK_FRAGS, frag_cap * sizeof *frags);
    if (!frags) {
        st = CORRAL_OUT_OF_MEMORY;
        goto done;
    }
    size_t n_frags = 0;
    for (size_t i = 0, off = 0; i < n_segs; off += segs[i].len, i++) {
        if (segs[i].len) {
            frags[n_frags++] = (fragment){off, segs[i].len, TOK_NONE, segs[i].parse_special != 0};
        }
    }
    if (len > 0 && t->n_specials > 0) {
        uint8_t present[256] = {0};
        for (size_t i = 0; i < len; i++) {
            present[u[i]] = 1;
        }
        int any_parse = 0;
        for (size_t i = 0; i < n_segs; i++) any_parse |= segs[i].parse_special != 0;
        fragment *next = NULL;
        for (size_t s = 0; s < t->n_specials; s++) {
            int32_t id = t->specials[s];
            if (!any_parse && t->type[id] != TOK_TYPE_USER_DEFINED) {
                continue;
            }
            if (!present[(uint8_t)t->text[id].data[0]] || t->text[id].len > len) {
                continue;
            }
            if (!next) {
                next = tok__scratch(&work, TOK_WORK_FRAGS_NEXT, frag_cap * sizeof *next);
                if (!next) {
                    st = CORRAL_OUT_OF_MEMORY;
                    goto done;
                }
            }
            n_frags = split_at_special(t, u, frags, n_frags, id, next);
            fragment *swap = frags;
            frags = next;
            next = swap;
        }
    }
    /* Raw text that touches across a segment boundary is one stretch of text, exactly as if the
     * segments had been one string: merge adjacent raw fragments. */
    size_t merged = 0;
    for (size_t k = 0; k < n_frags; k++) {
        if (merged > 0 && frags[k].token == TOK_NONE && frags[merged - 1].token == TOK_NONE &&
            frags[merged - 1].off + frags[merged - 1].len == frags[k].off) {
            frags[merged - 1].len += frags[k].len;
        } else {
            frags[merged++] = frags[k];
        }
    }
    n_frags = merged;
    /* Tokens that right-strip (Phi-3's markers) swallow the blanks after them, wherever those
     * blanks came from, exactly as in one string. */
    for (size_t k = 0; k + 1 < n_frags; k++) {
        if (frags[k].token == TOK_NONE || !(t->attr[frags[k].token] & TOK_ATTR_RSTRIP) ||
            frags[k + 1].token != TOK_NONE) {
            continue;
        }
        while (frags[k + 1].len > 0 && is_blank(u[frags[k + 1].off])) {
            frags[k + 1].off++;
            frags[k + 1].len--;
        }
    }

    if ((flags & TOK_ADD_SPECIAL) && t->add_bos) {
        tok__emit(&sink, t->special[TOK_SPECIAL_BOS]);
    }
    int after_special = 1; /* SPM: the text start counts as following a special token */
    for (size_t k = 0; k < n_frags && st == CORRAL_OK; k++) {
        if (frags[k].token == TOK_NONE && frags[k].len == 0) {
            continue; /* all blanks, stripped */
        }
        if (frags[k].token != TOK_NONE) {
            tok__emit(&sink, frags[k].token);
            after_special = 1;
            continue;
        }
        if (t->model == TOK_MODEL_SPM) {
            st = tok__spm_encode(t, u + frags[k].off, frags[k].len,
                                 t->add_space_prefix && after_special, &work, &sink);
        } else {
            st = tok__bpe_encode(t, u + frags[k].off, frags[k].len, &work, &sink);
        }
        after_special = 0;
    }
    if (st == CORRAL_OK && (flags & TOK_ADD_SPECIAL) && t->add_eos) {
        tok__emit(&sink, t->special[TOK_SPECIAL_EOS]);
    }

done:
    tok__work_free(&work);
    if (st == CORRAL_OUT_OF_MEMORY) {
        return corral_error_set(err, st, "tok_encode: no memory for %zu bytes of text", len);
    }
    if (st != CORRAL_OK) {
        return corral_error_set(err, st, "tok_encode: text of %zu bytes is too long", len);
    }
    *n_ids = sink.n;
    if (sink.n > cap) {
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "tok_encode: %zu ids do not fit in %zu", sink.n, cap);
    }
    return CORRAL_OK;
}

/* ---- decoding -------------------------------------------------------------------------------- */

/* Bytes written while they fit, always counted. */
typedef struct byte_out {
    char *buf;
    size_t cap, n;
} byte_out;

static void put(byte_out *o, const void *p, size_t n) {
    if (o->n < o->cap) {
        size_t room = o->cap - o->n;
        memcpy(o->buf + o->n, p, n < room ? n : room);
    }
    o->n += n;
}

/* Render id into o. While *strip is set, one leading space is dropped; it is cleared by the first
 * piece that renders anything (the dropped space included), so pieces that render as nothing,
 * such as BOS, do not use it up. Returns the bytes rendered. */
static size_t render_piece(const tokenizer *t, int32_t id, uint32_t flags, int *strip,
                           byte_out *o) {
    size_t before = o->n;
    const gguf_str *s = &t->text[id];
    const char *p = s->data;
    size_t len = (size_t)s->len;
    char byte;
    switch ((tok_type)t->type[id]) {
        case TOK_TYPE_CONTROL:
        case TOK_TYPE_UNKNOWN:
            if (!(flags & TOK_DECODE_SPECIAL)) {
                return 0;
            }
            break;
        case TOK_TYPE_USER_DEFINED:
            break;
        case TOK_TYPE_NORMAL:
            if (len == 0) {
                return 0;
            }
            if (t->model == TOK_MODEL_SPM) {
                for (size_t i = 0; i < len;) {
                    if (len - i >= 3 && memcmp(p + i, "\xe2\x96\x81", 3) == 0) {
                        if (!*strip) {
                            put(o, " ", 1);
                        }
                        i += 3;
                    } else {
                        put(o, p + i, 1);
                        i++;
                    }
                    *strip = 0;
                }
                return o->n - before;
            }
            /* BPE: undo the byte table in bounded chunks, never cutting a code point in two */
            for (size_t i = 0; i < len;) {
                char chunk[128];
                size_t take = len - i < sizeof chunk ? len - i : sizeof chunk;
                while (i + take < len && take > 1 && utf8_is_continuation((uint8_t)p[i + take])) {
                    take--;
                }
                size_t m = tok__bpe_unmap(t, p + i, take, chunk);
                const char *c = chunk;
                if (*strip && m > 0) {
                    if (c[0] == ' ') {
                        c++, m--;
                    }
                    *strip = 0;
                }
                put(o, c, m);
                i += take;
            }
            return o->n - before;
        case TOK_TYPE_BYTE:
            if (t->byte_value[id] < 0) {
                return 0;
            }
            byte = (char)t->byte_value[id];
            p = &byte;
            len = 1;
            break;
        case TOK_TYPE_UNUSED:
        case TOK_TYPE_UNDEFINED:
        case TOK_TYPE_COUNT:
            return 0;
    }
    /* the piece's text (control, unknown, user-defined) or its byte, as it is */
    if (len > 0 && *strip) {
        if (p[0] == ' ') {
            p++, len--;
        }
        *strip = 0;
    }
    put(o, p, len);
    return o->n - before;
}

corral_status tok_decode_piece(const tokenizer *t, int32_t id, uint32_t flags, char *buf,
                               size_t cap, size_t *n_bytes, corral_error *err) {
    return tok_decode(t, &id, 1, flags, buf, cap, n_bytes, err);
}

corral_status tok_decode(const tokenizer *t, const int32_t *ids, size_t n, uint32_t flags,
                         char *buf, size_t cap, size_t *n_bytes, corral_error *err) {
    if (n_bytes) *n_bytes = 0;
    if (!t || !n_bytes || (!ids && n) || (!buf && cap)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tok_decode: bad arguments");
    }
    byte_out o = {.buf = buf, .cap = cap, .n = 0};
    int strip = (flags & TOK_DECODE_STRIP_SPACE) && t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        if (!valid_id(t, ids[i])) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "tok_decode: id %d at position %zu is outside the vocabulary "
                                    "of %d tokens",
                                    ids[i], i, t->n_vocab);
        }
        render_piece(t, ids[i], flags, &strip, &o);
    }
    *n_bytes = o.n;
    if (o.n > cap) {
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "tok_decode: %zu bytes do not fit in %zu", o.n, cap);
    }
    return CORRAL_OK;
}

/* ---- streaming decoder ----------------------------------------------------------------------- */

struct tok_decoder {
    const tokenizer *t;
    uint32_t flags;
    int strip;                          /* the next non-empty piece loses a leading space */
    uint8_t pending[UTF8_SEQUENCE_MAX]; /* a UTF-8 sequence the last piece ended inside */
    uint8_t n_pending;
    char *piece; /* max_piece bytes */
    char *out;   /* 3 * (max_piece + 4) bytes: every byte may become U+FFFD */
    size_t n_out;
};

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static void out_bytes(tok_decoder *d, const void *p, size_t n) {
    memcpy(d->out + d->n_out, p, n);
    d->n_out += n;
}

/* A rendered piece through the WHATWG UTF-8 decoder, as a stream: complete characters go out,
 * an ill-formed stretch becomes one U+FFFD per maximal subpart (so the byte that revealed it is
 * looked at again as a new start), and a sequence the piece ends inside waits in d->pending for
 * the next piece. */
static void utf8_feed(tok_decoder *d, const uint8_t *p, size_t n) {
    size_t i = 0;
    /* First finish the sequence the last piece left open, one byte at a time: pending is always a
     * well-formed start, so each added byte completes it, extends it or breaks it. */
    while (d->n_pending > 0 && i < n) {
        d->pending[d->n_pending++] = p[i++];
        size_t len;
        const utf8_status st = utf8_decode(d->pending, d->n_pending, NULL, &len);
        if (st == UTF8_TRUNCATED) continue;
        if (st == UTF8_OK) {
            out_bytes(d, d->pending, len);
        } else {
            out_bytes(d, replacement, sizeof replacement);
            i--; /* the maximal subpart was what came before this byte */
        }
        d->n_pending = 0;
    }
    while (i < n) {
        size_t len;
        switch (utf8_decode(p + i, n - i, NULL, &len)) {
            case UTF8_OK:
                out_bytes(d, p + i, len);
                break;
            case UTF8_INVALID:
                out_bytes(d, replacement, sizeof replacement);
                break;
            case UTF8_TRUNCATED:
                memcpy(d->pending, p + i, len);
                d->n_pending = (uint8_t)len;
                break;
        }
        i += len;
    }
}

tok_decoder *tok_decoder_new(const tokenizer *t, uint32_t flags, corral_error *err) {
    if (!t) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "tok_decoder_new: no tokenizer");
        return NULL;
    }
    tok_decoder *d = calloc(1, sizeof *d);
    if (d) {
        d->piece = malloc(t->max_piece);
        d->out = malloc(3 * (t->max_piece + 4));
    }
    if (!d || !d->piece || !d->out) {
        tok_decoder_destroy(&d);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "tok_decoder_new: no memory");
        return NULL;
    }
    d->t = t;
    d->flags = flags;
    d->strip = (flags & TOK_DECODE_STRIP_SPACE) && t->add_space_prefix;
    return d;
}

corral_status tok_decoder_feed(tok_decoder *d, int32_t id, const char **text, size_t *len,
                               corral_error *err) {
    *text = NULL;
    *len = 0;
    if (!valid_id(d->t, id)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "tok_decoder_feed: id %d is outside the vocabulary of %d tokens",
                                id, d->t->n_vocab);
    }
    byte_out o = {.buf = d->piece, .cap = d->t->max_piece, .n = 0};
    size_t n = render_piece(d->t, id, d->flags, &d->strip, &o);
    d->n_out = 0;
    utf8_feed(d, (const uint8_t *)d->piece, n);
    *text = d->out;
    *len = d->n_out;
    return CORRAL_OK;
}

void tok_decoder_flush(tok_decoder *d, const char **text, size_t *len) {
    d->n_out = 0;
    if (d->n_pending > 0) {
        out_bytes(d, replacement, sizeof replacement);
        d->n_pending = 0;
    }
    d->strip = (d->flags & TOK_DECODE_STRIP_SPACE) && d->t->add_space_prefix;
    *text = d->out;
    *len = d->n_out;
}

void tok_decoder_destroy(tok_decoder **dp) {
    if (!dp || !*dp) {
        return;
    }
    free((*dp)->piece);
    free((*dp)->out);
    free(*dp);
    *dp = NULL;
}
