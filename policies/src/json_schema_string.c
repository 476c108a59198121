/*
 * json_schema_string.c — the JSON Schema compiler's strings (json_schema.h, "Strings"): JSON's
 * string syntax as a pattern, lengths, the formats, `pattern`, and the literals of enum/const.
 *
 * The pattern runs over the document's bytes, so a string is matched in its JSON spelling: a
 * character is either itself (anything but `"`, `\` and the controls U+0000-U+001F; the regex
 * compiler admits only valid UTF-8) or an escape. A schema's `pattern` speaks of the decoded
 * characters instead; regex__rewrite parses it with the constraint compiler's parser and writes
 * each of its character sets back as the JSON spellings of those characters (themselves, or the
 * escape JSON requires), and fills the ends JSON Schema's search semantics leave open with "any
 * characters".
 */
#include <string.h>

#include "corral/utf8.h"
#include "json_schema_impl.h"

/* One character of a string's JSON text: itself, a short escape, or \uXXXX with a surrogate
 * only as a high-low pair (so the text decodes to valid Unicode, as Python's json requires). */
static const char json_char[] =
    "(?:[^\"\\\\\\x00-\\x1F]|\\\\[\"\\\\/bfnrt]|\\\\u(?:[0-9A-Ca-cE-Fe-f][0-9A-Fa-f]{3}|"
    "[Dd][0-7][0-9A-Fa-f]{2}|[Dd][89ABab][0-9A-Fa-f]{2}\\\\u[Dd][C-Fc-f][0-9A-Fa-f]{2}))";

bool js__json_char(regex_text *out) {
    return regex__text_puts(out, json_char);
}

bool js__any_string(regex_text *out) {
    regex__text_puts(out, "\"");
    regex__text_puts(out, json_char);
    return regex__text_puts(out, "*\"");
}

/* ---- formats ---------------------------------------------------------------------------------
 *
 * Dates are real dates (what a validator that parses them accepts: Python's date.fromisoformat):
 * years 0001-9999, the days each month has, February 29 only in leap years (divisible by 4 and
 * not by 100, or by 400: the last two digits divisible by 4 and not 00, or 00 after a century
 * divisible by 4).
 */
#define F_YEAR "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
#define F_DIV4 "(?:0[48]|[2468][048]|[13579][26])"
#define F_LEAP "(?:[0-9]{2}" F_DIV4 "|" F_DIV4 "00)-02-29"
#define F_MONTHS                                                                              \
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|" \
    "02-(?:0[1-9]|1[0-9]|2[0-8]))"
#define F_DATE  "(?:" F_YEAR "-" F_MONTHS "|" F_LEAP ")"
#define F_HOUR  "(?:[01][0-9]|2[0-3])"
#define F_TIME  F_HOUR ":[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+\\-]" F_HOUR ":[0-5][0-9])"
#define F_ATEXT "[A-Za-z0-9!#$%&'*+/=?\\^_`{|}~\\-]"
#define F_LABEL "[A-Za-z0-9](?:[A-Za-z0-9\\-]*[A-Za-z0-9])?"
#define F_OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"

static const struct {
    const char *name, *pattern;
} formats[] = {
    {"date", F_DATE},
    {"time", F_TIME},
    {"date-time", F_DATE "T" F_TIME},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email", F_ATEXT "+(?:\\." F_ATEXT "+)*@(?:" F_LABEL "\\.)+[A-Za-z]{2,}"},
    {"ipv4", F_OCTET "(?:\\." F_OCTET "){3}"},
};

/* ---- pattern ---------------------------------------------------------------------------------
 */

/* JSON's short escapes, by control character. */
static const char *short_escape(uint32_t cp) {
    switch (cp) {
        case 0x08:
            return "\\\\b";
        case 0x09:
            return "\\\\t";
        case 0x0A:
            return "\\\\n";
        case 0x0C:
            return "\\\\f";
        case 0x0D:
            return "\\\\r";
        default:
            return NULL;
    }
}

static bool set_has(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    for (size_t i = 0; i < n; i++)
        if (cp >= r[i][0] && cp <= r[i][1]) return true;
    return false;
}

/* Append lo..hi to the class being written (opening it first). */
static void class_range(regex_text *out, uint32_t lo, uint32_t hi, int *alts, bool *open) {
    if (!*open) {
        regex__text_puts(out, *alts ? "|[" : "[");
        *open = true;
        ++*alts;
    }
    regex__text_put_cp(out, lo);
    if (hi > lo) {
        regex__text_puts(out, "-");
        regex__text_put_cp(out, hi);
    }
}

/* regex__rewrite's set writer: the JSON spellings of one character of the set: the characters
 * JSON lets stand as themselves in one class, then the escapes of `"`, `\` and the controls. */
static bool write_json_set(void *user, const uint32_t (*r)[2], size_t n, regex_text *out) {
    (void)user;
    int alts = 0;
    bool open = false;
    regex__text_puts(out, "(?:");
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = r[i][0] < 0x20 ? 0x20 : r[i][0];
        const uint32_t hi = r[i][1];
        static const uint32_t cuts[] = {'"', '\\'}; /* ascending */
        for (size_t c = 0; c < 2 && lo <= hi; c++) {
            if (cuts[c] < lo || cuts[c] > hi) continue;
            if (lo < cuts[c]) class_range(out, lo, cuts[c] - 1, &alts, &open);
            lo = cuts[c] + 1;
        }
        if (lo <= hi) class_range(out, lo, hi, &alts, &open);
    }
    if (open) regex__text_puts(out, "]");
    if (set_has(r, n, '"')) regex__text_puts(out, alts++ ? "|\\\\\"" : "\\\\\"");
    if (set_has(r, n, '\\')) regex__text_puts(out, alts++ ? "|\\\\\\\\" : "\\\\\\\\");
    bool all_controls = true;
    for (uint32_t c = 0; c < 0x20 && all_controls; c++) all_controls = set_has(r, n, c);
    if (all_controls) {
        regex__text_puts(out, alts++ ? "|" : "");
        regex__text_puts(out, "\\\\(?:[bfnrt]|u00[01][0-9A-Fa-f])");
    } else {
        for (uint32_t c = 0; c < 0x20; c++) {
            if (!set_has(r, n, c)) continue;
            regex__text_puts(out, alts++ ? "|" : "");
            const char *e = short_escape(c);
            if (e) {
                regex__text_puts(out, e);
            } else {
                const unsigned d = c & 0xF;
                regex__text_printf(out, "\\\\u00%u", (unsigned)(c >> 4));
                if (d < 10)
                    regex__text_printf(out, "%u", d);
                else
                    regex__text_printf(out, "[%c%c]", 'A' + d - 10, 'a' + d - 10);
            }
        }
    }
    if (!alts) regex__text_puts(out, "[]"); /* the empty set stays empty */
    return regex__text_puts(out, ")");
}

/* `pattern`: a search over the decoded string, rewritten for its JSON text. */
static bool string_pattern(js_ctx *j, const json_t *pat) {
    if (!json_is_string(pat))
        return js__fail(j, "pattern", CORRAL_INVALID_ARGUMENT, "pattern must be a string");
    char any[sizeof json_char + 2];
    snprintf(any, sizeof any, "%s*", json_char);
    const regex_rewrite how = {.set = write_json_set, .unanchored = any};
    corral_error e = {0};
    regex__text_puts(j->out, "\"");
    const size_t start = j->out->len;
    const corral_status st =
        regex__rewrite(json_string_value(pat), json_string_length(pat), &how, j->out, &e);
    if (st != CORRAL_OK) {
        if (j->out->status != CORRAL_OK) return js__ok(j);
        return js__fail(j, "pattern", st, "%s", e.message);
    }
    if (j->out->status != CORRAL_OK) return js__ok(j);
    /* A pattern no string matches (`[]`, an empty class) would leave a schema nothing can
     * satisfy, refused only by the whole pattern's compile, which cannot say where: compile this
     * part alone to name it here. */
    regex_dfa alone;
    const corral_status cs = regex__compile(j->out->data + start, j->out->len - start,
                                            REGEX_GENERATED, &alone, NULL, &e);
    regex__free(&alone);
    if (cs != CORRAL_OK) return js__fail(j, "pattern", cs, "%s", e.message);
    return regex__text_puts(j->out, "\"");
}

/* A count keyword: absent (-1), or a whole number 0..JSON_SCHEMA_MAX_COUNT in *out. */
static bool read_count(js_ctx *j, const json_t *s, const char *key, int64_t *out) {
    const json_t *v = json_object_get(s, key);
    *out = -1;
    if (!v) return true;
    if (json_is_real(v) && json_real_value(v) == (double)(int64_t)json_real_value(v) &&
        json_real_value(v) >= 0 && json_real_value(v) <= JSON_SCHEMA_MAX_COUNT) {
        *out = (int64_t)json_real_value(v); /* 3.0 is an integer to JSON Schema */
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return js__fail(j, key, CORRAL_INVALID_ARGUMENT, "%s must be a non-negative integer", key);
    if (json_integer_value(v) > JSON_SCHEMA_MAX_COUNT)
        return js__fail(j, key, CORRAL_RESOURCE_EXHAUSTED,
                        "%s %lld is above the limit of %d (JSON_SCHEMA_MAX_COUNT)", key,
                        (long long)json_integer_value(v), JSON_SCHEMA_MAX_COUNT);
    *out = json_integer_value(v);
    return true;
}

bool js__counts(js_ctx *j, const json_t *s, const char *min_key, const char *max_key, int64_t *min,
                int64_t *max) {
    if (!read_count(j, s, min_key, min) || !read_count(j, s, max_key, max)) return false;
    if (*max >= 0 && *min > *max)
        return js__fail(j, max_key, CORRAL_INVALID_ARGUMENT, "%s %lld is below %s %lld", max_key,
                        (long long)*max, min_key, (long long)*min);
    return true;
}

bool js__string(js_ctx *j, const json_t *s) {
    const json_t *format = json_object_get(s, "format");
    const json_t *pattern = json_object_get(s, "pattern");
    int64_t min, max;
    if (!js__counts(j, s, "minLength", "maxLength", &min, &max)) return false;
    const bool lengths = min > 0 || max >= 0;
    if (format && pattern)
        return js__fail(j, "pattern", CORRAL_INVALID_ARGUMENT,
                        "pattern together with format is not supported");
    if ((format || pattern) && lengths)
        return js__fail(j, min > 0 ? "minLength" : "maxLength", CORRAL_INVALID_ARGUMENT,
                        "%s together with %s is not supported (put the length in the pattern)",
                        min > 0 ? "minLength" : "maxLength", format ? "format" : "pattern");
    if (pattern) return string_pattern(j, pattern);
    if (format) {
        if (!json_is_string(format))
            return js__fail(j, "format", CORRAL_INVALID_ARGUMENT, "format must be a string");
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
            if (strcmp(json_string_value(format), formats[i].name) != 0) continue;
            regex__text_puts(j->out, "\"");
            regex__text_puts(j->out, formats[i].pattern);
            return regex__text_puts(j->out, "\"");
        }
        return js__fail(j, "format", CORRAL_INVALID_ARGUMENT,
                        "format '%.64s' is not supported (supported: date, time, date-time, "
                        "uuid, email, ipv4)",
                        json_string_value(format));
    }
    regex__text_puts(j->out, "\"");
    regex__text_puts(j->out, json_char);
    if (max >= 0)
        regex__text_printf(j->out, "{%lld,%lld}", (long long)(min > 0 ? min : 0), (long long)max);
    else if (min > 0)
        regex__text_printf(j->out, "{%lld,}", (long long)min);
    else
        regex__text_puts(j->out, "*");
    return regex__text_puts(j->out, "\"");
}

/* ---- literals -------------------------------------------------------------------------------- */

bool js__literal(js_ctx *j, const json_t *v) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!text) return js__fail(j, NULL, CORRAL_OUT_OF_MEMORY, "out of memory");
    const size_t len = strlen(text);
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n;
        if (utf8_decode((const uint8_t *)text + i, len - i, &cp, &n) != UTF8_OK) {
            free(text);
            return js__fail(j, NULL, CORRAL_INTERNAL, "jansson wrote invalid UTF-8");
        }
        regex__text_put_cp(j->out, cp);
        i += n;
    }
    free(text);
    return js__ok(j);
}
