/*
 * request.h — what a front end asks of corrald's core, and what the core answers, in corral's own
 * types. No wire format appears here: each front end (front_zmq.c for ZeroMQ + protobuf, and any
 * other) translates its messages into a core_request at the edge, and the core's answers (the
 * events of job.h and the replies below) back into its own messages.
 *
 * Strings in a request are borrowed from the front end's storage for the request (job.h: the
 * job's `front` data), which lives as long as the job. User text (a prompt, a message's content,
 * text to tokenize, a constraint) carries its length, so that a front end that knows it can pass
 * text with embedded NUL bytes and the core refuses them by name instead of cutting the text.
 */
#ifndef CORRAL_DAEMON_REQUEST_H
#define CORRAL_DAEMON_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* What a request asks for. */
typedef enum core_kind {
    CORE_GENERATE = 1,    /* a completion or a chat turn, streamed or whole */
    CORE_TOKENIZE = 2,    /* token ids and pieces of text, as a model sees it */
    CORE_LIST_MODELS = 3, /* the configured models */
    CORE_STATUS = 4,      /* the daemon's and its models' state */
    CORE_LOAD = 5,        /* residency control: load now, */
    CORE_UNLOAD = 6,      /* unload now, */
    CORE_PIN = 7,         /* load now and never evict, */
    CORE_UNPIN = 8,       /* evictable again */
} core_kind;

/* One message of a chat. */
typedef struct core_message {
    const char *role; /* "system", "user" or "assistant" (checked by the core) */
    const char *content;
    size_t content_len;
} core_message;

/* Sampling and length options of a Generate; each has_ flag says whether the client set the
 * value (otherwise the model's configured default applies, else the engine's). */
typedef struct core_sampling {
    bool has_max_tokens, has_temperature, has_top_k, has_top_p, has_min_p, has_repeat_penalty;
    bool has_presence_penalty, has_frequency_penalty, has_penalty_last_n, has_seed;
    uint32_t max_tokens;
    float temperature;
    int32_t top_k;
    float top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int32_t penalty_last_n;
    uint64_t seed;
} core_sampling;

typedef struct core_generate {
    const char *model;
    const char *prompt; /* a raw completion prompt, or NULL for a chat */
    size_t prompt_len;
    const core_message *messages; /* a chat (n_messages > 0), or none */
    size_t n_messages;
    core_sampling sampling;
    const char *const *stop; /* stop strings */
    size_t n_stop;
    bool stream;            /* output as it is generated, or all of it with the final event */
    int priority;           /* 0: the model's class; else a cfg_priority */
    const char *session;    /* "" for none */
    uint32_t deadline_ms;   /* 0 for none */
    const char *constraint; /* a regular expression the whole output must match; "" for none */
    size_t constraint_len;
    const char *json_schema; /* structured output: a JSON Schema's text the output must be a
                                document of, or {"type":"json_object"} for any object ("" or NULL
                                for none; policies' json_schema.h); not together with constraint */
    size_t json_schema_len;
    const char *sanitizer;     /* a profile name; "" for the app's or model's */
    const char *template_name; /* a chat template name; "" for the model's */
    /* Each generated token's log-probability, and those of its top_logprobs most likely
     * alternatives (at most 20), with the job's text (job.h: job_text.lps). */
    bool logprobs;
    uint32_t top_logprobs;
} core_generate;

typedef struct core_request {
    core_kind kind;
    union {
        core_generate generate; /* CORE_GENERATE */
        struct {
            const char *model;
            const char *text;
            size_t text_len;
            bool add_special;
        } tokenize; /* CORE_TOKENIZE */
        struct {
            const char *model; /* CORE_STATUS: "" for every model */
            bool progress;     /* CORE_LOAD, CORE_PIN: report the load's progress (job.h) */
            bool force;        /* CORE_UNLOAD: unpin a pinned model first */
        } target;              /* CORE_STATUS, CORE_LOAD, CORE_UNLOAD, CORE_PIN, CORE_UNPIN */
    };
} core_request;

/* ---- answers ------------------------------------------------------------------------------- */

/* Why a generation ended; 1-5 are the engine's gen_stop values. */
typedef enum core_stop {
    CORE_STOP_EOG = 1,
    CORE_STOP_MAX_TOKENS = 2,
    CORE_STOP_STRING = 3,
    CORE_STOP_CONTEXT = 4,
    CORE_STOP_CONSTRAINT = 5,
    CORE_STOP_CANCELLED = 6,
} core_stop;

/* A model's residency. */
typedef enum core_model_state {
    CORE_MODEL_UNLOADED = 1, /* configured, not in memory */
    CORE_MODEL_LOADING = 2,  /* being loaded, merged or mapped again (the loader works on it) */
    CORE_MODEL_RESIDENT = 3, /* in memory, ready */
    CORE_MODEL_SWAPPED = 4,  /* weights unmapped to make room; they come back by mmap */
    CORE_MODEL_BROKEN = 5,   /* its file failed under it: its requests in flight failed; the next
                                request loads it afresh (core_model_info.error says why) */
} core_model_state;

/* How a generation went (its final event). */
typedef struct core_done {
    core_stop stop;
    uint32_t prompt_tokens;    /* tokens of the whole prompt as the model sees it */
    uint32_t prefilled_tokens; /* of those, the ones run for this request (the rest came from its
                                  session's cache) */
    uint32_t generated_tokens;
    int64_t queue_us, load_us, prefill_us, decode_us, total_us;
    uint32_t queue_steps;      /* other requests' steps begun between receipt and its first step */
    uint32_t dropped_messages; /* chat messages left out because the chat outgrew the context */
    char model[128];
    char *sanitizer_report; /* what the sanitizers did, or NULL; owned by the job */
} core_done;

/* One adapter of a variant. */
typedef struct core_adapter {
    char *path;
    float scale;
} core_adapter;

/* One model in a ListModels or Status answer. Strings are the answer's own copies. */
typedef struct core_model_info {
    char *name;
    char *path; /* the configured file (a variant's base) */
    char *arch; /* "" until loaded once */
    uint32_t context;
    char *chat_template;          /* "" when unknown */
    const char *context_overflow; /* "truncate_oldest" or "error" (static) */
    core_model_state state;
    bool pinned, preload;
    core_adapter *adapters;
    size_t n_adapters;
    /* Status only. */
    uint64_t bytes, last_used_ms, requests_served, swap_ins, swap_outs, ttl_ms, merges;
    uint64_t last_load_ms, loads;
    uint64_t steps, step_sequences; /* batch steps run, and the sequences in them */
    uint32_t queue_depth, active, sessions;
    char *error; /* BROKEN: why; "" otherwise */
} core_model_info;

/* The daemon's totals in a Status answer. */
typedef struct core_daemon_info {
    uint64_t uptime_ms, total_bytes, limit_bytes, requests_served;
    uint64_t allocated_bytes;       /* by the core's threads so far (mem_allocated_bytes) */
    uint64_t front_allocated_bytes; /* by the front ends' threads so far */
    uint64_t heap_bytes;            /* held on the heap now (mem_heap_live_bytes) */
    uint32_t active, queued, sessions, threads;
} core_daemon_info;

/* The answer to a request other than Generate: made by the core, owned by the job from the
 * final event on (freed with it). */
typedef struct core_reply {
    core_kind kind;
    char message[256]; /* Load/Unload/Pin/Unpin: what was done */
    /* Tokenize. */
    int32_t *ids;
    char **pieces;
    size_t n_ids;
    /* ListModels, Status. */
    core_model_info *models;
    size_t n_models;
    core_daemon_info daemon; /* Status */
} core_reply;

/* A reply of `kind` with nothing in it. NULL when memory runs out. */
core_reply *core_reply_new(core_kind kind);

/* Free a reply and everything in it. NULL-safe; sets *r to NULL. */
void core_reply_destroy(core_reply **r);

#endif /* CORRAL_DAEMON_REQUEST_H */
