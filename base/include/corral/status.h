/*
 * status.h — the one status enum of corral, and the error record that carries its message.
 *
 * Every fallible function in corral returns a corral_status (CORRAL_OK = 0, errors negative) or,
 * for constructors, NULL plus a filled corral_error. The table below is the single source of
 * truth: it generates the enum, corral_strerror(), the stable upper-case names used in logs and
 * on the wire, and it maps 1:1 onto proto/corral.proto's ErrorCode (wire value = -status).
 * Numbers are append-only: never renumber or reuse one.
 */
#ifndef CORRAL_STATUS_H
#define CORRAL_STATUS_H

#include <stddef.h>

/* X(NAME, value, description) */
#define CORRAL_STATUS_TABLE(X)                                  \
    X(OK, 0, "success")                                         \
    X(INVALID_ARGUMENT, -1, "invalid argument")                 \
    X(NOT_FOUND, -2, "not found")                               \
    X(IO, -3, "input/output error")                             \
    X(FORMAT, -4, "malformed data")                             \
    X(UNSUPPORTED, -5, "unsupported")                           \
    X(OUT_OF_MEMORY, -6, "out of memory")                       \
    X(RESOURCE_EXHAUSTED, -7, "resource exhausted")             \
    X(DEADLINE_EXCEEDED, -8, "deadline exceeded")               \
    X(CANCELLED, -9, "cancelled")                               \
    X(PERMISSION_DENIED, -10, "permission denied")              \
    X(SANITIZER_REJECTED, -11, "input rejected by a sanitizer") \
    X(INTERNAL, -12, "internal error")                          \
    X(UNAVAILABLE, -13, "service unavailable")                  \
    X(PROTOCOL, -14, "protocol error")                          \
    X(FAILED_PRECONDITION, -15, "operation not allowed in the current state")

typedef enum corral_status {
#define CORRAL_STATUS_ENUM_(name, value, text) CORRAL_##name = value,
    CORRAL_STATUS_TABLE(CORRAL_STATUS_ENUM_)
#undef CORRAL_STATUS_ENUM_
} corral_status;

/* Number of entries in the table (the most negative value is -(CORRAL_STATUS_COUNT - 1)). */
#define CORRAL_STATUS_COUNT 16

/* Human description of a status ("deadline exceeded"). Never NULL: unknown values give
 * "unknown status". Thread-safe; the string is static. */
const char *corral_strerror(int status);

/* Stable upper-case name of a status ("DEADLINE_EXCEEDED"), as used in logs and on the wire.
 * Unknown values give NULL. Thread-safe; the string is static. */
const char *corral_status_name(int status);

/* Parse a stable name back into its status. Returns 0 and sets *out on success, -1 if the
 * name is not in the table. */
int corral_status_from_name(const char *name, corral_status *out);

/* An error record: the status and a message that names what was wrong (file, tensor, key,
 * line:column). Callers own it, usually on the stack; functions that fail fill it. */
#define CORRAL_ERROR_MESSAGE_MAX 512

typedef struct corral_error {
    corral_status status;
    char message[CORRAL_ERROR_MESSAGE_MAX];
} corral_error;

/* Fill *err (which may be NULL: then only the status is returned) with status and a printf-style
 * message, truncated to fit (never inside a UTF-8 character, so a message cut from valid text
 * stays valid). Returns status, so that `return corral_error_set(err, ...)` reads naturally. */
corral_status corral_error_set(corral_error *err, corral_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepend printf-style context and ": " to an error's message ("model stories: <message>"),
 * keeping its status; what does not fit is cut as corral_error_set cuts. NULL-safe. Returns
 * err->status (CORRAL_OK for NULL). */
corral_status corral_error_prefix(corral_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reset *err to CORRAL_OK with an empty message. NULL-safe. */
void corral_error_clear(corral_error *err);

#endif /* CORRAL_STATUS_H */
