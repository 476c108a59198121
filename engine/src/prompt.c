/*
 * prompt.c — user text and chats to token ids (see prompt.h), on top of the tokenizer's segment
 * encoder, which parses special tokens only inside scaffold segments.
 */
#include "corral/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "corral/log.h"

/* Encode segments into a malloc'ed array: ask for the size first, then fill. */
static corral_status encode_alloc(const tokenizer *t, const tok_segment *segs, size_t n_segs,
                                  uint32_t flags, int32_t **ids, size_t *n_ids, corral_error *err) {
    size_t need = 0;
    *ids = NULL;
    *n_ids = 0;
    corral_status st = tok_encode_segments(t, segs, n_segs, flags, NULL, 0, &need, err);
    if (st != CORRAL_OK && st != CORRAL_RESOURCE_EXHAUSTED) return st;
    int32_t *buf = malloc((need ? need : 1) * sizeof *buf);
    if (!buf) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    st = tok_encode_segments(t, segs, n_segs, flags, buf, need, &need, err);
    if (st != CORRAL_OK) {
        free(buf);
        return st;
    }
    *ids = buf;
    *n_ids = need;
    return CORRAL_OK;
}

corral_status prompt_tokenize_text(const tokenizer *t, const char *text, size_t len, int32_t **ids,
                                   size_t *n_ids, corral_error *err) {
    const tok_segment seg = {.text = text, .len = len, .parse_special = 0};
    return encode_alloc(t, &seg, 1, TOK_ADD_SPECIAL, ids, n_ids, err);
}

corral_status prompt_tokenize_chat(const tokenizer *t, chat_template tmpl,
                                   const chat_message *messages, size_t n, int32_t **ids,
                                   size_t *n_ids, corral_error *err) {
    /* Templates that write bos_token get the vocabulary's, and the tokenizer adds none. */
    char bos[256] = "";
    size_t bos_len = 0;
    const char *bos_text = tok_bos(t) != TOK_NONE ? tok_token_text(t, tok_bos(t), &bos_len) : NULL;
    if (bos_text && bos_len < sizeof bos) memcpy(bos, bos_text, bos_len);
    bos[bos_text && bos_len < sizeof bos ? bos_len : 0] = '\0';
    const chat_options opts = {.add_generation_prompt = true, .bos_token = bos[0] ? bos : NULL};
    chat_prompt *p = chat_prompt_render(tmpl, messages, n, &opts, err);
    if (!p) return err ? err->status : CORRAL_INVALID_ARGUMENT;
    size_t n_segs = 0;
    const chat_segment *cs = chat_prompt_segments(p, &n_segs);
    tok_segment *segs = malloc((n_segs ? n_segs : 1) * sizeof *segs);
    corral_status st;
    if (!segs) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    } else {
        for (size_t i = 0; i < n_segs; i++)
            segs[i] = (tok_segment){
                .text = cs[i].text, .len = cs[i].len, .parse_special = cs[i].is_scaffold};
        st = encode_alloc(t, segs, n_segs, chat_template_writes_bos(tmpl) ? 0 : TOK_ADD_SPECIAL,
                          ids, n_ids, err);
    }
    free(segs);
    chat_prompt_destroy(&p);
    return st;
}

chat_template prompt_file_chat_template(const gguf_file *f) {
    gguf_str src;
    if (gguf_get_str(f, "tokenizer.chat_template", &src, NULL) != CORRAL_OK)
        return CHAT_TEMPLATE_NONE;
    /* chat_template_detect wants a C string; templates are a few kB. */
    char *text = malloc(src.len + 1);
    if (!text) return CHAT_TEMPLATE_NONE;
    memcpy(text, src.data, src.len);
    text[src.len] = '\0';
    chat_template tmpl = chat_template_detect(text);
    free(text);
    if (tmpl == CHAT_TEMPLATE_UNKNOWN) {
        log_warn("the model's chat template is not one corral recognises: chats are rendered with "
                 "the fallback template 'none' (the messages' text joined, no role markers); name "
                 "a template in the model's configuration (template:) or with --template",
                 LOG_STR("model", gguf_path(f)), LOG_STR("fallback", "none"));
        return CHAT_TEMPLATE_NONE;
    }
    return tmpl;
}
