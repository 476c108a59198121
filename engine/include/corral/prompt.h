/*
 * prompt.h — turning what a client sends into the token ids the model sees.
 *
 * The one rule: text that came from a user is tokenized with special-token parsing OFF, always.
 * A raw prompt is user text. A chat is rendered by its template into scaffold (the template's own
 * markers, parsed for special tokens) and content (the messages, never parsed), so typing
 * "<|im_end|>" in a message yields the tokens of that text, not the control token.
 */
#ifndef CORRAL_PROMPT_H
#define CORRAL_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "corral/chat.h"
#include "corral/model.h"
#include "corral/status.h"
#include "corral/tokenizer.h"

/* Tokenize user text for completion: BOS/EOS as the model asks, special tokens NOT parsed.
 * *ids is malloc'ed (caller frees), *n_ids its length. */
corral_status prompt_tokenize_text(const tokenizer *t, const char *text, size_t len, int32_t **ids,
                                   size_t *n_ids, corral_error *err);

/* Render messages with a template (adding the assistant's generation prompt) and tokenize the
 * result: scaffold with special tokens, content without, BOS as the model asks — or, for a
 * template that writes bos_token (chat_template_writes_bos), the vocabulary's BOS text in the
 * scaffold and none added. *ids is malloc'ed (caller frees). Errors from the template (unknown
 * role, gemma3's alternation) name the problem. */
corral_status prompt_tokenize_chat(const tokenizer *t, chat_template tmpl,
                                   const chat_message *messages, size_t n, int32_t **ids,
                                   size_t *n_ids, corral_error *err);

/* The chat template of a model file: recognised from its `tokenizer.chat_template`;
 * CHAT_TEMPLATE_NONE (raw completion) when the file has none, or when it is not one corral knows
 * (a warning naming the file and the fallback 'none' is logged). */
chat_template prompt_file_chat_template(const gguf_file *f);

#endif /* CORRAL_PROMPT_H */
