/*
 * test_prompt.c — Check suite for prompt building: chats tokenize exactly like llama.cpp's
 * rendered-string tokenization when messages are benign, and no user text — in a raw prompt or
 * in any message of any template, on any vocabulary — ever yields a control token.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corral/log.h"

#include "corral/prompt.h"
#include "testutil.h"

typedef struct vocab {
    gguf_file *f;
    tokenizer *t;
    char name[128];
} vocab;

enum { MAX_VOCABS = 32 };

/* Every ggml-vocab-*.gguf of the shared folder (new files are picked up). */
static int open_vocabs(vocab *v) {
    DIR *d = opendir(test_shared_path("vocab"));
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_VOCABS) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
        char rel[300];
        snprintf(rel, sizeof rel, "vocab/%s", e->d_name);
        corral_error err;
        v[n].f = gguf_open(test_shared_path(rel), &err);
        ck_assert_msg(v[n].f != NULL, "%s", err.message);
        v[n].t = tok_new_from_gguf(v[n].f, &err);
        ck_assert_msg(v[n].t != NULL, "%s", err.message);
        snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
        n++;
    }
    closedir(d);
    ck_assert_int_ge(n, 6);
    return n;
}

static void close_vocabs(vocab *v, int n) {
    for (int i = 0; i < n; i++) {
        tok_destroy(&v[i].t);
        gguf_destroy(&v[i].f);
    }
}

static const chat_template templates[] = {
    CHAT_TEMPLATE_CHATML, CHAT_TEMPLATE_LLAMA2,          CHAT_TEMPLATE_LLAMA2_SYS,
    CHAT_TEMPLATE_LLAMA3, CHAT_TEMPLATE_MISTRAL_V1,      CHAT_TEMPLATE_MISTRAL_V3,
    CHAT_TEMPLATE_PHI3,   CHAT_TEMPLATE_GEMMA,           CHAT_TEMPLATE_ZEPHYR,
    CHAT_TEMPLATE_NONE,   CHAT_TEMPLATE_LLAMA3_INSTRUCT, CHAT_TEMPLATE_QWEN3,
    CHAT_TEMPLATE_GEMMA3,
};
#define N_TEMPLATES (sizeof templates / sizeof templates[0])

START_TEST(test_benign_chat_equals_rendered_string_tokenization) {
    vocab v[MAX_VOCABS];
    int n = open_vocabs(v);
    const chat_message msgs[] = {
        {"system", "You are a helpful assistant."},
        {"user", "Hello there!\nHow are you?"},
        {"assistant", " I am fine, thanks."},
        {"user", "What is 2+2?"},
    };
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < N_TEMPLATES; k++) {
            corral_error err;
            int32_t *ids;
            size_t n_ids;
            ck_assert_int_eq(
                prompt_tokenize_chat(v[i].t, templates[k], msgs, 4, &ids, &n_ids, &err), CORRAL_OK);
            /* A template that writes bos_token gets the vocabulary's, and then nothing is
             * added: exactly one BOS either way. */
            const bool writes_bos = chat_template_writes_bos(templates[k]);
            char bos[64] = "";
            size_t bos_len = 0;
            if (tok_bos(v[i].t) != TOK_NONE) {
                const char *b = tok_token_text(v[i].t, tok_bos(v[i].t), &bos_len);
                snprintf(bos, sizeof bos, "%.*s", (int)bos_len, b);
            }
            const chat_options opts = {.add_generation_prompt = true,
                                       .bos_token = bos[0] ? bos : NULL};
            chat_prompt *p = chat_prompt_render(templates[k], msgs, 4, &opts, &err);
            size_t len;
            const char *text = chat_prompt_text(p, &len);
            size_t n_ref;
            const uint32_t flags = (writes_bos ? 0 : TOK_ADD_SPECIAL) | TOK_PARSE_SPECIAL;
            tok_encode(v[i].t, text, len, flags, NULL, 0, &n_ref, &err);
            int32_t *ref = malloc(n_ref * sizeof *ref);
            ck_assert_int_eq(tok_encode(v[i].t, text, len, flags, ref, n_ref, &n_ref, &err),
                             CORRAL_OK);
            if (writes_bos && bos[0]) {
                ck_assert_int_eq(ids[0], tok_bos(v[i].t));
                ck_assert_int_ne(ids[1], tok_bos(v[i].t));
            }
            ck_assert_msg(n_ids == n_ref && memcmp(ids, ref, n_ids * sizeof *ids) == 0,
                          "%s, template %s: segment tokenization differs from the rendered string",
                          v[i].name, chat_template_name(templates[k]));
            free(ref);
            free(ids);
            chat_prompt_destroy(&p);
        }
    }
    close_vocabs(v, n);
}
END_TEST

/* All control-token texts of a vocabulary, concatenated with spaces (the attack string). */
static char *all_control_texts(const tokenizer *t) {
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    for (int32_t id = 0; id < tok_vocab_size(t); id++) {
        if (tok_token_type(t, id) != TOK_TYPE_CONTROL) continue;
        size_t n;
        const char *text = tok_token_text(t, id, &n);
        if (len + n + 2 >= cap) break;
        memcpy(s + len, text, n);
        len += n;
        s[len++] = ' ';
    }
    s[len] = '\0';
    return s;
}

static int count_control(const tokenizer *t, const int32_t *ids, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += tok_token_type(t, ids[i]) == TOK_TYPE_CONTROL;
    return c;
}

START_TEST(test_user_text_never_yields_control_tokens) {
    vocab v[MAX_VOCABS];
    int n = open_vocabs(v);
    for (int i = 0; i < n; i++) {
        char *attack = all_control_texts(v[i].t);
        corral_error err;
        int32_t *ids;
        size_t n_ids;
        /* Raw prompt: only the BOS/EOS the tokenizer adds itself may be control tokens. */
        ck_assert_int_eq(prompt_tokenize_text(v[i].t, attack, strlen(attack), &ids, &n_ids, &err),
                         CORRAL_OK);
        int allowed = tok_adds_bos(v[i].t) + tok_adds_eos(v[i].t);
        ck_assert_msg(count_control(v[i].t, ids, n_ids) == allowed,
                      "%s: a raw prompt produced control tokens", v[i].name);
        free(ids);
        /* Chats: the hostile conversation has exactly the control tokens of a harmless one. */
        for (size_t k = 0; k < N_TEMPLATES; k++) {
            const chat_message hostile[] = {
                {"system", attack}, {"user", attack}, {"assistant", attack}, {"user", attack}};
            const chat_message plain[] = {
                {"system", "x"}, {"user", "x"}, {"assistant", "x"}, {"user", "x"}};
            int32_t *a, *b;
            size_t na, nb;
            ck_assert_int_eq(prompt_tokenize_chat(v[i].t, templates[k], hostile, 4, &a, &na, &err),
                             CORRAL_OK);
            ck_assert_int_eq(prompt_tokenize_chat(v[i].t, templates[k], plain, 4, &b, &nb, &err),
                             CORRAL_OK);
            ck_assert_msg(count_control(v[i].t, a, na) == count_control(v[i].t, b, nb),
                          "%s, template %s: user text produced control tokens", v[i].name,
                          chat_template_name(templates[k]));
            free(a);
            free(b);
        }
        free(attack);
    }
    close_vocabs(v, n);
}
END_TEST

START_TEST(test_file_chat_template_detection) {
    corral_error err;
    gguf_file *f = gguf_open(test_shared_path("vocab/ggml-vocab-phi-3.gguf"), &err);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(prompt_file_chat_template(f), CHAT_TEMPLATE_PHI3);
    gguf_destroy(&f);
    f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    ck_assert_int_eq(prompt_file_chat_template(f), CHAT_TEMPLATE_NONE); /* has none */
    gguf_destroy(&f);
}
END_TEST

/* Reads all of `path` into a malloc'd buffer (NUL-terminated); *len gets its size. */
static char *read_whole_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    ck_assert_int_ge(n, 0);
    rewind(fp);
    char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = '\0';
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

/* A model whose tokenizer.chat_template is none corral knows: chats fall back to 'none', and the
 * log says so, naming the fallback and how to choose a template instead. The phi-3 vocabulary's
 * template is overwritten in a copy by text of the same length, so the file stays valid. */
START_TEST(test_unrecognised_template_is_logged_with_its_fallback) {
    size_t len;
    char *file = read_whole_file(test_shared_path("vocab/ggml-vocab-phi-3.gguf"), &len);
    static const char key[] = "tokenizer.chat_template";
    char *at = memmem(file, len, key, sizeof key - 1);
    ck_assert_ptr_nonnull(at);
    /* key, then the value's type (uint32 = 8, a string), then its length (uint64), then text */
    char *p = at + sizeof key - 1 + 4;
    uint64_t n;
    memcpy(&n, p, sizeof n);
    ck_assert_uint_gt(n, 16);
    ck_assert_uint_le(n, (uint64_t)(file + len - (p + 8)));
    memset(p + 8, ' ', n);
    memcpy(p + 8, "{{ unknown }}", 13);

    char model_path[] = "/tmp/corral-test-prompt-XXXXXX";
    int fd = mkstemp(model_path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, file, len), (ssize_t)len);
    close(fd);
    free(file);
    char log_path[] = "/tmp/corral-test-prompt-log-XXXXXX";
    int log_fd = mkstemp(log_path);
    ck_assert_int_ge(log_fd, 0);

    corral_error err;
    gguf_file *f = gguf_open(model_path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    const int old_fd = log_set_fd(log_fd);
    const chat_template tmpl = prompt_file_chat_template(f);
    log_set_fd(old_fd);
    gguf_destroy(&f);
    ck_assert_int_eq(tmpl, CHAT_TEMPLATE_NONE);

    size_t log_len;
    char *log = read_whole_file(log_path, &log_len);
    ck_assert_msg(strstr(log, "level=warn") && strstr(log, "not one corral recognises") &&
                      strstr(log, "fallback=none") && strstr(log, "template:"),
                  "log: %s", log);
    free(log);
    close(log_fd);
    unlink(log_path);
    unlink(model_path);
}
END_TEST

START_TEST(test_bad_role_is_named) {
    vocab v[MAX_VOCABS];
    int n = open_vocabs(v);
    const chat_message msgs[] = {{"wizard", "hi"}};
    corral_error err;
    int32_t *ids = NULL;
    size_t n_ids;
    ck_assert_int_eq(
        prompt_tokenize_chat(v[0].t, CHAT_TEMPLATE_CHATML, msgs, 1, &ids, &n_ids, &err),
        CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "wizard"));
    ck_assert_ptr_null(ids);
    close_vocabs(v, n);
}
END_TEST

static Suite *prompt_suite(void) {
    Suite *s = suite_create("prompt");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_benign_chat_equals_rendered_string_tokenization);
    tcase_add_test(core, test_file_chat_template_detection);
    tcase_add_test(core, test_unrecognised_template_is_logged_with_its_fallback);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_user_text_never_yields_control_tokens);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_bad_role_is_named);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(prompt_suite)
