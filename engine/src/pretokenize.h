/*
 * pretokenize.h — the pre-tokenizers of byte-level BPE vocabularies: cutting text into the
 * "words" that BPE then merges inside, as llama.cpp does for each `tokenizer.ggml.pre` value.
 * Internal to the tokenizer (engine/src/tokenizer*.c).
 *
 * Text arrives as code points (decoded with tok__utf8_decode) together with their class flags
 * (unicode_cpt_flags); words come back as end offsets in code points. Splitting is linear in the
 * text length for every family. Pure functions; thread-safe.
 */
#ifndef CORRAL_PRETOKENIZE_H
#define CORRAL_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

/* The regex families. Several `tokenizer.ggml.pre` names share one family (pretok_find). */
typedef enum pretok_kind {
    PRETOK_DEFAULT = 0,        /* llama.cpp's fallback: punctuation runs, GPT-2, digit runs, 3s */
    PRETOK_GPT2 = 1,           /* 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
    PRETOK_LLAMA3 = 2,         /* the Llama 3 / tiktoken cl100k pattern, digits in 3s */
    PRETOK_QWEN2 = 3,          /* the Llama 3 pattern with single digits */
    PRETOK_FALCON = 4,         /* punctuation runs, then GPT-2, then ASCII digit triples */
    PRETOK_STARCODER = 5,      /* single digits, then GPT-2 */
    PRETOK_DEEPSEEK_LLM = 6,   /* DeepSeek LLM's six-regex cascade */
    PRETOK_DEEPSEEK_CODER = 7, /* DeepSeek Coder's five-regex cascade */
    PRETOK_COUNT
} pretok_kind;

/* One accepted value of `tokenizer.ggml.pre` and what it implies. */
typedef struct pretok_name {
    const char *name;
    pretok_kind kind;
    uint8_t ignore_merges; /* a word that is already a whole token is emitted without merging */
    uint8_t add_bos;       /* add_bos default when tokenizer.ggml.add_bos_token is absent */
} pretok_name;

/* The table entry for a `tokenizer.ggml.pre` value (len bytes, not NUL-terminated), or NULL when
 * the name is unknown. */
const pretok_name *pretok_find(const char *name, size_t len);

/* A short name of the family ("gpt2", "llama3", ...), for logs. */
const char *pretok_kind_name(pretok_kind kind);

/* Cut cpts[0..n) (with flags[i] = unicode_cpt_flags(cpts[i])) into words. Writes the exclusive end
 * offset of each word, in order, to ends[] and returns the number of words (0 for n == 0; the last
 * end is n). ends and scratch must each have room for n entries. */
size_t pretok_split(pretok_kind kind, const uint32_t *cpts, const uint16_t *flags, size_t n,
                    size_t *ends, size_t *scratch);

#endif /* CORRAL_PRETOKENIZE_H */
