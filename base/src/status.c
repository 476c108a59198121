/*
 * status.c — corral_strerror(), stable names and the error record, all generated from
 * CORRAL_STATUS_TABLE in status.h so that the three can never disagree.
 */
#include "corral/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "corral/utf8.h"

typedef struct status_entry {
    int value;
    const char *name;
    const char *text;
} status_entry;

static const status_entry status_entries[] = {
#define STATUS_ENTRY_(name, value, text) {value, #name, text},
    CORRAL_STATUS_TABLE(STATUS_ENTRY_)
#undef STATUS_ENTRY_
};

_Static_assert(sizeof status_entries / sizeof status_entries[0] == CORRAL_STATUS_COUNT,
               "CORRAL_STATUS_COUNT must equal the number of rows in CORRAL_STATUS_TABLE");

/* The table is dense: row i holds value -i. Checked by the unit tests; relied on here. */
static const status_entry *status_lookup(int status) {
    if (status > 0 || status <= -CORRAL_STATUS_COUNT) return NULL;
    const status_entry *e = &status_entries[-status];
    return e->value == status ? e : NULL;
}

const char *corral_strerror(int status) {
    const status_entry *e = status_lookup(status);
    return e ? e->text : "unknown status";
}

const char *corral_status_name(int status) {
    const status_entry *e = status_lookup(status);
    return e ? e->name : NULL;
}

int corral_status_from_name(const char *name, corral_status *out) {
    if (!name) return -1;
    for (size_t i = 0; i < CORRAL_STATUS_COUNT; i++) {
        if (strcmp(status_entries[i].name, name) == 0) {
            *out = (corral_status)status_entries[i].value;
            return 0;
        }
    }
    return -1;
}

/* A message is composed with room for the few bytes past the record's limit that tell whether a
 * character straddles it; error_store then cuts before such a character, so that a long message
 * still leaves the daemon as valid UTF-8. */
#define ERROR_TEXT_MAX (CORRAL_ERROR_MESSAGE_MAX + UTF8_SEQUENCE_MAX - 1)

static void error_store(corral_error *err, const char *text, size_t len) {
    const size_t n = utf8_cut((const uint8_t *)text, len, sizeof err->message - 1);
    memcpy(err->message, text, n);
    err->message[n] = '\0';
}

corral_status corral_error_set(corral_error *err, corral_status status, const char *fmt, ...) {
    if (!err) return status;
    err->status = status;
    char text[ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    error_store(err, text, n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
    return status;
}

corral_status corral_error_prefix(corral_error *err, const char *fmt, ...) {
    if (!err) return CORRAL_OK;
    char joined[ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(joined, sizeof joined, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n;
    if (len > sizeof joined - 1) len = sizeof joined - 1;
    /* Append ": " and the old message, as much as the buffer holds. */
    const char *parts[2] = {": ", err->message};
    for (int i = 0; i < 2; i++) {
        for (const char *p = parts[i]; *p && len < sizeof joined - 1; p++) joined[len++] = *p;
    }
    error_store(err, joined, len);
    return err->status;
}

void corral_error_clear(corral_error *err) {
    if (!err) return;
    err->status = CORRAL_OK;
    err->message[0] = '\0';
}
