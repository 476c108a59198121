/*
 * job.h — one client request on its way through corrald, shared by the server (I/O thread) and
 * the scheduler (compute thread).
 *
 * Ownership: the server creates a job for every request that needs the scheduler, registers it in
 * its table of requests in flight, and hands it over with sched_submit(). From then on the
 * scheduler alone touches the job's scheduler fields; it answers through sched outbox messages
 * (outmsg), the last of which is marked final. The server sends that final message, removes the
 * job from its table and frees it — so the job outlives everything that may point at it. The only
 * fields the server writes after the hand-over are the atomics: `cancel` (Cancel request, client
 * gone, stream stalled) and `paused` (the client is not reading).
 */
#ifndef CORRAL_DAEMON_JOB_H
#define CORRAL_DAEMON_JOB_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "corral.pb-c.h"
#include "corral/generate.h"

/* What the client was told when a job was cancelled. */
typedef enum job_cancel {
    JOB_CANCEL_NONE = 0,
    JOB_CANCEL_CLIENT = 1,  /* Cancel request */
    JOB_CANCEL_GONE = 2,    /* the client disconnected or went silent */
    JOB_CANCEL_STALLED = 3, /* the client stopped reading its stream */
    JOB_CANCEL_SHUTDOWN = 4,
} job_cancel;

struct sched_model;
struct sched_session;

typedef struct job {
    /* Set by the server before sched_submit; read-only afterwards. */
    uint64_t id;       /* the client's request id */
    uint8_t peer[256]; /* ZeroMQ routing identity of the client */
    size_t peer_len;
    char app[64];
    Corral__V1__Request *req; /* decoded request; owned (freed with the job) */
    int64_t received_us;      /* monotonic */
    int64_t deadline_us;      /* monotonic; 0 = none */

    /* Written by the server at any time, read by the scheduler. */
    atomic_int cancel; /* job_cancel */
    atomic_int paused; /* 1 while the client's pipe is full */

    /* Scheduler state. */
    struct sched_model *model;
    struct sched_session *session;
    cfg_priority priority;
    bool started;    /* prompt tokenized, generator made */
    bool counted;    /* counted in the model's and app's queue totals */
    bool active;     /* holds an active slot of its model */
    int32_t *prompt; /* prompt ids (whole prompt, session prefix included) */
    uint32_t n_prompt;
    uint32_t n_prefilled; /* prompt ids run so far (counting the reused prefix) */
    uint32_t n_cached;    /* ids taken from the session's KV cache */
    int32_t *generated;   /* generated ids, for sessions */
    uint32_t n_generated, cap_generated;
    struct kv_cache *kv; /* the job's own cache, or the session's */
    generator *gen;
    struct policy_gen *pg;  /* its output constraint (regex), or NULL */
    char *sanitizer_report; /* what the sanitizers changed, for Done; NULL when nothing */
    uint32_t chunk_index;
    char *text; /* non-streaming: the whole output */
    size_t text_len, text_cap;
    int64_t started_us, load_us, prefill_us, decode_us;
    int64_t retry_at_us;          /* waiting for memory: do not try to start before this */
    int64_t memory_wait_until_us; /* waiting for memory: give up at this time */
    char wait_reason[384];        /* waiting for memory: what holds it (the eventual error) */
    struct job *next;             /* scheduler queue link */
} job;

/* A message for the server to send: `data` is a packed Response to job's peer. When `final`, the
 * server frees the job after sending (or failing to send) it. */
typedef struct outmsg {
    job *job;
    uint8_t *data;
    size_t len;
    bool final;
    struct outmsg *next;
} outmsg;

/* Free a job and everything it owns (the request, buffers). Not its kv cache if it belongs to a
 * session, nor the generator: the scheduler releases those when it finishes the job. */
void job_free(job *j);

#endif /* CORRAL_DAEMON_JOB_H */
