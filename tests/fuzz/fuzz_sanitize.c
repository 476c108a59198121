/*
 * fuzz_sanitize.c — the sanitizer pipeline (policy.h's policy_sanitize) over arbitrary input, the
 * way corrald runs it over a prompt or a chat message, with profiles that use every built-in step.
 *
 * Input: the first byte chooses the profile (bit 0) and the vocabulary whose special-token texts
 * and tokenizer the steps use (bit 1: ggml-vocab-gpt-2 — <|endoftext|> —, else ggml-vocab-phi-3,
 * whose chat markers <|user|>, <|end|>, ... are control tokens); the rest is the user text.
 *
 *   "strict": utf8 repair, invisible, special_tokens strip, normalize_space (trim, collapse, at
 *     most 2 newlines), deny (two rules, one ASCII-caseless), max_input (4 KiB, 1024 tokens) and
 *     the output regex (no sanitize callback: it must be skipped). What passes is valid UTF-8,
 *     holds no special-token text, no invisible character, no \r, no horizontal space but single
 *     ' ' between words, no space at a line's ends, at most two newlines in a row, neither deny
 *     rule's plain form, and is at most 4 KiB and at most 3 bytes per input byte (U+FFFD for
 *     each bad one).
 *   "exact": utf8 reject, special_tokens keep, normalize_space that neither trims nor collapses
 *     and keeps every newline, max_input 1 KiB. Its outcome is known byte for byte: ill-formed
 *     input is rejected; otherwise the output is the input with \r\n and \r turned into \n,
 *     rejected when that is over 1 KiB; special_tokens is flagged exactly when a special-token
 *     text occurs.
 */
#include "corral/gguf.h"
#include "corral/policy.h"
#include "corral/sanitize.h"
#include "corral/tokenizer.h"
#include "corral/unicode.h"
#include "corral/utf8.h"
#include "fuzz.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define STRICT_MAX_BYTES 4096
#define EXACT_MAX_BYTES  1024

static const corral_policy_kv repair[] = {{"mode", "repair"}};
static const corral_policy_kv reject[] = {{"mode", "reject"}};
static const corral_policy_kv strip[] = {{"mode", "strip"}};
static const corral_policy_kv keep[] = {{"mode", "keep"}};
static const corral_policy_kv strict_max[] = {{"bytes", "4KiB"}, {"tokens", "1024"}};
static const corral_policy_kv exact_max[] = {{"bytes", "1KiB"}};
static const corral_policy_kv deny_rules[] = {
    {"jailbreak", "/ignore\\s+(all\\s+)?previous\\s+instructions/i"},
    {"secret", "BEGIN (RSA )?PRIVATE KEY"},
};
static const corral_policy_kv keep_space[] = {
    {"trim", "false"}, {"collapse", "false"}, {"max_newlines", "0"}};
static const corral_policy_kv any_output[] = {{"pattern", "[\\s\\S]*"}};

static const policy_step_desc strict_steps[] = {
    {.kind = "utf8", .params = repair, .n_params = N_OF(repair)},
    {.kind = "invisible"},
    {.kind = "special_tokens", .params = strip, .n_params = N_OF(strip)},
    {.kind = "normalize_space"},
    {.kind = "deny", .params = deny_rules, .n_params = N_OF(deny_rules)},
    {.kind = "max_input", .params = strict_max, .n_params = N_OF(strict_max)},
    {.kind = "regex", .params = any_output, .n_params = N_OF(any_output)},
};

static const policy_step_desc exact_steps[] = {
    {.kind = "utf8", .params = reject, .n_params = N_OF(reject)},
    {.kind = "special_tokens", .params = keep, .n_params = N_OF(keep)},
    {.kind = "normalize_space", .params = keep_space, .n_params = N_OF(keep_space)},
    {.kind = "max_input", .params = exact_max, .n_params = N_OF(exact_max)},
};

typedef struct vocab {
    const char *rel;
    gguf_file *file;
    tokenizer *tok;
    policy_vocab *pv;
    const char *const *specials;
    size_t n_specials;
} vocab;

static vocab vocabs[2] = {
    {.rel = "vocab/ggml-vocab-phi-3.gguf"},
    {.rel = "vocab/ggml-vocab-gpt-2.gguf"},
};
static policy_profile *strict, *exact;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    corral_error err = {0};
    for (size_t i = 0; i < N_OF(vocabs); i++) {
        vocab *v = &vocabs[i];
        const char *path = fuzz_shared_path(v->rel);
        v->file = gguf_open(path, &err);
        if (v->file) v->tok = tok_new_from_gguf(v->file, &err);
        if (v->tok) v->pv = policy_vocab_new(v->tok, &err);
        if (!v->pv) {
            fprintf(stderr, "fuzz_sanitize: %s: %s (set CORRAL_SHARED_DIR)\n", path, err.message);
            exit(1);
        }
        v->specials = policy_vocab_specials(v->pv, &v->n_specials);
    }
    strict = policy_profile_new("strict", strict_steps, N_OF(strict_steps), &err);
    if (strict) exact = policy_profile_new("exact", exact_steps, N_OF(exact_steps), &err);
    if (!exact) {
        fprintf(stderr, "fuzz_sanitize: %s\n", err.message);
        exit(1);
    }
    return 0;
}

static int has_special(const vocab *v, const char *s, size_t n) {
    for (size_t i = 0; i < v->n_specials; i++)
        if (memmem(s, n, v->specials[i], strlen(v->specials[i]))) return 1;
    return 0;
}

static void check_report(const sanitize_report *r, size_t n_steps, corral_status st) {
    FUZZ_CHECK(r->n_steps <= n_steps, "%u report lines for %zu steps", r->n_steps, n_steps);
    for (uint32_t i = 0; i < r->n_steps; i++) {
        FUZZ_CHECK(r->steps[i].verdict <= SANITIZE_REJECTED, "verdict %d",
                   (int)r->steps[i].verdict);
        FUZZ_CHECK(memchr(r->steps[i].note, '\0', sizeof r->steps[i].note), "note unterminated");
        /* Only the last line can be a refusal, and only when the run failed. */
        if (r->steps[i].verdict == SANITIZE_REJECTED)
            FUZZ_CHECK(i + 1 == r->n_steps && st != CORRAL_OK, "rejected at line %u", i);
    }
    char line[96];
    const size_t need = sanitize_report_format(r, line, sizeof line);
    FUZZ_CHECK(strlen(line) == (need < sizeof line ? need : sizeof line - 1),
               "report format: %zu needed, %zu written", need, strlen(line));
}

static void check_strict(const vocab *v, const char *in, size_t len, const char *out,
                         size_t out_len) {
    FUZZ_CHECK(utf8_validate((const uint8_t *)out, out_len) == out_len, "output not UTF-8");
    FUZZ_CHECK(out_len <= STRICT_MAX_BYTES && out_len <= 3 * len, "%zu bytes out of %zu", out_len,
               len);
    FUZZ_CHECK(!has_special(v, out, out_len), "special-token text survived strip");
    FUZZ_CHECK(!memmem(out, out_len, "BEGIN PRIVATE KEY", 17) &&
                   !memmem(out, out_len, "BEGIN RSA PRIVATE KEY", 21),
               "deny rule 'secret' let its text through");
    FUZZ_CHECK(!memmem(out, out_len, "  ", 2) && !memmem(out, out_len, " \n", 2) &&
                   !memmem(out, out_len, "\n ", 2) && !memmem(out, out_len, "\n\n\n", 3),
               "white space not normalized");
    FUZZ_CHECK(out_len == 0 || (out[0] != ' ' && out[0] != '\n' && out[out_len - 1] != ' ' &&
                                out[out_len - 1] != '\n'),
               "white space at the ends");
    (void)in;
    for (size_t i = 0; i < out_len;) {
        uint32_t cp = 0;
        size_t l = 1;
        utf8_decode((const uint8_t *)out + i, out_len - i, &cp, &l);
        FUZZ_CHECK(cp != '\r', "\\r at %zu", i);
        FUZZ_CHECK(cp == '\n' || cp == ' ' || !sanitize_is_invisible(cp), "invisible U+%04X at %zu",
                   cp, i);
        FUZZ_CHECK(cp == ' ' || cp == '\n' ||
                       (cp != '\t' && cp != '\v' && cp != '\f' &&
                        unicode_cpt_category(cp) != UNICODE_GC_ZS),
                   "uncollapsed space U+%04X at %zu", cp, i);
        i += l;
    }
}

static void check_exact(const vocab *v, const char *in, size_t len, corral_status st,
                        const char *out, size_t out_len, const sanitize_report *r) {
    if (utf8_validate((const uint8_t *)in, len) != len) {
        FUZZ_CHECK(st == CORRAL_SANITIZER_REJECTED && r->n_steps == 1,
                   "ill-formed input: status %d after %u steps", (int)st, r->n_steps);
        return;
    }
    char *want = malloc(len + 1);
    FUZZ_CHECK(want != NULL, "out of memory");
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
        if (in[i] == '\r') {
            want[w++] = '\n';
            if (i + 1 < len && in[i + 1] == '\n') i++;
        } else {
            want[w++] = in[i];
        }
    }
    FUZZ_CHECK(r->n_steps >= 2, "%u steps ran on valid input", r->n_steps);
    const int flagged = r->steps[1].verdict == SANITIZE_FLAGGED;
    FUZZ_CHECK(flagged == has_special(v, in, len), "special_tokens keep: flagged %d", flagged);
    if (w > EXACT_MAX_BYTES) {
        FUZZ_CHECK(st == CORRAL_SANITIZER_REJECTED && r->n_steps == 4,
                   "%zu bytes after normalize: status %d", w, (int)st);
    } else {
        FUZZ_CHECK(st == CORRAL_OK, "valid input of %zu bytes: status %d", w, (int)st);
        FUZZ_CHECK(out_len == w && memcmp(out, want, w) == 0, "output %zu bytes, want %zu", out_len,
                   w);
    }
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const int use_exact = data[0] & 1;
    const vocab *v = &vocabs[(data[0] >> 1) & 1];
    const policy_profile *p = use_exact ? exact : strict;
    const char *in = (const char *)data + 1;
    const size_t len = size - 1;

    char *out = NULL;
    size_t out_len = 0;
    sanitize_report report;
    corral_error err = {0};
    corral_status st = policy_sanitize(p, v->pv, in, len, &out, &out_len, &report, &err);
    FUZZ_CHECK(st == CORRAL_OK || st == CORRAL_SANITIZER_REJECTED, "status %d: %s", (int)st,
               err.message);
    FUZZ_CHECK((st == CORRAL_OK) == (out != NULL), "output and status disagree");
    if (st == CORRAL_OK) {
        FUZZ_CHECK(out[out_len] == '\0', "output not NUL-terminated");
        FUZZ_CHECK(report.bytes_in == len && report.bytes_out == out_len, "report byte counts");
    } else {
        FUZZ_CHECK(err.message[0] != '\0', "refusal without a message");
    }
    check_report(&report, policy_profile_n_steps(p), st);
    if (use_exact)
        check_exact(v, in, len, st, out, out_len, &report);
    else if (st == CORRAL_OK)
        check_strict(v, in, len, out, out_len);
    free(out);
    return 0;
}
