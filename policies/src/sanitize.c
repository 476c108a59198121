/*
 * sanitize.c — the six built-in sanitizers as corral_policy_v1 tables (see sanitize.h), their
 * settings, and the report format.
 *
 * Each step first scans the text and returns CORRAL_POLICY_KEEP when it has nothing to do, so the
 * common case — clean input — copies nothing. Steps that change the text write the whole new text
 * through out->write; the host swaps it in (policy.c).
 */
#include "corral/sanitize.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/policy.h"
#include "corral/unicode.h"
#include "corral/utf8.h"
#include "regex.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- settings ----------------------------------------------------------------------------------
 */

__attribute__((format(printf, 3, 4))) static int fail(char *msg, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (msg && cap) vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return CORRAL_POLICY_INVALID_ARGUMENT;
}

/* Every key must be one of `known` (NULL-terminated). */
static int check_keys(const char *step, const corral_policy_kv *kv, size_t n,
                      const char *const *known, char *msg, size_t cap) {
    for (size_t i = 0; i < n; i++) {
        bool ok = false;
        for (size_t k = 0; known[k] && !ok; k++) ok = kv[i].key && strcmp(kv[i].key, known[k]) == 0;
        if (!ok) {
            char list[128] = "";
            for (size_t k = 0; known[k]; k++) {
                strncat(list, k ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, known[k], sizeof list - strlen(list) - 1);
            }
            return fail(msg, cap, "%s: unknown setting '%s' (known: %s)", step,
                        kv[i].key ? kv[i].key : "(null)", known[0] ? list : "none");
        }
    }
    return 0;
}

static const char *get(const corral_policy_kv *kv, size_t n, const char *key) {
    const char *v = NULL;
    for (size_t i = 0; i < n; i++)
        if (kv[i].key && strcmp(kv[i].key, key) == 0) v = kv[i].value; /* the last one wins */
    return v;
}

static int parse_bool(const char *step, const char *key, const char *v, bool *out, char *msg,
                      size_t cap) {
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                                "off", "0"};
    for (size_t i = 0; v && i < N_OF(yes); i++) {
        if (strcmp(v, yes[i]) == 0) return *out = true, 0;
        if (strcmp(v, no[i]) == 0) return *out = false, 0;
    }
    return fail(msg, cap, "%s: %s must be true or false, got '%s'", step, key, v ? v : "");
}

/* A count with an optional binary suffix: 123, 64K, 64KiB, 1M, 1MiB, 1G, 1GiB. */
static int parse_count(const char *step, const char *key, const char *v, uint64_t *out, char *msg,
                       size_t cap) {
    uint64_t x = 0;
    size_t i = 0;
    for (; v && v[i] >= '0' && v[i] <= '9'; i++) {
        if (x > (UINT64_MAX - 9) / 10) goto bad;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (!v || i == 0) goto bad;
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0}, {"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20}, {"G", 30}, {"GiB", 30}};
    for (size_t u = 0; u < N_OF(units); u++) {
        if (strcmp(v + i, units[u].suffix) != 0) continue;
        if (x > (UINT64_MAX >> units[u].shift)) goto bad;
        *out = x << units[u].shift;
        return 0;
    }
bad:
    return fail(msg, cap, "%s: %s must be a count (123, 64KiB, 1MiB), got '%s'", step, key,
                v ? v : "");
}

/* Allocate a copy of the settings struct of size n (the instance). */
static void *instance_new(size_t n, void **instance, char *msg, size_t cap) {
    void *p = calloc(1, n);
    if (!p) fail(msg, cap, "out of memory");
    *instance = p;
    return p;
}

static void instance_free(void *instance) {
    free(instance);
}

static void note(corral_policy_out *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(corral_policy_out *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->note, sizeof out->note, fmt, ap);
    va_end(ap);
}

/* ---- utf8 --------------------------------------------------------------------------------------
 */

typedef struct utf8_cfg {
    bool repair;
} utf8_cfg;

static int utf8_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg, size_t cap) {
    static const char *const known[] = {"mode", NULL};
    int rc = check_keys("utf8", kv, n, known, msg, cap);
    if (rc) return rc;
    const char *mode = get(kv, n, "mode");
    if (mode && strcmp(mode, "reject") != 0 && strcmp(mode, "repair") != 0)
        return fail(msg, cap, "utf8: mode must be reject or repair, got '%s'", mode);
    utf8_cfg *c = instance_new(sizeof *c, instance, msg, cap);
    if (!c) return CORRAL_POLICY_OUT_OF_MEMORY;
    c->repair = mode && strcmp(mode, "repair") == 0;
    return 0;
}

static int utf8_sanitize(void *instance, const corral_policy_host *host, const char *text,
                         size_t len, corral_policy_out *out) {
    (void)host;
    const utf8_cfg *c = instance;
    const uint8_t *s = (const uint8_t *)text;
    /* Ill-formed sequences are counted by maximal subpart: each is what one U+FFFD replaces. */
    uint32_t bad = 0;
    size_t first = 0;
    for (size_t i = 0, k; i < len; i += k) {
        if (utf8_decode(s + i, len - i, NULL, &k) != UTF8_OK && bad++ == 0) first = i;
    }
    out->count = bad;
    if (bad == 0) return CORRAL_POLICY_KEEP;
    if (!c->repair) {
        note(out, "invalid UTF-8 at byte %zu (0x%02X); %u ill-formed sequence%s", first, s[first],
             bad, bad == 1 ? "" : "s");
        return CORRAL_POLICY_REJECTED;
    }
    static const char fffd[] = "\xEF\xBF\xBD";
    size_t run = 0; /* start of the valid stretch not yet written */
    for (size_t i = 0, k; i < len; i += k) {
        if (utf8_decode(s + i, len - i, NULL, &k) == UTF8_OK) continue;
        int rc = out->write(out, text + run, i - run);
        if (rc == 0) rc = out->write(out, fffd, 3);
        if (rc) return rc;
        run = i + k;
    }
    const int rc = out->write(out, text + run, len - run);
    if (rc) return rc;
    note(out, "replaced %u ill-formed sequence%s with U+FFFD", bad, bad == 1 ? "" : "s");
    return CORRAL_POLICY_REWRITE;
}

/* ---- invisible ---------------------------------------------------------------------------------
 */

enum { INVISIBLE_NO = 0, INVISIBLE_CONTROL = 1, INVISIBLE_FORMAT = 2, INVISIBLE_PRIVATE = 3 };

/* What `invisible` removes, by General_Category from the Unicode table (corral/unicode.h). */
static const uint8_t invisible_by_category[UNICODE_GC_COUNT] = {
    [UNICODE_GC_CC] = INVISIBLE_CONTROL, /* but tab, newline and carriage return, below */
    [UNICODE_GC_CF] = INVISIBLE_FORMAT,  /* soft hyphen, zero-width and bidirectional controls */
    [UNICODE_GC_CO] = INVISIBLE_PRIVATE,
};

static int invisible_kind(uint32_t cp) {
    if (cp >= 0x20 && cp < 0x7F) return INVISIBLE_NO; /* printable ASCII, most of any text */
    if (cp == '\n' || cp == '\t' || cp == '\r') return INVISIBLE_NO;
    return invisible_by_category[unicode_cpt_category(cp)];
}

int sanitize_is_invisible(uint32_t cp) {
    return invisible_kind(cp) != INVISIBLE_NO;
}

static int invisible_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                          size_t cap) {
    static const char *const known[] = {NULL};
    *instance = NULL;
    return check_keys("invisible", kv, n, known, msg, cap);
}

static int invisible_sanitize(void *instance, const corral_policy_host *host, const char *text,
                              size_t len, corral_policy_out *out) {
    (void)instance;
    (void)host;
    const uint8_t *s = (const uint8_t *)text;
    uint32_t kinds[4] = {0}, cp;
    for (size_t i = 0, k; i < len; i += k) {
        if (utf8_decode(s + i, len - i, &cp, &k) == UTF8_OK) kinds[invisible_kind(cp)]++;
    }
    const uint32_t removed = kinds[1] + kinds[2] + kinds[3];
    out->count = removed;
    if (removed == 0) return CORRAL_POLICY_KEEP;
    size_t run = 0;
    for (size_t i = 0, k; i < len; i += k) {
        if (utf8_decode(s + i, len - i, &cp, &k) == UTF8_OK && invisible_kind(cp) != INVISIBLE_NO) {
            const int rc = out->write(out, text + run, i - run);
            if (rc) return rc;
            run = i + k;
        }
    }
    const int rc = out->write(out, text + run, len - run);
    if (rc) return rc;
    note(out, "removed %u character%s (%u control, %u format, %u private-use)", removed,
         removed == 1 ? "" : "s", kinds[1], kinds[2], kinds[3]);
    return CORRAL_POLICY_REWRITE;
}

/* ---- special_tokens ----------------------------------------------------------------------------
 */

#define SPECIAL_MAX_PASSES 64

typedef struct special_cfg {
    bool strip;
} special_cfg;

static int special_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                        size_t cap) {
    static const char *const known[] = {"mode", NULL};
    int rc = check_keys("special_tokens", kv, n, known, msg, cap);
    if (rc) return rc;
    const char *mode = get(kv, n, "mode");
    if (mode && strcmp(mode, "keep") != 0 && strcmp(mode, "strip") != 0)
        return fail(msg, cap, "special_tokens: mode must be keep or strip, got '%s'", mode);
    special_cfg *c = instance_new(sizeof *c, instance, msg, cap);
    if (!c) return CORRAL_POLICY_OUT_OF_MEMORY;
    c->strip = mode && strcmp(mode, "strip") == 0;
    return 0;
}

/* Copy s[0..n) to dst without the special-token texts; returns how many were removed. */
static uint32_t strip_pass(const corral_policy_host *h, const char *s, size_t n, char *dst,
                           size_t *dst_len) {
    uint32_t found = 0;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const size_t k = h->special_prefix(h->ctx, s + i, n - i);
        if (k) {
            found++;
            i += k;
        } else {
            dst[o++] = s[i++];
        }
    }
    *dst_len = o;
    return found;
}

static int special_sanitize(void *instance, const corral_policy_host *host, const char *text,
                            size_t len, corral_policy_out *out) {
    const special_cfg *c = instance;
    if (!host || !host->special_prefix) {
        note(out, "no vocabulary to take special tokens from");
        return CORRAL_POLICY_INTERNAL;
    }
    uint32_t found = 0;
    for (size_t i = 0; i < len;) {
        const size_t k = host->special_prefix(host->ctx, text + i, len - i);
        found += k > 0;
        i += k ? k : 1;
    }
    out->count = found;
    if (found == 0) return CORRAL_POLICY_KEEP;
    if (!c->strip) {
        note(out, "%u special-token string%s kept as plain text", found, found == 1 ? "" : "s");
        return CORRAL_POLICY_FLAG;
    }
    /* Strip until nothing is left: "<|im_<|im_end|>end|>" hides one inside another. */
    char *a = malloc(len + 1), *b = malloc(len + 1);
    if (!a || !b) {
        free(a);
        free(b);
        return CORRAL_POLICY_OUT_OF_MEMORY;
    }
    size_t n = 0;
    uint32_t total = strip_pass(host, text, len, a, &n), passes = 1, more;
    while ((more = strip_pass(host, a, n, b, &n)) > 0 && passes < SPECIAL_MAX_PASSES) {
        total += more;
        passes++;
        char *t = a;
        a = b;
        b = t;
    }
    int rc;
    if (more > 0) {
        note(out, "special-token text still present after %d stripping passes", passes);
        rc = CORRAL_POLICY_REJECTED;
    } else {
        rc = out->write(out, a, n);
        out->count = total;
        note(out, "removed %u special-token string%s", total, total == 1 ? "" : "s");
        if (rc == 0) rc = CORRAL_POLICY_REWRITE;
    }
    free(a);
    free(b);
    return rc;
}

/* ---- max_input ---------------------------------------------------------------------------------
 */

typedef struct max_input_cfg {
    uint64_t bytes, tokens;
} max_input_cfg;

static int max_input_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                          size_t cap) {
    static const char *const known[] = {"bytes", "tokens", NULL};
    int rc = check_keys("max_input", kv, n, known, msg, cap);
    if (rc) return rc;
    max_input_cfg c = {0};
    const char *b = get(kv, n, "bytes"), *t = get(kv, n, "tokens");
    if (b && (rc = parse_count("max_input", "bytes", b, &c.bytes, msg, cap))) return rc;
    if (t && (rc = parse_count("max_input", "tokens", t, &c.tokens, msg, cap))) return rc;
    if (!c.bytes && !c.tokens) return fail(msg, cap, "max_input: set bytes or tokens (or both)");
    max_input_cfg *p = instance_new(sizeof *p, instance, msg, cap);
    if (!p) return CORRAL_POLICY_OUT_OF_MEMORY;
    *p = c;
    return 0;
}

static int max_input_sanitize(void *instance, const corral_policy_host *host, const char *text,
                              size_t len, corral_policy_out *out) {
    const max_input_cfg *c = instance;
    out->count = (uint32_t)(len > UINT32_MAX ? UINT32_MAX : len);
    if (c->bytes && len > c->bytes) {
        note(out, "the input is %zu bytes; the limit is %llu", len, (unsigned long long)c->bytes);
        return CORRAL_POLICY_REJECTED;
    }
    if (!c->tokens) return CORRAL_POLICY_KEEP;
    if (!host || !host->count_tokens) {
        note(out, "no tokenizer to count tokens with");
        return CORRAL_POLICY_INTERNAL;
    }
    const int64_t n = host->count_tokens(host->ctx, text, len);
    if (n < 0) {
        note(out, "cannot count tokens");
        return (int)n;
    }
    out->count = (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n);
    if ((uint64_t)n > c->tokens) {
        note(out, "the input is %lld tokens; the limit is %llu", (long long)n,
             (unsigned long long)c->tokens);
        return CORRAL_POLICY_REJECTED;
    }
    return CORRAL_POLICY_KEEP;
}

/* ---- deny --------------------------------------------------------------------------------------
 */

typedef struct deny_rule {
    char *name;
    regex_dfa dfa;
} deny_rule;

typedef struct deny_cfg {
    size_t n;
    deny_rule rules[];
} deny_cfg;

static void deny_destroy(void *instance) {
    deny_cfg *c = instance;
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->rules[i].name);
        regex__free(&c->rules[i].dfa);
    }
    free(c);
}

static int deny_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg, size_t cap) {
    *instance = NULL;
    if (n == 0) return fail(msg, cap, "deny: no rules (write NAME: REGEX pairs)");
    deny_cfg *c = calloc(1, sizeof *c + n * sizeof c->rules[0]);
    if (!c) {
        fail(msg, cap, "out of memory");
        return CORRAL_POLICY_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = kv[i].key, *v = kv[i].value;
        if (!name || !*name || !v) {
            deny_destroy(c);
            return fail(msg, cap, "deny: rule %zu needs a name and a regex", i + 1);
        }
        /* /REGEX/i is the caseless form; anything else is the regex itself. */
        size_t vlen = strlen(v);
        uint32_t flags = REGEX_SEARCH;
        if (vlen >= 3 && v[0] == '/' && v[vlen - 2] == '/' && v[vlen - 1] == 'i') {
            flags |= REGEX_CASELESS;
            v++;
            vlen -= 3;
        } else if (vlen >= 2 && v[0] == '/' && v[vlen - 1] == '/') {
            v++;
            vlen -= 2;
        }
        corral_error err;
        c->rules[i].name = strdup(name);
        c->n = i + 1;
        if (!c->rules[i].name ||
            regex__compile(v, vlen, flags, &c->rules[i].dfa, NULL, &err) != CORRAL_OK) {
            const int rc = c->rules[i].name ? (int)err.status : CORRAL_POLICY_OUT_OF_MEMORY;
            fail(msg, cap, "deny: rule '%s': %s", name,
                 c->rules[i].name ? err.message : "out of memory");
            deny_destroy(c);
            return rc;
        }
        if (c->rules[i].dfa.accepting[0]) {
            fail(msg, cap,
                 "deny: rule '%s' matches the empty string, so it would refuse every input", name);
            deny_destroy(c);
            return CORRAL_POLICY_INVALID_ARGUMENT;
        }
    }
    *instance = c;
    return 0;
}

static int deny_sanitize(void *instance, const corral_policy_host *host, const char *text,
                         size_t len, corral_policy_out *out) {
    (void)host;
    const deny_cfg *c = instance;
    for (size_t r = 0; r < c->n; r++) {
        const regex_dfa *d = &c->rules[r].dfa;
        int32_t st = 0;
        for (size_t i = 0; i < len && st != REGEX_DEAD; i++) {
            st = regex__step(d, st, (uint8_t)text[i]);
            if (st != REGEX_DEAD && d->accepting[st]) {
                out->count = 1;
                note(out, "matches deny rule '%s' (ending at byte %zu)", c->rules[r].name, i);
                return CORRAL_POLICY_REJECTED;
            }
        }
    }
    return CORRAL_POLICY_KEEP;
}

/* ---- normalize_space ---------------------------------------------------------------------------
 */

typedef struct space_cfg {
    bool trim, collapse;
    uint64_t max_newlines;
} space_cfg;

static int space_init(const corral_policy_kv *kv, size_t n, void **instance, char *msg,
                      size_t cap) {
    static const char *const known[] = {"trim", "collapse", "max_newlines", NULL};
    int rc = check_keys("normalize_space", kv, n, known, msg, cap);
    if (rc) return rc;
    space_cfg c = {.trim = true, .collapse = true, .max_newlines = 2};
    const char *v;
    if ((v = get(kv, n, "trim")) &&
        (rc = parse_bool("normalize_space", "trim", v, &c.trim, msg, cap)))
        return rc;
    if ((v = get(kv, n, "collapse")) &&
        (rc = parse_bool("normalize_space", "collapse", v, &c.collapse, msg, cap)))
        return rc;
    if ((v = get(kv, n, "max_newlines")) &&
        (rc = parse_count("normalize_space", "max_newlines", v, &c.max_newlines, msg, cap)))
        return rc;
    space_cfg *p = instance_new(sizeof *p, instance, msg, cap);
    if (!p) return CORRAL_POLICY_OUT_OF_MEMORY;
    *p = c;
    return 0;
}

/* Horizontal white space: ECMAScript's white space without the line terminators and BOM, that is
 * tab, vertical tab, form feed and the space separators (Zs, from the Unicode table). */
static bool is_hspace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || cp == '\t' || cp == '\v' || cp == '\f';
    return unicode_cpt_category(cp) == UNICODE_GC_ZS;
}

static int space_sanitize(void *instance, const corral_policy_host *host, const char *text,
                          size_t len, corral_policy_out *out) {
    (void)host;
    const space_cfg *c = instance;
    /* The result is never longer than the input: every rewrite shortens or keeps a length. */
    char *buf = malloc(len + 1);
    if (!buf) return CORRAL_POLICY_OUT_OF_MEMORY;
    const uint8_t *s = (const uint8_t *)text;
    size_t o = 0, content_end = 0;   /* output length after the last non-space character */
    size_t run_from = 0, run_to = 0; /* the pending run of horizontal space, in the input */
    uint64_t newlines = 0;
    for (size_t i = 0; i <= len;) {
        uint32_t cp = 0;
        size_t step = 1;
        const bool end = i == len, ok = !end && utf8_decode(s + i, len - i, &cp, &step) == UTF8_OK;
        const bool newline = ok && (cp == '\r' || cp == '\n');
        if (ok && is_hspace(cp)) {
            if (run_to != i) run_from = i;
            run_to = i + step;
            i += step;
            continue;
        }
        /* The run of spaces before this character (or the end): trimmed at the ends of lines
         * and of the text, one space when collapsing, as it was otherwise. */
        if (run_to == i && run_to > run_from) {
            const bool line_start = o == 0 || buf[o - 1] == '\n';
            if (!c->trim || !(line_start || newline || end)) {
                if (c->collapse) {
                    buf[o++] = ' ';
                } else {
                    memcpy(buf + o, text + run_from, run_to - run_from);
                    o += run_to - run_from;
                }
            }
        }
        if (end) break;
        if (newline) {
            if (cp == '\r' && i + 1 < len && s[i + 1] == '\n') i++; /* \r\n counts once */
            newlines++;
            if ((o > 0 || !c->trim) && (c->max_newlines == 0 || newlines <= c->max_newlines))
                buf[o++] = '\n';
            i += step;
            continue;
        }
        memcpy(buf + o, text + i, step);
        o += step;
        content_end = o;
        newlines = 0;
        i += step;
    }
    if (c->trim) o = content_end;
    int rc = CORRAL_POLICY_KEEP;
    if (o != len || memcmp(buf, text, len) != 0) {
        rc = out->write(out, buf, o);
        out->count = (uint32_t)(len - o);
        note(out, "normalized white space (%zu bytes shorter)", len - o);
        if (rc == 0) rc = CORRAL_POLICY_REWRITE;
    }
    free(buf);
    return rc;
}

/* ---- the table ---------------------------------------------------------------------------------
 */

#define BUILTIN(id, nm, desc, ini, des, san)                                      \
    static const corral_policy_v1 id = {.abi_version = CORRAL_POLICY_ABI_VERSION, \
                                        .struct_size = sizeof(corral_policy_v1),  \
                                        .name = nm,                               \
                                        .description = desc,                      \
                                        .init = ini,                              \
                                        .destroy = des,                           \
                                        .sanitize = san}

BUILTIN(builtin_utf8, "utf8", "reject or repair invalid UTF-8", utf8_init, instance_free,
        utf8_sanitize);
BUILTIN(builtin_invisible, "invisible",
        "strip control, format and private-use characters (except \\n and \\t)", invisible_init,
        NULL, invisible_sanitize);
BUILTIN(builtin_special, "special_tokens",
        "keep special-token texts as plain text (flagged), or strip them", special_init,
        instance_free, special_sanitize);
BUILTIN(builtin_max_input, "max_input", "refuse input over a byte or token limit", max_input_init,
        instance_free, max_input_sanitize);
BUILTIN(builtin_deny, "deny", "refuse input matching a named regex", deny_init, deny_destroy,
        deny_sanitize);
BUILTIN(builtin_space, "normalize_space", "collapse runs of white space and trim", space_init,
        instance_free, space_sanitize);

static const corral_policy_v1 *const builtins[] = {
    &builtin_utf8,      &builtin_invisible, &builtin_special,
    &builtin_max_input, &builtin_deny,      &builtin_space,
};

const struct corral_policy_v1 *sanitize_builtin(const char *name) {
    for (size_t i = 0; name && i < N_OF(builtins); i++)
        if (strcmp(builtins[i]->name, name) == 0) return builtins[i];
    return NULL;
}

/* ---- report ------------------------------------------------------------------------------------
 */

const char *sanitize_verdict_name(sanitize_verdict v) {
    switch (v) {
        case SANITIZE_PASSED:
            return "passed";
        case SANITIZE_CHANGED:
            return "changed";
        case SANITIZE_FLAGGED:
            return "flagged";
        case SANITIZE_REJECTED:
            return "rejected";
    }
    return "?";
}

size_t sanitize_report_format(const sanitize_report *r, char *buf, size_t cap) {
    size_t need = 0;
    if (buf && cap) buf[0] = '\0';
    for (uint32_t i = 0; r && i < r->n_steps && i < SANITIZE_MAX_STEPS; i++) {
        const sanitize_step_report *s = &r->steps[i];
        char line[256];
        int n;
        if (s->verdict == SANITIZE_PASSED) {
            n = snprintf(line, sizeof line, "%s%s=passed", i ? " " : "", s->step);
        } else {
            n = snprintf(line, sizeof line, "%s%s=%s(%u: %s)", i ? " " : "", s->step,
                         sanitize_verdict_name(s->verdict), s->count, s->note);
        }
        if (n < 0) continue;
        if (buf && need < cap) snprintf(buf + need, cap - need, "%s", line);
        need += (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    }
    return need;
}
