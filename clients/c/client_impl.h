/*
 * client_impl.h — libcorral's private structures and the internals its files share: the client
 * (socket, ids, liveness clocks, the list of live generations), a generation (its queue of
 * chunks and its final result), and the one loop that reads the socket and sorts Responses by id.
 * Nothing here is part of the installed API.
 */
#ifndef CORRAL_CLIENT_IMPL_H
#define CORRAL_CLIENT_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "corral.h"
#include "corral.pb-c.h"
#include "corral/endpoint.h"

/* How long corral_client_destroy lets unsent messages (cancels) leave before closing. */
#define CLIENT_CLOSE_LINGER_MS 100

/* Bookkeeping a queued message is charged on top of its wire size. */
#define CLIENT_QUEUE_OVERHEAD 64

/* A Response waiting in a generation's queue (only Chunks are queued). */
typedef struct client__queued {
    Corral__V1__Response *resp;
    size_t cost; /* wire size + CLIENT_QUEUE_OVERHEAD */
    struct client__queued *next;
} client__queued;

struct corral_generation {
    corral_client *client; /* NULL once the client was destroyed */
    uint64_t id;
    corral_generation *prev, *next; /* the client's list of generations */

    client__queued *head, *tail; /* chunks received, not yet polled */
    size_t queued_bytes;
    Corral__V1__Response *current; /* the chunk the last poll handed out (borrowed by the caller) */

    uint32_t expected_index; /* Chunk.index the next arriving chunk must carry */
    uint32_t prefilled, prefill_total;
    corral_progress_info progress; /* the latest Progress */
    bool heard; /* something of it arrived (a Progress, a Chunk): the daemon took it up */
    bool cancel_sent;
    bool overflowed;

    /* The end: set when Done or Error arrived, or the generation failed on this side. Polls see
     * it only after the queue is empty. */
    bool finished;
    corral_status final_status; /* CORRAL_OK: `done` holds the Done */
    corral_done done;
    corral_error error;
};

struct corral_client {
    void *zctx;
    void *dealer;
    void *monitor; /* PAIR: the dealer's failed handshakes (corrald refused the connection) */
    bool curve;    /* the connection uses CURVE (a tcp endpoint with keys) */
    /* corrald refused the connection for good (libzmq does not retry a refused handshake):
     * every later call fails at once with this. CORRAL_OK while it was not. */
    corral_status refused;
    char refused_message[CORRAL_ERROR_MESSAGE_MAX];
    bool refused_final; /* the monitor's last failed handshake was final */
    char endpoint[ENDPOINT_MAX];
    char app[CORRAL_APP_NAME_MAX];
    uint64_t next_id;
    size_t queue_limit;

    /* Whether a daemon is there at all: the connection was made once (the monitor's
     * ZMQ_EVENT_CONNECTED; the kernel accepts it whatever the daemon's threads are doing). Until
     * then, once an attempt to connect has failed (ZMQ_EVENT_CONNECT_RETRIED: refused, or no
     * socket file), a call that waits fails with CORRAL_UNAVAILABLE when CORRAL_CONNECT_TIMEOUT_MS
     * have passed since the first call began (connect_since_ms), instead of waiting out its
     * timeout. Without such evidence (libzmq's I/O thread not yet scheduled on a busy machine, a
     * tcp connection still pending) the call waits as usual: a daemon that is there is never
     * reported missing because the machine is slow. */
    bool connected;
    bool connect_refused;
    int64_t connect_since_ms; /* 0 until a call first waits */
    int64_t last_send_ms;     /* when anything last went out (pings are due 5 s after) */
    int64_t silent_since_ms;  /* first ping sent after the last message received; 0: none */

    corral_generation *generations; /* live generations (finished ones too, until destroyed) */

    /* The plain request a call is waiting on (0: none) and its reply once it came; Progress
     * messages for it (a Load or Pin that asked) go to awaited_progress, if set. */
    uint64_t awaited_id;
    Corral__V1__Response *awaited_reply;
    corral_progress_cb awaited_progress;
    void *awaited_progress_user;
};

/* A Progress message as the API's struct. */
void client__progress_from(const Corral__V1__Progress *p, corral_progress_info *out);

/* Monotonic milliseconds. */
int64_t client__now_ms(void);

/* Fill in id (a fresh one), app and protocol version, and send. Returns CORRAL_OK or
 * CORRAL_UNAVAILABLE / CORRAL_OUT_OF_MEMORY. */
corral_status client__send(corral_client *c, Corral__V1__Request *req, corral_error *err);

/* Send Cancel for request `id` (its Ack is not waited for). */
corral_status client__send_cancel(corral_client *c, uint64_t id, corral_error *err);

/* Wait until one message arrived and was sorted to its owner, or until deadline_ms (monotonic;
 * -1: none). Sends pings while it waits. Returns CORRAL_OK after one message; on timeout
 * CORRAL_DEADLINE_EXCEEDED *without* touching err (callers word the message); CORRAL_UNAVAILABLE
 * when the daemon stayed silent too long; CORRAL_PROTOCOL for an undecodable message;
 * CORRAL_PERMISSION_DENIED when corrald refused the connection's handshake. */
corral_status client__pump(corral_client *c, int64_t deadline_ms, corral_error *err);

/* Send a plain request and wait for its one reply, which must have body `want` (an Error becomes
 * the returned status). `what` names the request in messages. Caller owns *out
 * (corral__v1__response__free_unpacked). */
corral_status client__call(corral_client *c, Corral__V1__Request *req,
                           Corral__V1__Response__BodyCase want, const char *what, int timeout_ms,
                           Corral__V1__Response **out, corral_error *err);

/* Turn an Error body into the matching corral_status and message. */
corral_status client__error_from(const Corral__V1__Error *e, corral_error *err);

/* Name of a Response body ("chunk", "pong", ...) for messages. */
const char *client__body_name(Corral__V1__Response__BodyCase body);

/* Sort a Response that belongs to generation g into it (takes ownership of resp). */
void generation__accept(corral_generation *g, Corral__V1__Response *resp, size_t wire_size);

/* End g on this side with an error (if it has not ended yet), cancelling it at the daemon. */
void generation__fail(corral_generation *g, corral_status status, const char *message);

/* The client is going away: mark g as detached. */
void generation__detach(corral_generation *g);

/* Deadline in monotonic ms for a timeout (-1 stays -1). */
static inline int64_t client__deadline(int timeout_ms) {
    return timeout_ms < 0 ? -1 : client__now_ms() + timeout_ms;
}

/* NULL → "" for protobuf-c string fields. */
static inline char *client__str(const char *s) {
    return (char *)(s ? s : "");
}

#endif /* CORRAL_CLIENT_IMPL_H */
