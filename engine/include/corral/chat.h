/*
 * chat.h — chat templates: turning a conversation into the prompt text a chat model expects.
 *
 * Two kinds of formats. llama.cpp's built-in templates (src/llama-chat.cpp,
 * llm_chat_apply_template, and the expectations in tests/test-chat-template.cpp), reproduced byte
 * for byte; and the Jinja templates that three model families ship (llama3-instruct, qwen3,
 * gemma3), reproduced byte for byte as Jinja renders them (Hugging Face's settings: trim_blocks,
 * lstrip_blocks) — the test oracle is python3-jinja2 rendering the shipped template. corral does
 * not run Jinja: it recognises a model's GGUF `tokenizer.chat_template` by signature substrings
 * (chat_template_detect) and renders the matching format.
 *
 * A rendered prompt is not one string but a sequence of segments. Scaffold segments are the
 * template's own text (`<|im_start|>`, `[INST] `, role names, separators): the tokenizer must
 * parse special-token text in them. Content segments are the messages' text: the tokenizer must
 * NOT parse special tokens in them, so a user who types `<|im_end|>` gets the characters, never
 * the control token. To get llama.cpp's tokens, tokenize the concatenated text the way
 * llama_tokenize(parse_special = true) does, except that special-token strings are only
 * recognised inside scaffold segments: plain text that runs across a segment boundary is one
 * fragment, as it is in llama.cpp. The result then equals llama.cpp's
 * llama_chat_apply_template + llama_tokenize(add_special = true, parse_special = true) for every
 * conversation whose content contains no special-token text.
 *
 * BOS: no built-in template's text starts with the BOS token (llama.cpp's output does not contain
 * `<s>`, `<|begin_of_text|>` or `<bos>` at the start either); BOS is added by the tokenizer
 * according to the vocabulary's add_bos flag, as llama_tokenize(add_special = true) does. The
 * only BOS text in a built-in template is llama2-sys-bos's `<s>` before every later `[INST]`, a
 * scaffold segment, so it becomes the BOS token. The shipped Jinja templates of Llama 3 and
 * Gemma 3 write `bos_token` themselves (chat_template_writes_bos): their text starts with it, a
 * scaffold segment, and the prompt is then tokenized without adding another (prompt.h), as
 * Hugging Face's apply_chat_template does.
 *
 * The templates (S = system, U = user, A = assistant content; "gen" = add_generation_prompt):
 *   none            S, U and A concatenated, nothing else (raw completion); gen adds nothing.
 *   chatml          <|im_start|>ROLE\nTEXT<|im_end|>\n per message; gen: <|im_start|>assistant\n
 *   llama2          "[INST] " S "\n" U " [/INST]" A "</s>" "[INST] " U " [/INST]" ... — the system
 *                   message is folded into the first [INST]. No gen text: the prompt ends in
 *                   " [/INST]". Variants (as llama.cpp):
 *     llama2-sys        S becomes "<<SYS>>\n" S "\n<</SYS>>\n\n";
 *     llama2-sys-bos    as llama2-sys, and every [INST] after the first is preceded by <s>;
 *     llama2-sys-strip  as llama2-sys, with every message's content trimmed of whitespace.
 *   llama3          <|start_header_id|>ROLE<|end_header_id|>\n\nTRIMMED<|eot_id|> per message;
 *                   gen: <|start_header_id|>assistant<|end_header_id|>\n\n
 *   mistral-v1      Mistral's official "v1" template (Mistral-7B-Instruct v0.1/v0.2 with a
 *                   system prompt; llama.cpp's LLM_CHAT_TEMPLATE_MISTRAL_V1):
 *                   " [INST] " S "\n\n" U " [/INST]" " " A "</s>" " [INST] " U " [/INST]" ...;
 *                   no gen text. Also accepted by name as "mistral-instruct".
 *     mistral-v3        "[INST] " S "\n\n" U "[/INST]" " " TRIMMED-A "</s>" ... (v0.3);
 *     mistral-v3-tekken "[INST]" S "\n\n" U "[/INST]" A "</s>" ... (Mistral Nemo).
 *   phi3            <|ROLE|>\nTEXT<|end|>\n per message; gen: <|assistant|>\n
 *   gemma           <start_of_turn>ROLE\nTRIMMED<end_of_turn>\n with assistant called "model";
 *                   gemma has no system role: trimmed system text (several are joined with
 *                   nothing between them) is put before the next user message, followed by
 *                   "\n\n". gen: <start_of_turn>model\n
 *   zephyr          <|ROLE|>\nTEXT<|endoftext|>\n per message; gen: <|assistant|>\n
 *                   (StableLM-2-Zephyr's format, as llama.cpp writes it).
 *   llama3-instruct Meta-Llama-3-Instruct's template as shipped (no add_generation_prompt test):
 *                   BOS, then <|start_header_id|>ROLE<|end_header_id|>\n\nJTRIMMED<|eot_id|> per
 *                   message; <|start_header_id|>assistant<|end_header_id|>\n\n always.
 *   qwen3           Qwen3's template (without tools): a first system message as
 *                   <|im_start|>system\nS<|im_end|>\n; users (and later systems) as chatml; an
 *                   assistant message's "<think>R</think>C" is cut into reasoning R and reply C,
 *                   and the reasoning is written (<think>\nR\n</think>\n\n) only for the turns
 *                   after the last real user query (one that is not a <tool_response>) and only
 *                   when non-empty, or for the last message; gen: <|im_start|>assistant\n.
 *   gemma3          Gemma 3's template: BOS; a first system message becomes a prefix S "\n\n"
 *                   (untrimmed) of the first user turn; then
 *                   <start_of_turn>ROLE\nJTRIMMED<end_of_turn>\n with assistant called "model",
 *                   the roles alternating user/model from the first (a system message in a model
 *                   slot is written as "system"; anything else is an error, the template's
 *                   raise_exception); gen: <start_of_turn>model\n.
 * Trimming removes ASCII whitespace (space, \t, \n, \v, \f, \r) at both ends, as llama.cpp;
 * JTRIMMED is Jinja's trim filter, Python's str.strip(): the code points str.isspace() accepts
 * (ASCII whitespace, U+001C..U+001F, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
 * U+202F, U+205F, U+3000).
 */
#ifndef CORRAL_CHAT_H
#define CORRAL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "corral/status.h"

typedef enum chat_template {
    CHAT_TEMPLATE_UNKNOWN = -1, /* detection found no supported template */
    CHAT_TEMPLATE_NONE = 0,
    CHAT_TEMPLATE_CHATML = 1,
    CHAT_TEMPLATE_LLAMA2 = 2,
    CHAT_TEMPLATE_LLAMA2_SYS = 3,
    CHAT_TEMPLATE_LLAMA2_SYS_BOS = 4,
    CHAT_TEMPLATE_LLAMA2_SYS_STRIP = 5,
    CHAT_TEMPLATE_LLAMA3 = 6,
    CHAT_TEMPLATE_MISTRAL_V1 = 7,
    CHAT_TEMPLATE_MISTRAL_V3 = 8,
    CHAT_TEMPLATE_MISTRAL_V3_TEKKEN = 9,
    CHAT_TEMPLATE_PHI3 = 10,
    CHAT_TEMPLATE_GEMMA = 11,
    CHAT_TEMPLATE_ZEPHYR = 12,
    CHAT_TEMPLATE_LLAMA3_INSTRUCT = 13,
    CHAT_TEMPLATE_QWEN3 = 14,
    CHAT_TEMPLATE_GEMMA3 = 15,
    CHAT_TEMPLATE_COUNT
} chat_template;

/* One message. `role` is "system", "user" or "assistant"; both strings are borrowed for the call
 * and must be NUL-terminated UTF-8 (not checked: bytes are passed through). */
typedef struct chat_message {
    const char *role;
    const char *content;
} chat_message;

/* A piece of a rendered prompt: `len` bytes at `text` (not NUL-terminated: segments are
 * consecutive ranges of chat_prompt_text); `is_scaffold` tells whether special tokens may be
 * parsed in it (see the header comment). */
typedef struct chat_segment {
    const char *text;
    size_t len;
    bool is_scaffold;
} chat_segment;

typedef struct chat_prompt chat_prompt;

/* Recognise a template from a GGUF `tokenizer.chat_template` (Jinja source). A source that is
 * exactly a template name gives that template. The shipped templates corral renders as Jinja do
 * come next: "<|im_start|>" with "reasoning_content" and "last_query_index" → qwen3;
 * "<start_of_turn>" with "first_user_prefix" → gemma3; "<|start_header_id|>" with
 * "bos_token + content" and no "add_generation_prompt" → llama3-instruct. Then llama.cpp's
 * signature substrings, in llama.cpp's order (llm_chat_detect_template): "<|im_start|>" →
 * chatml (but phi-4's "<|im_sep|>" and
 * SmolVLM's "<end_of_utterance>" → unknown); "[INST]" (or a source starting with "mistral") →
 * the mistral or llama2 variant its further cues select (mistral v7's "[SYSTEM_PROMPT]" →
 * unknown); "<|assistant|>" with "<|end|>" → phi3; "<|user|>" with "<|endoftext|>" → zephyr;
 * "<start_of_turn>" → gemma; "<|start_header_id|>" with "<|end_header_id|>" → llama3. Templates
 * that llama.cpp recognises as formats corral does not render (falcon3, glmedge, chatglm,
 * monarch, orion, openchat, vicuna, deepseek, command-r, ...) give CHAT_TEMPLATE_UNKNOWN, as do
 * NULL and anything unrecognised; the caller chooses the fallback. Thread-safe. */
chat_template chat_template_detect(const char *jinja_source);

/* The template called `name` ("chatml", "llama2", "llama2-sys", "llama2-sys-bos",
 * "llama2-sys-strip", "llama3", "mistral-v1" or its alias "mistral-instruct", "mistral-v3",
 * "mistral-v3-tekken", "phi3", "gemma", "zephyr", "llama3-instruct", "qwen3", "gemma3", "none"),
 * for configuration overrides. Unknown
 * names give CHAT_TEMPLATE_UNKNOWN and fill err (may be NULL) with CORRAL_NOT_FOUND and a message
 * naming the name. Thread-safe. */
chat_template chat_template_from_name(const char *name, corral_error *err);

/* The canonical name of a template ("mistral-v1"), or NULL for CHAT_TEMPLATE_UNKNOWN and
 * out-of-range values. Thread-safe; the string is static. */
const char *chat_template_name(chat_template tmpl);

/* 1 when the template writes the BOS token's text itself (llama3-instruct, gemma3): the
 * tokenizer must not add one. Thread-safe. */
bool chat_template_writes_bos(chat_template tmpl);

/* How to render. */
typedef struct chat_options {
    /* Append the assistant header where the template has one (llama3-instruct always does). */
    bool add_generation_prompt;
    /* The text of the vocabulary's BOS token, for templates that write it (Jinja's bos_token);
     * NULL: the family's own ("<|begin_of_text|>" for llama3-instruct, "<bos>" for gemma3).
     * Borrowed for the call. */
    const char *bos_token;
} chat_options;

/* Render n messages with `tmpl`. n may be 0 (the result is whatever the template produces for an
 * empty conversation, possibly no segments; qwen3 and gemma3, whose Jinja fails on an empty list,
 * fail). Caller owns the result (chat_prompt_destroy). Returns NULL and fills err with
 * CORRAL_INVALID_ARGUMENT for an unknown template value, `messages` NULL with n > 0, a NULL role
 * or content, a role other than system/user/assistant (the message names the message index and
 * the role), a conversation gemma3 refuses (roles not alternating: its own message, with the
 * index); CORRAL_OUT_OF_MEMORY if allocation fails. opts NULL: no generation prompt, the family's
 * BOS. Thread-safe (no shared state). */
chat_prompt *chat_prompt_render(chat_template tmpl, const chat_message *messages, size_t n,
                                const chat_options *opts, corral_error *err);

/* chat_prompt_render with the family's BOS text and add_generation_prompt as given. */
chat_prompt *chat_prompt_new(chat_template tmpl, const chat_message *messages, size_t n,
                             bool add_generation_prompt, corral_error *err);

/* Free the prompt and set *p to NULL. NULL-safe (p or *p). */
void chat_prompt_destroy(chat_prompt **p);

/* The segments, in order: *count receives their number. Never two adjacent segments of the same
 * kind, never an empty one. Borrowed: valid until the prompt is destroyed. */
const chat_segment *chat_prompt_segments(const chat_prompt *p, size_t *count);

/* The whole prompt as one NUL-terminated string (all segments concatenated), for logs and tests;
 * *len (may be NULL) receives its length. Borrowed: valid until the prompt is destroyed. */
const char *chat_prompt_text(const chat_prompt *p, size_t *len);

#endif /* CORRAL_CHAT_H */
