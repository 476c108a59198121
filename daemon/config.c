/*
 * config.c — the config tables and the YAML walker that applies a file to them.
 *
 * How a file is read: libyaml loads the whole document as a node tree (so every node keeps its
 * line and column). The walker visits a mapping against a table; each key is joined to its
 * parent's path with '.' ("limits" + "max_message_bytes"). A path that names a row is parsed by
 * that row's type; a path that is a prefix of some rows is a section and must be a mapping;
 * anything else is an unknown key. A LIST row (models, apps) holds a sequence of mappings, each
 * walked against the row's item table after that table's defaults are applied. A problem is
 * reported with its position and the walk goes on (the next key, the next entry), so that one
 * run names every mistake of a file (cfg_report); the load then fails with the first.
 *
 * Defaults are YAML text in the tables and are applied by the same walker, so a default can never
 * be something the file could not say.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "corral/curve.h"
#include "corral/endpoint.h"
#include "corral/evict.h"
#include "corral/paths.h"
#include "corral/quantize.h"
#include "corral/suggest.h"

typedef enum cfg_type {
    CFG_TYPE_BYTES,     /* unsigned byte count, with optional K/M/G/T suffix (KiB = 1024) */
    CFG_TYPE_MEMORY,    /* a byte count, or "N%" of the machine's RAM */
    CFG_TYPE_INT,       /* int64 within [min, max] */
    CFG_TYPE_FLOAT,     /* float within [fmin, fmax] */
    CFG_TYPE_DOUBLE,    /* double within [fmin, fmax] */
    CFG_TYPE_BOOL,      /* true | false */
    CFG_TYPE_STRING,    /* any string (char *, owned) */
    CFG_TYPE_PATH,      /* a string; relative paths resolve against the config file's folder */
    CFG_TYPE_LOG_LEVEL, /* error | warn | info | debug | trace */
    CFG_TYPE_PRIORITY,  /* background | interactive | realtime */
    CFG_TYPE_KV_TYPE,   /* f16 | f32 (stored as bool: f32) */
    CFG_TYPE_OVERFLOW,  /* truncate_oldest | error (stored as cfg_overflow) */
    CFG_TYPE_POLICY,    /* an eviction policy name (policies/evict.h), stored as a string */
    CFG_TYPE_STEPS,     /* sanitizer steps: a list of single-key mappings `- kind: {k: v, ...}` */
    CFG_TYPE_ENDPOINTS, /* a sequence of endpoint strings (or one string) */
    CFG_TYPE_NAMES,     /* a sequence of names (or one name) */
    CFG_TYPE_IDS,       /* a sequence of numeric user or group ids (or one), as uint32_t */
    CFG_TYPE_LIST,      /* a sequence of mappings, each walked against item_table */
} cfg_type;

typedef struct cfg_table cfg_table;

typedef struct cfg_option {
    const char *path; /* dotted key path */
    cfg_type type;
    size_t offset;             /* the field in the struct the table describes */
    int64_t min, max;          /* inclusive bounds for INT and BYTES */
    double fmin, fmax;         /* inclusive bounds for FLOAT/DOUBLE */
    const char *default_value; /* YAML text, parsed like a value from a file; NULL: none */
    const char *default_shown; /* --help-config's default when it is computed at run time */
    bool required;             /* must be given (list items) */
    ptrdiff_t has_offset;      /* >= 0: a bool field set when the key is given; -1: none */
    /* LIST: the item table, the item size and where the count lives. NAMES/ENDPOINTS/IDS:
     * count. */
    const cfg_table *item_table;
    size_t item_size;
    size_t count_offset;
    const char *doc;
} cfg_option;

struct cfg_table {
    const cfg_option *options;
    size_t n;
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define NO_HAS  .has_offset = -1

/* ---- the tables --------------------------------------------------------------------------- */

#define SAMPLING_OPT(key, t, field, lo, hi, what)                                          \
    {                                                                                      \
        .path = "defaults." key, .type = t, .offset = offsetof(cfg_model, defaults.field), \
        .fmin = lo, .fmax = hi, .min = (int64_t)(lo), .max = (int64_t)(hi),                \
        .has_offset = offsetof(cfg_model, defaults.has_##field), .doc = what               \
    }

static const cfg_option adapter_options[] = {
    {.path = "path", .type = CFG_TYPE_PATH, .offset = offsetof(cfg_adapter, path),
     .required = true, NO_HAS,
     .doc = "LoRA adapter: a llama.cpp GGUF adapter, or a PEFT folder (adapter_config.json and "
            "adapter_model.safetensors); relative to this file's folder"},
    {.path = "scale", .type = CFG_TYPE_FLOAT, .offset = offsetof(cfg_adapter, scale),
     .fmin = -100, .fmax = 100, .default_value = "1.0", NO_HAS,
     .doc = "strength: multiplies the adapter's alpha/r"},
};
static const cfg_table adapter_table = {adapter_options, N_OF(adapter_options)};

static const cfg_option model_options[] = {
    {.path = "name",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_model, name),
     .required = true,
     NO_HAS,
     .doc = "the name clients use"},
    {.path = "path",
     .type = CFG_TYPE_PATH,
     .offset = offsetof(cfg_model, path),
     .required = true,
     NO_HAS,
     .doc = "GGUF file (relative to this file's folder)"},
    {.path = "context",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg_model, context),
     .min = 0,
     .max = 1 << 20,
     .default_value = "0",
     NO_HAS,
     .doc = "tokens per conversation; 0 = the model's own, halved while one KV cache of it "
            "would take more than a quarter of memory.limit"},
    {.path = "kv_type",
     .type = CFG_TYPE_KV_TYPE,
     .offset = offsetof(cfg_model, kv_f32),
     .default_value = "f16",
     NO_HAS,
     .doc = "KV cache element type: f16 or f32"},
    {.path = "context_overflow",
     .type = CFG_TYPE_OVERFLOW,
     .offset = offsetof(cfg_model, context_overflow),
     .default_value = "truncate_oldest",
     NO_HAS,
     .doc = "a chat that outgrows the context: truncate_oldest drops its oldest turns (leading "
            "system messages kept; a session's cache is recomputed from the kept turns), error "
            "fails the request"},
    {.path = "priority",
     .type = CFG_TYPE_PRIORITY,
     .offset = offsetof(cfg_model, priority),
     .default_value = "interactive",
     NO_HAS,
     .doc = "class of requests that name none: background, interactive, realtime"},
    {.path = "pin",
     .type = CFG_TYPE_BOOL,
     .offset = offsetof(cfg_model, pin),
     .default_value = "false",
     NO_HAS,
     .doc = "keep this model: loaded at start, never unloaded or swapped out to make room "
            "(`corral unload` refuses it unless --force)"},
    {.path = "preload",
     .type = CFG_TYPE_BOOL,
     .offset = offsetof(cfg_model, preload),
     .default_value = "false",
     NO_HAS,
     .doc = "load at start instead of on first use"},
    {.path = "ttl_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg_model, ttl_ms),
     .min = 0,
     .max = 30ll * 86400000,
     .default_value = "0",
     NO_HAS,
     .doc = "unload the model after this long without requests, to give memory back to the "
            "machine; 0 = keep it"},
    {.path = "template",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_model, chat_template),
     NO_HAS,
     .doc = "chat template name overriding the file's (chatml, llama3, ...)"},
    {.path = "sanitizer",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_model, sanitizer),
     NO_HAS,
     .doc = "sanitizer profile applied to what clients send to this model (`sanitizers`)"},
    {.path = "adapters",
     .type = CFG_TYPE_LIST,
     .offset = offsetof(cfg_model, adapters),
     .count_offset = offsetof(cfg_model, n_adapters),
     .item_table = &adapter_table,
     .item_size = sizeof(cfg_adapter),
     .default_value = "[]",
     NO_HAS,
     .doc = "LoRA adapters merged into `path` ({path, scale}): the entry is a variant of that "
            "base, a model of its own; merged weights are kept in cache.dir"},
    {.path = "quantize",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_model, quantize),
     NO_HAS,
     .doc = "a type (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k): the "
            "entry is its full-precision `path` (with its adapters merged in f32 first) quantized "
            "once with llama-quantize's recipe, made on first use and kept in cache.dir"},
    SAMPLING_OPT("temperature", CFG_TYPE_FLOAT, temperature, 0, 100, "sampling temperature"),
    SAMPLING_OPT("top_k", CFG_TYPE_INT, top_k, 0, 1 << 24, "top-k (0 = off)"),
    SAMPLING_OPT("top_p", CFG_TYPE_FLOAT, top_p, 1e-9, 1, "top-p (1 = off)"),
    SAMPLING_OPT("min_p", CFG_TYPE_FLOAT, min_p, 0, 1, "min-p (0 = off)"),
    SAMPLING_OPT("repeat_penalty", CFG_TYPE_FLOAT, repeat_penalty, 1e-9, 100,
                 "repetition penalty (1 = off)"),
    SAMPLING_OPT("presence_penalty", CFG_TYPE_FLOAT, presence_penalty, -100, 100,
                 "presence penalty"),
    SAMPLING_OPT("frequency_penalty", CFG_TYPE_FLOAT, frequency_penalty, -100, 100,
                 "frequency penalty"),
    SAMPLING_OPT("penalty_last_n", CFG_TYPE_INT, penalty_last_n, 0, 65536,
                 "tokens the penalties look back over"),
    SAMPLING_OPT("max_tokens", CFG_TYPE_INT, max_tokens, 1, 1 << 20,
                 "tokens generated when a request names no limit"),
};
static const cfg_table model_table = {model_options, N_OF(model_options)};

static const cfg_option app_options[] = {
    {.path = "name",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_app, name),
     .required = true,
     NO_HAS,
     .doc = "the app's name (letters, digits, '.', '_', '-'; at most 63): what logs show, and "
            "what Request.app selects when a client may act as several apps"},
    {.path = "uids",
     .type = CFG_TYPE_IDS,
     .offset = offsetof(cfg_app, uids),
     .count_offset = offsetof(cfg_app, n_uids),
     .default_value = "[]",
     NO_HAS,
     .doc = "local users (numeric uids) whose ipc connections act as this app"},
    {.path = "gids",
     .type = CFG_TYPE_IDS,
     .offset = offsetof(cfg_app, gids),
     .count_offset = offsetof(cfg_app, n_gids),
     .default_value = "[]",
     NO_HAS,
     .doc = "local groups (numeric gids): ipc connections of processes running with one of them "
            "as their group act as this app"},
    {.path = "curve_keys",
     .type = CFG_TYPE_NAMES,
     .offset = offsetof(cfg_app, curve_keys),
     .count_offset = offsetof(cfg_app, n_curve_keys),
     .default_value = "[]",
     NO_HAS,
     .doc = "CURVE public keys (z85, 40 characters; `corral keygen`) of tcp clients that act as "
            "this app"},
    {.path = "models",
     .type = CFG_TYPE_NAMES,
     .offset = offsetof(cfg_app, models),
     .count_offset = offsetof(cfg_app, n_models),
     .default_value = "[]",
     NO_HAS,
     .doc = "models the app may use; empty = all"},
    {.path = "max_priority",
     .type = CFG_TYPE_PRIORITY,
     .offset = offsetof(cfg_app, max_priority),
     .default_value = "interactive",
     NO_HAS,
     .doc = "highest class the app may ask for (a request above it is refused; one naming no "
            "class runs at most at it)"},
    {.path = "admin",
     .type = CFG_TYPE_BOOL,
     .offset = offsetof(cfg_app, admin),
     .default_value = "false",
     NO_HAS,
     .doc = "may Load, Unload, Pin and Unpin models"},
    {.path = "max_concurrent",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg_app, max_concurrent),
     .min = 0,
     .max = 100000,
     .default_value = "0",
     NO_HAS,
     .doc = "Generate requests of the app in flight at once (0: only limits.queue_per_app)"},
    {.path = "requests_per_minute",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg_app, requests_per_minute),
     .min = 0,
     .max = 6000000,
     .default_value = "0",
     NO_HAS,
     .doc = "requests (all but Status and ListModels) per minute, in bursts of up to as many "
            "(0: no limit)"},
    {.path = "max_tokens",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg_app, max_tokens),
     .min = 0,
     .max = 1 << 20,
     .default_value = "0",
     NO_HAS,
     .doc = "tokens one Generate may ask for; a request naming no limit gets at most this many "
            "(0: no limit)"},
    {.path = "sanitizer",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_app, sanitizer),
     NO_HAS,
     .doc = "sanitizer profile for the app's requests, instead of each model's"},
};
static const cfg_table app_table = {app_options, N_OF(app_options)};

static const cfg_option sanitizer_options[] = {
    {.path = "name",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_sanitizer, name),
     .required = true,
     NO_HAS,
     .doc = "the profile's name (models' and apps' `sanitizer`, Generate.sanitizer)"},
    {.path = "steps",
     .type = CFG_TYPE_STEPS,
     .offset = offsetof(cfg_sanitizer, steps),
     .count_offset = offsetof(cfg_sanitizer, n_steps),
     .default_value = "[]",
     NO_HAS,
     .doc = "in order: utf8 {mode: reject|repair}, invisible {}, special_tokens {mode: "
            "keep|strip}, max_input {bytes, tokens}, deny {NAME: REGEX, ...}, normalize_space "
            "{trim, collapse, max_newlines}, regex {pattern}, plugin {path, ...settings}"},
};
static const cfg_table sanitizer_table = {sanitizer_options, N_OF(sanitizer_options)};

static const cfg_option http_key_options[] = {
    {.path = "key_file",
     .type = CFG_TYPE_PATH,
     .offset = offsetof(cfg_http_key, key_file),
     .required = true,
     NO_HAS,
     .doc = "file whose first line is the bearer key (at least 16 bytes); relative to this "
            "file's folder"},
    {.path = "app",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg_http_key, app),
     .required = true,
     NO_HAS,
     .doc = "the app the key's requests run as (its rules in `apps` apply)"},
};
static const cfg_table http_key_table = {http_key_options, N_OF(http_key_options)};

static const cfg_option root_options[] = {
    {.path = "listen",
     .type = CFG_TYPE_ENDPOINTS,
     .offset = offsetof(cfg, listen),
     .count_offset = offsetof(cfg, n_listen),
     .default_value = "[]",
     NO_HAS,
     .doc = "endpoints to bind: ipc://ABSOLUTE/PATH or tcp://127.0.0.1:PORT; empty means "
            "ipc://$XDG_RUNTIME_DIR/corral/corral.sock (or /tmp/corral-$UID/corral.sock)"},
    {.path = "log_level",
     .type = CFG_TYPE_LOG_LEVEL,
     .offset = offsetof(cfg, log_level),
     .default_value = "info",
     NO_HAS,
     .doc = "error, warn, info, debug or trace; CORRAL_LOG_LEVEL and --log-level override it"},
    {.path = "threads",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, threads),
     .min = 0,
     .max = 1024,
     .default_value = "0",
     NO_HAS,
     .doc = "compute threads shared by all models; 0 = one per physical core"},
    {.path = "limits.max_message_bytes",
     .type = CFG_TYPE_BYTES,
     .offset = offsetof(cfg, max_message_bytes),
     .min = 1024,
     .max = 256ll << 20,
     .default_value = "1MiB",
     NO_HAS,
     .doc = "largest request message accepted; a larger one gets an Error, and one over 4 times "
            "this (at most 64 MiB more) makes the transport drop the connection"},
    {.path = "limits.queue_per_model",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, queue_per_model),
     .min = 1,
     .max = 100000,
     .default_value = "64",
     NO_HAS,
     .doc = "requests waiting or running per model before RESOURCE_EXHAUSTED"},
    {.path = "limits.queue_per_app",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, queue_per_app),
     .min = 1,
     .max = 100000,
     .default_value = "64",
     NO_HAS,
     .doc = "requests waiting or running per app before RESOURCE_EXHAUSTED"},
    {.path = "limits.active_per_model",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, active_per_model),
     .min = 1,
     .max = 1024,
     .default_value = "8",
     NO_HAS,
     .doc = "requests of one model computed at once, batched into one forward pass a step"},
    {.path = "limits.stall_timeout_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, stall_timeout_ms),
     .min = 100,
     .max = 86400000,
     .default_value = "30000",
     NO_HAS,
     .doc = "a stream whose client stopped reading is paused, then cancelled after this"},
    {.path = "limits.peer_timeout_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, peer_timeout_ms),
     .min = 100,
     .max = 86400000,
     .default_value = "30000",
     NO_HAS,
     .doc = "requests of a client silent for this long (no ping, no request) are cancelled"},
    {.path = "limits.session_ttl_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, session_ttl_ms),
     .min = 1000,
     .max = 30ll * 86400000,
     .default_value = "600000",
     NO_HAS,
     .doc = "idle sessions (and their KV caches) are dropped after this"},
    {.path = "limits.max_sessions",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, max_sessions),
     .min = 0,
     .max = 100000,
     .default_value = "256",
     NO_HAS,
     .doc = "sessions kept at once; the least recently used goes first"},
    {.path = "limits.prefill_chunk",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, prefill_chunk),
     .min = 1,
     .max = 8192,
     .default_value = "64",
     NO_HAS,
     .doc = "prompt tokens per step (beside the other requests' next tokens): smaller keeps "
            "steps short, so urgent requests cut in sooner"},
    {.path = "limits.memory_wait_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, memory_wait_ms),
     .min = 0,
     .max = 86400000,
     .default_value = "30000",
     NO_HAS,
     .doc = "a request without a deadline waits this long for memory when nothing can be evicted, "
            "then fails with RESOURCE_EXHAUSTED"},
    {.path = "memory.limit",
     .type = CFG_TYPE_MEMORY,
     .offset = offsetof(cfg, memory_limit),
     .min = 1 << 20,
     .max = INT64_MAX,
     .default_value = "50%",
     NO_HAS,
     .doc = "memory budget for models and their state: bytes (4GiB) or a share of RAM (50%)"},
    {.path = "memory.high_watermark",
     .type = CFG_TYPE_DOUBLE,
     .offset = offsetof(cfg, high_watermark),
     .fmin = 0.05,
     .fmax = 1.0,
     .default_value = "0.85",
     NO_HAS,
     .doc = "fraction of the limit at which eviction starts"},
    {.path = "memory.low_watermark",
     .type = CFG_TYPE_DOUBLE,
     .offset = offsetof(cfg, low_watermark),
     .fmin = 0.01,
     .fmax = 1.0,
     .default_value = "0.70",
     NO_HAS,
     .doc = "fraction of the limit eviction brings memory down to"},
    {.path = "memory.swap_dir",
     .type = CFG_TYPE_PATH,
     .offset = offsetof(cfg, swap_dir),
     .default_shown = "$XDG_STATE_HOME/corral/swap",
     NO_HAS,
     .doc = "where swapped-out state is written (an SSD is best); by default the user's own "
            "(~/.local/state/corral/swap without XDG_STATE_HOME), made with mode 0700"},
    {.path = "memory.policy",
     .type = CFG_TYPE_POLICY,
     .offset = offsetof(cfg, evict_policy),
     .default_value = "lru",
     NO_HAS,
     .doc = "what goes first when room is needed: lru (least recently used) or lru-cost (idle "
            "time weighed by the cost of bringing it back)"},
    {.path = "cache.dir",
     .type = CFG_TYPE_PATH,
     .offset = offsetof(cfg, cache_dir),
     .default_shown = "$XDG_CACHE_HOME/corral",
     NO_HAS,
     .doc = "where merged (LoRA) variants and weights rearranged for the kernels are kept; by "
            "default the user's own (~/.cache/corral without XDG_CACHE_HOME), mode 0700"},
    {.path = "cache.limit",
     .type = CFG_TYPE_BYTES,
     .offset = offsetof(cfg, cache_limit),
     .min = 0,
     .max = INT64_MAX,
     .default_value = "32GiB",
     NO_HAS,
     .doc = "size of cache.dir: the least recently used images are removed beyond it (0: none)"},
    {.path = "auth.owner",
     .type = CFG_TYPE_BOOL,
     .offset = offsetof(cfg, auth_owner),
     .default_value = "true",
     NO_HAS,
     .doc = "ipc clients running as corrald's own user, when no app lists that uid, are its "
            "owner: every model, admin operations, any app; false: they are refused too"},
    {.path = "auth.server_key_file",
     .type = CFG_TYPE_PATH,
     .offset = offsetof(cfg, server_key_file),
     NO_HAS,
     .doc = "corrald's CURVE secret key (z85, `corral keygen`; not readable by other users): "
            "required by tcp endpoints, whose clients must hold a key of apps[].curve_keys"},
    {.path = "auth.default_app",
     .type = CFG_TYPE_STRING,
     .offset = offsetof(cfg, default_app),
     NO_HAS,
     .doc = "the app (of `apps`) whose rules apply to requests a front end takes without knowing "
            "who sent them (HTTP requests without a key, from loopback); unset: every model up "
            "to interactive, no admin operation"},
    {.path = "sanitizers",
     .type = CFG_TYPE_LIST,
     .offset = offsetof(cfg, sanitizers),
     .count_offset = offsetof(cfg, n_sanitizers),
     .item_table = &sanitizer_table,
     .item_size = sizeof(cfg_sanitizer),
     .default_value = "[]",
     NO_HAS,
     .doc = "input sanitizer profiles (name, steps) that models and apps name"},
    {.path = "http.listen",
     .type = CFG_TYPE_NAMES,
     .offset = offsetof(cfg, http_listen),
     .count_offset = offsetof(cfg, n_http_listen),
     .default_value = "[]",
     NO_HAS,
     .doc = "addresses of the OpenAI- and Ollama-compatible HTTP API (HOST:PORT, e.g. "
            "127.0.0.1:11435 or [::1]:11435); empty = off. Non-loopback addresses need http.keys"},
    {.path = "http.keys",
     .type = CFG_TYPE_LIST,
     .offset = offsetof(cfg, http_keys),
     .count_offset = offsetof(cfg, n_http_keys),
     .item_table = &http_key_table,
     .item_size = sizeof(cfg_http_key),
     .default_value = "[]",
     NO_HAS,
     .doc = "bearer keys ({key_file, app}); clients without a key are served as the default app "
            "from loopback only"},
    {.path = "http.cors",
     .type = CFG_TYPE_NAMES,
     .offset = offsetof(cfg, http_cors),
     .count_offset = offsetof(cfg, n_http_cors),
     .default_value = "[]",
     NO_HAS,
     .doc = "origins browsers may call the API from (e.g. http://localhost:3000, or *)"},
    {.path = "http.max_body_bytes",
     .type = CFG_TYPE_BYTES,
     .offset = offsetof(cfg, http_max_body_bytes),
     .min = 1024,
     .max = 256ll << 20,
     .default_value = "1MiB",
     NO_HAS,
     .doc = "largest request body accepted (HTTP 413 beyond)"},
    {.path = "http.request_timeout_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, http_request_timeout_ms),
     .min = 100,
     .max = 3600000,
     .default_value = "10000",
     NO_HAS,
     .doc = "time a client has to send a request's body once its headers are in (slower "
            "clients are disconnected)"},
    {.path = "http.idle_timeout_ms",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, http_idle_timeout_ms),
     .min = 1000,
     .max = 3600000,
     .default_value = "60000",
     NO_HAS,
     .doc = "an idle keep-alive connection, or one still sending a request's headers, is closed "
            "after this"},
    {.path = "http.max_connections",
     .type = CFG_TYPE_INT,
     .offset = offsetof(cfg, http_max_connections),
     .min = 1,
     .max = 65536,
     .default_value = "512",
     NO_HAS,
     .doc = "connections served at once; beyond it new ones are closed at once"},
    {.path = "models",
     .type = CFG_TYPE_LIST,
     .offset = offsetof(cfg, models),
     .count_offset = offsetof(cfg, n_models),
     .item_table = &model_table,
     .item_size = sizeof(cfg_model),
     .default_value = "[]",
     NO_HAS,
     .doc = "the models served (name, path, context, kv_type, priority, pin, preload, ttl_ms, "
            "template, adapters: [{path, scale}], quantize, defaults: {temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty, "
            "frequency_penalty, penalty_last_n, max_tokens})"},
    {.path = "apps",
     .type = CFG_TYPE_LIST,
     .offset = offsetof(cfg, apps),
     .count_offset = offsetof(cfg, n_apps),
     .item_table = &app_table,
     .item_size = sizeof(cfg_app),
     .default_value = "[]",
     NO_HAS,
     .doc = "the apps that connect: who each is (uids, gids, curve_keys) and what it may do "
            "(models, max_priority, admin, max_concurrent, requests_per_minute, max_tokens, "
            "sanitizer); any other client is refused, except corrald's owner (auth.owner)"},
};
static const cfg_table root_table = {root_options, N_OF(root_options)};

/* ---- names of enumerations ---------------------------------------------------------------- */

static const char *const priority_names[] = {
    [CFG_PRIORITY_BACKGROUND] = "background",
    [CFG_PRIORITY_INTERACTIVE] = "interactive",
    [CFG_PRIORITY_REALTIME] = "realtime",
};

const char *cfg_priority_name(cfg_priority p) {
    return p >= CFG_PRIORITY_BACKGROUND && p <= CFG_PRIORITY_REALTIME ? priority_names[p] : NULL;
}

static const char *const overflow_names[] = {
    [CFG_OVERFLOW_TRUNCATE_OLDEST] = "truncate_oldest",
    [CFG_OVERFLOW_ERROR] = "error",
};

const char *cfg_overflow_name(cfg_overflow o) {
    return (size_t)o < N_OF(overflow_names) ? overflow_names[o] : NULL;
}

/* ---- value parsers: each returns NULL on success or a description of what was wanted ------- */

static const char *parse_bytes(const char *text, uint64_t *out) {
    const char *want = "a byte size such as 1048576, 512KiB, 1MiB or 4GiB";
    if (!text[0] || text[0] == '-') return want;
    errno = 0;
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text || errno == ERANGE) return want;
    while (*end == ' ') end++;
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0},     {"B", 0},   {"K", 10},   {"KB", 10}, {"KiB", 10},
                 {"M", 20},   {"MB", 20}, {"MiB", 20}, {"G", 30},  {"GB", 30},
                 {"GiB", 30}, {"T", 40},  {"TB", 40},  {"TiB", 40}};
    for (size_t i = 0; i < N_OF(units); i++) {
        if (strcmp(end, units[i].suffix) != 0) continue;
        if (units[i].shift && value > (UINT64_MAX >> units[i].shift)) return want;
        *out = (uint64_t)value << units[i].shift;
        return NULL;
    }
    return want;
}

static uint64_t machine_ram_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

static const char *parse_memory(const char *text, uint64_t *out) {
    size_t len = strlen(text);
    if (len > 1 && text[len - 1] == '%') {
        char *end;
        errno = 0;
        double pct = strtod(text, &end);
        if (end != text + len - 1 || errno || !(pct > 0 && pct <= 100))
            return "a share of RAM between 0% and 100%, or a byte size";
        *out = (uint64_t)((double)machine_ram_bytes() * pct / 100.0);
        return NULL;
    }
    return parse_bytes(text, out) ? "a byte size (4GiB) or a share of RAM (50%)" : NULL;
}

static const char *parse_int(const char *text, int64_t *out) {
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno == ERANGE) return "an integer";
    *out = v;
    return NULL;
}

static const char *parse_double(const char *text, double *out) {
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(v)) return "a number";
    *out = v;
    return NULL;
}

/* ---- the loader ----------------------------------------------------------------------------- */

typedef struct cfg_loader {
    yaml_document_t *doc;
    const char *name;     /* file name for messages */
    const char *base_dir; /* for relative paths; NULL = as given */
    corral_error *err;    /* the first problem */
    cfg_report *report;   /* every problem, or NULL */
    size_t n_problems;
} cfg_loader;

void cfg_report_add(cfg_report *r, const char *fmt, ...) {
    if (!r) return;
    char line[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->n == r->cap) {
        const size_t cap = r->cap ? r->cap * 2 : 8;
        char **grown = realloc(r->problems, cap * sizeof *grown);
        if (!grown) return; /* out of memory: the first problem is in err all the same */
        r->problems = grown;
        r->cap = cap;
    }
    if ((r->problems[r->n] = strdup(line))) r->n++;
}

void cfg_report_free(cfg_report *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free(r->problems[i]);
    free(r->problems);
    *r = (cfg_report){0};
}

/* Record a problem at node: the first goes to err, every one to the report. The walk goes on
 * past it where it can, so that one run names every mistake of a file. */
void cfg_report_problem(cfg_report *r, corral_error *err, size_t *count, const char *line) {
    if ((*count)++ == 0) corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s", line);
    cfg_report_add(r, "%s", line);
}

static corral_status cfg_fail(cfg_loader *ld, const yaml_node_t *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static corral_status cfg_fail(cfg_loader *ld, const yaml_node_t *node, const char *fmt, ...) {
    char what[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char line[CORRAL_ERROR_MESSAGE_MAX + 64]; /* (cut to the message size when kept) */
    snprintf(line, sizeof line, "%s:%zu:%zu: %s", ld->name, node->start_mark.line + 1,
             node->start_mark.column + 1, what);
    cfg_report_problem(ld->report, ld->err, &ld->n_problems, line);
    return CORRAL_INVALID_ARGUMENT;
}

static corral_status cfg_oom(cfg_loader *ld) {
    return corral_error_set(ld->err, CORRAL_OUT_OF_MEMORY, "out of memory reading %s", ld->name);
}

static const cfg_option *cfg_find_option(const cfg_table *t, const char *path) {
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->options[i].path, path) == 0) return &t->options[i];
    return NULL;
}

static int cfg_is_section(const cfg_table *t, const char *path) {
    size_t len = strlen(path);
    for (size_t i = 0; i < t->n; i++)
        if (strncmp(t->options[i].path, path, len) == 0 && t->options[i].path[len] == '.') return 1;
    return 0;
}

static const char *node_kind(const yaml_node_t *node) {
    switch (node->type) {
        case YAML_SCALAR_NODE:
            return node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? "a plain value"
                                                                      : "a quoted string";
        case YAML_SEQUENCE_NODE:
            return "a list";
        case YAML_MAPPING_NODE:
            return "a mapping";
        default:
            return "nothing";
    }
}

static const char *scalar_text(const yaml_node_t *node) {
    return (const char *)node->data.scalar.value;
}

static void free_string_list(char **list, size_t n) {
    for (size_t i = 0; i < n; i++) free(list[i]);
    free(list);
}

static void cfg_free_fields(const cfg_table *t, void *base);

/* The nodes of a value that may be one scalar or a list of scalars. */
static corral_status scalar_items(cfg_loader *ld, const cfg_option *opt, yaml_node_t *node,
                                  yaml_node_t ***items, size_t *n, const char *want) {
    *n = 0;
    *items = NULL;
    if (node->type == YAML_SCALAR_NODE) {
        if (scalar_text(node)[0] == '\0' && node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
            return CORRAL_OK; /* "key:" with nothing: an empty list */
        *items = malloc(sizeof **items);
        if (!*items) return cfg_oom(ld);
        (*items)[(*n)++] = node;
        return CORRAL_OK;
    }
    if (node->type != YAML_SEQUENCE_NODE)
        return cfg_fail(ld, node, "%s: expected %s or a list of them, got %s", opt->path, want,
                        node_kind(node));
    size_t count = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    *items = malloc((count ? count : 1) * sizeof **items);
    if (!*items) return cfg_oom(ld);
    for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(ld->doc, *it);
        if (item->type != YAML_SCALAR_NODE) {
            free(*items);
            *items = NULL;
            return cfg_fail(ld, item, "%s: expected %s, got %s", opt->path, want, node_kind(item));
        }
        (*items)[(*n)++] = item;
    }
    return CORRAL_OK;
}

/* ENDPOINTS and NAMES: a list of strings, each checked. */
static corral_status cfg_set_strings(cfg_loader *ld, const cfg_option *opt, void *base,
                                     yaml_node_t *node) {
    const bool endpoints = opt->type == CFG_TYPE_ENDPOINTS;
    yaml_node_t **items;
    size_t n;
    corral_status st =
        scalar_items(ld, opt, node, &items, &n, endpoints ? "an endpoint" : "a name");
    if (st != CORRAL_OK) return st;
    char **list = calloc(n ? n : 1, sizeof *list);
    if (!list) {
        free(items);
        return cfg_oom(ld);
    }
    for (size_t i = 0; i < n && st == CORRAL_OK; i++) {
        const char *text = scalar_text(items[i]);
        corral_error why;
        if (endpoints && endpoint_validate(text, &why) != CORRAL_OK)
            st = cfg_fail(ld, items[i], "%s: %s", opt->path, why.message);
        else if (!endpoints && !text[0])
            st = cfg_fail(ld, items[i], "%s: empty name", opt->path);
        else if (!(list[i] = strdup(text)))
            st = cfg_oom(ld);
    }
    free(items);
    if (st != CORRAL_OK) {
        free_string_list(list, n);
        return st;
    }
    char ***field = (char ***)((char *)base + opt->offset);
    size_t *count = (size_t *)((char *)base + opt->count_offset);
    free_string_list(*field, *count);
    *field = list;
    *count = n;
    return CORRAL_OK;
}

/* IDS: a list of numeric user or group ids. */
static corral_status cfg_set_ids(cfg_loader *ld, const cfg_option *opt, void *base,
                                 yaml_node_t *node) {
    yaml_node_t **items;
    size_t n;
    corral_status st = scalar_items(ld, opt, node, &items, &n, "a numeric id");
    if (st != CORRAL_OK) return st;
    uint32_t *ids = calloc(n ? n : 1, sizeof *ids);
    if (!ids) {
        free(items);
        return cfg_oom(ld);
    }
    for (size_t i = 0; i < n && st == CORRAL_OK; i++) {
        int64_t v;
        const char *text = scalar_text(items[i]);
        /* (uid_t)-1 means "no change" to the kernel: it names nobody. */
        if (parse_int(text, &v) || v < 0 || v >= UINT32_MAX)
            st = cfg_fail(ld, items[i], "%s: expected a numeric id (`id -u NAME`), got '%s'",
                          opt->path, text);
        else
            ids[i] = (uint32_t)v;
    }
    free(items);
    if (st != CORRAL_OK) {
        free(ids);
        return st;
    }
    uint32_t **field = (uint32_t **)((char *)base + opt->offset);
    size_t *count = (size_t *)((char *)base + opt->count_offset);
    free(*field);
    *field = ids;
    *count = n;
    return CORRAL_OK;
}

static corral_status cfg_walk_mapping(cfg_loader *ld, const cfg_table *t, void *base,
                                      yaml_node_t *map, const char *prefix);
static corral_status cfg_apply_defaults(const cfg_table *t, void *base, corral_error *err);

/* Where a model entry and the keys that later checks name are (cfg_model's marks). */
static void cfg_model_marks(cfg_loader *ld, cfg_model *m, const yaml_node_t *item) {
    m->cfg_line = (int)item->start_mark.line + 1;
    m->at = (cfg_pos){(int)item->start_mark.line + 1, (int)item->start_mark.column + 1};
    m->at_path = m->at_context = m->at_template = m->at;
    for (yaml_node_pair_t *pair = item->data.mapping.pairs.start;
         pair < item->data.mapping.pairs.top; pair++) {
        const yaml_node_t *key = yaml_document_get_node(ld->doc, pair->key);
        const yaml_node_t *value = yaml_document_get_node(ld->doc, pair->value);
        if (key->type != YAML_SCALAR_NODE) continue;
        const cfg_pos at = {(int)value->start_mark.line + 1, (int)value->start_mark.column + 1};
        if (strcmp(scalar_text(key), "path") == 0) m->at_path = at;
        if (strcmp(scalar_text(key), "context") == 0) m->at_context = at;
        if (strcmp(scalar_text(key), "template") == 0) m->at_template = at;
    }
}

/* LIST: a sequence of mappings; each item starts from the item table's defaults. */
static corral_status cfg_set_list(cfg_loader *ld, const cfg_option *opt, void *base,
                                  yaml_node_t *node) {
    if (node->type == YAML_SCALAR_NODE && scalar_text(node)[0] == '\0' &&
        node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        node = NULL; /* "models:" with nothing after it */
    } else if (node->type != YAML_SEQUENCE_NODE) {
        return cfg_fail(ld, node, "%s: expected a list of mappings, got %s", opt->path,
                        node_kind(node));
    }
    const cfg_table *it = opt->item_table;
    size_t n = node ? (size_t)(node->data.sequence.items.top - node->data.sequence.items.start) : 0;
    char *items = calloc(n ? n : 1, opt->item_size);
    if (!items) return cfg_oom(ld);
    /* Every entry is walked, whatever failed before it: one run reports every problem. */
    corral_status first = CORRAL_OK;
    size_t done = 0;
    for (; done < n && first != CORRAL_OUT_OF_MEMORY; done++) {
        yaml_node_t *item = yaml_document_get_node(ld->doc, node->data.sequence.items.start[done]);
        void *ib = items + done * opt->item_size;
        corral_status st = CORRAL_OK;
        if (item->type != YAML_MAPPING_NODE) {
            st = cfg_fail(ld, item, "%s: each entry must be a mapping, got %s", opt->path,
                          node_kind(item));
            if (first == CORRAL_OK) first = st;
            continue;
        }
        st = cfg_apply_defaults(it, ib, ld->err);
        if (st == CORRAL_OK) st = cfg_walk_mapping(ld, it, ib, item, "");
        /* The other checks of the entry still run after a bad key (not after no memory). */
        corral_status walked = st;
        if (st == CORRAL_INVALID_ARGUMENT) st = CORRAL_OK;
        /* Required keys. */
        for (size_t k = 0; st == CORRAL_OK && k < it->n; k++) {
            const cfg_option *o = &it->options[k];
            if (o->required && !*(char **)((char *)ib + o->offset))
                st = cfg_fail(ld, item, "%s: entry %zu lacks the required key '%s'", opt->path,
                              done + 1, o->path);
        }
        /* Names are unique within a list (every list item table starts with `name`). */
        const char *name = *(char **)((char *)ib + it->options[0].offset);
        for (size_t k = 0; st == CORRAL_OK && name && k < done; k++) {
            const char *other = *(char **)(items + k * opt->item_size + it->options[0].offset);
            if (other && strcmp(name, other) == 0)
                st = cfg_fail(ld, item, "%s: '%s' is listed twice", opt->path, name);
        }
        if (it == &model_table) cfg_model_marks(ld, (cfg_model *)ib, item);
        if (st == CORRAL_OK) st = walked;
        if (first == CORRAL_OK || st == CORRAL_OUT_OF_MEMORY) first = st;
    }
    if (first == CORRAL_OUT_OF_MEMORY) {
        for (size_t k = 0; k < (done < n ? done + 1 : n); k++)
            cfg_free_fields(it, items + k * opt->item_size);
        free(items);
        return first;
    }
    /* With problems too the entries are kept (a key that failed left its default, or NULL): the
     * load fails, but the checks that read entries still run over them first, so that one run
     * reports every problem. */
    void **field = (void **)((char *)base + opt->offset);
    size_t *count = (size_t *)((char *)base + opt->count_offset);
    for (size_t k = 0; k < *count; k++) cfg_free_fields(it, (char *)*field + k * opt->item_size);
    free(*field);
    *field = items;
    *count = n;
    return first;
}

static void free_steps(cfg_policy_step *steps, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(steps[i].kind);
        free(steps[i].path);
        for (size_t k = 0; k < steps[i].n_params; k++) {
            free(steps[i].params[k].key);
            free(steps[i].params[k].value);
        }
        free(steps[i].params);
    }
    free(steps);
}

/* STEPS: `- kind: {key: value, ...}` (or `- kind:` with no settings). The settings are kept as
 * strings; the policies module checks them when the profile is built. A plugin's `path` is
 * resolved against the config file's folder. */
static corral_status cfg_set_steps(cfg_loader *ld, const cfg_option *opt, void *base,
                                   yaml_node_t *node) {
    if (node->type == YAML_SCALAR_NODE && !scalar_text(node)[0]) node = NULL;
    else if (node->type != YAML_SEQUENCE_NODE)
        return cfg_fail(ld, node, "%s: expected a list of steps, got %s", opt->path,
                        node_kind(node));
    size_t n = node ? (size_t)(node->data.sequence.items.top - node->data.sequence.items.start) : 0;
    cfg_policy_step *steps = calloc(n ? n : 1, sizeof *steps);
    if (!steps) return cfg_oom(ld);
    corral_status st = CORRAL_OK;
    for (size_t i = 0; i < n && st == CORRAL_OK; i++) {
        yaml_node_t *item = yaml_document_get_node(ld->doc, node->data.sequence.items.start[i]);
        if (item->type != YAML_MAPPING_NODE ||
            item->data.mapping.pairs.top - item->data.mapping.pairs.start != 1) {
            st = cfg_fail(ld, item, "%s: each step is a mapping with one key, the step's kind "
                                    "(e.g. `- utf8: {mode: reject}`)",
                          opt->path);
            break;
        }
        yaml_node_t *key = yaml_document_get_node(ld->doc, item->data.mapping.pairs.start->key);
        yaml_node_t *val = yaml_document_get_node(ld->doc, item->data.mapping.pairs.start->value);
        if (key->type != YAML_SCALAR_NODE || !scalar_text(key)[0]) {
            st = cfg_fail(ld, key, "%s: a step's kind must be a name", opt->path);
            break;
        }
        if (!(steps[i].kind = strdup(scalar_text(key)))) {
            st = cfg_oom(ld);
            break;
        }
        if (val->type == YAML_SCALAR_NODE && !scalar_text(val)[0]) continue; /* no settings */
        if (val->type != YAML_MAPPING_NODE) {
            st = cfg_fail(ld, val, "%s: the settings of step '%s' must be a mapping, got %s",
                          opt->path, steps[i].kind, node_kind(val));
            break;
        }
        size_t np = (size_t)(val->data.mapping.pairs.top - val->data.mapping.pairs.start);
        steps[i].params = calloc(np ? np : 1, sizeof *steps[i].params);
        if (!steps[i].params) {
            st = cfg_oom(ld);
            break;
        }
        for (size_t k = 0; k < np && st == CORRAL_OK; k++) {
            yaml_node_t *pk = yaml_document_get_node(ld->doc, val->data.mapping.pairs.start[k].key);
            yaml_node_t *pv =
                yaml_document_get_node(ld->doc, val->data.mapping.pairs.start[k].value);
            if (pk->type != YAML_SCALAR_NODE || pv->type != YAML_SCALAR_NODE) {
                st = cfg_fail(ld, pv, "%s: step '%s': settings are `name: value` pairs",
                              opt->path, steps[i].kind);
                break;
            }
            const char *pkey = scalar_text(pk), *pval = scalar_text(pv);
            if (strcmp(steps[i].kind, "plugin") == 0 && strcmp(pkey, "path") == 0) {
                char joined[PATH_MAX];
                corral_error why;
                if (paths_join(ld->base_dir, pval, joined, sizeof joined, &why) != CORRAL_OK)
                    st = cfg_fail(ld, pv, "%s: step 'plugin': %s", opt->path, why.message);
                else if (!(steps[i].path = strdup(joined)))
                    st = cfg_oom(ld);
                continue;
            }
            cfg_policy_param *pp = &steps[i].params[steps[i].n_params++];
            if (!(pp->key = strdup(pkey)) || !(pp->value = strdup(pval))) st = cfg_oom(ld);
        }
        if (st == CORRAL_OK && strcmp(steps[i].kind, "plugin") == 0 && !steps[i].path)
            st = cfg_fail(ld, val, "%s: step 'plugin' needs a `path`", opt->path);
    }
    if (st != CORRAL_OK) {
        free_steps(steps, n);
        return st;
    }
    cfg_policy_step **field = (cfg_policy_step **)((char *)base + opt->offset);
    size_t *count = (size_t *)((char *)base + opt->count_offset);
    free_steps(*field, *count);
    *field = steps;
    *count = n;
    return CORRAL_OK;
}

static corral_status cfg_set_option(cfg_loader *ld, const cfg_option *opt, void *base,
                                    yaml_node_t *node) {
    void *field = (char *)base + opt->offset;
    switch (opt->type) {
        case CFG_TYPE_STEPS:
            return cfg_set_steps(ld, opt, base, node);
        case CFG_TYPE_ENDPOINTS:
        case CFG_TYPE_NAMES:
            return cfg_set_strings(ld, opt, base, node);
        case CFG_TYPE_IDS:
            return cfg_set_ids(ld, opt, base, node);
        case CFG_TYPE_LIST:
            return cfg_set_list(ld, opt, base, node);
        default:
            break;
    }
    if (node->type != YAML_SCALAR_NODE)
        return cfg_fail(ld, node, "%s: expected a single value, got %s", opt->path,
                        node_kind(node));
    const char *text = scalar_text(node);
    const bool plain = node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    if (!plain && opt->type != CFG_TYPE_STRING && opt->type != CFG_TYPE_PATH)
        return cfg_fail(ld, node, "%s: expected a plain value, got a quoted string", opt->path);
    const char *want = NULL;
    switch (opt->type) {
        case CFG_TYPE_BYTES:
        case CFG_TYPE_MEMORY: {
            uint64_t value;
            want = opt->type == CFG_TYPE_BYTES ? parse_bytes(text, &value)
                                               : parse_memory(text, &value);
            if (want) break;
            if (value < (uint64_t)opt->min || value > (uint64_t)opt->max)
                return cfg_fail(ld, node, "%s: %s is out of range [%lld, %lld] bytes", opt->path,
                                text, (long long)opt->min, (long long)opt->max);
            *(uint64_t *)field = value;
            break;
        }
        case CFG_TYPE_INT: {
            int64_t value;
            if ((want = parse_int(text, &value))) break;
            if (value < opt->min || value > opt->max)
                return cfg_fail(ld, node, "%s: %s is out of range [%lld, %lld]", opt->path, text,
                                (long long)opt->min, (long long)opt->max);
            *(int64_t *)field = value;
            break;
        }
        case CFG_TYPE_FLOAT:
        case CFG_TYPE_DOUBLE: {
            double value;
            if ((want = parse_double(text, &value))) break;
            if (value < opt->fmin || value > opt->fmax)
                return cfg_fail(ld, node, "%s: %s is out of range [%g, %g]", opt->path, text,
                                opt->fmin, opt->fmax);
            if (opt->type == CFG_TYPE_FLOAT)
                *(float *)field = (float)value;
            else
                *(double *)field = value;
            break;
        }
        case CFG_TYPE_BOOL:
            if (strcmp(text, "true") == 0)
                *(bool *)field = true;
            else if (strcmp(text, "false") == 0)
                *(bool *)field = false;
            else
                want = "true or false";
            break;
        case CFG_TYPE_STRING:
        case CFG_TYPE_PATH: {
            if (!text[0]) return cfg_fail(ld, node, "%s: must not be empty", opt->path);
            char *copy;
            if (opt->type == CFG_TYPE_PATH) {
                /* Relative to the file's folder, spelled without the `dir/..` detours. */
                char joined[PATH_MAX];
                corral_error why;
                if (paths_join(ld->base_dir, text, joined, sizeof joined, &why) != CORRAL_OK)
                    return cfg_fail(ld, node, "%s: %s", opt->path, why.message);
                copy = strdup(joined);
            } else {
                copy = strdup(text);
            }
            if (!copy) return cfg_oom(ld);
            free(*(char **)field);
            *(char **)field = copy;
            break;
        }
        case CFG_TYPE_LOG_LEVEL: {
            log_level level;
            if (log_level_parse(text, &level) != 0)
                want = "one of error, warn, info, debug, trace";
            else
                *(log_level *)field = level;
            break;
        }
        case CFG_TYPE_PRIORITY: {
            want = "one of background, interactive, realtime";
            for (int p = CFG_PRIORITY_BACKGROUND; p <= CFG_PRIORITY_REALTIME; p++)
                if (strcmp(text, priority_names[p]) == 0) {
                    *(cfg_priority *)field = (cfg_priority)p;
                    want = NULL;
                }
            break;
        }
        case CFG_TYPE_POLICY: {
            if (!evict_policy_find(text)) {
                return cfg_fail(ld, node, "%s: expected one of %s, got '%s'", opt->path,
                                evict_policy_names(), text);
            }
            char *copy = strdup(text);
            if (!copy) return cfg_oom(ld);
            free(*(char **)field);
            *(char **)field = copy;
            break;
        }
        case CFG_TYPE_KV_TYPE:
            if (strcmp(text, "f16") == 0)
                *(bool *)field = false;
            else if (strcmp(text, "f32") == 0)
                *(bool *)field = true;
            else
                want = "f16 or f32";
            break;
        case CFG_TYPE_OVERFLOW:
            want = "truncate_oldest or error";
            for (size_t o = 0; o < N_OF(overflow_names); o++)
                if (strcmp(text, overflow_names[o]) == 0) {
                    *(cfg_overflow *)field = (cfg_overflow)o;
                    want = NULL;
                }
            break;
        case CFG_TYPE_ENDPOINTS:
        case CFG_TYPE_NAMES:
        case CFG_TYPE_IDS:
        case CFG_TYPE_LIST:
        case CFG_TYPE_STEPS:
            break;
    }
    if (want) return cfg_fail(ld, node, "%s: expected %s, got '%s'", opt->path, want, text);
    if (opt->has_offset >= 0) *(bool *)((char *)base + opt->has_offset) = true;
    return CORRAL_OK;
}

/* "unknown key 'limits.max_mesage_bytes' (did you mean 'limits.max_message_bytes'?)": the
 * table's keys and sections are the candidates. */
static corral_status cfg_unknown_key(cfg_loader *ld, const cfg_table *t, const yaml_node_t *key,
                                     const char *path) {
    const char *names[2 * 64];
    char sections[64][128];
    size_t n = 0, n_sections = 0;
    for (size_t i = 0; i < t->n && n < sizeof names / sizeof names[0]; i++) {
        names[n++] = t->options[i].path;
        /* Its section ("limits" of "limits.queue_per_model"), once. */
        const char *dot = strchr(t->options[i].path, '.');
        if (!dot || n_sections == sizeof sections / sizeof sections[0]) continue;
        const int len = (int)(dot - t->options[i].path);
        bool seen = false;
        for (size_t k = 0; k < n_sections && !seen; k++)
            seen = strncmp(sections[k], t->options[i].path, (size_t)len) == 0 &&
                   sections[k][len] == '\0';
        if (seen || n == sizeof names / sizeof names[0]) continue;
        snprintf(sections[n_sections], sizeof sections[0], "%.*s", len, t->options[i].path);
        names[n++] = sections[n_sections++];
    }
    char hint[200] = "";
    suggest_append(hint, sizeof hint, path, names, n);
    return cfg_fail(ld, key, "unknown key '%s'%s", path, hint);
}

static corral_status cfg_walk_mapping(cfg_loader *ld, const cfg_table *t, void *base,
                                      yaml_node_t *map, const char *prefix) {
    /* Every key is tried, whatever failed before it: one run reports every problem. */
    corral_status first = CORRAL_OK;
    for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
         pair++) {
        yaml_node_t *key = yaml_document_get_node(ld->doc, pair->key);
        yaml_node_t *value = yaml_document_get_node(ld->doc, pair->value);
        corral_status st = CORRAL_OK;
        if (key->type != YAML_SCALAR_NODE) {
            st = cfg_fail(ld, key, "keys must be plain names, got %s", node_kind(key));
            goto next;
        }

        /* Duplicate keys are almost always a mistake; refuse them rather than pick one. */
        for (yaml_node_pair_t *prev = map->data.mapping.pairs.start; prev < pair; prev++) {
            yaml_node_t *prev_key = yaml_document_get_node(ld->doc, prev->key);
            if (prev_key->type == YAML_SCALAR_NODE &&
                strcmp(scalar_text(prev_key), scalar_text(key)) == 0) {
                st = cfg_fail(ld, key, "duplicate key '%s' (first at line %zu)", scalar_text(key),
                              prev_key->start_mark.line + 1);
                goto next;
            }
        }

        char path[256];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", scalar_text(key));
        if (n < 0 || (size_t)n >= sizeof path) {
            st = cfg_fail(ld, key, "key path too long");
            goto next;
        }

        const cfg_option *opt = cfg_find_option(t, path);
        if (opt) {
            st = cfg_set_option(ld, opt, base, value);
        } else if (cfg_is_section(t, path)) {
            if (value->type != YAML_MAPPING_NODE)
                st = cfg_fail(ld, value, "%s: expected a mapping (a section), got %s", path,
                              node_kind(value));
            else
                st = cfg_walk_mapping(ld, t, base, value, path);
        } else {
            st = cfg_unknown_key(ld, t, key, path);
        }
    next:
        /* Running out of memory ends the walk; a problem of the file does not. */
        if (st == CORRAL_OUT_OF_MEMORY) return st;
        if (first == CORRAL_OK) first = st;
    }
    return first;
}

/* The deepest nesting of lists and mappings a file may have. corrald's own keys go six levels
 * deep (sanitizers, a profile, its steps, a step, its settings); the bound is there because
 * libyaml's scanner costs time in the square of the depth (a 32768-deep flow sequence, 64 KiB of
 * text, took 9 s to be refused for its key), so depth is checked before the document is
 * composed. */
#define CFG_YAML_DEPTH_MAX 64

/* Read the first document of text as events, before yaml_parser_load composes it, and refuse it
 * at the first collection nested deeper than CFG_YAML_DEPTH_MAX, naming its line:column. Stopping
 * there keeps libyaml's work linear in the text. A syntax error is left to yaml_parser_load,
 * which reports it.
 *
 * Aliases (*name) are refused here too. The composed document shares an aliased node, but the
 * walk below reads it once per reference, so a list of a thousand aliases to a list of a thousand
 * adapters is a million entries, each checked against the others: a 262 KiB file took 139 s and
 * 430 MB before failing. corrald's files have no use for them; every value is written out. */
static corral_status cfg_check_nesting(const char *text, size_t len, const char *name,
                                       corral_error *err) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "cannot initialise the YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    corral_status st = CORRAL_OK;
    int depth = 0;
    for (bool more = true; more && st == CORRAL_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break;
        switch (ev.type) {
            case YAML_SEQUENCE_START_EVENT:
            case YAML_MAPPING_START_EVENT:
                if (++depth > CFG_YAML_DEPTH_MAX)
                    st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                          "%s:%zu:%zu: nesting deeper than %d levels", name,
                                          ev.start_mark.line + 1, ev.start_mark.column + 1,
                                          CFG_YAML_DEPTH_MAX);
                break;
            case YAML_SEQUENCE_END_EVENT:
            case YAML_MAPPING_END_EVENT:
                depth--;
                break;
            case YAML_ALIAS_EVENT:
                st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                      "%s:%zu:%zu: YAML aliases (*%.64s) are not supported; write "
                                      "the value out",
                                      name, ev.start_mark.line + 1, ev.start_mark.column + 1,
                                      (const char *)ev.data.alias.anchor);
                break;
            case YAML_DOCUMENT_END_EVENT: /* yaml_parser_load reads the first document only */
            case YAML_STREAM_END_EVENT:
                more = false;
                break;
            default:
                break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return st;
}

/* Parse `text` as a YAML document and apply it to base through table t. An empty document
 * changes nothing. */
static corral_status cfg_apply_yaml(const cfg_table *t, void *base, const char *text, size_t len,
                                    const char *name, const char *base_dir, cfg_report *report,
                                    corral_error *err) {
    const corral_status deep = cfg_check_nesting(text, len, name, err);
    if (deep != CORRAL_OK) {
        cfg_report_add(report, "%s", err->message);
        return deep;
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "cannot initialise the YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yaml_document_t doc;
    if (!yaml_parser_load(&parser, &doc)) {
        corral_status st =
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s:%zu:%zu: YAML syntax error: %s",
                             name, parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                             parser.problem ? parser.problem : "unknown problem");
        cfg_report_add(report, "%s", err->message);
        yaml_parser_delete(&parser);
        return st;
    }
    corral_status st = CORRAL_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        cfg_loader ld = {
            .doc = &doc, .name = name, .base_dir = base_dir, .err = err, .report = report};
        if (root->type == YAML_MAPPING_NODE)
            st = cfg_walk_mapping(&ld, t, base, root, "");
        else if (!(root->type == YAML_SCALAR_NODE && scalar_text(root)[0] == '\0'))
            st = cfg_fail(&ld, root, "the top level must be a mapping of keys, got %s",
                          node_kind(root));
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

/* Apply every default of table t to base: "a.b.c" with default V becomes "a: {b: {c: V}}". */
static corral_status cfg_apply_defaults(const cfg_table *t, void *base, corral_error *err) {
    for (size_t i = 0; i < t->n; i++) {
        const cfg_option *opt = &t->options[i];
        if (!opt->default_value) continue;
        char text[512];
        size_t len = 0;
        const char *seg = opt->path;
        int depth = 0;
        for (const char *dot; (dot = strchr(seg, '.')); seg = dot + 1, depth++)
            len +=
                (size_t)snprintf(text + len, sizeof text - len, "%.*s: {", (int)(dot - seg), seg);
        len += (size_t)snprintf(text + len, sizeof text - len, "%s: %s", seg, opt->default_value);
        for (int d = 0; d < depth; d++) len += (size_t)snprintf(text + len, sizeof text - len, "}");
        corral_error why;
        if (cfg_apply_yaml(t, base, text, len, "(built-in defaults)", NULL, NULL, &why) !=
            CORRAL_OK)
            return corral_error_set(err, CORRAL_INTERNAL, "default of %s is invalid: %s", opt->path,
                                    why.message);
        /* A default is not "given": clear the has_ flag the parser set. */
        if (opt->has_offset >= 0) *(bool *)((char *)base + opt->has_offset) = false;
    }
    return CORRAL_OK;
}

/* Free whatever a table's fields own (strings, lists). */
static void cfg_free_fields(const cfg_table *t, void *base) {
    for (size_t i = 0; i < t->n; i++) {
        const cfg_option *opt = &t->options[i];
        void *field = (char *)base + opt->offset;
        switch (opt->type) {
            case CFG_TYPE_STRING:
            case CFG_TYPE_PATH:
            case CFG_TYPE_POLICY:
                free(*(char **)field);
                *(char **)field = NULL;
                break;
            case CFG_TYPE_ENDPOINTS:
            case CFG_TYPE_NAMES: {
                size_t *count = (size_t *)((char *)base + opt->count_offset);
                free_string_list(*(char ***)field, *count);
                *(char ***)field = NULL;
                *count = 0;
                break;
            }
            case CFG_TYPE_IDS: {
                size_t *count = (size_t *)((char *)base + opt->count_offset);
                free(*(uint32_t **)field);
                *(uint32_t **)field = NULL;
                *count = 0;
                break;
            }
            case CFG_TYPE_STEPS: {
                size_t *count = (size_t *)((char *)base + opt->count_offset);
                free_steps(*(cfg_policy_step **)field, *count);
                *(cfg_policy_step **)field = NULL;
                *count = 0;
                break;
            }
            case CFG_TYPE_LIST: {
                size_t *count = (size_t *)((char *)base + opt->count_offset);
                char *items = *(char **)field;
                for (size_t k = 0; k < *count; k++)
                    cfg_free_fields(opt->item_table, items + k * opt->item_size);
                free(items);
                *(char **)field = NULL;
                *count = 0;
                break;
            }
            default:
                break;
        }
    }
}

/* An app's name: what logs print and clients select, so plain characters only (a name cannot
 * look like the owner's "(owner)", or carry a byte a log or a terminal would interpret). */
static bool app_name_ok(const char *s) {
    const size_t len = strlen(s);
    if (len == 0 || len > 63) return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* Problems of checks that span keys go to err (the first) and the report (each), as the walk's. */
typedef struct cfg_checker {
    corral_error *err;
    cfg_report *report;
    size_t n;
} cfg_checker;

static void cfg_problem(cfg_checker *ck, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void cfg_problem(cfg_checker *ck, const char *fmt, ...) {
    char line[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cfg_report_problem(ck->report, ck->err, &ck->n, line);
}

/* " (did you mean 'X'?)" for the closest of n names taken from items of `size` bytes whose
 * first field is their name (cfg_model, cfg_app, cfg_sanitizer), or "". */
static const char *cfg_hint(char *buf, size_t size, const char *word, const void *items, size_t n,
                            size_t item_size) {
    buf[0] = '\0';
    const char *names[256];
    const size_t count = n < 256 ? n : 256;
    for (size_t i = 0; i < count; i++)
        names[i] = *(char *const *)((const char *)items + i * item_size);
    return suggest_append(buf, size, word, names, count);
}

/* Checks that span keys: the watermarks' order, model files, profiles and apps naming what
 * exists. Every problem is reported, not only the first. */
static corral_status cfg_check_whole(cfg *c, const char *name, cfg_report *report,
                                     corral_error *err) {
    cfg_checker ck = {.err = err, .report = report};
    char hint[160];
    if (c->low_watermark >= c->high_watermark)
        cfg_problem(&ck, "%s: memory.low_watermark (%g) must be below high_watermark (%g)", name,
                    c->low_watermark, c->high_watermark);
    for (size_t i = 0; i < c->n_models; i++) {
        const cfg_model *m = &c->models[i];
        if (!m->name || !m->path) continue; /* reported by the walk */
        struct stat st;
        errno = 0;
        if (stat(m->path, &st) != 0 || !S_ISREG(st.st_mode))
            cfg_problem(&ck, "%s:%d:%d: model '%s': file %s: %s", name, m->at_path.line,
                        m->at_path.col, m->name, m->path,
                        errno ? strerror(errno) : "not a regular file");
        for (size_t k = 0; k < m->n_adapters; k++)
            if (m->adapters[k].path && stat(m->adapters[k].path, &st) != 0)
                cfg_problem(&ck, "%s:%d:%d: model '%s': adapter %s: %s", name, m->at.line,
                            m->at.col, m->name, m->adapters[k].path, strerror(errno));
        quantize_ftype ft;
        if (m->quantize && quantize_ftype_from_name(m->quantize, &ft) != 0)
            cfg_problem(&ck, "%s:%d:%d: model '%s': quantize: '%s' is not one of %s", name,
                        m->at.line, m->at.col, m->name, m->quantize, quantize_ftype_names());
        if (m->sanitizer && !cfg_find_sanitizer(c, m->sanitizer))
            cfg_problem(&ck,
                        "%s:%d:%d: model '%s' names sanitizer profile '%s', which is not in "
                        "`sanitizers`%s",
                        name, m->at.line, m->at.col, m->name, m->sanitizer,
                        cfg_hint(hint, sizeof hint, m->sanitizer, c->sanitizers, c->n_sanitizers,
                                 sizeof *c->sanitizers));
    }
    for (size_t i = 0; i < c->n_apps; i++) {
        const cfg_app *a = &c->apps[i];
        if (!a->name) continue;
        if (!app_name_ok(a->name))
            cfg_problem(&ck, "%s: app '%s': a name is 1 to 63 letters, digits, '.', '_' or '-'",
                        name, a->name);
        for (size_t k = 0; k < a->n_curve_keys; k++)
            if (!curve_key_valid(a->curve_keys[k]))
                cfg_problem(&ck,
                            "%s: app '%s': curve_keys entry %zu is not a CURVE public key (40 "
                            "characters of z85, as `corral keygen` writes in NAME.pub)",
                            name, a->name, k + 1);
        if (a->sanitizer && !cfg_find_sanitizer(c, a->sanitizer))
            cfg_problem(&ck,
                        "%s: app '%s' names sanitizer profile '%s', which is not in "
                        "`sanitizers`%s",
                        name, a->name, a->sanitizer,
                        cfg_hint(hint, sizeof hint, a->sanitizer, c->sanitizers, c->n_sanitizers,
                                 sizeof *c->sanitizers));
        for (size_t k = 0; k < a->n_models; k++)
            if (!cfg_find_model(c, a->models[k]))
                cfg_problem(&ck, "%s: app '%s' names model '%s', which is not configured%s", name,
                            a->name, a->models[k],
                            cfg_hint(hint, sizeof hint, a->models[k], c->models, c->n_models,
                                     sizeof *c->models));
    }
    if (c->default_app && !cfg_find_app(c, c->default_app))
        cfg_problem(
            &ck, "%s: auth.default_app names app '%s', which is not in `apps`%s", name,
            c->default_app,
            cfg_hint(hint, sizeof hint, c->default_app, c->apps, c->n_apps, sizeof *c->apps));
    /* The HTTP API: well-formed addresses, and keys before anything beyond loopback. */
    for (size_t i = 0; i < c->n_http_listen; i++) {
        endpoint_addr addr;
        corral_error why;
        if (endpoint_parse_address(c->http_listen[i], &addr, &why) != CORRAL_OK)
            cfg_problem(&ck, "%s: http.listen: %s", name, why.message);
        else if (!addr.loopback && c->n_http_keys == 0)
            cfg_problem(&ck,
                        "%s: http.listen: '%s' is not a loopback address; serving beyond this "
                        "machine needs http.keys",
                        name, c->http_listen[i]);
    }
    return ck.n ? CORRAL_INVALID_ARGUMENT : CORRAL_OK;
}

/* The defaults that depend on who runs corrald: its swap and cache folders are the user's own
 * (corral/paths.h), so that two users' daemons never share one. A config file may name others. */
static corral_status cfg_user_dirs(cfg *c, corral_error *err) {
    char swap[PATH_MAX], cache[PATH_MAX];
    corral_status st = paths_user_swap_dir(swap, sizeof swap, err);
    if (st == CORRAL_OK) st = paths_user_cache_dir(cache, sizeof cache, err);
    if (st != CORRAL_OK) return st;
    free(c->swap_dir);
    free(c->cache_dir);
    c->swap_dir = strdup(swap);
    c->cache_dir = strdup(cache);
    if (!c->swap_dir || !c->cache_dir)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    return CORRAL_OK;
}

cfg *cfg_new_defaults(corral_error *err) {
    cfg *c = calloc(1, sizeof *c);
    if (!c) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    if (cfg_apply_defaults(&root_table, c, err) != CORRAL_OK || cfg_user_dirs(c, err) != CORRAL_OK)
        cfg_destroy(&c);
    return c;
}

/* Load text with relative paths resolved against base_dir. When the walk found problems, the
 * checks that span keys still run over what was read (a model's file, a profile's name), so
 * that one run reports them all; err gets the first, with how many more there are. */
static cfg *cfg_load_text(const char *text, size_t len, const char *name, const char *base_dir,
                          cfg_report *report, cfg_check_fn extra, corral_error *err) {
    cfg *c = cfg_new_defaults(err);
    if (!c) return NULL;
    cfg_report own = {0};
    cfg_report *rep = report ? report : &own;
    const size_t before = rep->n;
    corral_error first;
    const corral_status walked =
        cfg_apply_yaml(&root_table, c, text, len, name, base_dir, rep, &first);
    corral_error second;
    bool checked =
        walked == CORRAL_OUT_OF_MEMORY || cfg_check_whole(c, name, rep, &second) == CORRAL_OK;
    /* The caller's checks (the models' files: config_check.c) run over what was read, problems
     * or not; when the file itself had none, their first problem is the one err reports. */
    if (extra && walked != CORRAL_OUT_OF_MEMORY) {
        corral_error third;
        if (extra(c, name, rep, &third) != CORRAL_OK && checked) {
            checked = false;
            second = third;
        }
    }
    if (walked != CORRAL_OK || !checked) {
        *err = walked != CORRAL_OK ? first : second;
        const size_t more = rep->n - before;
        if (more > 1)
            corral_error_set(err, err->status,
                             "%s (and %zu more problem%s: corrald -c %s "
                             "--check-config lists them all)",
                             first.message[0] && walked != CORRAL_OK ? first.message
                                                                     : second.message,
                             more - 1, more == 2 ? "" : "s", name);
        cfg_destroy(&c);
    }
    cfg_report_free(&own);
    return c;
}

cfg *cfg_load_string(const char *text, size_t len, const char *name, corral_error *err) {
    return cfg_load_string_report(text, len, name, NULL, NULL, err);
}

cfg *cfg_load_string_report(const char *text, size_t len, const char *name, cfg_report *report,
                            cfg_check_fn extra, corral_error *err) {
    char cwd[PATH_MAX];
    return cfg_load_text(text, len, name, getcwd(cwd, sizeof cwd) ? cwd : NULL, report, extra, err);
}

cfg *cfg_load_file(const char *path, corral_error *err) {
    return cfg_load_file_report(path, NULL, NULL, err);
}

cfg *cfg_load_file_report(const char *path, cfg_report *report, cfg_check_fn extra,
                          corral_error *err) {
    /* Non-blocking open, then a regular-file check: a FIFO or a device named as the config must
     * not freeze the reader. */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        corral_error_set(err, errno == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "config file %s: %s",
                         path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                         "config file %s: not a regular file (a FIFO, a device or a directory)",
                         path);
        close(fd);
        return NULL;
    }
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        corral_error_set(err, CORRAL_IO, "config file %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    enum { CFG_FILE_MAX = 4 << 20 };
    char *text = malloc(CFG_FILE_MAX + 1);
    size_t len = text ? fread(text, 1, CFG_FILE_MAX + 1, fp) : 0;
    int read_error = ferror(fp);
    fclose(fp);
    if (!text) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory reading %s", path);
        return NULL;
    }
    if (read_error || len > CFG_FILE_MAX) {
        corral_error_set(
            err, read_error ? CORRAL_IO : CORRAL_INVALID_ARGUMENT,
            read_error ? "config file %s: read error" : "config file %s: larger than 4 MiB", path);
        free(text);
        return NULL;
    }
    /* Relative model paths are relative to the config file's folder. */
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        if (!getcwd(dir, sizeof dir)) snprintf(dir, sizeof dir, ".");
    } else if (path[0] == '/' || !getcwd(dir, sizeof dir)) {
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
        if (!dir[0]) snprintf(dir, sizeof dir, "/");
    } else {
        size_t n = strlen(dir);
        snprintf(dir + n, sizeof dir - n, "/%.*s", (int)(slash - path), path);
    }
    cfg *c = cfg_load_text(text, len, path, dir, report, extra, err);
    free(text);
    if (c) {
        c->source_path = strdup(path);
        if (!c->source_path) {
            corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            cfg_destroy(&c);
        }
    }
    return c;
}

void cfg_destroy(cfg **pc) {
    if (!pc || !*pc) return;
    cfg *c = *pc;
    cfg_free_fields(&root_table, c);
    free(c->source_path);
    free(c);
    *pc = NULL;
}

const cfg_model *cfg_find_model(const cfg *c, const char *name) {
    for (size_t i = 0; name && i < c->n_models; i++)
        if (c->models[i].name && strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

const cfg_app *cfg_find_app(const cfg *c, const char *name) {
    for (size_t i = 0; name && i < c->n_apps; i++)
        if (c->apps[i].name && strcmp(c->apps[i].name, name) == 0)
            return &c->apps[i];
    return NULL;
}

const cfg_sanitizer *cfg_find_sanitizer(const cfg *c, const char *name) {
    for (size_t i = 0; name && i < c->n_sanitizers; i++)
        if (c->sanitizers[i].name && strcmp(c->sanitizers[i].name, name) == 0)
            return &c->sanitizers[i];
    return NULL;
}

bool cfg_app_allows_model(const cfg_app *app, const char *model) {
    if (!app || app->n_models == 0) return true;
    for (size_t i = 0; i < app->n_models; i++)
        if (strcmp(app->models[i], model) == 0) return true;
    return false;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int cfg_find_default_file(char *buf, size_t size) {
    const char *env = getenv("CORRAL_CONFIG");
    if (env && *env) {
        snprintf(buf, size, "%s", env);
        return 1;
    }
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    char candidate[PATH_MAX];
    if (xdg && xdg[0] == '/') {
        snprintf(candidate, sizeof candidate, "%s/corral/corral.yaml", xdg);
        if (file_exists(candidate)) return snprintf(buf, size, "%s", candidate), 1;
    } else if (home && home[0] == '/') {
        snprintf(candidate, sizeof candidate, "%s/.config/corral/corral.yaml", home);
        if (file_exists(candidate)) return snprintf(buf, size, "%s", candidate), 1;
    }
    /* Installed under a prefix (cmake --install --prefix P): P/etc/corral beside P/bin/corrald. */
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        corral_error why;
        if (paths_join(exe, "../etc/corral/corral.yaml", candidate, sizeof candidate, &why) ==
                CORRAL_OK &&
            file_exists(candidate))
            return snprintf(buf, size, "%s", candidate), 1;
    }
    if (file_exists("/etc/corral/corral.yaml")) {
        snprintf(buf, size, "%s", "/etc/corral/corral.yaml");
        return 1;
    }
    return 0;
}

static void print_table(FILE *out, const cfg_table *t, const char *prefix) {
    static const char *const type_names[] = {
        [CFG_TYPE_BYTES] = "bytes",       [CFG_TYPE_MEMORY] = "bytes|%",
        [CFG_TYPE_INT] = "integer",       [CFG_TYPE_FLOAT] = "number",
        [CFG_TYPE_DOUBLE] = "number",     [CFG_TYPE_BOOL] = "bool",
        [CFG_TYPE_STRING] = "string",     [CFG_TYPE_PATH] = "path",
        [CFG_TYPE_LOG_LEVEL] = "level",   [CFG_TYPE_PRIORITY] = "priority",
        [CFG_TYPE_KV_TYPE] = "f16|f32",   [CFG_TYPE_ENDPOINTS] = "endpoints",
        [CFG_TYPE_OVERFLOW] = "overflow", [CFG_TYPE_POLICY] = "policy",
        [CFG_TYPE_STEPS] = "steps",       [CFG_TYPE_NAMES] = "names",
        [CFG_TYPE_IDS] = "ids",           [CFG_TYPE_LIST] = "list",
    };
    for (size_t i = 0; i < t->n; i++) {
        const cfg_option *opt = &t->options[i];
        char path[128];
        snprintf(path, sizeof path, "%s%s", prefix, opt->path);
        fprintf(out, "  %-36s %-10s %s%s%s\n      %s\n", path, type_names[opt->type],
                opt->required ? "required" : "default ", opt->required ? "" : " ",
                opt->required        ? ""
                : opt->default_value ? opt->default_value
                : opt->default_shown ? opt->default_shown
                                     : "(none)",
                opt->doc);
        if (opt->type == CFG_TYPE_LIST) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s[].", opt->path);
            print_table(out, opt->item_table, sub);
        }
    }
}

void cfg_print_reference(FILE *out) {
    print_table(out, &root_table, "");
}
