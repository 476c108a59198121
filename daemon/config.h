/*
 * config.h — corrald's configuration: the YAML file, its defaults and its checks.
 *
 * Every key is a row of a declarative table in config.c (dotted path, type, bounds, default,
 * documentation), in the manner of redis's config.c: parsing, defaults and range checks all come
 * from the tables, so a key cannot be parsed one way and defaulted another. Lists of models and
 * apps are rows whose items have tables of their own. Defaults are written as YAML text and go
 * through the same parser as the file. Any problem in a file (unknown key, wrong type, value out
 * of range, duplicate key or name, missing required key, missing model file, YAML syntax) is
 * reported as `file:line:column: message`.
 */
#ifndef CORRAL_DAEMON_CONFIG_H
#define CORRAL_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "corral/log.h"
#include "corral/status.h"

/* Scheduling classes, in increasing urgency (the numbers of proto's Priority). */
typedef enum cfg_priority {
    CFG_PRIORITY_BACKGROUND = 1,
    CFG_PRIORITY_INTERACTIVE = 2,
    CFG_PRIORITY_REALTIME = 3,
} cfg_priority;

/* "background", "interactive", "realtime"; NULL for other values. */
const char *cfg_priority_name(cfg_priority p);

/* What a chat that outgrows a model's context does (its `context_overflow`). */
typedef enum cfg_overflow {
    CFG_OVERFLOW_TRUNCATE_OLDEST = 0, /* drop the oldest turns (system messages kept) */
    CFG_OVERFLOW_ERROR = 1,           /* fail the request, naming both sizes */
} cfg_overflow;

/* "truncate_oldest", "error"; NULL for other values. */
const char *cfg_overflow_name(cfg_overflow o);

/* Sampling defaults of a model: each has_ flag says whether the config set the value. */
typedef struct cfg_sampling {
    bool has_temperature, has_top_k, has_top_p, has_min_p, has_repeat_penalty;
    bool has_presence_penalty, has_frequency_penalty, has_penalty_last_n, has_max_tokens;
    float temperature;
    int64_t top_k;
    float top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int64_t penalty_last_n;
    int64_t max_tokens;
} cfg_sampling;

/* One step of a sanitizer profile: a built-in kind (utf8, invisible, special_tokens, max_input,
 * deny, normalize_space, regex) or "plugin", with its settings as strings. */
typedef struct cfg_policy_param {
    char *key;
    char *value;
} cfg_policy_param;

typedef struct cfg_policy_step {
    char *kind;
    char *path; /* a plugin's shared library (its `path` setting, resolved like model paths) */
    cfg_policy_param *params;
    size_t n_params;
} cfg_policy_step;

/* A named sanitizer profile (config `sanitizers`). */
typedef struct cfg_sanitizer {
    char *name;
    cfg_policy_step *steps;
    size_t n_steps;
} cfg_sanitizer;

/* A LoRA adapter applied to a model entry's base weights. */
typedef struct cfg_adapter {
    char *path;  /* GGUF adapter file, or PEFT directory (adapter_config.json + safetensors) */
    float scale; /* multiplies the adapter's alpha/r */
} cfg_adapter;

/* A place in the configuration file (1-based), for messages about what was read there. */
typedef struct cfg_pos {
    int line, col;
} cfg_pos;

typedef struct cfg_model {
    char *name;      /* unique; what clients ask for */
    char *path;      /* the GGUF file, absolute (relative paths resolve against the
                        config file's directory) */
    int64_t context; /* KV positions per sequence; 0 = the model's own, sized by memory */
    bool kv_f32;     /* kv_type: f32 instead of the default f16 */
    cfg_overflow context_overflow; /* a chat longer than the context */
    cfg_priority priority;         /* class of requests that do not name one */
    bool pin;                      /* never unloaded to make room */
    bool preload;                  /* loaded at start instead of on first use */
    int64_t ttl_ms;                /* unload after this long unused (0: never) */
    char *chat_template;           /* template name overriding the file's; NULL = the file's */
    cfg_adapter *adapters;         /* merged into the weights: the entry is a variant of `path` */
    size_t n_adapters;
    char *quantize;        /* a file type (quantize.h, "q4_k_m"): `path` (its adapters merged
                              first) quantized once, kept in cache.dir; NULL: none */
    char *sanitizer;       /* profile applied to its input; NULL: none */
    cfg_sampling defaults;
    int cfg_line; /* where the entry starts, for messages */
    cfg_pos at, at_path, at_context, at_template; /* the entry, and its keys' values (else at) */
} cfg_model;

/* An app: who may act as it (SECURITY.md; the daemon establishes a request's app from the
 * client's credentials, daemon/auth.h) and what it may do (enforced by the core). */
typedef struct cfg_app {
    char *name;    /* 1-63 bytes of [A-Za-z0-9._-] */
    char **models; /* models it may use; n_models == 0: all */
    size_t n_models;
    cfg_priority max_priority; /* requests asking for more are refused; those naming no class run
                                  at most at it */
    char *sanitizer;           /* profile for its requests instead of the model's; NULL: the model's */
    /* Who: ipc peers whose uid or gid is listed, tcp peers holding one of the CURVE keys. */
    uint32_t *uids;
    size_t n_uids;
    uint32_t *gids;
    size_t n_gids;
    char **curve_keys; /* clients' CURVE public keys, z85 (40 characters) */
    size_t n_curve_keys;
    /* What: 0 means no limit for each of the three numbers. */
    bool admin;                  /* may Load, Unload, Pin and Unpin */
    int64_t max_concurrent;      /* Generate requests in flight at once */
    int64_t requests_per_minute; /* requests (all but Status and ListModels) per minute */
    int64_t max_tokens;          /* tokens one Generate may ask for */
} cfg_app;

/* A bearer key of the HTTP front end: the file that holds it, and the app its requests run as. */
typedef struct cfg_http_key {
    char *key_file; /* the key is the file's first line (at least 16 bytes, no spaces) */
    char *app;
} cfg_http_key;

typedef struct cfg {
    char *source_path; /* the file this came from; NULL when built from defaults only */
    char **listen;     /* endpoints to bind; n_listen == 0 means the default endpoint */
    size_t n_listen;
    log_level log_level;
    int64_t threads; /* compute threads; 0 = physical cores */
    /* limits */
    uint64_t max_message_bytes;
    int64_t queue_per_model;  /* requests waiting or running per model */
    int64_t queue_per_app;    /* requests waiting or running per app */
    int64_t active_per_model; /* requests computed concurrently (interleaved) per model */
    int64_t stall_timeout_ms; /* a paused stream (client not reading) is cancelled after this */
    int64_t peer_timeout_ms;  /* a silent client's requests are cancelled after this */
    int64_t session_ttl_ms;   /* idle sessions are dropped after this */
    int64_t max_sessions;
    int64_t prefill_chunk;  /* prompt tokens per scheduling step */
    int64_t memory_wait_ms; /* a request that finds no memory waits this long (or its deadline) */
    /* memory */
    uint64_t memory_limit; /* bytes; computed from memory.limit (bytes or % of RAM) */
    double high_watermark, low_watermark;
    char *swap_dir;
    char *evict_policy; /* memory.policy: lru | lru-cost */
    /* cache: merged (LoRA) and repacked weights kept between loads */
    char *cache_dir;
    uint64_t cache_limit;
    /* http: the OpenAI- and Ollama-compatible front end (front_http.h); off when http_listen is
     * empty */
    char **http_listen; /* HOST:PORT addresses */
    size_t n_http_listen;
    cfg_http_key *http_keys;
    size_t n_http_keys;
    char **http_cors; /* origins allowed to call from a browser ("*": any) */
    size_t n_http_cors;
    uint64_t http_max_body_bytes;
    int64_t http_request_timeout_ms; /* to receive a request's body */
    int64_t http_idle_timeout_ms;    /* idle, or still sending headers: closed after this */
    int64_t http_max_connections;
    /* models and apps */
    cfg_model *models;
    size_t n_models;
    cfg_app *apps;
    size_t n_apps;
    cfg_sanitizer *sanitizers;
    size_t n_sanitizers;
    /* auth: who the clients are (SECURITY.md) */
    bool auth_owner;       /* ipc peers with corrald's own uid, mapped to no app, are its owner */
    char *server_key_file; /* the CURVE secret key of tcp endpoints (z85); NULL: no tcp */
    char *default_app;     /* the app whose rules apply to the default app ""; NULL: built-in */
} cfg;

/* Every problem found in a configuration, in the order found, each "file:line:column: message"
 * (some, about the whole file, "file: message"). */
typedef struct cfg_report {
    char **problems;
    size_t n, cap;
} cfg_report;

/* Append a problem (printf format). Out of memory drops it. NULL-safe (does nothing). */
void cfg_report_add(cfg_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record one problem of a check that reports every problem: the first of them (*count 0)
 * becomes err (INVALID_ARGUMENT), each goes to r (NULL-safe); *count counts them. */
void cfg_report_problem(cfg_report *r, corral_error *err, size_t *count, const char *line);

/* Free the problems; the report is empty again. NULL-safe. */
void cfg_report_free(cfg_report *r);

/* A configuration holding every default. Caller owns the result (cfg_destroy). NULL only when
 * memory runs out, with err set. */
cfg *cfg_new_defaults(corral_error *err);

/* Load and check a YAML file; keys it leaves out keep their defaults. Caller owns the result.
 * Returns NULL with err set: CORRAL_NOT_FOUND when the file does not exist, CORRAL_IO when it
 * cannot be read, CORRAL_INVALID_ARGUMENT with "path:line:column: message" for bad content
 * (including a model whose file does not exist). */
cfg *cfg_load_file(const char *path, corral_error *err);

/* A check of a configuration beyond its text (cfg_check_models), for the loaders below. It may
 * see a configuration with problems: entries whose keys failed (a NULL name or path) it skips. */
typedef corral_status (*cfg_check_fn)(const cfg *c, const char *name, cfg_report *report,
                                      corral_error *err);

/* cfg_load_file, appending every problem of the file to *report (not only the first): unknown
 * keys with the likeliest meant one, values out of range, missing files, names of profiles,
 * models and apps that do not exist. The walk goes on past a problem wherever it can, and
 * `extra` (may be NULL) runs over what was read whether or not the file had problems, its own
 * problems appended too: one run reports everything. */
cfg *cfg_load_file_report(const char *path, cfg_report *report, cfg_check_fn extra,
                          corral_error *err);

/* Parse YAML text (for tests and for files already in memory); `name` is used in messages and
 * relative model paths resolve against the current directory. */
cfg *cfg_load_string(const char *text, size_t len, const char *name, corral_error *err);
cfg *cfg_load_string_report(const char *text, size_t len, const char *name, cfg_report *report,
                            cfg_check_fn extra, corral_error *err);

/* Check what the configured models are, beyond their files' existence, without loading their
 * weights: each model file's header as a load would read it (GGUF magic and version, every count
 * and offset, a supported architecture, its hyperparameters, every tensor it needs with its
 * shape and type, its vocabulary), each adapter against its base, `context` against the model's
 * own, `template` against the known chat templates (with the closest name). Each problem is
 * appended to *report (may be NULL) as "name:line:column: model 'x': ..." (name: the file's, as
 * messages give it; NULL: c->source_path); returns CORRAL_OK or
 * CORRAL_INVALID_ARGUMENT with err holding the first (config_check.c). For startup,
 * --check-config and reloads. */
corral_status cfg_check_models(const cfg *c, const char *name, cfg_report *report,
                               corral_error *err);

/* Free a configuration. NULL-safe; sets *c to NULL. */
void cfg_destroy(cfg **c);

/* The model, app or sanitizer profile called name, or NULL. Entries without a name (a config
 * with problems, whose checks still run) are skipped. */
const cfg_model *cfg_find_model(const cfg *c, const char *name);
const cfg_app *cfg_find_app(const cfg *c, const char *name);
const cfg_sanitizer *cfg_find_sanitizer(const cfg *c, const char *name);

/* Whether app (NULL: the default app) may use model; the default app may use every model. */
bool cfg_app_allows_model(const cfg_app *app, const char *model);

/* Which file corrald reads when no -c is given: $CORRAL_CONFIG if set, else the first that exists
 * of $XDG_CONFIG_HOME/corral/corral.yaml (~/.config when unset), ../etc/corral/corral.yaml beside
 * the corrald executable's folder (an installed prefix's own) and /etc/corral/corral.yaml.
 * Returns 1 and writes the path into buf, or 0 when none exists (run on defaults). */
int cfg_find_default_file(char *buf, size_t size);

/* Print every key with its type, default and documentation (corrald --help-config). */
void cfg_print_reference(FILE *out);

#endif /* CORRAL_DAEMON_CONFIG_H */
