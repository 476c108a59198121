/*
 * log.h — corral's structured logging: one logfmt line per event, to stderr.
 *
 *     2026-11-30T11:34:00.123Z level=info msg="model loaded" model=stories bytes=1185376
 *
 * Fields are typed (LOG_STR, LOG_INT, LOG_UINT, LOG_F64) so that values are quoted and
 * escaped by the logger, never by the caller; a line is formatted into a buffer and written with
 * one write(2), so lines from different threads never interleave. The level comes from
 * CORRAL_LOG_LEVEL, the config file or a flag (the caller decides the precedence) and can be
 * changed at any time; records below it cost one comparison.
 *
 *     log_info("model loaded", LOG_STR("model", name), LOG_UINT("bytes", size));
 */
#ifndef CORRAL_LOG_H
#define CORRAL_LOG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN = 1,
    LOG_LEVEL_INFO = 2,
    LOG_LEVEL_DEBUG = 3,
    LOG_LEVEL_TRACE = 4,
    LOG_LEVEL_COUNT
} log_level;

typedef enum log_field_type {
    LOG_FIELD_END = 0,
    LOG_FIELD_STR,
    LOG_FIELD_INT,
    LOG_FIELD_UINT,
    LOG_FIELD_F64,
} log_field_type;

/* One key=value pair. Build them with the LOG_* macros below. Keys are identifiers chosen by
 * the programmer and printed as they are; values are escaped as needed. */
typedef struct log_field {
    const char *key;
    log_field_type type;
    union {
        const char *s; /* NULL prints as "(null)" */
        int64_t i;
        uint64_t u;
        double f;
    };
} log_field;

#define LOG_STR(k, v)  ((log_field){.key = (k), .type = LOG_FIELD_STR, .s = (v)})
#define LOG_INT(k, v)  ((log_field){.key = (k), .type = LOG_FIELD_INT, .i = (int64_t)(v)})
#define LOG_UINT(k, v) ((log_field){.key = (k), .type = LOG_FIELD_UINT, .u = (uint64_t)(v)})
#define LOG_F64(k, v)  ((log_field){.key = (k), .type = LOG_FIELD_F64, .f = (double)(v)})
#define LOG_END_       ((log_field){.type = LOG_FIELD_END})

/* log_error(msg, fields...) etc. The message is a fixed phrase; the variable parts go in fields. */
#define log_error(...) log_write(LOG_LEVEL_ERROR, __VA_ARGS__, LOG_END_)
#define log_warn(...)  log_write(LOG_LEVEL_WARN, __VA_ARGS__, LOG_END_)
#define log_info(...)  log_write(LOG_LEVEL_INFO, __VA_ARGS__, LOG_END_)
#define log_debug(...) log_write(LOG_LEVEL_DEBUG, __VA_ARGS__, LOG_END_)
#define log_trace(...) log_write(LOG_LEVEL_TRACE, __VA_ARGS__, LOG_END_)

/* Set / get the threshold: records with a level above it are dropped. Default LOG_LEVEL_INFO.
 * Thread-safe (relaxed atomic). */
void log_set_level(log_level level);
log_level log_get_level(void);

/* True when a record at `level` would be written: guard expensive field computations with it. */
int log_enabled(log_level level);

/* Parse "error", "warn", "info", "debug" or "trace" (case-insensitive). Returns 0 and sets *out,
 * or -1 for anything else. */
int log_level_parse(const char *name, log_level *out);

/* The lower-case name of a level ("warn"); "?" for out-of-range values. */
const char *log_level_name(log_level level);

/* Apply CORRAL_LOG_LEVEL from the environment if it is set and valid. Returns 0 if it was unset
 * or applied, -1 if it was set to something invalid (the level is then left unchanged). */
int log_level_from_env(void);

/* Write a record (use the log_* macros rather than calling this directly). The variadic part is
 * a sequence of log_field values terminated by LOG_END_. */
void log_write(log_level level, const char *msg, ...);

/* Format a record into buf (always NUL-terminated, ends with '\n'; overlong lines are cut and end
 * in "...\n"). `fields` is an array terminated by a LOG_FIELD_END entry; `unix_ms` is the
 * timestamp in milliseconds since the epoch, printed in UTC. Returns the length written.
 * Exposed so that the format can be tested byte for byte. */
size_t log_format(char *buf, size_t size, int64_t unix_ms, log_level level, const char *msg,
                  const log_field *fields);

/* How a quoted value spells byte c: \" \\ \n \r \t, \xhh for the other control bytes and DEL, or
 * NULL when c stands for itself (every other byte, UTF-8 included). buf receives the \xhh form.
 * Exposed so that other one-line quoting (gguf's value printer) spells bytes the same way. */
#define LOG_ESCAPE_MAX 5
const char *log_escape_byte(uint8_t c, char buf[LOG_ESCAPE_MAX]);

/* A limit on a warning that others can cause at will (a refused connection, an unauthenticated
 * message): at most `burst` records per `window_ms`; the ones over it are not written but
 * counted, and the next record written reports how many were left out, so that a peer retrying
 * in a loop cannot fill the log (or the disk under it) while every kind of event still shows.
 * Any thread may use one; define it static with LOG_LIMIT_INIT.
 *
 *     static log_limit refusals = LOG_LIMIT_INIT(20, 10000);
 *     uint64_t left_out;
 *     if (log_limit_allow(&refusals, &left_out))
 *         log_warn("connection refused", LOG_STR("peer", who), LOG_UINT("left_out", left_out));
 */
typedef struct log_limit {
    uint32_t burst, window_ms;
    atomic_flag busy;
    int64_t window_start_ms; /* -1: no window yet */
    uint32_t in_window;
    uint64_t left_out;
} log_limit;
#define LOG_LIMIT_INIT(b, w) \
    { .burst = (b), .window_ms = (w), .busy = ATOMIC_FLAG_INIT, .window_start_ms = -1 }

/* 1 if a record may be written now (then *left_out, when not NULL, receives how many were not
 * since the last one written); 0 if it is over the limit (and counted). */
int log_limit_allow(log_limit *l, uint64_t *left_out);

/* The same at a given time on the monotonic clock, in milliseconds (tests). */
int log_limit_allow_at(log_limit *l, int64_t now_ms, uint64_t *left_out);

/* Direct records to a file descriptor other than stderr (tests). Returns the previous one. */
int log_set_fd(int fd);

#endif /* CORRAL_LOG_H */
