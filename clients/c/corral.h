/*
 * corral.h — libcorral, the C client library of corral.
 *
 * A corral_client is one connection (a ZeroMQ DEALER socket) to corrald; proto/corral.proto is
 * the protocol it speaks. Every call that talks to the daemon takes a timeout in milliseconds
 * (-1: wait forever) and fills a corral_error on failure; the status codes are corral's
 * project-wide ones (corral/status.h): an Error from the daemon keeps its code and message, a
 * timeout is CORRAL_DEADLINE_EXCEEDED (the message names the endpoint), a reply that does not
 * follow the protocol is CORRAL_PROTOCOL.
 *
 * Threads: a client, and every generation started on it, is used by one thread at a time. The
 * library starts no threads and never reads the socket behind the caller's back: it reads only
 * inside a call that waits, and only until what that call waits for has arrived. Different
 * clients are independent and may be used from different threads at once.
 *
 * Liveness: a client whose endpoint refuses the connection (no daemon running: no socket file,
 * or nothing listening) fails its calls with CORRAL_UNAVAILABLE after CORRAL_CONNECT_TIMEOUT_MS.
 * While a call waits, the library sends a Ping every CORRAL_PING_INTERVAL_MS (the daemon cancels
 * the requests of a client that stays silent), and gives up with CORRAL_UNAVAILABLE when the daemon
 * has answered nothing at all, pings included, for CORRAL_SILENCE_LIMIT_MS.
 *
 * Memory and flow control: several generations may be in flight on one client. The daemon stops
 * computing a stream whose client does not read, so a caller controls the pace by how often it
 * polls. While the caller waits on one request, messages for other generations that arrive
 * first are kept in per-generation queues; a queue may hold at most the client's queue limit
 * (corral_client_set_queue_limit). A generation whose queue would grow past it is cancelled: the
 * chunks already queued can still be polled, and it then ends with CORRAL_RESOURCE_EXHAUSTED.
 *
 * Results: every function that returns a struct with pointers inside allocates it as one block
 * and names the one call that frees it.
 *
 * Who the client is (SECURITY.md): corrald establishes the app of every request itself. Over ipc
 * it knows the client by its user (uid and gid); over tcp only by a CURVE key, which the client
 * takes from corral_connect_options or the environment (CORRAL_SERVER_KEY or
 * CORRAL_SERVER_KEY_FILE: corrald's public key; CORRAL_CLIENT_KEY_FILE: this client's secret key,
 * as `corral keygen` writes them). When corrald refuses the connection (a user no app lists, a tcp
 * client without CURVE, a key no app lists), the call waiting fails at once with
 * CORRAL_PERMISSION_DENIED saying so, not after a timeout.
 */
#ifndef CORRAL_CLIENT_H
#define CORRAL_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Symbols of the client API are exported from libcorral.so; everything else stays inside. */
#define CORRAL_API __attribute__((visibility("default")))

/* A call that waits fails with CORRAL_UNAVAILABLE ("no answer from corrald at ... (is it
 * running? ...)") when no connection to the endpoint could be made this long after the client's
 * first call began: a daemon that is not running is reported within about a second, not after
 * the call's timeout. (A call with a shorter timeout ends with CORRAL_DEADLINE_EXCEEDED first.) */
#define CORRAL_CONNECT_TIMEOUT_MS  1000
/* While a call waits, a Ping goes out when nothing was sent for this long. */
#define CORRAL_PING_INTERVAL_MS    5000
/* A waiting call fails with CORRAL_UNAVAILABLE after this long without any message from the
 * daemon although pings went out (the daemon is gone or hung). */
#define CORRAL_SILENCE_LIMIT_MS    30000
/* Default per-generation queue limit in bytes (see corral_client_set_queue_limit). */
#define CORRAL_QUEUE_LIMIT_DEFAULT (8u << 20)
/* Longest app name, including the NUL. */
#define CORRAL_APP_NAME_MAX        128

typedef struct corral_client corral_client;
typedef struct corral_generation corral_generation;

/* ---- connection --------------------------------------------------------------------------- */

/* Connect to corrald at `endpoint` (NULL: $CORRAL_ENDPOINT, else the default endpoint), with the
 * CURVE keys of the environment for a tcp endpoint (corral_client_new_with). Connecting does not
 * wait for the daemon; the first request does. Caller owns the result (corral_client_destroy).
 * Returns NULL with err set for an invalid endpoint or key. Thread-safe. */
CORRAL_API corral_client *corral_client_new(const char *endpoint, corral_error *err);

/* How corral_client_new_with connects. Zero-initialise it; NULL fields take their defaults. */
typedef struct corral_connect_options {
    const char *endpoint; /* NULL: $CORRAL_ENDPOINT, else the default endpoint */
    /* CURVE keys, used on tcp:// endpoints only (corrald serves tcp only with CURVE). Keys are z85
     * text, 40 characters; key files hold one on a line (`corral keygen DIR` writes a pair). */
    const char *server_key;      /* corrald's public key; NULL: server_key_file */
    const char *server_key_file; /* NULL: $CORRAL_SERVER_KEY, else $CORRAL_SERVER_KEY_FILE */
    const char *client_key_file; /* this client's secret key file, not readable by other users;
                                    NULL: $CORRAL_CLIENT_KEY_FILE */
} corral_connect_options;

/* Connect as corral_client_new does, with the options given. A tcp endpoint with neither key
 * connects without CURVE (corrald then refuses it: the first call says how to fix it); with only
 * one of the two, or with a key that does not read, this fails with CORRAL_INVALID_ARGUMENT or the
 * key file's error (a secret key file others may read is CORRAL_PERMISSION_DENIED). Caller owns the
 * result (corral_client_destroy). Thread-safe. */
CORRAL_API corral_client *corral_client_new_with(const corral_connect_options *options,
                                                 corral_error *err);

/* Close the connection. NULL-safe; sets *client to NULL. Messages not yet sent (such as the
 * Cancel of a generation destroyed just before) get up to 100 ms to leave. Generations still
 * alive on it become detached: their queued chunks stay readable, then they fail with
 * CORRAL_UNAVAILABLE; they must still be destroyed. Thread: the client's (see the top of this
 * file). */
CORRAL_API void corral_client_destroy(corral_client **client);

/* The endpoint this client connects to. Borrowed: valid until the client is destroyed. Thread-safe.
 */
CORRAL_API const char *corral_client_endpoint(const corral_client *client);

/* Name the calling app (an entry of the daemon config's `apps` section) for every later request
 * of this client; NULL or "" is the default app. The text is copied. Returns CORRAL_OK, or
 * CORRAL_INVALID_ARGUMENT when the name is CORRAL_APP_NAME_MAX bytes or longer. Thread: the
 * client's. */
CORRAL_API corral_status corral_client_set_app(corral_client *client, const char *app);

/* Set the most bytes one generation's queue may hold while the caller waits on something else
 * (0: CORRAL_QUEUE_LIMIT_DEFAULT). A queued chunk counts its wire size plus 64 bytes. Thread: the
 * client's. */
CORRAL_API void corral_client_set_queue_limit(corral_client *client, size_t bytes);

/* What the daemon answered to a ping. */
typedef struct corral_pong {
    char version[32];          /* corral version of the daemon, e.g. "0.1.0" */
    uint32_t protocol_version; /* the daemon's protocol revision */
    uint64_t uptime_ms;        /* milliseconds since the daemon started */
    uint32_t pid;              /* the daemon's process id (0 from older daemons) */
    char config_path[1024];    /* the configuration file it reads, absolute ("" on defaults) */
} corral_pong;

/* Ask the daemon whether it is alive. Returns CORRAL_OK and fills *pong (may be NULL), or
 * CORRAL_DEADLINE_EXCEEDED when no answer came within timeout_ms, or the daemon's error. Thread:
 * the client's. */
CORRAL_API corral_status corral_client_ping(corral_client *client, int timeout_ms,
                                            corral_pong *pong, corral_error *err);

/* ---- generation --------------------------------------------------------------------------- */

/* Scheduling class (proto Priority). */
typedef enum corral_priority {
    CORRAL_PRIORITY_DEFAULT = 0, /* the model's configured default */
    CORRAL_PRIORITY_BACKGROUND = 1,
    CORRAL_PRIORITY_INTERACTIVE = 2,
    CORRAL_PRIORITY_REALTIME = 3,
} corral_priority;

/* Why a generation ended (proto StopReason). */
typedef enum corral_stop_reason {
    CORRAL_STOP_UNSPECIFIED = 0,
    CORRAL_STOP_EOG = 1,          /* the model produced an end-of-generation token */
    CORRAL_STOP_MAX_TOKENS = 2,   /* max_tokens were generated */
    CORRAL_STOP_STOP_STRING = 3,  /* a stop string appeared (it is not part of the text) */
    CORRAL_STOP_CONTEXT_FULL = 4, /* the context (or the session's) is full */
    CORRAL_STOP_CONSTRAINT = 5,   /* the output constraint accepts nothing more */
    CORRAL_STOP_CANCELLED = 6,    /* cancelled by the client */
} corral_stop_reason;

/* Whether the daemon sends a chunk per token. */
typedef enum corral_stream_mode {
    CORRAL_STREAM_AUTO = 0, /* corral_generate: stream when on_chunk is given; _start: stream */
    CORRAL_STREAM_ON = 1,   /* a chunk per token as it is generated */
    CORRAL_STREAM_OFF = 2,  /* one chunk with the whole text, then Done */
} corral_stream_mode;

/* One message of a chat; role is "system", "user" or "assistant". */
typedef struct corral_message {
    const char *role;
    const char *content;
} corral_message;

/* What to generate, and how. A zero-initialised struct means "every default"; set model and
 * either prompt or messages. Optional numbers count only when their has_ flag is set (absent
 * means the model's configured default, else the engine's). Strings may be NULL (= unset).
 * Everything is borrowed for the duration of the call that takes the struct. */
typedef struct corral_generate_params {
    const char *model;              /* configured model (or variant) name */
    const char *prompt;             /* raw completion prompt, or NULL */
    const corral_message *messages; /* a chat instead of a prompt */
    size_t n_messages;              /* entries of messages */
    const char *chat_template;      /* template name instead of the model's ("chatml", ...) */
    bool has_max_tokens;
    uint32_t max_tokens; /* 1..context */
    bool has_temperature;
    float temperature; /* >= 0; 0 = greedy */
    bool has_top_k;
    int32_t top_k; /* >= 0; 0 = off */
    bool has_top_p;
    float top_p; /* (0, 1] */
    bool has_min_p;
    float min_p; /* [0, 1] */
    bool has_repeat_penalty;
    float repeat_penalty; /* > 0; 1 = off */
    bool has_presence_penalty;
    float presence_penalty;
    bool has_frequency_penalty;
    float frequency_penalty;
    bool has_penalty_last_n;
    int32_t penalty_last_n; /* >= 0 tokens */
    bool has_seed;
    uint64_t seed;           /* same seed and inputs give the same text */
    const char *const *stop; /* stop strings (at most 16, each 1..256 bytes) */
    size_t n_stop;
    corral_stream_mode stream;
    corral_priority priority;
    const char *session;    /* keep the conversation's KV cache under this id (the app's own:
                               another app naming it gets PERMISSION_DENIED) */
    uint32_t deadline_ms;   /* give up after this long from receipt; 0 = none */
    const char *constraint; /* regular expression the whole output must match */
    const char *sanitizer;  /* sanitizer profile instead of the model's default */
    /* Structured output: a JSON Schema's text the output must be a document of, or
     * {"type":"json_object"} for any object (proto Generate.json_schema); not with constraint. */
    const char *json_schema;
} corral_generate_params;

/* A part of a generation's output. Borrowed: valid until the next poll or destroy of its
 * generation (in a callback: until the callback returns). text is NUL-terminated as well. */
typedef struct corral_chunk {
    const char *text; /* UTF-8, complete characters only */
    size_t text_len;
    const int32_t *token_ids; /* the tokens this chunk comes from */
    size_t n_token_ids;
    uint32_t index; /* 0, 1, 2, ... per generation (checked by the library) */
} corral_chunk;

/* Timings of one generation in microseconds (proto Timings). */
typedef struct corral_timings {
    uint64_t queue_us, load_us, prefill_us, decode_us, total_us;
} corral_timings;

/* How a generation ended (proto Done). */
typedef struct corral_done {
    corral_stop_reason stop_reason;
    uint32_t prompt_tokens;    /* tokens of the whole prompt or chat as the model sees it */
    uint32_t prefilled_tokens; /* of those, the ones computed now (the rest came from a session) */
    uint32_t generated_tokens;
    corral_timings timings;
    uint32_t queue_steps; /* other requests' forward passes begun before its first one */
    /* Chat messages left out because the conversation outgrew the model's context (its oldest
     * turns after the leading system messages; context_overflow truncate_oldest). */
    uint32_t dropped_messages;
    char model[128]; /* the model that answered */
    /* What the input sanitizers did, one "step=verdict(details)" per step; empty when the
     * request ran under no sanitizer profile. Truncated to fit. */
    char sanitizer_report[512];
} corral_done;

/* Called for every chunk in order. Return 0 to go on, nonzero to cancel the generation: the
 * library sends Cancel, calls the callback no more, and waits for the daemon's Done. The
 * callback must not use the client it was called from. */
typedef int (*corral_chunk_fn)(const corral_chunk *chunk, void *user);

/* Generate and wait for the end. Chunks go to on_chunk (may be NULL); the stream mode AUTO
 * streams exactly when on_chunk is given. Returns CORRAL_OK with *done filled (may be NULL)
 * whenever the daemon finished the generation, including after a cancel (done->stop_reason is
 * then usually CORRAL_STOP_CANCELLED); otherwise the daemon's error, CORRAL_DEADLINE_EXCEEDED when
 * the whole call took longer than timeout_ms (the generation is then cancelled), or a local error.
 * Thread: the client's; on_chunk runs on it.
 */
CORRAL_API corral_status corral_generate(corral_client *client, const corral_generate_params *p,
                                         corral_chunk_fn on_chunk, void *user, corral_done *done,
                                         int timeout_ms, corral_error *err);

/* As corral_generate, but collects the whole text: on success *text is a NUL-terminated string
 * the caller frees with free() (and *text_len, may be NULL, its length). The stream mode AUTO
 * means one chunk. On failure *text is NULL. Thread: the client's. */
CORRAL_API corral_status corral_generate_text(corral_client *client,
                                              const corral_generate_params *p, char **text,
                                              size_t *text_len, corral_done *done, int timeout_ms,
                                              corral_error *err);

/* A chat: as corral_generate with p's messages replaced by `messages` (p gives the model,
 * chat_template and options; p->prompt and p->messages must be unset). Thread: the client's;
 * on_chunk runs on it. */
CORRAL_API corral_status corral_chat(corral_client *client, const corral_generate_params *p,
                                     const corral_message *messages, size_t n_messages,
                                     corral_chunk_fn on_chunk, void *user, corral_done *done,
                                     int timeout_ms, corral_error *err);

/* Send a Generate and return at once (the stream mode AUTO streams). Caller owns the result
 * (corral_generation_destroy); it stays tied to the client. Returns NULL with err set when the
 * request could not be sent; the daemon's answer, error or not, comes through poll. Thread: the
 * client's. */
CORRAL_API corral_generation *
corral_generate_start(corral_client *client, const corral_generate_params *p, corral_error *err);

/* What corral_generation_poll found. Errors are negative corral_status values. */
typedef enum corral_poll_result {
    CORRAL_POLL_NOTHING = 0, /* nothing arrived within timeout_ms */
    CORRAL_POLL_CHUNK = 1,   /* *chunk holds the next chunk */
    CORRAL_POLL_DONE = 2,    /* the generation ended; *done is filled */
} corral_poll_result;

/* Wait up to timeout_ms (0: just look, -1: forever) for the next event of the generation; while
 * waiting, messages of other requests of the client are sorted into their queues. Returns
 * CORRAL_POLL_CHUNK with *chunk filled (borrowed until the next poll or destroy), CORRAL_POLL_DONE
 * with *done (may be NULL) filled — again on every later call —, CORRAL_POLL_NOTHING, or a negative
 * status with err filled when the generation failed (the daemon's Error, a broken reply, a queue
 * overflow, a lost daemon) — again on every later call. Thread: the client's. */
CORRAL_API int corral_generation_poll(corral_generation *g, int timeout_ms, corral_chunk *chunk,
                                      corral_done *done, corral_error *err);

/* Ask the daemon to stop the generation (no wait; the Done or Error comes through poll). Returns
 * CORRAL_OK, also when it had already ended, or an error if the Cancel could not be sent. Thread:
 * the client's. */
CORRAL_API corral_status corral_generation_cancel(corral_generation *g, corral_error *err);

/* What a request waits on while the daemon reports progress (proto ProgressPhase). */
typedef enum corral_progress_phase {
    CORRAL_PHASE_UNSPECIFIED = 0, /* none reported yet (or a phase this library does not know) */
    CORRAL_PHASE_PREFILL = 1,     /* the prompt runs through the model: done/total in tokens */
    CORRAL_PHASE_LOADING = 2,     /* the model is being loaded (total 0: no fraction) */
    CORRAL_PHASE_MERGING = 3,     /* a variant's LoRA adapters are merged: tensors */
    CORRAL_PHASE_REPACKING = 4,  /* the weights are rearranged and cached, once per file: tensors */
    CORRAL_PHASE_QUANTIZING = 5, /* a quantized variant is made and cached, once: tensors */
} corral_progress_phase;

/* One progress report (proto Progress). */
typedef struct corral_progress_info {
    corral_progress_phase phase;
    uint64_t done, total; /* units of the phase; total 0 when it has no fraction */
    char model[128];      /* the model the work is for */
} corral_progress_info;

/* Called with each progress report of a Load or Pin that asked for them. The callback must not
 * use the client it was called from. */
typedef void (*corral_progress_cb)(const corral_progress_info *progress, void *user);

/* The latest prefill progress the daemon reported (0/0 before any). Never waits. Thread: the
 * client's. */
CORRAL_API void corral_generation_progress(const corral_generation *g, uint32_t *prefilled,
                                           uint32_t *total);

/* The latest progress of any phase the daemon reported for the generation (the load of its
 * model, its prompt's prefill); phase CORRAL_PHASE_UNSPECIFIED before any. Reports arrive while a
 * poll waits; a caller that shows them reads this after each poll. Never waits. Thread: the
 * client's. */
CORRAL_API void corral_generation_progress_info(const corral_generation *g,
                                                corral_progress_info *out);

/* The request id of the generation on its client (for logs). Thread: the client's. */
CORRAL_API uint64_t corral_generation_id(const corral_generation *g);

/* Forget the generation, cancelling it first if it is still running. NULL-safe; sets *g to NULL.
 * Must run on the thread that uses its client (or after the client was destroyed). */
CORRAL_API void corral_generation_destroy(corral_generation **g);

/* ---- tokens, models, status --------------------------------------------------------------- */

/* Token ids of a text with their vocabulary pieces; one block, freed by corral_tokens_destroy. */
typedef struct corral_tokens {
    size_t n;
    int32_t *ids;
    char **pieces; /* the vocabulary piece of each id (n strings), or NULL if none were sent */
} corral_tokens;

/* Tokenize `text` as `model` would for a raw prompt (special tokens never parsed; add_special
 * adds BOS/EOS as the model does for prompts). Caller owns *out (corral_tokens_destroy). Thread:
 * the client's. */
CORRAL_API corral_status corral_tokenize(corral_client *client, const char *model, const char *text,
                                         bool add_special, int timeout_ms, corral_tokens **out,
                                         corral_error *err);

/* Free a result of corral_tokenize. NULL-safe; sets *t to NULL. Thread-safe (a result does not
 * depend on its client). */
CORRAL_API void corral_tokens_destroy(corral_tokens **t);

/* A model's residency (proto ModelState). */
typedef enum corral_model_state {
    CORRAL_MODEL_UNSPECIFIED = 0,
    CORRAL_MODEL_UNLOADED = 1,
    CORRAL_MODEL_LOADING = 2,
    CORRAL_MODEL_RESIDENT = 3,
    CORRAL_MODEL_SWAPPED = 4,
    CORRAL_MODEL_BROKEN = 5, /* its file failed under it; the next request loads it afresh */
} corral_model_state;

/* A configured model (proto ModelInfo). Strings are never NULL. */
/* A LoRA adapter merged into a variant's base weights. */
typedef struct corral_adapter {
    const char *path; /* the adapter file (GGUF) or PEFT directory */
    float scale;      /* 1.0: as trained */
} corral_adapter;

typedef struct corral_model_info {
    const char *name;
    const char *path;
    const char *arch; /* "" until first loaded */
    uint32_t context;
    const char *chat_template; /* "none" for raw completion */
    corral_model_state state;
    bool pinned;
    size_t n_adapters; /* a variant (path is its base): the adapters merged in, in order */
    const corral_adapter *adapters;
    const char *context_overflow; /* "truncate_oldest" or "error" ("" from older daemons) */
} corral_model_info;

typedef struct corral_model_list {
    size_t n_models;
    corral_model_info *models;
} corral_model_list;

/* The configured models. Caller owns *out (corral_model_list_destroy). Thread: the client's. */
CORRAL_API corral_status corral_list_models(corral_client *client, int timeout_ms,
                                            corral_model_list **out, corral_error *err);

/* Free a result of corral_list_models. NULL-safe; sets *list to NULL. Thread-safe (a result does
 * not depend on its client). */
CORRAL_API void corral_model_list_destroy(corral_model_list **list);

/* One model's state (proto ModelStatus). */
typedef struct corral_model_status {
    const char *name;
    corral_model_state state;
    uint64_t bytes;        /* memory held: weights, KV caches, scratch (swapped out: what it
                              kept, its tokenizer and scratch, until memory runs short) */
    uint64_t last_used_ms; /* Unix time in ms of the last request; 0 if never used */
    uint32_t queue_depth;  /* requests waiting */
    uint32_t active;       /* requests being computed */
    uint64_t requests_served;
    bool pinned;
    uint32_t sessions;
    uint64_t swap_ins, swap_outs; /* came back after / was unmapped for a swap-out */
    bool preload;                 /* loaded at start (config) */
    uint64_t ttl_ms;              /* unloaded after this long unused; 0: kept (config) */
    const char *base_path;        /* a variant's base model file; "" for a plain model */
    size_t n_adapters;            /* a variant's adapters, in order */
    const corral_adapter *adapters;
    uint64_t merges;         /* times its adapters were merged (0 while the cache served) */
    uint64_t last_load_ms;   /* how long its last load or swap-in took */
    uint64_t loads;          /* loads and swap-ins started for it */
    uint64_t steps;          /* batch steps (forward passes) run for it */
    uint64_t step_sequences; /* the sequences in them: / steps = the mean batch */
    const char *error;       /* BROKEN: what failed, or why its last load was refused; "" else */
} corral_model_status;

/* The daemon's totals (proto DaemonStatus). */
typedef struct corral_daemon_status {
    const char *version;
    uint64_t uptime_ms;
    uint64_t total_bytes; /* memory held by all models */
    uint64_t limit_bytes; /* the memory budget (0: none) */
    uint32_t active, queued;
    uint64_t requests_served;
    uint32_t sessions, threads;
    uint64_t allocated_bytes;       /* by the core's threads so far; 0 without jemalloc */
    uint64_t front_allocated_bytes; /* by the front ends' threads so far */
    uint64_t heap_bytes;            /* held on the heap now; 0 without jemalloc */
} corral_daemon_status;

typedef struct corral_status_report {
    corral_daemon_status daemon;
    size_t n_models;
    corral_model_status *models;
} corral_status_report;

/* The daemon's state; model NULL or "": every model. Caller owns *out
 * (corral_status_report_destroy). Thread: the client's. */
CORRAL_API corral_status corral_client_status(corral_client *client, const char *model,
                                              int timeout_ms, corral_status_report **out,
                                              corral_error *err);

/* Free a result of corral_client_status. NULL-safe; sets *report to NULL. Thread-safe (a result
 * does not depend on its client). */
CORRAL_API void corral_status_report_destroy(corral_status_report **report);

/* Load a model now and return when it is resident; unload it (refused while requests use it,
 * and while it is pinned: CORRAL_FAILED_PRECONDITION naming the pin; its sessions' KV caches go
 * to the swap directory); pin it (load it, as corral_load does, and keep it: never unloaded or
 * swapped out to make room; returns when it is resident); unpin it.
 * Return CORRAL_OK on the daemon's Ack, else its error (CORRAL_NOT_FOUND for an unknown model).
 * Thread: the client's. */
CORRAL_API corral_status corral_load(corral_client *client, const char *model, int timeout_ms,
                                     corral_error *err);
CORRAL_API corral_status corral_unload(corral_client *client, const char *model, int timeout_ms,
                                       corral_error *err);
CORRAL_API corral_status corral_pin(corral_client *client, const char *model, int timeout_ms,
                                    corral_error *err);
CORRAL_API corral_status corral_unpin(corral_client *client, const char *model, int timeout_ms,
                                      corral_error *err);

/* corral_load and corral_pin, with the load's progress reports (phase, fraction) passed to
 * on_progress (may be NULL) as they arrive, on the calling thread. */
CORRAL_API corral_status corral_load_with_progress(corral_client *client, const char *model,
                                                   int timeout_ms, corral_progress_cb on_progress,
                                                   void *user, corral_error *err);
CORRAL_API corral_status corral_pin_with_progress(corral_client *client, const char *model,
                                                  int timeout_ms, corral_progress_cb on_progress,
                                                  void *user, corral_error *err);

/* corral_unload; with force, a pinned model is unpinned first instead of refused. */
CORRAL_API corral_status corral_unload_force(corral_client *client, const char *model, bool force,
                                             int timeout_ms, corral_error *err);

/* ---- names -------------------------------------------------------------------------------- */

/* Lower-case names ("eog", "max_tokens", ...; "unloaded", "resident", ...; "background", ...).
 * Unknown values give "unknown". Thread-safe; the strings are static. */
CORRAL_API const char *corral_stop_reason_name(corral_stop_reason reason);
CORRAL_API const char *corral_model_state_name(corral_model_state state);
CORRAL_API const char *corral_priority_name(corral_priority priority);
/* "prefill", "loading", "merging", "repacking", "quantizing" (what a person reads beside a
 * progress bar). */
CORRAL_API const char *corral_progress_phase_name(corral_progress_phase phase);

/* Parse "background", "interactive", "realtime" (or "default"). Returns 0 and sets *out, or -1. */
CORRAL_API int corral_priority_from_name(const char *name, corral_priority *out);

#ifdef __cplusplus
}
#endif

#endif /* CORRAL_CLIENT_H */
