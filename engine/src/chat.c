/*
 * chat.c — rendering conversations with llama.cpp's built-in chat formats and the shipped Jinja
 * templates of Llama 3, Qwen3 and Gemma 3, as segments that keep template text (scaffold) apart
 * from message text (content); see chat.h for the formats.
 *
 * The Jinja templates are written out here as C, statement by statement, with Python's string
 * semantics where they use them (the trim filter is str.strip(); Qwen3's split, lstrip and
 * rstrip of "\n"); test_chat.c checks every rendering against python3-jinja2's.
 *
 * Rendering appends to a growing buffer and records each run of same-kind text as a segment
 * (offsets while the buffer may still move, pointers once it is final). Roles are checked before
 * anything is written, so a rejected conversation allocates nothing. Scaffold role names come
 * from a static table, never from the caller's string.
 */
#include "corral/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ----------------------------------------------------------------------------------- */

static const char *const chat_template_names[CHAT_TEMPLATE_COUNT] = {
    [CHAT_TEMPLATE_NONE] = "none",
    [CHAT_TEMPLATE_CHATML] = "chatml",
    [CHAT_TEMPLATE_LLAMA2] = "llama2",
    [CHAT_TEMPLATE_LLAMA2_SYS] = "llama2-sys",
    [CHAT_TEMPLATE_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [CHAT_TEMPLATE_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [CHAT_TEMPLATE_LLAMA3] = "llama3",
    [CHAT_TEMPLATE_MISTRAL_V1] = "mistral-v1",
    [CHAT_TEMPLATE_MISTRAL_V3] = "mistral-v3",
    [CHAT_TEMPLATE_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_TEMPLATE_PHI3] = "phi3",
    [CHAT_TEMPLATE_GEMMA] = "gemma",
    [CHAT_TEMPLATE_ZEPHYR] = "zephyr",
    [CHAT_TEMPLATE_LLAMA3_INSTRUCT] = "llama3-instruct",
    [CHAT_TEMPLATE_QWEN3] = "qwen3",
    [CHAT_TEMPLATE_GEMMA3] = "gemma3",
};

static const struct {
    const char *alias;
    chat_template tmpl;
} chat_template_aliases[] = {
    {"mistral-instruct", CHAT_TEMPLATE_MISTRAL_V1},
};

const char *chat_template_name(chat_template tmpl) {
    if (tmpl < 0 || tmpl >= CHAT_TEMPLATE_COUNT) return NULL;
    return chat_template_names[tmpl];
}

/* Only names, no error: chat_template_detect also asks. */
static chat_template lookup_name(const char *name) {
    for (int t = 0; t < CHAT_TEMPLATE_COUNT; t++) {
        if (strcmp(chat_template_names[t], name) == 0) return (chat_template)t;
    }
    for (size_t i = 0; i < sizeof chat_template_aliases / sizeof chat_template_aliases[0]; i++) {
        if (strcmp(chat_template_aliases[i].alias, name) == 0) return chat_template_aliases[i].tmpl;
    }
    return CHAT_TEMPLATE_UNKNOWN;
}

chat_template chat_template_from_name(const char *name, corral_error *err) {
    if (!name) {
        corral_error_set(err, CORRAL_NOT_FOUND, "chat template name missing");
        return CHAT_TEMPLATE_UNKNOWN;
    }
    chat_template t = lookup_name(name);
    if (t == CHAT_TEMPLATE_UNKNOWN) {
        corral_error_set(err, CORRAL_NOT_FOUND,
                         "unknown chat template '%s' (known: none, chatml, llama2, llama2-sys, "
                         "llama2-sys-bos, llama2-sys-strip, llama3, mistral-v1, mistral-instruct, "
                         "mistral-v3, mistral-v3-tekken, phi3, gemma, zephyr, llama3-instruct, "
                         "qwen3, gemma3)",
                         name);
    }
    return t;
}

/* ---- detection ------------------------------------------------------------------------------- */

/* After the chatml and [INST] checks, llama.cpp tries these in this order; formats corral does
 * not render still take their place in the order, so that a template llama.cpp would call
 * "falcon3" is never mistaken for a later one. */
typedef struct detect_rule {
    const char *need[2]; /* every non-NULL string must occur */
    chat_template result;
} detect_rule;

static const detect_rule detect_rules[] = {
    {{"<|assistant|>", "<|end|>"}, CHAT_TEMPLATE_PHI3},
    {{"[gMASK]<sop>", NULL}, CHAT_TEMPLATE_UNKNOWN},        /* chatglm4 */
    {{"<|assistant|>", "<|user|>"}, CHAT_TEMPLATE_UNKNOWN}, /* falcon3, glmedge */
    {{"<|{{ item['role'] }}|>", "<|begin_of_image|>"}, CHAT_TEMPLATE_UNKNOWN}, /* glmedge */
    {{"<|user|>", "<|endoftext|>"}, CHAT_TEMPLATE_ZEPHYR},
    {{"bos_token + message['role']", NULL}, CHAT_TEMPLATE_UNKNOWN}, /* monarch */
    {{"<start_of_turn>", NULL}, CHAT_TEMPLATE_GEMMA},
    {{"'\\n\\nAssistant: ' + eos_token", NULL}, CHAT_TEMPLATE_UNKNOWN},     /* orion */
    {{"GPT4 Correct ", NULL}, CHAT_TEMPLATE_UNKNOWN},                       /* openchat */
    {{"USER: ", "ASSISTANT: "}, CHAT_TEMPLATE_UNKNOWN},                     /* vicuna */
    {{"### Instruction:", "<|EOT|>"}, CHAT_TEMPLATE_UNKNOWN},               /* deepseek */
    {{"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"}, CHAT_TEMPLATE_UNKNOWN}, /* command-r */
    {{"<|start_header_id|>", "<|end_header_id|>"}, CHAT_TEMPLATE_LLAMA3},
};

static bool has(const char *src, const char *needle) {
    return strstr(src, needle) != NULL;
}

/* The [INST] family: mistral's official templates by their cues, else a llama2 variant. */
static chat_template detect_inst(const char *src) {
    if (has(src, "[SYSTEM_PROMPT]")) return CHAT_TEMPLATE_UNKNOWN; /* mistral v7 */
    if (has(src, "' [INST] ' + system_message") || has(src, "[AVAILABLE_TOOLS]")) {
        if (has(src, " [INST]")) return CHAT_TEMPLATE_MISTRAL_V1;
        if (has(src, "\"[INST]\"")) return CHAT_TEMPLATE_MISTRAL_V3_TEKKEN;
        return CHAT_TEMPLATE_MISTRAL_V3;
    }
    if (has(src, "content.strip()")) return CHAT_TEMPLATE_LLAMA2_SYS_STRIP;
    if (has(src, "bos_token + '[INST]")) return CHAT_TEMPLATE_LLAMA2_SYS_BOS;
    if (has(src, "<<SYS>>")) return CHAT_TEMPLATE_LLAMA2_SYS;
    return CHAT_TEMPLATE_LLAMA2;
}

chat_template chat_template_detect(const char *src) {
    if (!src) return CHAT_TEMPLATE_UNKNOWN;
    chat_template named = lookup_name(src);
    if (named != CHAT_TEMPLATE_UNKNOWN) return named;
    /* The shipped templates rendered as Jinja renders them, before the signatures that would
     * take them for their families' older formats (chatml, gemma, llama3). */
    if (has(src, "<|im_start|>") && has(src, "reasoning_content") && has(src, "last_query_index"))
        return CHAT_TEMPLATE_QWEN3;
    if (has(src, "<start_of_turn>") && has(src, "first_user_prefix")) return CHAT_TEMPLATE_GEMMA3;
    if (has(src, "<|start_header_id|>") && has(src, "bos_token + content") &&
        !has(src, "add_generation_prompt"))
        return CHAT_TEMPLATE_LLAMA3_INSTRUCT;
    if (has(src, "<|im_start|>")) {
        if (has(src, "<|im_sep|>") || has(src, "<end_of_utterance>")) return CHAT_TEMPLATE_UNKNOWN;
        return CHAT_TEMPLATE_CHATML;
    }
    if (strncmp(src, "mistral", 7) == 0 || has(src, "[INST]")) return detect_inst(src);
    for (size_t i = 0; i < sizeof detect_rules / sizeof detect_rules[0]; i++) {
        const detect_rule *r = &detect_rules[i];
        if (has(src, r->need[0]) && (!r->need[1] || has(src, r->need[1]))) return r->result;
    }
    return CHAT_TEMPLATE_UNKNOWN;
}

/* ---- roles ----------------------------------------------------------------------------------- */

typedef enum chat_role {
    CHAT_ROLE_SYSTEM = 0,
    CHAT_ROLE_USER = 1,
    CHAT_ROLE_ASSISTANT = 2
} chat_role;

static const char *const chat_role_names[] = {"system", "user", "assistant"};

static int parse_role(const char *role) {
    for (int r = 0; r < 3; r++) {
        if (strcmp(role, chat_role_names[r]) == 0) return r;
    }
    return -1;
}

/* ---- the prompt and its builder -------------------------------------------------------------- */

struct chat_prompt {
    char *text; /* all segments, NUL-terminated */
    size_t len;
    chat_segment *segments;
    size_t n_segments;
};

typedef struct seg_span {
    size_t offset, len;
    bool is_scaffold;
} seg_span;

typedef struct builder {
    char *text;
    size_t len, cap;
    seg_span *spans;
    size_t n_spans, span_cap;
    bool oom; /* sticky: later appends do nothing */
} builder;

static bool builder_reserve(builder *b, size_t extra) {
    if (extra > SIZE_MAX - 1 - b->len) return false;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *t = realloc(b->text, cap);
    if (!t) return false;
    b->text = t;
    b->cap = cap;
    return true;
}

/* Append n bytes of one kind; a run of the same kind stays one segment. */
static void put(builder *b, const char *s, size_t n, bool is_scaffold) {
    if (b->oom || n == 0) return;
    if (!builder_reserve(b, n)) {
        b->oom = true;
        return;
    }
    if (b->n_spans > 0 && b->spans[b->n_spans - 1].is_scaffold == is_scaffold) {
        b->spans[b->n_spans - 1].len += n;
    } else {
        if (b->n_spans == b->span_cap) {
            size_t cap = b->span_cap ? b->span_cap * 2 : 16;
            seg_span *sp = realloc(b->spans, cap * sizeof *sp);
            if (!sp) {
                b->oom = true;
                return;
            }
            b->spans = sp;
            b->span_cap = cap;
        }
        b->spans[b->n_spans++] = (seg_span){.offset = b->len, .len = n, .is_scaffold = is_scaffold};
    }
    memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = '\0';
}

static void scaffold(builder *b, const char *s) {
    put(b, s, strlen(s), true);
}

static void content_all(builder *b, const char *s) {
    put(b, s, strlen(s), false);
}

static bool is_trim_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* llama.cpp's trim(): ASCII whitespace off both ends. */
static void content_trimmed(builder *b, const char *s) {
    size_t end = strlen(s), start = 0;
    while (start < end && is_trim_space(s[start])) start++;
    while (end > start && is_trim_space(s[end - 1])) end--;
    put(b, s + start, end - start, false);
}

/* The length of the Python whitespace character (str.isspace()) that starts at s (before end), or
 * 0: ASCII whitespace and U+001C..U+001F as single bytes; U+0085, U+00A0 (C2 xx); U+1680
 * (E1 9A 80); U+2000..U+200A, U+2028, U+2029, U+202F (E2 80 xx); U+205F (E2 81 9F); U+3000
 * (E3 80 80). */
static size_t py_space_at(const unsigned char *s, const unsigned char *end) {
    const size_t n = (size_t)(end - s);
    if (n == 0) return 0;
    if (is_trim_space((char)s[0]) || (s[0] >= 0x1c && s[0] <= 0x1f)) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;
    if (s[0] == 0xe2 && s[1] == 0x80 &&
        (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf) && s[2] >= 0x80)
        return 3;
    if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;
    if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

/* Jinja's trim filter (Python's str.strip()): [*start, *end) shrunk past whitespace characters at
 * both ends. */
static void py_strip(const char *s, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k;
    while (*start < *end && (k = py_space_at(u + *start, u + *end)) > 0) *start += k;
    /* From the end: the longest whitespace character that ends there. */
    while (*end > *start) {
        size_t cut = 0;
        for (size_t len = 1; len <= 3 && len <= *end - *start && !cut; len++)
            if (py_space_at(u + *end - len, u + *end) == len) cut = len;
        if (!cut) break;
        *end -= cut;
    }
}

/* Message text through Jinja's trim filter, as content. */
static void content_py_trimmed(builder *b, const char *s) {
    size_t start = 0, end = strlen(s);
    py_strip(s, &start, &end);
    put(b, s + start, end - start, false);
}

static bool trims_to_empty(const char *s) {
    for (; *s; s++) {
        if (!is_trim_space(*s)) return false;
    }
    return true;
}

/* ---- the formats (chat.h lists them; llama.cpp's llm_chat_apply_template is the reference) ----
 */

typedef struct render_args {
    const chat_message *m;
    const chat_role *roles;
    size_t n;
    bool gen;
    const char *bos; /* the BOS token's text, for the templates that write it */
} render_args;

static void render_none(builder *b, const render_args *a) {
    for (size_t i = 0; i < a->n; i++) content_all(b, a->m[i].content);
}

static void render_chatml(builder *b, const render_args *a) {
    for (size_t i = 0; i < a->n; i++) {
        scaffold(b, "<|im_start|>");
        scaffold(b, chat_role_names[a->roles[i]]);
        scaffold(b, "\n");
        content_all(b, a->m[i].content);
        scaffold(b, "<|im_end|>\n");
    }
    if (a->gen) scaffold(b, "<|im_start|>assistant\n");
}

static void render_llama2(builder *b, const render_args *a, chat_template t) {
    bool with_sys = t != CHAT_TEMPLATE_LLAMA2;
    bool bos_inside = t == CHAT_TEMPLATE_LLAMA2_SYS_BOS;
    bool strip = t == CHAT_TEMPLATE_LLAMA2_SYS_STRIP;
    bool inside_turn = true; /* the first [INST] is written up front, without BOS */
    scaffold(b, "[INST] ");
    for (size_t i = 0; i < a->n; i++) {
        if (!inside_turn) {
            inside_turn = true;
            scaffold(b, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (a->roles[i] == CHAT_ROLE_SYSTEM && with_sys) scaffold(b, "<<SYS>>\n");
        if (strip) {
            content_trimmed(b, a->m[i].content);
        } else {
            content_all(b, a->m[i].content);
        }
        switch (a->roles[i]) {
            case CHAT_ROLE_SYSTEM:
                scaffold(b, with_sys ? "\n<</SYS>>\n\n" : "\n");
                break;
            case CHAT_ROLE_USER:
                scaffold(b, " [/INST]");
                break;
            case CHAT_ROLE_ASSISTANT:
                scaffold(b, "</s>");
                inside_turn = false;
                break;
        }
    }
}

static void render_mistral(builder *b, const render_args *a, chat_template t) {
    const char *lead = t == CHAT_TEMPLATE_MISTRAL_V1 ? " " : "";
    const char *trail = t == CHAT_TEMPLATE_MISTRAL_V3_TEKKEN ? "" : " ";
    bool trim_assistant = t == CHAT_TEMPLATE_MISTRAL_V3;
    bool inside_turn = false;
    for (size_t i = 0; i < a->n; i++) {
        if (!inside_turn) {
            scaffold(b, lead);
            scaffold(b, "[INST]");
            scaffold(b, trail);
            inside_turn = true;
        }
        switch (a->roles[i]) {
            case CHAT_ROLE_SYSTEM:
                content_all(b, a->m[i].content);
                scaffold(b, "\n\n");
                break;
            case CHAT_ROLE_USER:
                content_all(b, a->m[i].content);
                scaffold(b, lead);
                scaffold(b, "[/INST]");
                break;
            case CHAT_ROLE_ASSISTANT:
                scaffold(b, trail);
                if (trim_assistant) {
                    content_trimmed(b, a->m[i].content);
                } else {
                    content_all(b, a->m[i].content);
                }
                scaffold(b, "</s>");
                inside_turn = false;
                break;
        }
    }
}

static void render_llama3(builder *b, const render_args *a) {
    for (size_t i = 0; i < a->n; i++) {
        scaffold(b, "<|start_header_id|>");
        scaffold(b, chat_role_names[a->roles[i]]);
        scaffold(b, "<|end_header_id|>\n\n");
        content_trimmed(b, a->m[i].content);
        scaffold(b, "<|eot_id|>");
    }
    if (a->gen) scaffold(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* phi3 and zephyr differ only in the end-of-message marker. */
static void render_pipe_roles(builder *b, const render_args *a, const char *end) {
    for (size_t i = 0; i < a->n; i++) {
        scaffold(b, "<|");
        scaffold(b, chat_role_names[a->roles[i]]);
        scaffold(b, "|>\n");
        content_all(b, a->m[i].content);
        scaffold(b, end);
    }
    if (a->gen) scaffold(b, "<|assistant|>\n");
}

static void render_gemma(builder *b, const render_args *a) {
    /* System messages wait for the next user turn; `pending_from` is the first of them. */
    size_t pending_from = SIZE_MAX;
    bool pending_text = false;
    for (size_t i = 0; i < a->n; i++) {
        chat_role role = a->roles[i];
        if (role == CHAT_ROLE_SYSTEM) {
            if (pending_from == SIZE_MAX) pending_from = i;
            pending_text = pending_text || !trims_to_empty(a->m[i].content);
            continue;
        }
        scaffold(b, "<start_of_turn>");
        scaffold(b, role == CHAT_ROLE_ASSISTANT ? "model" : "user");
        scaffold(b, "\n");
        if (role == CHAT_ROLE_USER && pending_from != SIZE_MAX) {
            if (pending_text) {
                for (size_t j = pending_from; j < i; j++) {
                    if (a->roles[j] == CHAT_ROLE_SYSTEM) content_trimmed(b, a->m[j].content);
                }
                scaffold(b, "\n\n");
            }
            pending_from = SIZE_MAX;
            pending_text = false;
        }
        content_trimmed(b, a->m[i].content);
        scaffold(b, "<end_of_turn>\n");
    }
    if (a->gen) scaffold(b, "<start_of_turn>model\n");
}

/* ---- the shipped Jinja templates (chat.h; ../shared/vocab/templates) --------------------------
 */

/* Meta-Llama-3-Instruct: every message's content trimmed between its header and <|eot_id|>, BOS
 * before the first, and the assistant header whatever add_generation_prompt says. */
static void render_llama3_instruct(builder *b, const render_args *a) {
    for (size_t i = 0; i < a->n; i++) {
        if (i == 0) scaffold(b, a->bos);
        scaffold(b, "<|start_header_id|>");
        scaffold(b, chat_role_names[a->roles[i]]);
        scaffold(b, "<|end_header_id|>\n\n");
        content_py_trimmed(b, a->m[i].content);
        scaffold(b, "<|eot_id|>");
    }
    scaffold(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma 3 (roles already checked to alternate: chat_prompt_render). */
static void render_gemma3(builder *b, const render_args *a) {
    scaffold(b, a->bos);
    const size_t first = a->n > 0 && a->roles[0] == CHAT_ROLE_SYSTEM ? 1 : 0;
    for (size_t i = first; i < a->n; i++) {
        scaffold(b, "<start_of_turn>");
        scaffold(b, a->roles[i] == CHAT_ROLE_ASSISTANT ? "model" : chat_role_names[a->roles[i]]);
        scaffold(b, "\n");
        if (i == first && first == 1) { /* first_user_prefix: the system text, untrimmed */
            content_all(b, a->m[0].content);
            scaffold(b, "\n\n");
        }
        content_py_trimmed(b, a->m[i].content);
        scaffold(b, "<end_of_turn>\n");
    }
    if (a->gen) scaffold(b, "<start_of_turn>model\n");
}

/* Where needle last (or first) occurs in s[0..n), or NULL. */
static const char *find_in(const char *s, size_t n, const char *needle, bool last) {
    const size_t k = strlen(needle);
    const char *found = NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0) {
            found = s + i;
            if (!last) break;
        }
    return found;
}

/* Python's lstrip('\n') and rstrip('\n') of [*p, *p + *n). */
static void lstrip_nl(const char **p, size_t *n) {
    while (*n > 0 && **p == '\n') (*p)++, (*n)--;
}
static void rstrip_nl(const char *p, size_t *n) {
    while (*n > 0 && p[*n - 1] == '\n') (*n)--;
}

/* A user message that is only a tool's answer does not count as the conversation's last query. */
static bool is_tool_response(const char *c) {
    const size_t n = strlen(c), a = strlen("<tool_response>"), z = strlen("</tool_response>");
    return n >= a && n >= z && memcmp(c, "<tool_response>", a) == 0 &&
           memcmp(c + n - z, "</tool_response>", z) == 0;
}

/* Qwen3, without tools (corral's messages have none). */
static void render_qwen3(builder *b, const render_args *a) {
    if (a->roles[0] == CHAT_ROLE_SYSTEM) {
        scaffold(b, "<|im_start|>system\n");
        content_all(b, a->m[0].content);
        scaffold(b, "<|im_end|>\n");
    }
    size_t last_query = a->n - 1;
    for (size_t i = a->n; i-- > 0;)
        if (a->roles[i] == CHAT_ROLE_USER && !is_tool_response(a->m[i].content)) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < a->n; i++) {
        const char *c = a->m[i].content;
        if (a->roles[i] == CHAT_ROLE_USER || (a->roles[i] == CHAT_ROLE_SYSTEM && i > 0)) {
            scaffold(b, "<|im_start|>");
            scaffold(b, chat_role_names[a->roles[i]]);
            scaffold(b, "\n");
            content_all(b, c);
            scaffold(b, "<|im_end|>\n");
            continue;
        }
        if (a->roles[i] != CHAT_ROLE_ASSISTANT) continue;
        /* content.split('</think>')[-1].lstrip('\n'), and the reasoning:
         * content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        const size_t len = strlen(c);
        const char *reply = c, *reason = "";
        size_t reply_len = len, reason_len = 0;
        const char *close = find_in(c, len, "</think>", false);
        if (close) {
            const char *last_close = find_in(c, len, "</think>", true);
            reply = last_close + strlen("</think>");
            reply_len = len - (size_t)(reply - c);
            lstrip_nl(&reply, &reply_len);
            reason_len = (size_t)(close - c);
            rstrip_nl(c, &reason_len);
            const char *open = find_in(c, reason_len, "<think>", true);
            reason = open ? open + strlen("<think>") : c;
            reason_len -= (size_t)(reason - c);
            lstrip_nl(&reason, &reason_len);
        }
        if (i > last_query && (i == a->n - 1 || reason_len > 0)) {
            scaffold(b, "<|im_start|>assistant\n<think>\n");
            size_t r = reason_len; /* reasoning_content.strip('\n') */
            lstrip_nl(&reason, &r);
            rstrip_nl(reason, &r);
            put(b, reason, r, false);
            scaffold(b, "\n</think>\n\n");
            lstrip_nl(&reply, &reply_len);
            put(b, reply, reply_len, false);
        } else {
            scaffold(b, "<|im_start|>assistant\n");
            put(b, reply, reply_len, false);
        }
        scaffold(b, "<|im_end|>\n");
    }
    if (a->gen) scaffold(b, "<|im_start|>assistant\n");
}

bool chat_template_writes_bos(chat_template tmpl) {
    return tmpl == CHAT_TEMPLATE_LLAMA3_INSTRUCT || tmpl == CHAT_TEMPLATE_GEMMA3;
}

/* What the shipped templates refuse, as their Jinja does: qwen3 and gemma3 read messages[0] (an
 * empty list fails there), and gemma3 raises on roles that do not alternate user/model from its
 * first (non-system) message. */
static corral_status check_jinja_roles(chat_template t, const chat_role *roles, size_t n,
                                       corral_error *err) {
    if ((t == CHAT_TEMPLATE_QWEN3 || t == CHAT_TEMPLATE_GEMMA3) && n == 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the %s chat template needs at least one message",
                                chat_template_names[t]);
    if (t != CHAT_TEMPLATE_GEMMA3) return CORRAL_OK;
    const size_t first = roles[0] == CHAT_ROLE_SYSTEM ? 1 : 0;
    for (size_t i = first; i < n; i++)
        if ((roles[i] == CHAT_ROLE_USER) != ((i - first) % 2 == 0))
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "chat message %zu (%s): Conversation roles must alternate "
                                    "user/assistant/user/assistant/... (the gemma3 template)",
                                    i, chat_role_names[roles[i]]);
    return CORRAL_OK;
}

static void render(builder *b, chat_template t, const render_args *a) {
    switch (t) {
        case CHAT_TEMPLATE_NONE:
            render_none(b, a);
            break;
        case CHAT_TEMPLATE_CHATML:
            render_chatml(b, a);
            break;
        case CHAT_TEMPLATE_LLAMA2:
        case CHAT_TEMPLATE_LLAMA2_SYS:
        case CHAT_TEMPLATE_LLAMA2_SYS_BOS:
        case CHAT_TEMPLATE_LLAMA2_SYS_STRIP:
            render_llama2(b, a, t);
            break;
        case CHAT_TEMPLATE_LLAMA3:
            render_llama3(b, a);
            break;
        case CHAT_TEMPLATE_MISTRAL_V1:
        case CHAT_TEMPLATE_MISTRAL_V3:
        case CHAT_TEMPLATE_MISTRAL_V3_TEKKEN:
            render_mistral(b, a, t);
            break;
        case CHAT_TEMPLATE_PHI3:
            render_pipe_roles(b, a, "<|end|>\n");
            break;
        case CHAT_TEMPLATE_GEMMA:
            render_gemma(b, a);
            break;
        case CHAT_TEMPLATE_ZEPHYR:
            render_pipe_roles(b, a, "<|endoftext|>\n");
            break;
        case CHAT_TEMPLATE_LLAMA3_INSTRUCT:
            render_llama3_instruct(b, a);
            break;
        case CHAT_TEMPLATE_QWEN3:
            render_qwen3(b, a);
            break;
        case CHAT_TEMPLATE_GEMMA3:
            render_gemma3(b, a);
            break;
        case CHAT_TEMPLATE_UNKNOWN:
        case CHAT_TEMPLATE_COUNT:
            break; /* rejected by the caller */
    }
}

/* ---- public ---------------------------------------------------------------------------------- */

chat_prompt *chat_prompt_new(chat_template tmpl, const chat_message *messages, size_t n,
                             bool add_generation_prompt, corral_error *err) {
    const chat_options opts = {.add_generation_prompt = add_generation_prompt};
    return chat_prompt_render(tmpl, messages, n, &opts, err);
}

chat_prompt *chat_prompt_render(chat_template tmpl, const chat_message *messages, size_t n,
                                const chat_options *opts, corral_error *err) {
    const chat_options none = {0};
    if (!opts) opts = &none;
    if (tmpl < 0 || tmpl >= CHAT_TEMPLATE_COUNT) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "chat template %d is not a template",
                         (int)tmpl);
        return NULL;
    }
    if (n > 0 && !messages) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "chat messages missing (count %zu)", n);
        return NULL;
    }
    if (n > SIZE_MAX / sizeof(chat_role)) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "too many chat messages: %zu", n);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!messages[i].role) {
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "chat message %zu has no role", i);
            return NULL;
        }
        if (parse_role(messages[i].role) < 0) {
            corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                             "chat message %zu: unknown role '%.64s' (expected system, user or "
                             "assistant)",
                             i, messages[i].role);
            return NULL;
        }
        if (!messages[i].content) {
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "chat message %zu has no content", i);
            return NULL;
        }
    }

    chat_role *roles = malloc((n ? n : 1) * sizeof *roles);
    chat_prompt *p = calloc(1, sizeof *p);
    builder b = {0};
    if (!roles || !p || !builder_reserve(&b, 0)) goto oom;
    for (size_t i = 0; i < n; i++) roles[i] = (chat_role)parse_role(messages[i].role);
    if (check_jinja_roles(tmpl, roles, n, err) != CORRAL_OK) {
        free(b.text);
        free(roles);
        chat_prompt_destroy(&p);
        return NULL;
    }
    b.text[0] = '\0';
    const char *bos = opts->bos_token
                          ? opts->bos_token
                          : (tmpl == CHAT_TEMPLATE_GEMMA3 ? "<bos>" : "<|begin_of_text|>");
    render(
        &b, tmpl,
        &(render_args){
            .m = messages, .roles = roles, .n = n, .gen = opts->add_generation_prompt, .bos = bos});
    if (b.oom) goto oom;

    p->segments = malloc((b.n_spans ? b.n_spans : 1) * sizeof *p->segments);
    if (!p->segments) goto oom;
    for (size_t i = 0; i < b.n_spans; i++) {
        p->segments[i] = (chat_segment){.text = b.text + b.spans[i].offset,
                                        .len = b.spans[i].len,
                                        .is_scaffold = b.spans[i].is_scaffold};
    }
    p->n_segments = b.n_spans;
    p->text = b.text;
    p->len = b.len;
    free(b.spans);
    free(roles);
    return p;
oom:
    free(b.text);
    free(b.spans);
    free(roles);
    chat_prompt_destroy(&p);
    corral_error_set(err, CORRAL_OUT_OF_MEMORY, "chat prompt of %zu messages: out of memory", n);
    return NULL;
}

void chat_prompt_destroy(chat_prompt **pp) {
    if (!pp || !*pp) return;
    chat_prompt *p = *pp;
    free(p->segments);
    free(p->text);
    free(p);
    *pp = NULL;
}

const chat_segment *chat_prompt_segments(const chat_prompt *p, size_t *count) {
    if (count) *count = p ? p->n_segments : 0;
    return p ? p->segments : NULL;
}

const char *chat_prompt_text(const chat_prompt *p, size_t *len) {
    if (len) *len = p ? p->len : 0;
    return p ? p->text : NULL;
}
