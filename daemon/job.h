/*
 * job.h — one request on its way through corrald: the object a front end and the core share.
 *
 * A front end makes a job for every request the core must answer (job_new), fills in the request
 * (core_request, request.h) and hands it over with core_submit (core.h). The core answers through
 * the job's events: text as it is generated, progress (a long prompt's prefill, the load its
 * model waits for), and exactly one final event — a
 * generation's Done, an Error, or the reply to another request. The front end that owns the job
 * learns of new events through its sink: a queue of jobs with something to take, and a notify
 * callback the core calls when a job joins the queue (e.g. a write to an eventfd the front end
 * polls). After the final event the core never touches the job again; the front end sends what
 * it took, and frees the job.
 *
 * No allocation per token. The core appends a token's text and id to the job's pending buffers;
 * the front end takes them by swapping in its own empty buffers (job_take), so each side reuses
 * two buffers that only grow, amortised, when a burst is bigger than any before. Tokens the front
 * end has not taken yet coalesce: a front end that falls behind sends them as one piece.
 *
 * Threads. The request and `front` are written by the front end before core_submit and read-only
 * afterwards. `cancel` and `paused` are atomics the front end sets at any time (then core_poke).
 * Events are exchanged under the sink's lock. Everything else in a job is the front end's.
 */
#ifndef CORRAL_DAEMON_JOB_H
#define CORRAL_DAEMON_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"
#include "request.h"

/* Why a job was cancelled, as the client is told. */
typedef enum job_cancel {
    JOB_CANCEL_NONE = 0,
    JOB_CANCEL_CLIENT = 1,  /* the client asked */
    JOB_CANCEL_GONE = 2,    /* the client disconnected: nothing more reaches it */
    JOB_CANCEL_STALLED = 3, /* the client stopped reading its stream */
    JOB_CANCEL_SHUTDOWN = 4,
    JOB_CANCEL_SILENT = 5, /* the client sent nothing for limits.peer_timeout_ms; its connection
                              is still there, so it is told (the final event is sent) */
    JOB_CANCEL_COUNT
} job_cancel;

/* The reason's name for logs ("client", "gone", "stalled", "shutdown", "silent"). */
const char *job_cancel_name(job_cancel why);

/* A token's log-probability and its text (Generate with logprobs). */
typedef struct job_logprob {
    int32_t id;
    float logprob;
    uint32_t text_off, text_len; /* its bytes in job_text.lp_text */
} job_logprob;

/* Generated text and the ids it came from, not yet sent. */
typedef struct job_text {
    char *text; /* NUL-terminated */
    size_t len, cap;
    int32_t *ids;
    size_t n_ids, cap_ids;
    /* With logprobs: 1 + top_logprobs entries per id (the sampled token, then its alternatives,
     * best first), and their texts; grown only for jobs that ask. */
    job_logprob *lps;
    size_t n_lps, cap_lps;
    char *lp_text;
    size_t lp_text_len, lp_text_cap;
} job_text;

/* What a job waits on while it reports progress (proto ProgressPhase). */
typedef enum job_phase {
    JOB_PHASE_PREFILL = 1,    /* its prompt runs through the model: done/total are tokens */
    JOB_PHASE_LOADING = 2,    /* its model's file is opened, or its weights mapped again */
    JOB_PHASE_MERGING = 3,    /* a variant's adapters are merged: done/total are tensors */
    JOB_PHASE_REPACKING = 4,  /* the weights are rearranged and written to cache.dir: tensors */
    JOB_PHASE_QUANTIZING = 5, /* a quantized variant is made (merged in f32, quantized): tensors */
} job_phase;

/* One progress report: total 0 when the phase has no fraction. */
typedef struct job_progress {
    job_phase phase;
    uint64_t done, total;
} job_progress;

/* Reports a job holds until its front end takes them: a later report of the same phase replaces
 * the one before it, a new phase is kept beside them, so that a client that reads slowly still
 * sees every phase its request went through (loading, merging or quantizing, repacking, prefill),
 * in order. */
#define JOB_PROGRESS_MAX 4

/* The kind of a job's final event. */
typedef enum job_final {
    JOB_FINAL_NONE = 0,  /* not yet */
    JOB_FINAL_DONE = 1,  /* a generation ended: job->done */
    JOB_FINAL_ERROR = 2, /* job->error_code, job->error_message */
    JOB_FINAL_REPLY = 3, /* job->reply */
} job_final;

/* job.error_rule for corral's own checks. */
/* With CORRAL_RESOURCE_EXHAUSTED, for good (asking again gets the same answer, unlike a full
 * queue or memory in use, which have no rule): the request's regex or JSON schema is over the
 * compile limits (policies/src/regex.h); the model, or the KV cache the request needs, can never
 * fit in memory.limit. */
#define JOB_RULE_OUTPUT_CONSTRAINT "output_constraint"
#define JOB_RULE_MEMORY_LIMIT      "memory.limit"
/* With CORRAL_NOT_FOUND: what is missing is the sanitizer profile the request names, not a
 * model. */
#define JOB_RULE_SANITIZER_PROFILE "sanitizer"

typedef struct core_sink core_sink;
typedef struct job job;

struct job {
    /* Set by the front end before core_submit. */
    core_request req;
    /* The app the request runs as: established by the front end from who the client is
     * (auth.h), never from its word alone; the core applies that app's rules. "" is the default
     * app (a front end's unauthenticated clients, if it has any): every model up to interactive,
     * no admin operation. `owner` is set by a front end only for corrald's owner (auth.h): with
     * app AUTH_OWNER_APP, every model and admin operation and no per-app limits. */
    char app[64];
    bool owner;
    uint64_t id;                     /* the front end's id of the request, for logs */
    int64_t received_us;             /* monotonic */
    int64_t deadline_us;             /* monotonic; 0 = none */
    void *front;                     /* the front end's own data (owns the request's strings) */
    void (*front_free)(void *front); /* frees `front` with the job; may be NULL */

    /* Set by the front end at any time. */
    atomic_int cancel; /* job_cancel */
    atomic_int paused; /* 1 while the client cannot take more output */

    /* Events: written by the core under the sink's lock (job_emit_*), taken by the front end
     * (job_take). The final event's data below is the front end's to read once job_take has
     * reported it. */
    core_sink *sink;
    job_text pending;    /* text not yet taken */
    uint32_t n_progress; /* reports not yet taken, oldest first */
    job_progress progress[JOB_PROGRESS_MAX];
    job_final final;
    bool queued;                                  /* in the sink's ready queue */
    job *ready_next;                              /* the sink's ready queue */
    job *inbox_next;                              /* the core's inbox, before admission */
    core_done done;                               /* JOB_FINAL_DONE */
    corral_status error_code;                     /* JOB_FINAL_ERROR */
    char error_message[CORRAL_ERROR_MESSAGE_MAX]; /* JOB_FINAL_ERROR */
    core_reply *reply;                            /* JOB_FINAL_REPLY */
    /* JOB_FINAL_ERROR: the rule that refused the job (a string literal), else NULL: an app
     * rule's name (apps[].max_priority, ...) or one of the JOB_RULE_ values above. The status says
     * what happened; the rule tells a front end that maps statuses (HTTP) whether asking again
     * can help. */
    const char *error_rule;

    /* The core's own state for the job; the front end never looks at it. */
    void *core;
};

/* ---- sinks (front end side) ---------------------------------------------------------------- */

/* A front end's queue of jobs with events to take. `notify(ctx)` is called, from the core's
 * thread, whenever a job joins the queue; it must be cheap and must not call back into the core.
 * Caller owns the result. NULL with err when out of memory. */
core_sink *core_sink_new(void (*notify)(void *ctx), void *ctx, corral_error *err);

/* NULL-safe; sets *s to NULL. Every job of the sink must be freed first. */
void core_sink_destroy(core_sink **s);

/* Take up to max of the jobs queued since the last call, oldest first, into out[]; returns how
 * many. Each leaves the queue (the next event queues it again). Call again while it returns max.
 * Thread-safe. */
size_t core_sink_take_ready(core_sink *s, job **out, size_t max);

/* ---- jobs (front end side) ----------------------------------------------------------------- */

/* A new job whose events go to `sink`, with its output buffers allocated. Caller owns the result
 * (job_free). NULL with err when out of memory. */
job *job_new(core_sink *sink, corral_error *err);

/* Free a job: its buffers, its final event's data, and `front` through front_free. Only after its
 * final event (or if it was never submitted). NULL-safe; sets *j to NULL. */
void job_free(job **j);

/* What job_take found. */
typedef struct job_taken {
    uint32_t n_progress; /* progress reports since the last take, oldest first */
    job_progress progress[JOB_PROGRESS_MAX];
    job_final final; /* JOB_FINAL_NONE while the job goes on */
} job_taken;

/* Take a job's events: when `with_text`, the pending text and ids are swapped with *spare, which
 * must be empty (its len and n_ids 0) and comes back holding them; the progress reports since
 * the last take are handed over, each once; `final` tells whether the final event has come (its
 * data is then in the job). A non-streamed generation is taken without text until its final event.
 * Thread-safe. */
void job_take(job *j, bool with_text, job_text *spare, job_taken *out);

/* Buffers for job_take's `spare`, and their release. */
corral_status job_text_init(job_text *t, corral_error *err);
void job_text_free(job_text *t);
static inline void job_text_clear(job_text *t) {
    t->len = 0;
    t->n_ids = 0;
    t->n_lps = 0;
    t->lp_text_len = 0;
    if (t->text) t->text[0] = '\0';
}

/* ---- events (core side) -------------------------------------------------------------------- */

/* Append a token's text (len bytes, may be 0) and, when id >= 0, its id. Never allocates unless
 * the pending text outgrows every earlier burst; when memory runs out the text is dropped (the
 * generation still ends with its final event). */
void job_emit_text(job *j, const char *text, size_t len, int32_t id);

/* job_emit_text with the token's log-probability entries (n: the sampled token, then its
 * alternatives) and their texts (texts[i], lps[i].text_len bytes; text_off is set here),
 * appended in the same exchange so that they stay aligned with the ids. Allocates only as
 * job_emit_text does (buffers that grow past every earlier burst). */
void job_emit_token(job *j, const char *text, size_t len, int32_t id, const job_logprob *lps,
                    const char *const *texts, size_t n);

/* Report progress: a prompt's prefill, or the load its model waits for (it replaces a report of
 * the same phase not yet taken; see JOB_PROGRESS_MAX). */
void job_emit_progress(job *j, job_phase phase, uint64_t done, uint64_t total);

/* Final events: after any of them the core must not touch j again. job_emit_done takes ownership
 * of done->sanitizer_report; job_emit_reply of reply. An error's message is always valid UTF-8:
 * ill-formed bytes (a client's name echoed in it) are written as \xhh. */
void job_emit_done(job *j, const core_done *done);
void job_emit_error(job *j, corral_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void job_emit_reply(job *j, core_reply *reply);

#endif /* CORRAL_DAEMON_JOB_H */
