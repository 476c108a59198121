/*
 * json.c — the CLI's --json helpers on jansson (see json.h): UTF-8 repair before a string
 * becomes a json_t (jansson refuses invalid UTF-8 outright), and the one printing call.
 */
#include "json.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "corral/utf8.h"

static bool failed; /* a value could not be made or set since the last print */

json_t *cli_json_str(const char *s) {
    if (!s) return json_null();
    const size_t len = strlen(s);
    if (utf8_validate((const uint8_t *)s, len) == len) return json_stringn(s, len);
    /* Each bad byte becomes U+FFFD (3 bytes): at most 3x as long. */
    char *fixed = malloc(3 * len + 1);
    if (!fixed) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t k;
        if (utf8_decode((const uint8_t *)s + i, len - i, NULL, &k) == UTF8_OK) {
            memcpy(fixed + n, s + i, k);
            n += k;
            i += k;
        } else {
            memcpy(fixed + n, "\xef\xbf\xbd", 3);
            n += 3;
            i++;
        }
    }
    json_t *v = json_stringn(fixed, n);
    free(fixed);
    return v;
}

json_t *cli_json_uint(uint64_t v) {
    return v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

json_t *cli_json_real(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

void cli_json_set(json_t *obj, const char *key, json_t *v) {
    if (!obj || !v || json_object_set_new(obj, key, v) != 0) failed = true;
}

void cli_json_append(json_t *arr, json_t *v) {
    if (!arr || !v || json_array_append_new(arr, v) != 0) failed = true;
}

int cli_json_print(json_t **doc, FILE *out, int indent) {
    const size_t flags = JSON_ENCODE_ANY | (indent > 0 ? JSON_INDENT(indent) : JSON_COMPACT) |
                         JSON_REAL_PRECISION(17);
    int rc = !*doc || failed ? -1 : json_dumpf(*doc, out, flags);
    if (rc == 0 && fputc('\n', out) == EOF) rc = -1;
    json_decref(*doc);
    *doc = NULL;
    failed = false;
    return rc;
}
