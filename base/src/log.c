/*
 * log.c — formatting and writing of logfmt records (see log.h for the format).
 *
 * Values are written bare when they are made only of printable, non-space ASCII other than '"'
 * and '=', or bytes of UTF-8 sequences; anything else is quoted with \" \\ \n \r \t and \xNN
 * escapes. Text that reaches the log can come from clients, so a value can never start a new
 * line or forge a field.
 */
#include "corral/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

enum { LOG_LINE_MAX = 4096, LOG_FIELDS_MAX = 32 };

static atomic_int log_threshold = LOG_LEVEL_INFO;
static atomic_int log_fd = STDERR_FILENO;

static const char *const log_level_names[LOG_LEVEL_COUNT] = {
    [LOG_LEVEL_ERROR] = "error", [LOG_LEVEL_WARN] = "warn",   [LOG_LEVEL_INFO] = "info",
    [LOG_LEVEL_DEBUG] = "debug", [LOG_LEVEL_TRACE] = "trace",
};

void log_set_level(log_level level) {
    if (level >= 0 && level < LOG_LEVEL_COUNT)
        atomic_store_explicit(&log_threshold, level, memory_order_relaxed);
}

log_level log_get_level(void) {
    return (log_level)atomic_load_explicit(&log_threshold, memory_order_relaxed);
}

int log_enabled(log_level level) {
    return (int)level <= atomic_load_explicit(&log_threshold, memory_order_relaxed);
}

int log_level_parse(const char *name, log_level *out) {
    if (!name) return -1;
    for (int i = 0; i < LOG_LEVEL_COUNT; i++) {
        if (strcasecmp(name, log_level_names[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    }
    return -1;
}

const char *log_level_name(log_level level) {
    return (level >= 0 && level < LOG_LEVEL_COUNT) ? log_level_names[level] : "?";
}

int log_level_from_env(void) {
    const char *env = getenv("CORRAL_LOG_LEVEL");
    if (!env || !*env) return 0;
    log_level level;
    if (log_level_parse(env, &level) != 0) return -1;
    log_set_level(level);
    return 0;
}

int log_set_fd(int fd) {
    return atomic_exchange(&log_fd, fd);
}

/* A bounded string builder: appends never overflow; `overflow` records that something was cut. */
typedef struct line_buf {
    char *p;
    size_t len, cap;
    int overflow;
} line_buf;

static void lb_putc(line_buf *b, char c) {
    if (b->len + 1 < b->cap)
        b->p[b->len++] = c;
    else
        b->overflow = 1;
}

static void lb_puts(line_buf *b, const char *s) {
    while (*s) lb_putc(b, *s++);
}

static void lb_printf(line_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lb_printf(line_buf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    lb_puts(b, tmp);
}

const char *log_escape_byte(uint8_t c, char buf[LOG_ESCAPE_MAX]) {
    switch (c) {
        case '"':
            return "\\\"";
        case '\\':
            return "\\\\";
        case '\n':
            return "\\n";
        case '\r':
            return "\\r";
        case '\t':
            return "\\t";
        default:
            break;
    }
    if (c >= 0x20 && c != 0x7f) return NULL;
    snprintf(buf, LOG_ESCAPE_MAX, "\\x%02x", c);
    return buf;
}

static int needs_quotes(const char *s) {
    if (!*s) return 1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f) return 1;
    }
    return 0;
}

static void lb_put_value(line_buf *b, const char *s) {
    if (!s) s = "(null)";
    if (!needs_quotes(s)) {
        lb_puts(b, s);
        return;
    }
    lb_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char hex[LOG_ESCAPE_MAX];
        const char *esc = log_escape_byte(*p, hex);
        if (esc)
            lb_puts(b, esc);
        else
            lb_putc(b, (char)*p);
    }
    lb_putc(b, '"');
}

size_t log_format(char *buf, size_t size, int64_t unix_ms, log_level level, const char *msg,
                  const log_field *fields) {
    if (size == 0) return 0;
    line_buf b = {.p = buf, .cap = size};

    time_t secs = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    lb_printf(&b, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
              tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(unix_ms % 1000));
    lb_puts(&b, " level=");
    lb_puts(&b, log_level_name(level));
    lb_puts(&b, " msg=");
    lb_put_value(&b, msg);

    for (const log_field *f = fields; f && f->type != LOG_FIELD_END; f++) {
        lb_putc(&b, ' ');
        lb_puts(&b, f->key ? f->key : "?");
        lb_putc(&b, '=');
        switch (f->type) {
            case LOG_FIELD_STR:
                lb_put_value(&b, f->s);
                break;
            case LOG_FIELD_INT:
                lb_printf(&b, "%" PRId64, f->i);
                break;
            case LOG_FIELD_UINT:
                lb_printf(&b, "%" PRIu64, f->u);
                break;
            case LOG_FIELD_F64:
                lb_printf(&b, "%.6g", f->f);
                break;
            case LOG_FIELD_END:
                break;
        }
    }

    /* Always end with a newline; mark a cut line with "...". */
    if (b.overflow || b.len + 2 > b.cap) {
        const char *tail = "...\n";
        size_t tail_len = strlen(tail);
        if (b.cap > tail_len) {
            if (b.len > b.cap - 1 - tail_len) b.len = b.cap - 1 - tail_len;
            memcpy(b.p + b.len, tail, tail_len);
            b.len += tail_len;
        } else {
            b.len = 0;
        }
    } else {
        b.p[b.len++] = '\n';
    }
    b.p[b.len] = '\0';
    return b.len;
}

void log_write(log_level level, const char *msg, ...) {
    if (!log_enabled(level)) return;

    log_field fields[LOG_FIELDS_MAX + 1];
    size_t n = 0;
    va_list ap;
    va_start(ap, msg);
    for (;;) {
        log_field f = va_arg(ap, log_field);
        if (f.type == LOG_FIELD_END) break;
        if (n < LOG_FIELDS_MAX) fields[n++] = f;
    }
    va_end(ap);
    fields[n] = LOG_END_;

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t unix_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;

    char line[LOG_LINE_MAX];
    size_t len = log_format(line, sizeof line, unix_ms, level, msg, fields);

    int fd = atomic_load(&log_fd);
    const char *p = line;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return; /* nowhere left to report a failing log write */
        }
        p += w;
        len -= (size_t)w;
    }
}

/* ---- limits ---------------------------------------------------------------------------------- */

int log_limit_allow_at(log_limit *l, int64_t now_ms, uint64_t *left_out) {
    while (atomic_flag_test_and_set_explicit(&l->busy, memory_order_acquire)) {
    }
    if (l->window_start_ms < 0 || now_ms - l->window_start_ms >= (int64_t)l->window_ms ||
        now_ms < l->window_start_ms) {
        l->window_start_ms = now_ms;
        l->in_window = 0;
    }
    const int allowed = l->in_window < l->burst;
    if (allowed) {
        l->in_window++;
        if (left_out) *left_out = l->left_out;
        l->left_out = 0;
    } else {
        l->left_out++;
    }
    atomic_flag_clear_explicit(&l->busy, memory_order_release);
    return allowed;
}

int log_limit_allow(log_limit *l, uint64_t *left_out) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return log_limit_allow_at(l, (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, left_out);
}
