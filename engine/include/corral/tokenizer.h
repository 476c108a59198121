/*
 * tokenizer.h — text to token ids and back, for the vocabularies stored in GGUF files.
 *
 * Two tokenizer models are supported, chosen by `tokenizer.ggml.model`, and both reproduce
 * llama.cpp's ids exactly (the reference vectors in shared/vocab are the test):
 *   - "llama": SentencePiece-style. Spaces become U+2581 "▁", a "▁" is put in front of the text
 *     (`tokenizer.ggml.add_space_prefix`, default true), then adjacent symbols are merged by
 *     token score, highest first; what is left over falls back to byte tokens <0xNN>.
 *   - "gpt2": byte-level BPE. The text is cut into words by the pre-tokenizer named by
 *     `tokenizer.ggml.pre` (GPT-2, Llama 3, Qwen 2, Falcon, StarCoder, DeepSeek, ... families),
 *     bytes are mapped to printable code points with GPT-2's table, and merges are applied by
 *     rank from `tokenizer.ggml.merges`.
 *
 * Special tokens: control and user-defined tokens can be matched literally in the text before
 * the model runs. Control tokens (<s>, <|im_start|>, ...) are matched only when the caller passes
 * TOK_PARSE_SPECIAL; user content must always be encoded without it, so that no one can type a
 * control token. User-defined tokens are matched in both cases, as llama.cpp does (they are
 * ordinary text that the vocabulary wants kept whole).
 *
 * Invalid UTF-8 never fails: SPM encodes stray bytes with byte tokens; BPE replaces each byte that
 * does not start a well-formed sequence with U+FFFD, as llama.cpp does. NUL bytes are ordinary
 * text (lengths are explicit everywhere).
 *
 * Ownership and threads: a tokenizer BORROWS its gguf_file — token texts point into the file's
 * mapping — so the gguf_file must outlive the tokenizer. After tok_new_from_gguf returns, a
 * tokenizer is immutable: every function taking a `const tokenizer *` is safe to call from many
 * threads at once. A tok_decoder has state and belongs to one thread at a time.
 */
#ifndef CORRAL_TOKENIZER_H
#define CORRAL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "corral/gguf.h"
#include "corral/status.h"

/* "No such token" for ids; also what a special-token id is when the file says 4294967295. */
#define TOK_NONE (-1)

typedef struct tokenizer tokenizer;

typedef enum tok_model {
    TOK_MODEL_SPM = 0, /* tokenizer.ggml.model = "llama" */
    TOK_MODEL_BPE = 1, /* tokenizer.ggml.model = "gpt2" */
    TOK_MODEL_COUNT
} tok_model;

/* Token types, with the numbers stored in `tokenizer.ggml.token_type`. */
typedef enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
    TOK_TYPE_COUNT
} tok_type;

/* The special-token roles read from `tokenizer.ggml.<role>_token_id`. */
typedef enum tok_special {
    TOK_SPECIAL_BOS = 0,
    TOK_SPECIAL_EOS = 1,
    TOK_SPECIAL_EOT = 2, /* end of turn */
    TOK_SPECIAL_EOM = 3, /* end of message (tool call follows) */
    TOK_SPECIAL_UNK = 4,
    TOK_SPECIAL_SEP = 5,
    TOK_SPECIAL_PAD = 6,
    TOK_SPECIAL_MASK = 7,
    TOK_SPECIAL_FIM_PRE = 8,
    TOK_SPECIAL_FIM_SUF = 9,
    TOK_SPECIAL_FIM_MID = 10,
    TOK_SPECIAL_FIM_PAD = 11,
    TOK_SPECIAL_FIM_REP = 12,
    TOK_SPECIAL_FIM_SEP = 13,
    TOK_SPECIAL_COUNT
} tok_special;

/* tok_encode flags.
 *   TOK_ADD_SPECIAL: add BOS / EOS as the file asks (add_bos_token / add_eos_token).
 *   TOK_PARSE_SPECIAL: match control tokens written in the text. Never for user content. */
#define TOK_ADD_SPECIAL   (1u << 0)
#define TOK_PARSE_SPECIAL (1u << 1)

/* Decode flags (tok_decode_piece, tok_decode, tok_decoder_new).
 *   TOK_DECODE_SPECIAL: render control and unknown tokens as their text (otherwise they render as
 *     nothing).
 *   TOK_DECODE_STRIP_SPACE: drop one leading space from the first piece that renders anything,
 *     when the tokenizer adds a space prefix (SPM), so that decode(encode(s)) == s. Pieces that
 *     render nothing (BOS) do not use it up. */
#define TOK_DECODE_SPECIAL     (1u << 0)
#define TOK_DECODE_STRIP_SPACE (1u << 1)

/* ---- lifetime -------------------------------------------------------------------------------- */

/* Build the tokenizer described by the `tokenizer.ggml.*` metadata of f. f is borrowed and must
 * outlive the result (token texts point into its mapping). Caller owns the result (tok_destroy).
 * On failure returns NULL and fills err with a message naming the key at fault:
 * CORRAL_NOT_FOUND (tokenizer.ggml.model or tokens missing), CORRAL_UNSUPPORTED (unknown model or
 * pre-tokenizer), CORRAL_FORMAT (wrong value types, array lengths that disagree, a merge naming an
 * unknown token, duplicate tokens, ...), CORRAL_OUT_OF_MEMORY. Costs O(vocabulary + merges). */
tokenizer *tok_new_from_gguf(const gguf_file *f, corral_error *err);

/* Free the tokenizer. NULL-safe; sets *t to NULL. */
void tok_destroy(tokenizer **t);

/* ---- vocabulary ------------------------------------------------------------------------------ */

/* Number of tokens (ids are 0 .. size-1), and the tokenizer model. */
int32_t tok_vocab_size(const tokenizer *t);
tok_model tok_get_model(const tokenizer *t);

/* The pre-tokenizer family in use ("gpt2", "llama3", ...); "" for SPM. Static string. */
const char *tok_pre_name(const tokenizer *t);

/* The id of a special role, or TOK_NONE when the vocabulary has none. */
int32_t tok_special_id(const tokenizer *t, tok_special role);
int32_t tok_bos(const tokenizer *t);
int32_t tok_eos(const tokenizer *t);
int32_t tok_eot(const tokenizer *t);
int32_t tok_unk(const tokenizer *t);

/* Whether TOK_ADD_SPECIAL adds BOS / EOS (the file's add_bos/add_eos_token, or the model's
 * default). */
int tok_adds_bos(const tokenizer *t);
int tok_adds_eos(const tokenizer *t);

/* 1 if generation should stop at id: EOS, EOT, EOM, and control tokens that end a turn by name
 * (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, <|endoftext|>, ...). 0 for anything else,
 * including out-of-range ids. */
int tok_is_eog(const tokenizer *t, int32_t id);

/* The type of id; TOK_TYPE_UNDEFINED for out-of-range ids. */
tok_type tok_token_type(const tokenizer *t, int32_t id);

/* The score of id (SPM merge priority; 0 when the file has none or id is out of range). */
float tok_token_score(const tokenizer *t, int32_t id);

/* The raw piece of id as stored in the vocabulary ("▁the", "Ġthe", "<0x0A>", "<s>"): *len bytes,
 * NOT NUL-terminated. Borrowed from the gguf_file. NULL (and *len = 0) for out-of-range ids. */
const char *tok_token_text(const tokenizer *t, int32_t id, size_t *len);

/* The id whose raw piece is exactly text[0..len), or TOK_NONE. */
int32_t tok_find_token(const tokenizer *t, const char *text, size_t len);

/* The longest raw piece, in bytes: an upper bound for the output of tok_decode_piece. */
size_t tok_max_piece_len(const tokenizer *t);

/* ---- encoding -------------------------------------------------------------------------------- */

/* Encode text[0..len) (any bytes; NUL allowed; text may be NULL when len is 0) with flags
 * (TOK_ADD_SPECIAL, TOK_PARSE_SPECIAL). Writes up to cap ids to ids (which may be NULL when cap is
 * 0) and the total count to *n_ids. Returns CORRAL_OK; CORRAL_RESOURCE_EXHAUSTED when cap is too
 * small, with *n_ids set to the count needed (grow and call again); CORRAL_OUT_OF_MEMORY;
 * CORRAL_INVALID_ARGUMENT for NULL pointers where data is promised.
 * Allocates working memory proportional to len for the duration of the call; runs in
 * O(len log len). Thread-safe. */
corral_status tok_encode(const tokenizer *t, const char *text, size_t len, uint32_t flags,
                         int32_t *ids, size_t cap, size_t *n_ids, corral_error *err);

/* A piece of text for tok_encode_segments: `len` bytes at `text`; control tokens are matched in
 * it only when parse_special is nonzero. */
typedef struct tok_segment {
    const char *text;
    size_t len;
    int parse_special;
} tok_segment;

/* Encode segments as if they were one string, except that control tokens are recognised only
 * inside segments with parse_special set: a chat template's scaffold is parsed, the messages in
 * it are not. Text that runs across a segment boundary is tokenized as one stretch, so a chat
 * gives exactly the ids llama.cpp gives for the rendered string (as long as the messages contain
 * no special-token text). flags: TOK_ADD_SPECIAL only. Same buffer and error contract as
 * tok_encode. Thread-safe. */
corral_status tok_encode_segments(const tokenizer *t, const tok_segment *segs, size_t n_segs,
                                  uint32_t flags, int32_t *ids, size_t cap, size_t *n_ids,
                                  corral_error *err);

/* ---- decoding -------------------------------------------------------------------------------- */

/* The bytes of one token (flags: TOK_DECODE_SPECIAL; TOK_DECODE_STRIP_SPACE strips a leading
 * space here too). SPM: "▁" becomes a space, <0xNN> the byte NN. BPE: GPT-2's byte table is
 * undone. Control and unknown tokens render as nothing unless TOK_DECODE_SPECIAL; user-defined
 * tokens render as their text; unused and undefined ones as nothing. The bytes need not be valid
 * UTF-8 on their own. Writes up to cap bytes to buf (no NUL) and the full length to *n_bytes.
 * Returns CORRAL_OK, CORRAL_RESOURCE_EXHAUSTED (cap too small; *n_bytes = needed) or
 * CORRAL_INVALID_ARGUMENT (id out of range). */
corral_status tok_decode_piece(const tokenizer *t, int32_t id, uint32_t flags, char *buf,
                               size_t cap, size_t *n_bytes, corral_error *err);

/* The concatenated pieces of ids[0..n) (flags as above; TOK_DECODE_STRIP_SPACE applies once, to
 * the first piece that renders anything). Same buffer contract as tok_decode_piece; an
 * out-of-range id anywhere gives CORRAL_INVALID_ARGUMENT naming its position. */
corral_status tok_decode(const tokenizer *t, const int32_t *ids, size_t n, uint32_t flags,
                         char *buf, size_t cap, size_t *n_bytes, corral_error *err);

/* ---- streaming decoder ----------------------------------------------------------------------- */

/* Turns ids, fed one at a time as they are generated, into text that is always valid UTF-8: bytes
 * of a character split across tokens are held back until the character is complete. A sequence
 * that cannot be completed (a bad lead or continuation byte) is replaced by U+FFFD, one per
 * maximal ill-formed part (the WHATWG decoding rule), so for valid text the outputs concatenate to
 * exactly tok_decode's bytes. */
typedef struct tok_decoder tok_decoder;

/* A decoder over t (borrowed: t must outlive it) with decode flags. Caller owns the result
 * (tok_decoder_destroy). NULL and err filled on failure (CORRAL_OUT_OF_MEMORY). */
tok_decoder *tok_decoder_new(const tokenizer *t, uint32_t flags, corral_error *err);

/* Feed one id. Sets *text and *len to the bytes now ready (possibly none). The bytes are borrowed:
 * valid until the next call on this decoder. CORRAL_INVALID_ARGUMENT for an out-of-range id (the
 * decoder's state is unchanged). No allocation. */
corral_status tok_decoder_feed(tok_decoder *d, int32_t id, const char **text, size_t *len,
                               corral_error *err);

/* End of stream: emits U+FFFD for a held-back incomplete character, if any, and resets the decoder
 * for a new stream (the leading-space strip applies again). Same borrowing as feed. */
void tok_decoder_flush(tok_decoder *d, const char **text, size_t *len);

/* Free. NULL-safe; sets *d to NULL. */
void tok_decoder_destroy(tok_decoder **d);

#endif /* CORRAL_TOKENIZER_H */
