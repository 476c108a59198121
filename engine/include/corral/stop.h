/*
 * stop.h — stop strings over streamed output.
 *
 * Generated text arrives piece by piece (one detokenized token at a time), and a stop string can
 * straddle pieces. The matcher decides, after each piece, how much of the text so far can be
 * sent to the client: everything except a tail that might still grow into a stop string, which
 * is held back. When a stop string completes, the output ends right before it: neither the stop
 * string nor anything after it is ever emitted. At the end of generation stop_finish releases the
 * held tail.
 *
 * Matching is on bytes (a stop string is any non-empty byte sequence; pieces may split UTF-8
 * characters and matches are found across such splits). When several stop strings match, the one
 * that starts first wins, so the emitted text is the longest that contains no stop string.
 *
 * Memory: stop_matcher_new allocates one fixed-size object; stop_feed and stop_finish never
 * allocate. The held tail is shorter than the longest stop string, so it always fits. A matcher is
 * not thread-safe: one per generation.
 */
#ifndef CORRAL_STOP_H
#define CORRAL_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "corral/status.h"

#define STOP_MAX_STRINGS 16  /* stop strings per matcher */
#define STOP_MAX_LEN     256 /* bytes per stop string */

typedef struct stop_matcher stop_matcher;

/* What may be emitted after a feed: first `held_len` bytes at `held` (text held back by earlier
 * feeds; borrowed, valid until the next call on the matcher), then the first `piece_len` bytes of
 * the piece just fed. `stopped` is true when a stop string matched: the emitted text ends right
 * before it and the generation should end. */
typedef struct stop_result {
    const char *held;
    size_t held_len;
    size_t piece_len;
    bool stopped;
} stop_result;

/* Create a matcher for n stop strings (NUL-terminated, copied; n may be 0: then every feed emits
 * everything). Caller owns the result (stop_matcher_destroy). Returns NULL and fills err with
 * CORRAL_INVALID_ARGUMENT naming the offending string (by index) for: more than
 * STOP_MAX_STRINGS strings, an empty or NULL string, one longer than STOP_MAX_LEN bytes, or
 * `stops` NULL with n > 0; CORRAL_OUT_OF_MEMORY if allocation fails. */
stop_matcher *stop_matcher_new(const char *const *stops, size_t n, corral_error *err);

/* Free the matcher and set *m to NULL. NULL-safe (m or *m). */
void stop_matcher_destroy(stop_matcher **m);

/* Feed the next `len` bytes of generated text (`piece` is borrowed for the call; it may be NULL
 * when len is 0) and fill *out with what may be emitted now. Once a stop string has matched,
 * further feeds emit nothing and report stopped again. Returns CORRAL_OK, or
 * CORRAL_INVALID_ARGUMENT for NULL m/out or a NULL piece with len > 0 (then *out, if given, is
 * empty). Never allocates. */
corral_status stop_feed(stop_matcher *m, const char *piece, size_t len, stop_result *out);

/* End of generation: fill *out with the held-back text (piece_len is 0; stopped as it was) and
 * empty the hold. Returns CORRAL_OK, or CORRAL_INVALID_ARGUMENT for NULL arguments. */
corral_status stop_finish(stop_matcher *m, stop_result *out);

/* Forget the held text and the stopped state, keeping the stop strings, for a new generation. */
void stop_reset(stop_matcher *m);

#endif /* CORRAL_STOP_H */
