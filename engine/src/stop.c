/*
 * stop.c — the streaming stop-string matcher of stop.h.
 *
 * The text seen so far but not yet emitted is S = hold + piece. After each feed:
 *   1. find the earliest position where a complete stop string starts in S. Only matches that
 *      end inside the new piece are possible: one lying wholly in the hold would have been found
 *      by an earlier feed. If there is one, emit S up to it and stop.
 *   2. otherwise find the longest suffix of S that is a proper prefix of some stop string; it
 *      could still become a match, so it is held. Everything before it is emitted.
 * The hold is always shorter than the longest stop string. It lives in one of two fixed buffers:
 * the new hold is written into the other one, so the old hold — whose front is what this call
 * emits — stays intact until the next call, as stop_result promises.
 */
#include "corral/stop.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct stop_matcher {
    size_t n;
    size_t len[STOP_MAX_STRINGS];
    char str[STOP_MAX_STRINGS][STOP_MAX_LEN];
    size_t max_len;
    char hold[2][STOP_MAX_LEN]; /* hold[cur] is current; the other is scratch */
    int cur;
    size_t hold_len;
    bool stopped;
};

stop_matcher *stop_matcher_new(const char *const *stops, size_t n, corral_error *err) {
    if (n > STOP_MAX_STRINGS) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "too many stop strings: %zu (at most %d)", n,
                         STOP_MAX_STRINGS);
        return NULL;
    }
    if (n > 0 && !stops) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "stop strings missing (count %zu)", n);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!stops[i] || stops[i][0] == '\0') {
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "stop string %zu is empty", i);
            return NULL;
        }
        size_t len = strnlen(stops[i], STOP_MAX_LEN + 1);
        if (len > STOP_MAX_LEN) {
            corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                             "stop string %zu is longer than %d bytes", i, STOP_MAX_LEN);
            return NULL;
        }
    }
    stop_matcher *m = calloc(1, sizeof *m);
    if (!m) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "stop matcher: out of memory");
        return NULL;
    }
    m->n = n;
    for (size_t i = 0; i < n; i++) {
        m->len[i] = strlen(stops[i]);
        memcpy(m->str[i], stops[i], m->len[i]);
        if (m->len[i] > m->max_len) m->max_len = m->len[i];
    }
    return m;
}

void stop_matcher_destroy(stop_matcher **m) {
    if (!m || !*m) return;
    free(*m);
    *m = NULL;
}

void stop_reset(stop_matcher *m) {
    if (!m) return;
    m->hold_len = 0;
    m->stopped = false;
}

/* Does s[pos .. pos+len) of the stream S = hold + piece equal str? The caller guarantees the
 * range lies inside S. */
static bool stream_equals(const char *hold, size_t hold_len, const char *piece, size_t pos,
                          const char *str, size_t len) {
    for (size_t i = 0; i < len; i++) {
        size_t at = pos + i;
        char c = at < hold_len ? hold[at] : piece[at - hold_len];
        if (c != str[i]) return false;
    }
    return true;
}

/* Step 1: the earliest start of a complete stop string ending inside the piece, or SIZE_MAX. */
static size_t find_match(const stop_matcher *m, const char *hold, size_t hold_len,
                         const char *piece, size_t piece_len) {
    size_t total = hold_len + piece_len;
    for (size_t pos = 0; pos < total; pos++) {
        for (size_t j = 0; j < m->n; j++) {
            size_t end = pos + m->len[j];
            if (end > total || end <= hold_len) continue;
            if (stream_equals(hold, hold_len, piece, pos, m->str[j], m->len[j])) return pos;
        }
    }
    return SIZE_MAX;
}

/* Step 2: the length of the longest suffix of S that is a proper prefix of a stop string. */
static size_t find_hold(const stop_matcher *m, const char *hold, size_t hold_len, const char *piece,
                        size_t piece_len) {
    size_t total = hold_len + piece_len;
    size_t k = m->max_len > 0 ? m->max_len - 1 : 0;
    if (k > total) k = total;
    for (; k > 0; k--) {
        for (size_t j = 0; j < m->n; j++) {
            if (m->len[j] <= k) continue;
            if (stream_equals(hold, hold_len, piece, total - k, m->str[j], k)) return k;
        }
    }
    return 0;
}

corral_status stop_feed(stop_matcher *m, const char *piece, size_t len, stop_result *out) {
    if (out) *out = (stop_result){.held = "", .held_len = 0, .piece_len = 0, .stopped = false};
    if (!m || !out || (!piece && len > 0)) return CORRAL_INVALID_ARGUMENT;
    if (m->stopped) {
        out->stopped = true;
        return CORRAL_OK;
    }
    const char *hold = m->hold[m->cur];
    size_t hold_len = m->hold_len;
    out->held = hold;

    size_t match = find_match(m, hold, hold_len, piece, len);
    size_t emit;
    if (match != SIZE_MAX) {
        emit = match;
        m->stopped = true;
        m->hold_len = 0;
        out->stopped = true;
    } else {
        size_t keep = find_hold(m, hold, hold_len, piece, len);
        emit = hold_len + len - keep;
        char *next = m->hold[1 - m->cur];
        for (size_t i = 0; i < keep; i++) {
            size_t at = emit + i;
            next[i] = at < hold_len ? hold[at] : piece[at - hold_len];
        }
        m->cur = 1 - m->cur;
        m->hold_len = keep;
    }
    out->held_len = emit < hold_len ? emit : hold_len;
    out->piece_len = emit > hold_len ? emit - hold_len : 0;
    return CORRAL_OK;
}

corral_status stop_finish(stop_matcher *m, stop_result *out) {
    if (out) *out = (stop_result){.held = "", .held_len = 0, .piece_len = 0, .stopped = false};
    if (!m || !out) return CORRAL_INVALID_ARGUMENT;
    out->held = m->hold[m->cur];
    out->held_len = m->hold_len;
    out->stopped = m->stopped;
    m->hold_len = 0;
    return CORRAL_OK;
}
