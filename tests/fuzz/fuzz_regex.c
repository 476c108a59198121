/*
 * fuzz_regex.c — the regex compiler behind output constraints and the deny sanitizer, through
 * their public APIs: constraint_compile (constraint.h, a whole-output match) and the deny step's
 * init (sanitize.h, a search anywhere, optionally ASCII-caseless), on arbitrary patterns.
 *
 * Input: the first byte's bit 0 picks the mode (0: constraint, 1: deny; bit 1: deny's /.../i
 * form); then the pattern, up to the first NUL; the bytes after it are a text to match.
 *
 * Constraint mode, on stories260K's 512-token vocabulary: compile; a failure is one of the
 * documented statuses with a message. A compiled pattern then drives a matcher for up to
 * MAX_STEPS tokens, choosing among the allowed ones by the text's bytes, and checks what makes
 * constraints sound: mask() and allowed() agree on every token; accept() takes exactly the allowed
 * ones; when the matcher is in an accepting state the bytes accepted so far match the pattern as
 * a DFA run over them says (constraint_match), and vice versa.
 * Deny mode: the step's init compiles the pattern in search mode, and its sanitize callback runs
 * over the text; a text that the same pattern matches whole must be refused (a whole match is a
 * match somewhere).
 *
 * Time and memory are bounded by libFuzzer (-timeout, -rss_limit_mb, set by scripts/fuzz): a
 * pattern that takes longer or more is reported as a timeout or an out-of-memory crash.
 */
#include <math.h>

#include "corral/constraint.h"
#include "corral/gguf.h"
#include "corral/policy.h"
#include "corral/sanitize.h"
#include "corral/tokenizer.h"
#include "fuzz.h"

#define MAX_STEPS 24

static gguf_file *file;
static tokenizer *tok;
static constraint_index *ix;
static const corral_policy_v1 *deny;

/* Frees what LLVMFuzzerInitialize made, so that LeakSanitizer reports only what inputs leak (a
 * static pointer written once and never read again may be optimized away, and its block then
 * counts as lost). */
static void cleanup(void) {
    constraint_index_destroy(&ix);
    tok_destroy(&tok);
    gguf_destroy(&file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    corral_error err = {0};
    const char *path = fuzz_shared_path("models/stories260K.gguf");
    file = gguf_open(path, &err);
    if (file) tok = tok_new_from_gguf(file, &err);
    if (tok) ix = constraint_index_new(tok, &err);
    deny = sanitize_builtin("deny");
    if (!ix || !deny) {
        fprintf(stderr, "fuzz_regex: %s: %s (set CORRAL_SHARED_DIR)\n", path, err.message);
        exit(1);
    }
    atexit(cleanup);
    return 0;
}

static void check_failure(corral_status st, const corral_error *err, const char *what) {
    FUZZ_CHECK(st == CORRAL_INVALID_ARGUMENT || st == CORRAL_RESOURCE_EXHAUSTED,
               "%s: status %d (%s)", what, (int)st, err->message);
    FUZZ_CHECK(err->message[0] != '\0', "%s failed without a message", what);
}

/* Walk the matcher through up to MAX_STEPS allowed tokens, picked by the bytes of `pick`. */
static void drive_matcher(constraint *c, const uint8_t *pick, size_t n_pick) {
    corral_error err = {0};
    constraint_matcher *m = constraint_matcher_new(c, &err);
    FUZZ_CHECK(m != NULL, "matcher: %s", err.message);
    const int32_t n_vocab = tok_vocab_size(tok);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    char *out = malloc((size_t)MAX_STEPS * (tok_max_piece_len(tok) + 1) + 1);
    FUZZ_CHECK(logits && out, "out of memory");
    size_t out_len = 0;
    for (int step = 0; step < MAX_STEPS; step++) {
        FUZZ_CHECK(constraint_matcher_is_accepting(m) == constraint_match(c, out, out_len),
                   "step %d: matcher accepting %d, DFA on the %zu bytes says otherwise", step,
                   constraint_matcher_is_accepting(m), out_len);
        const int fin = constraint_matcher_finished(m);
        FUZZ_CHECK(fin == 0 || fin == 1 || fin == CORRAL_FAILED_PRECONDITION, "finished %d", fin);
        if (fin != 0) {
            FUZZ_CHECK(fin != 1 || constraint_matcher_is_accepting(m),
                       "finished without a match after %zu bytes", out_len);
            break;
        }
        for (int32_t t = 0; t < n_vocab; t++) logits[t] = 0.0f;
        constraint_matcher_mask(m, logits, n_vocab);
        int32_t n_allowed = 0;
        for (int32_t t = 0; t < n_vocab; t++) {
            const int ok = isfinite(logits[t]);
            FUZZ_CHECK(ok == constraint_matcher_allowed(m, t), "token %d: mask %d, allowed %d", t,
                       ok, !ok);
            n_allowed += ok;
        }
        FUZZ_CHECK(n_allowed > 0, "not finished but nothing allowed");
        /* The k-th allowed token, k from the next byte of the text. */
        int32_t k = (int32_t)((size_t)step < n_pick ? pick[step] % n_allowed : 0), tok_id = -1;
        for (int32_t t = 0; t < n_vocab && tok_id < 0; t++)
            if (isfinite(logits[t]) && k-- == 0) tok_id = t;
        int32_t refused = -1; /* a token that is not allowed, which accept must refuse */
        for (int32_t t = 0; t < n_vocab && refused < 0; t++)
            if (!isfinite(logits[t])) refused = t;
        if (refused >= 0)
            FUZZ_CHECK(constraint_matcher_accept(m, refused) == CORRAL_INVALID_ARGUMENT,
                       "accepted disallowed token %d", refused);
        FUZZ_CHECK(constraint_matcher_accept(m, tok_id) == CORRAL_OK, "allowed token %d refused",
                   tok_id);
        if (tok_is_eog(tok, tok_id)) {
            FUZZ_CHECK(constraint_matcher_finished(m) == 1, "end of generation did not finish");
            break;
        }
        size_t n = 0;
        corral_status st =
            tok_decode_piece(tok, tok_id, 0, out + out_len, tok_max_piece_len(tok) + 1, &n, &err);
        FUZZ_CHECK(st == CORRAL_OK && n > 0, "token %d allowed but adds no bytes", tok_id);
        out_len += n;
    }
    free(logits);
    free(out);
    constraint_matcher_destroy(&m);
}

static void fuzz_constraint(const char *pattern, size_t len, const uint8_t *text, size_t n) {
    corral_error err = {0};
    constraint *c = constraint_compile(ix, pattern, len, &err);
    if (!c) {
        check_failure(err.status, &err, "constraint_compile");
        return;
    }
    FUZZ_CHECK(constraint_n_states(c) >= 1, "no states");
    FUZZ_CHECK(memcmp(constraint_pattern(c), pattern, len) == 0, "pattern not kept");
    (void)constraint_match(c, (const char *)text, n);
    drive_matcher(c, text, n);
    constraint_destroy(&c);
}

static int write_nothing(corral_policy_out *out, const char *bytes, size_t len) {
    (void)out;
    (void)bytes;
    (void)len;
    return 0;
}

static void fuzz_deny(const char *pattern, size_t len, int caseless, const uint8_t *text,
                      size_t n) {
    char *rule = malloc(len + 4);
    FUZZ_CHECK(rule != NULL, "out of memory");
    if (caseless)
        snprintf(rule, len + 4, "/%s/i", pattern);
    else
        memcpy(rule, pattern, len + 1);
    const corral_policy_kv kv = {.key = "rule", .value = rule};
    void *instance = NULL;
    char msg[256] = "";
    const int rc = deny->init(&kv, 1, &instance, msg, sizeof msg);
    if (rc != 0) {
        corral_error err = {.status = (corral_status)rc};
        snprintf(err.message, sizeof err.message, "%s", msg);
        check_failure(err.status, &err, "deny init");
        FUZZ_CHECK(instance == NULL, "failed init left an instance");
        free(rule);
        return;
    }
    corral_policy_out out = {.write = write_nothing};
    const int verdict = deny->sanitize(instance, NULL, (const char *)text, n, &out);
    FUZZ_CHECK(verdict == CORRAL_POLICY_KEEP || verdict == CORRAL_POLICY_REJECTED, "deny: %d",
               verdict);
    /* A rule written /REGEX/ or /REGEX/i is read without its slashes: compare only plain ones. */
    const int slashed = len >= 2 && pattern[0] == '/' &&
                        (pattern[len - 1] == '/' ||
                         (len >= 3 && pattern[len - 2] == '/' && pattern[len - 1] == 'i'));
    if (!caseless && !slashed && n > 0 && verdict == CORRAL_POLICY_KEEP) {
        corral_error err = {0};
        constraint *c = constraint_compile(ix, pattern, len, &err);
        if (c) {
            FUZZ_CHECK(!constraint_match(c, (const char *)text, n),
                       "deny kept a text the pattern matches whole");
            constraint_destroy(&c);
        }
    }
    deny->destroy(instance);
    free(rule);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t mode = data[0];
    const uint8_t *p = data + 1, *nul = memchr(p, '\0', size - 1);
    const size_t len = nul ? (size_t)(nul - p) : size - 1;
    const uint8_t *text = nul ? nul + 1 : data + size;
    const size_t n = (size_t)(data + size - text);
    char *pattern = fuzz_strdup(p, len);
    if (mode & 1)
        fuzz_deny(pattern, len, (mode >> 1) & 1, text, n);
    else
        fuzz_constraint(pattern, len, text, n);
    free(pattern);
    return 0;
}
