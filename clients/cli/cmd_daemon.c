/*
 * cmd_daemon.c — the `corral` commands that talk to a running corrald through libcorral:
 * ps, models, status, run, chat, load, unload, pin, unpin.
 *
 * Every command takes --endpoint URL and --app NAME, and for tcp endpoints the CURVE keys
 * --server-key KEY (or --server-key-file FILE) and --client-key-file FILE (also before the
 * command name, see cli_parse_global_options); without them, libcorral uses $CORRAL_ENDPOINT
 * (else the default endpoint), $CORRAL_SERVER_KEY, $CORRAL_SERVER_KEY_FILE and
 * $CORRAL_CLIENT_KEY_FILE. A command first pings the daemon briefly so that a daemon that is not
 * running gives one clear message instead of a timeout. Errors print `corral <cmd>: CODE: message`
 * and exit 1; bad usage exits 2; `run` and `chat` exit 130 when Ctrl-C stopped them.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"
#include "corral.h"
#include "json.h"

const char *cli_endpoint = NULL;
const char *cli_app = NULL;
const char *cli_server_key = NULL;
const char *cli_server_key_file = NULL;
const char *cli_client_key_file = NULL;

/* How long the first ping may take before the daemon counts as not running. */
#define DAEMON_CONNECT_TIMEOUT_MS 3000
/* Timeout of the quick requests (status, list, tokenize, pin). Load may take long: no limit. */
#define DAEMON_CALL_TIMEOUT_MS    30000
/* How often run/chat look at the Ctrl-C flag while they wait. */
#define DAEMON_POLL_MS            100
#define DAEMON_STOP_MAX           16

/* ---- global options and connecting ------------------------------------------------------- */

/* If argv[0] is a global option (as "--opt VALUE" or "--opt=VALUE"), store it and return how
 * many arguments it took; 0 if it is not a global option; -1 (with a message) if its value is
 * missing. */
static int global_option(int argc, char **argv) {
    static const struct {
        const char *name;
        const char **dest;
    } globals[] = {{"--endpoint", &cli_endpoint},
                   {"--app", &cli_app},
                   {"--server-key", &cli_server_key},
                   {"--server-key-file", &cli_server_key_file},
                   {"--client-key-file", &cli_client_key_file}};
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++) {
        size_t len = strlen(globals[i].name);
        if (strncmp(argv[0], globals[i].name, len) != 0) continue;
        if (argv[0][len] == '=') {
            *globals[i].dest = argv[0] + len + 1;
            return 1;
        }
        if (argv[0][len] != '\0') continue;
        if (argc < 2) {
            fprintf(stderr, "corral: %s needs a value\n", globals[i].name);
            return -1;
        }
        *globals[i].dest = argv[1];
        return 2;
    }
    return 0;
}

int cli_parse_global_options(int argc, char **argv) {
    int i = 1;
    while (i < argc) {
        int n = global_option(argc - i, argv + i);
        if (n < 0) return -1;
        if (n == 0) break;
        i += n;
    }
    return i - 1;
}

static int daemon_error(const char *cmd, corral_status st, const corral_error *err) {
    return cli_fail(cmd, "%s: %s", corral_status_name(st) ? corral_status_name(st) : "ERROR",
                    err->message);
}

static int daemon_not_running(const char *cmd, const char *endpoint) {
    return cli_fail(cmd,
                    "no answer from corrald at %s (is it running? start it with `make run` or "
                    "corrald -c FILE)",
                    endpoint);
}

/* Connect, name the app, and check that the daemon answers. Returns NULL after printing why. */
static corral_client *daemon_connect(const char *cmd) {
    corral_error err;
    const corral_connect_options options = {.endpoint = cli_endpoint,
                                            .server_key = cli_server_key,
                                            .server_key_file = cli_server_key_file,
                                            .client_key_file = cli_client_key_file};
    corral_client *c = corral_client_new_with(&options, &err);
    if (!c) {
        daemon_error(cmd, err.status, &err);
        return NULL;
    }
    if (corral_client_set_app(c, cli_app) != CORRAL_OK) {
        cli_fail(cmd, "--app: the name is longer than %d bytes", CORRAL_APP_NAME_MAX - 1);
        corral_client_destroy(&c);
        return NULL;
    }
    /* An ipc endpoint without its socket file has no daemon: say so without waiting. */
    const char *endpoint = corral_client_endpoint(c);
    struct stat sb;
    if (strncmp(endpoint, "ipc://", 6) == 0 && stat(endpoint + 6, &sb) != 0) {
        daemon_not_running(cmd, endpoint);
        corral_client_destroy(&c);
        return NULL;
    }
    corral_status st = corral_client_ping(c, DAEMON_CONNECT_TIMEOUT_MS, NULL, &err);
    if (st != CORRAL_OK) {
        if (st == CORRAL_DEADLINE_EXCEEDED)
            daemon_not_running(cmd, endpoint);
        else
            daemon_error(cmd, st, &err);
        corral_client_destroy(&c);
        return NULL;
    }
    return c;
}

/* getopt_long entries shared by every daemon command. */
enum {
    OPT_ENDPOINT = 1000,
    OPT_APP,
    OPT_HELP,
    OPT_JSON,
    OPT_SERVER_KEY,
    OPT_SERVER_KEY_FILE,
    OPT_CLIENT_KEY_FILE
};
#define DAEMON_COMMON_OPTIONS                                                \
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},                     \
        {"app", required_argument, NULL, OPT_APP},                           \
        {"server-key", required_argument, NULL, OPT_SERVER_KEY},             \
        {"server-key-file", required_argument, NULL, OPT_SERVER_KEY_FILE},   \
        {"client-key-file", required_argument, NULL, OPT_CLIENT_KEY_FILE}, { \
        "help", no_argument, NULL, 'h'                                       \
    }

static const char daemon_common_help[] =
    "      --endpoint URL      corrald's endpoint (default: $CORRAL_ENDPOINT, else the\n"
    "                          default ipc socket)\n"
    "      --app NAME          act as this app (one of those corrald lets this client be)\n"
    "      --server-key KEY    tcp: corrald's CURVE public key (default: $CORRAL_SERVER_KEY)\n"
    "      --server-key-file F tcp: a file holding it (default: $CORRAL_SERVER_KEY_FILE)\n"
    "      --client-key-file F tcp: this client's CURVE secret key file (default:\n"
    "                          $CORRAL_CLIENT_KEY_FILE; `corral keygen` makes key pairs)\n"
    "  -h, --help              this help\n";

/* Handle the shared options inside a getopt loop. Returns 1 if opt was one of them. */
static bool daemon_common_option(int opt) {
    if (opt == OPT_ENDPOINT) {
        cli_endpoint = optarg;
        return true;
    }
    if (opt == OPT_APP) {
        cli_app = optarg;
        return true;
    }
    if (opt == OPT_SERVER_KEY || opt == OPT_SERVER_KEY_FILE || opt == OPT_CLIENT_KEY_FILE) {
        *(opt == OPT_SERVER_KEY        ? &cli_server_key
          : opt == OPT_SERVER_KEY_FILE ? &cli_server_key_file
                                       : &cli_client_key_file) = optarg;
        return true;
    }
    return false;
}

/* ---- human-readable numbers -------------------------------------------------------------- */

static void format_bytes(uint64_t bytes, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
}

static void format_duration(uint64_t ms, char *buf, size_t size) {
    uint64_t s = ms / 1000;
    if (s < 60)
        snprintf(buf, size, "%" PRIu64 "s", s);
    else if (s < 3600)
        snprintf(buf, size, "%" PRIu64 "m %" PRIu64 "s", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, size, "%" PRIu64 "h %" PRIu64 "m", s / 3600, s / 60 % 60);
    else
        snprintf(buf, size, "%" PRIu64 "d %" PRIu64 "h", s / 86400, s / 3600 % 24);
}

/* "never", "just now", "42s ago", "3m ago", "5h ago", "2d ago" for a Unix time in ms. */
static void format_age(uint64_t unix_ms, char *buf, size_t size) {
    if (unix_ms == 0) {
        snprintf(buf, size, "never");
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    uint64_t now = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
    if (unix_ms >= now || now - unix_ms < 1000) {
        snprintf(buf, size, "just now");
        return;
    }
    uint64_t s = (now - unix_ms) / 1000;
    if (s < 60)
        snprintf(buf, size, "%" PRIu64 "s ago", s);
    else if (s < 3600)
        snprintf(buf, size, "%" PRIu64 "m ago", s / 60);
    else if (s < 86400)
        snprintf(buf, size, "%" PRIu64 "h ago", s / 3600);
    else
        snprintf(buf, size, "%" PRIu64 "d ago", s / 86400);
}

/* ---- ps, status, models ------------------------------------------------------------------ */

static void print_model_table(const corral_status_report *r) {
    int w = 4;
    for (size_t i = 0; i < r->n_models; i++) {
        int len = (int)strlen(r->models[i].name);
        if (len > w) w = len;
    }
    printf("%-*s  %-9s %10s  %-9s %5s %6s %7s  %s\n", w, "NAME", "STATE", "MEMORY", "LAST-USED",
           "QUEUE", "ACTIVE", "SERVED", "PINNED");
    for (size_t i = 0; i < r->n_models; i++) {
        const corral_model_status *m = &r->models[i];
        char mem[32], age[32];
        format_bytes(m->bytes, mem, sizeof mem);
        format_age(m->last_used_ms, age, sizeof age);
        printf("%-*s  %-9s %10s  %-9s %5" PRIu32 " %6" PRIu32 " %7" PRIu64 "  %s\n", w, m->name,
               corral_model_state_name(m->state), mem, age, m->queue_depth, m->active,
               m->requests_served, m->pinned ? "yes" : "no");
    }
    /* Variants: what they are made of, and whether the merged-image cache served them. */
    for (size_t i = 0; i < r->n_models; i++) {
        const corral_model_status *m = &r->models[i];
        if (!m->base_path[0]) continue;
        printf("\n%s: %s", m->name, m->base_path);
        for (size_t k = 0; k < m->n_adapters; k++)
            printf(" + %s (scale %g)", m->adapters[k].path, (double)m->adapters[k].scale);
        printf("; merges %" PRIu64 ", last load %" PRIu64 " ms", m->merges, m->last_load_ms);
    }
    for (size_t i = 0; i < r->n_models; i++)
        if (r->models[i].base_path[0]) {
            printf("\n");
            break;
        }
    /* Broken models: what failed. */
    for (size_t i = 0; i < r->n_models; i++)
        if (r->models[i].error[0]) printf("\n%s: %s\n", r->models[i].name, r->models[i].error);
}

static json_t *json_adapters(const corral_adapter *a, size_t n) {
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_object();
        cli_json_set(o, "path", cli_json_str(a[i].path));
        cli_json_set(o, "scale", cli_json_real(a[i].scale));
        cli_json_append(list, o);
    }
    return list;
}

static json_t *json_model_statuses(const corral_status_report *r) {
    json_t *list = json_array();
    for (size_t i = 0; i < r->n_models; i++) {
        const corral_model_status *m = &r->models[i];
        json_t *o = json_object();
        cli_json_set(o, "name", cli_json_str(m->name));
        cli_json_set(o, "state", cli_json_str(corral_model_state_name(m->state)));
        cli_json_set(o, "bytes", cli_json_uint(m->bytes));
        cli_json_set(o, "pinned", json_boolean(m->pinned));
        cli_json_set(o, "last_used_ms", cli_json_uint(m->last_used_ms));
        cli_json_set(o, "queue_depth", cli_json_uint(m->queue_depth));
        cli_json_set(o, "active", cli_json_uint(m->active));
        cli_json_set(o, "requests_served", cli_json_uint(m->requests_served));
        cli_json_set(o, "sessions", cli_json_uint(m->sessions));
        cli_json_set(o, "swap_ins", cli_json_uint(m->swap_ins));
        cli_json_set(o, "swap_outs", cli_json_uint(m->swap_outs));
        cli_json_set(o, "preload", json_boolean(m->preload));
        cli_json_set(o, "ttl_ms", cli_json_uint(m->ttl_ms));
        cli_json_set(o, "last_load_ms", cli_json_uint(m->last_load_ms));
        cli_json_set(o, "loads", cli_json_uint(m->loads));
        cli_json_set(o, "steps", cli_json_uint(m->steps));
        cli_json_set(o, "step_sequences", cli_json_uint(m->step_sequences));
        if (m->error[0]) cli_json_set(o, "error", cli_json_str(m->error));
        if (m->base_path[0]) {
            cli_json_set(o, "base_path", cli_json_str(m->base_path));
            cli_json_set(o, "adapters", json_adapters(m->adapters, m->n_adapters));
            cli_json_set(o, "merges", cli_json_uint(m->merges));
        }
        cli_json_append(list, o);
    }
    return list;
}

/* Shared by ps and status: options [--json] [MODEL]. */
static int status_command(const char *cmd, bool daemon_totals, int argc, char **argv) {
    static const struct option options[] = {
        {"json", no_argument, NULL, OPT_JSON},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    bool json = false;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (daemon_common_option(opt)) continue;
        if (opt == OPT_JSON) {
            json = true;
        } else if (opt == 'h') {
            printf("usage: corral %s [MODEL] [--json]\n\n", cmd);
            if (daemon_totals)
                printf("The daemon's totals (version, uptime, memory, requests) and the state of "
                       "each model.\n");
            else
                printf("The models corrald holds: state, memory, last use, queue, requests "
                       "being\ncomputed, requests served, pinned.\n");
            printf("\noptions:\n"
                   "      --json              one JSON object instead of a table\n%s",
                   daemon_common_help);
            return 0;
        } else {
            return 2;
        }
    }
    if (argc - optind > 1) return cli_fail(cmd, "at most one MODEL"), 2;
    const char *model = optind < argc ? argv[optind] : NULL;
    corral_client *c = daemon_connect(cmd);
    if (!c) return 1;
    corral_error err;
    corral_status_report *r = NULL;
    corral_status st = corral_client_status(c, model, DAEMON_CALL_TIMEOUT_MS, &r, &err);
    corral_client_destroy(&c);
    if (st != CORRAL_OK) return daemon_error(cmd, st, &err);
    const corral_daemon_status *d = &r->daemon;
    int printed = 0;
    if (json) {
        json_t *doc = json_object();
        if (daemon_totals) {
            json_t *o = json_object();
            cli_json_set(o, "version", cli_json_str(d->version));
            cli_json_set(o, "uptime_ms", cli_json_uint(d->uptime_ms));
            cli_json_set(o, "total_bytes", cli_json_uint(d->total_bytes));
            cli_json_set(o, "limit_bytes", cli_json_uint(d->limit_bytes));
            cli_json_set(o, "active", cli_json_uint(d->active));
            cli_json_set(o, "queued", cli_json_uint(d->queued));
            cli_json_set(o, "requests_served", cli_json_uint(d->requests_served));
            cli_json_set(o, "sessions", cli_json_uint(d->sessions));
            cli_json_set(o, "threads", cli_json_uint(d->threads));
            cli_json_set(o, "allocated_bytes", cli_json_uint(d->allocated_bytes));
            cli_json_set(o, "front_allocated_bytes", cli_json_uint(d->front_allocated_bytes));
            cli_json_set(o, "heap_bytes", cli_json_uint(d->heap_bytes));
            cli_json_set(doc, "daemon", o);
        } else {
            cli_json_set(doc, "limit_bytes", cli_json_uint(d->limit_bytes));
            cli_json_set(doc, "total_bytes", cli_json_uint(d->total_bytes));
        }
        cli_json_set(doc, "models", json_model_statuses(r));
        printed = cli_json_print(&doc, stdout, 0);
    } else {
        if (daemon_totals) {
            char up[32], total[32], limit[32];
            format_duration(d->uptime_ms, up, sizeof up);
            format_bytes(d->total_bytes, total, sizeof total);
            format_bytes(d->limit_bytes, limit, sizeof limit);
            printf("corrald %s, up %s, %" PRIu32 " threads\n", d->version, up, d->threads);
            printf("memory: %s held, limit %s\n", total, d->limit_bytes ? limit : "none");
            printf("requests: %" PRIu32 " active, %" PRIu32 " queued, %" PRIu64 " served; %" PRIu32
                   " sessions\n\n",
                   d->active, d->queued, d->requests_served, d->sessions);
        }
        print_model_table(r);
    }
    corral_status_report_destroy(&r);
    if (printed != 0) return cli_fail(cmd, "writing the JSON document failed");
    return fflush(stdout) == 0 ? 0 : cli_fail(cmd, "writing to stdout: %s", strerror(errno));
}

int cmd_ps(int argc, char **argv) {
    return status_command("ps", false, argc, argv);
}

int cmd_status(int argc, char **argv) {
    return status_command("status", true, argc, argv);
}

int cmd_models(int argc, char **argv) {
    static const struct option options[] = {
        {"json", no_argument, NULL, OPT_JSON},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    bool json = false;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (daemon_common_option(opt)) continue;
        if (opt == OPT_JSON) {
            json = true;
        } else if (opt == 'h') {
            printf("usage: corral models [--json]\n\n"
                   "The models configured in corrald: state, context, chat template, "
                   "architecture,\npinned, file.\n\noptions:\n"
                   "      --json              one JSON object instead of a table\n%s",
                   daemon_common_help);
            return 0;
        } else {
            return 2;
        }
    }
    if (optind < argc) return cli_fail("models", "unexpected argument '%s'", argv[optind]), 2;
    corral_client *c = daemon_connect("models");
    if (!c) return 1;
    corral_error err;
    corral_model_list *l = NULL;
    corral_status st = corral_list_models(c, DAEMON_CALL_TIMEOUT_MS, &l, &err);
    corral_client_destroy(&c);
    if (st != CORRAL_OK) return daemon_error("models", st, &err);
    int printed = 0;
    if (json) {
        json_t *doc = json_object(), *list = json_array();
        for (size_t i = 0; i < l->n_models; i++) {
            const corral_model_info *m = &l->models[i];
            json_t *o = json_object();
            cli_json_set(o, "name", cli_json_str(m->name));
            cli_json_set(o, "path", cli_json_str(m->path));
            cli_json_set(o, "arch", cli_json_str(m->arch));
            cli_json_set(o, "context", cli_json_uint(m->context));
            cli_json_set(o, "chat_template", cli_json_str(m->chat_template));
            cli_json_set(o, "state", cli_json_str(corral_model_state_name(m->state)));
            cli_json_set(o, "pinned", json_boolean(m->pinned));
            if (m->n_adapters)
                cli_json_set(o, "adapters", json_adapters(m->adapters, m->n_adapters));
            cli_json_append(list, o);
        }
        cli_json_set(doc, "models", list);
        printed = cli_json_print(&doc, stdout, 0);
    } else {
        int w = 4;
        for (size_t i = 0; i < l->n_models; i++) {
            int len = (int)strlen(l->models[i].name);
            if (len > w) w = len;
        }
        printf("%-*s  %-9s %7s  %-12s %-8s %-6s  %s\n", w, "NAME", "STATE", "CONTEXT", "TEMPLATE",
               "ARCH", "PINNED", "PATH");
        for (size_t i = 0; i < l->n_models; i++) {
            const corral_model_info *m = &l->models[i];
            printf("%-*s  %-9s %7" PRIu32 "  %-12s %-8s %-6s  %s\n", w, m->name,
                   corral_model_state_name(m->state), m->context, m->chat_template,
                   *m->arch ? m->arch : "-", m->pinned ? "yes" : "no", m->path);
            for (size_t k = 0; k < m->n_adapters; k++)
                printf("%-*s  + adapter %s (scale %g)\n", w, "", m->adapters[k].path,
                       (double)m->adapters[k].scale);
        }
    }
    corral_model_list_destroy(&l);
    if (printed != 0) return cli_fail("models", "writing the JSON document failed");
    return fflush(stdout) == 0 ? 0 : cli_fail("models", "writing to stdout: %s", strerror(errno));
}

/* ---- load, unload, pin, unpin ------------------------------------------------------------ */

typedef corral_status (*model_op_fn)(corral_client *, const char *, int, corral_error *);

static int model_command(const char *cmd, const char *done_word, const char *summary,
                         model_op_fn op, int timeout_ms, int argc, char **argv) {
    static const struct option options[] = {
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (daemon_common_option(opt)) continue;
        if (opt == 'h') {
            printf("usage: corral %s MODEL\n\n%s\n\noptions:\n%s", cmd, summary,
                   daemon_common_help);
            return 0;
        }
        return 2;
    }
    if (argc - optind != 1) return cli_fail(cmd, "give one MODEL (see corral %s --help)", cmd), 2;
    corral_client *c = daemon_connect(cmd);
    if (!c) return 1;
    corral_error err;
    corral_status st = op(c, argv[optind], timeout_ms, &err);
    corral_client_destroy(&c);
    if (st != CORRAL_OK) return daemon_error(cmd, st, &err);
    printf("%s %s\n", done_word, argv[optind]);
    return 0;
}

int cmd_load(int argc, char **argv) {
    return model_command("load", "loaded", "Load a model now and wait until it is resident.",
                         corral_load, -1, argc, argv);
}

int cmd_unload(int argc, char **argv) {
    return model_command("unload", "unloaded",
                         "Release a model's memory (requests in flight finish first; its sessions "
                         "are dropped).",
                         corral_unload, DAEMON_CALL_TIMEOUT_MS, argc, argv);
}

int cmd_pin(int argc, char **argv) {
    return model_command("pin", "pinned",
                         "Pin a model: it is never unloaded or swapped out to make room.",
                         corral_pin, DAEMON_CALL_TIMEOUT_MS, argc, argv);
}

int cmd_unpin(int argc, char **argv) {
    return model_command("unpin", "unpinned", "Unpin a model.", corral_unpin,
                         DAEMON_CALL_TIMEOUT_MS, argc, argv);
}

/* ---- generation options (run and chat) --------------------------------------------------- */

enum {
    OPT_TEMP = 1100,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_MIN_P,
    OPT_REPEAT,
    OPT_SEED,
    OPT_STOP,
    OPT_PRIORITY,
    OPT_SESSION,
    OPT_DEADLINE,
    OPT_REGEX,
    OPT_JSON_SCHEMA,
    OPT_SANITIZER,
    OPT_TEMPLATE,
    OPT_NO_STREAM,
    OPT_STATS,
    OPT_SYSTEM,
};

#define GEN_OPTIONS                                                                               \
    {"max-tokens", required_argument, NULL, 'n'}, {"temp", required_argument, NULL, OPT_TEMP},    \
        {"top-k", required_argument, NULL, OPT_TOP_K},                                            \
        {"top-p", required_argument, NULL, OPT_TOP_P},                                            \
        {"min-p", required_argument, NULL, OPT_MIN_P},                                            \
        {"repeat-penalty", required_argument, NULL, OPT_REPEAT},                                  \
        {"seed", required_argument, NULL, OPT_SEED}, {"stop", required_argument, NULL, OPT_STOP}, \
        {"priority", required_argument, NULL, OPT_PRIORITY},                                      \
        {"session", required_argument, NULL, OPT_SESSION},                                        \
        {"deadline", required_argument, NULL, OPT_DEADLINE},                                      \
        {"regex", required_argument, NULL, OPT_REGEX},                                            \
        {"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},                                \
        {"sanitizer", required_argument, NULL, OPT_SANITIZER},                                    \
        {"template", required_argument, NULL, OPT_TEMPLATE}, {                                    \
        "stats", no_argument, NULL, OPT_STATS                                                     \
    }

static const char gen_options_help[] =
    "  -n, --max-tokens N      tokens to generate (default: the model's configured default)\n"
    "      --temp T            temperature (0 = greedy)\n"
    "      --top-k K           (0 = off)\n"
    "      --top-p P           in (0, 1]\n"
    "      --min-p P           in [0, 1]\n"
    "      --repeat-penalty R  (1 = off)\n"
    "      --seed S            sampling seed (same seed, same text)\n"
    "      --stop TEXT         stop before this text (repeatable, at most 16)\n"
    "      --priority P        realtime, interactive or background\n"
    "      --session ID        keep the conversation's state in the daemon under this id\n"
    "      --deadline MS       give up after this many milliseconds\n"
    "      --regex R           the whole output must match this regular expression\n"
    "      --json-schema FILE  the output is a JSON document this JSON Schema validates\n"
    "                          (FILE holds the schema; - reads it from stdin)\n"
    "      --sanitizer P       apply this sanitizer profile to the input\n"
    "      --template NAME     chat template instead of the model's (chatml, llama3, ...)\n"
    "      --stats             print token counts and timings to stderr at the end\n";

/* Generation options parsed from the command line; the strings point into argv, but for the
 * schema, read from schema_path by gen_options_load (free it with gen_options_release). */
typedef struct gen_options {
    corral_generate_params params;
    const char *stops[DAEMON_STOP_MAX];
    bool stats;
    const char *schema_path;
    char *schema; /* owned */
} gen_options;

static int parse_u64(const char *text, uint64_t *out) {
    if (!text || !*text || *text == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (*end || errno) return -1;
    *out = v;
    return 0;
}

/* Apply one getopt result to o. Returns 1 if it was a generation option, 0 if not, -1 (after a
 * message) for a bad value. Ranges are the daemon's to check: it names the problem. */
static int gen_option(const char *cmd, int opt, gen_options *o) {
    corral_generate_params *p = &o->params;
    double d;
    long l;
    uint64_t u;
    switch (opt) {
        case 'n':
            if (cli_parse_long(optarg, 0, UINT32_MAX, &l))
                return cli_fail(cmd, "-n: '%s' is not a count", optarg), -1;
            p->has_max_tokens = true;
            p->max_tokens = (uint32_t)l;
            return 1;
        case OPT_TEMP:
        case OPT_TOP_P:
        case OPT_MIN_P:
        case OPT_REPEAT:
            if (cli_parse_double(optarg, -1e30, 1e30, &d))
                return cli_fail(cmd, "'%s' is not a number", optarg), -1;
            if (opt == OPT_TEMP) p->has_temperature = true, p->temperature = (float)d;
            if (opt == OPT_TOP_P) p->has_top_p = true, p->top_p = (float)d;
            if (opt == OPT_MIN_P) p->has_min_p = true, p->min_p = (float)d;
            if (opt == OPT_REPEAT) p->has_repeat_penalty = true, p->repeat_penalty = (float)d;
            return 1;
        case OPT_TOP_K:
            if (cli_parse_long(optarg, INT32_MIN, INT32_MAX, &l))
                return cli_fail(cmd, "--top-k: '%s' is not a whole number", optarg), -1;
            p->has_top_k = true;
            p->top_k = (int32_t)l;
            return 1;
        case OPT_SEED:
            if (parse_u64(optarg, &u))
                return cli_fail(cmd, "--seed: '%s' is not a number", optarg), -1;
            p->has_seed = true;
            p->seed = u;
            return 1;
        case OPT_STOP:
            if (p->n_stop == DAEMON_STOP_MAX)
                return cli_fail(cmd, "at most %d --stop strings", DAEMON_STOP_MAX), -1;
            o->stops[p->n_stop++] = optarg;
            p->stop = o->stops;
            return 1;
        case OPT_PRIORITY:
            if (corral_priority_from_name(optarg, &p->priority) != 0)
                return cli_fail(cmd, "--priority: '%s' is not realtime, interactive or background",
                                optarg),
                       -1;
            return 1;
        case OPT_SESSION:
            p->session = optarg;
            return 1;
        case OPT_DEADLINE:
            if (cli_parse_long(optarg, 0, UINT32_MAX, &l))
                return cli_fail(cmd, "--deadline: '%s' is not a number of milliseconds", optarg),
                       -1;
            p->deadline_ms = (uint32_t)l;
            return 1;
        case OPT_REGEX:
            p->constraint = optarg;
            return 1;
        case OPT_JSON_SCHEMA:
            o->schema_path = optarg;
            return 1;
        case OPT_SANITIZER:
            p->sanitizer = optarg;
            return 1;
        case OPT_TEMPLATE:
            p->chat_template = optarg;
            return 1;
        case OPT_STATS:
            o->stats = true;
            return 1;
        default:
            return 0;
    }
}

/* ---- streaming with Ctrl-C --------------------------------------------------------------- */

static volatile sig_atomic_t interrupts;

static void on_sigint(int signo) {
    (void)signo;
    interrupts++;
    if (interrupts >= 2) _exit(130); /* a second Ctrl-C does not wait for the daemon */
}

/* SIGINT sets a flag (no SA_RESTART, so blocking reads return) instead of killing us: the
 * running generation is cancelled first. */
static void install_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* A growing buffer for the reply text (chat keeps it for the history). */
typedef struct text_buf {
    char *data;
    size_t len, cap;
} text_buf;

static int text_buf_append(text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* Run one generation, printing each chunk to stdout as it comes (and appending it to *reply when
 * given). Ctrl-C cancels it. Returns 0 with *done filled, 130 if Ctrl-C cancelled it (after the
 * daemon confirmed), or 1 after printing the error. */
static int stream_generation(const char *cmd, corral_client *c, const corral_generate_params *p,
                             text_buf *reply, corral_done *done) {
    corral_error err;
    corral_generation *g = corral_generate_start(c, p, &err);
    if (!g) return daemon_error(cmd, err.status, &err);
    int interrupts_seen = interrupts;
    bool cancelled = false;
    int rc;
    for (;;) {
        if (interrupts != interrupts_seen && !cancelled) {
            cancelled = true;
            corral_status st = corral_generation_cancel(g, &err);
            if (st != CORRAL_OK) {
                rc = daemon_error(cmd, st, &err);
                break;
            }
        }
        corral_chunk chunk;
        int r = corral_generation_poll(g, DAEMON_POLL_MS, &chunk, done, &err);
        if (r == CORRAL_POLL_NOTHING) continue;
        if (r == CORRAL_POLL_CHUNK) {
            fwrite(chunk.text, 1, chunk.text_len, stdout);
            fflush(stdout);
            if (reply && text_buf_append(reply, chunk.text, chunk.text_len) != 0) {
                rc = cli_fail(cmd, "out of memory for the reply");
                break;
            }
            continue;
        }
        if (r == CORRAL_POLL_DONE) {
            rc = cancelled && done->stop_reason == CORRAL_STOP_CANCELLED ? 130 : 0;
        } else if (cancelled && r == CORRAL_CANCELLED) {
            rc = 130; /* cancelled before it started */
        } else {
            rc = daemon_error(cmd, (corral_status)r, &err);
        }
        break;
    }
    corral_generation_destroy(&g);
    return rc;
}

static void print_stats(const corral_done *d) {
    double decode_s = (double)d->timings.decode_us / 1e6;
    fprintf(stderr,
            "[%s: %" PRIu32 " prompt tokens (%" PRIu32 " computed), %" PRIu32
            " generated, stop: %s; queue %.1f ms, load %.1f ms, prefill %.1f ms, decode %.1f ms",
            d->model, d->prompt_tokens, d->prefilled_tokens, d->generated_tokens,
            corral_stop_reason_name(d->stop_reason), (double)d->timings.queue_us / 1e3,
            (double)d->timings.load_us / 1e3, (double)d->timings.prefill_us / 1e3,
            (double)d->timings.decode_us / 1e3);
    if (decode_s > 0) fprintf(stderr, ", %.1f tok/s", (double)d->generated_tokens / decode_s);
    fprintf(stderr, "]\n");
    if (d->sanitizer_report[0]) fprintf(stderr, "[sanitizers: %s]\n", d->sanitizer_report);
}

/* The whole of stdin as a string (caller frees), or NULL. */
static char *read_all_stdin(void) {
    text_buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0)
        if (text_buf_append(&b, chunk, n) != 0) {
            free(b.data);
            return NULL;
        }
    if (ferror(stdin)) {
        free(b.data);
        return NULL;
    }
    if (!b.data) b.data = calloc(1, 1);
    return b.data;
}

/* Read --json-schema's file (after every option is known good, so nothing leaks on a usage
 * error). 0, or 1 after a message. */
static int gen_options_load(const char *cmd, gen_options *o) {
    if (!o->schema_path) return 0;
    if (strcmp(o->schema_path, "-") == 0) {
        o->schema = read_all_stdin();
        if (!o->schema) return cli_fail(cmd, "--json-schema: reading stdin failed");
    } else {
        FILE *f = fopen(o->schema_path, "rb");
        if (!f) return cli_fail(cmd, "--json-schema: %s: %s", o->schema_path, strerror(errno));
        text_buf b = {0};
        char chunk[4096];
        size_t n;
        int bad = 0;
        while (!bad && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
            bad = text_buf_append(&b, chunk, n) != 0;
        bad = bad || ferror(f);
        fclose(f);
        if (bad) {
            free(b.data);
            return cli_fail(cmd, "--json-schema: reading %s failed", o->schema_path);
        }
        o->schema = b.data ? b.data : calloc(1, 1);
        if (!o->schema) return cli_fail(cmd, "out of memory");
    }
    if (!o->schema[0]) return cli_fail(cmd, "--json-schema: %s is empty", o->schema_path);
    o->params.json_schema = o->schema;
    return 0;
}

static void gen_options_release(gen_options *o) {
    free(o->schema);
    o->schema = NULL;
    o->params.json_schema = NULL;
}

/* ---- run --------------------------------------------------------------------------------- */

static void run_usage(FILE *out) {
    fprintf(out,
            "usage: corral run MODEL \"PROMPT\" [options]\n\n"
            "Generate text with a model of the running corrald. Prints only the generated text\n"
            "(not the prompt), streamed to stdout as it arrives; a final newline is added only\n"
            "when stdout is a terminal. Without PROMPT, or with \"-\", the prompt is read from\n"
            "stdin. Ctrl-C cancels the generation and exits with status 130.\n\n"
            "options:\n%s"
            "      --no-stream         ask for the whole text at once (printed at the end)\n%s",
            gen_options_help, daemon_common_help);
}

int cmd_run(int argc, char **argv) {
    static const struct option options[] = {
        GEN_OPTIONS,
        {"no-stream", no_argument, NULL, OPT_NO_STREAM},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    gen_options o;
    memset(&o, 0, sizeof o);
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "n:h", options, NULL)) != -1) {
        if (daemon_common_option(opt)) continue;
        int r = gen_option("run", opt, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (opt == OPT_NO_STREAM) {
            o.params.stream = CORRAL_STREAM_OFF;
        } else if (opt == 'h') {
            run_usage(stdout);
            return 0;
        } else {
            return 2;
        }
    }
    int positional = argc - optind;
    if (positional < 1 || positional > 2) {
        run_usage(stderr);
        return 2;
    }
    o.params.model = argv[optind];
    char *owned_prompt = NULL;
    if (o.schema_path && !strcmp(o.schema_path, "-") &&
        (positional == 1 || !strcmp(argv[optind + 1], "-")))
        return cli_fail("run", "--json-schema - and the prompt cannot both come from stdin");
    if (gen_options_load("run", &o)) return 1;
    if (positional == 1 || strcmp(argv[optind + 1], "-") == 0) {
        owned_prompt = read_all_stdin();
        if (!owned_prompt) {
            gen_options_release(&o);
            return cli_fail("run", "reading the prompt from stdin failed");
        }
        o.params.prompt = owned_prompt;
    } else {
        o.params.prompt = argv[optind + 1];
    }
    corral_client *c = daemon_connect("run");
    if (!c) {
        free(owned_prompt);
        gen_options_release(&o);
        return 1;
    }
    install_sigint();
    corral_done done;
    int rc = stream_generation("run", c, &o.params, NULL, &done);
    corral_client_destroy(&c);
    free(owned_prompt);
    gen_options_release(&o);
    if (rc == 0 || rc == 130) {
        if (isatty(STDOUT_FILENO)) putchar('\n');
        if (o.stats) print_stats(&done);
    }
    if (fflush(stdout) != 0 && rc == 0)
        rc = cli_fail("run", "writing to stdout: %s", strerror(errno));
    return rc;
}

/* ---- chat -------------------------------------------------------------------------------- */

/* "chat-" and 16 random hex digits: a session nobody else is likely to use. */
static void random_session_id(char *buf, size_t size) {
    unsigned char bytes[8] = {0};
    FILE *fp = fopen("/dev/urandom", "rb");
    size_t got = fp ? fread(bytes, 1, sizeof bytes, fp) : 0;
    if (fp) fclose(fp);
    if (got != sizeof bytes) {
        /* No urandom: time and pid are enough to tell this chat from others. */
        struct timeval tv;
        gettimeofday(&tv, NULL);
        uint64_t v = (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
        v ^= (uint64_t)getpid() << 40;
        memcpy(bytes, &v, sizeof bytes);
    }
    int n = snprintf(buf, size, "chat-");
    for (size_t i = 0; i < sizeof bytes && n + 2 < (int)size; i++)
        n += snprintf(buf + n, size - (size_t)n, "%02x", bytes[i]);
}

static void chat_usage(FILE *out) {
    fprintf(out,
            "usage: corral chat MODEL [--system TEXT] [--session ID] [options]\n\n"
            "An interactive conversation with a model of the running corrald. Type a message\n"
            "and press Enter; the reply streams back. /exit (or end of input) ends the chat;\n"
            "Ctrl-C stops a reply, or ends the chat at the prompt. The whole conversation is\n"
            "sent each turn on one session (by default a random id), so the daemon keeps its\n"
            "state and only computes what is new. A turn that fails is reported and dropped;\n"
            "the exit status is then 1.\n\n"
            "options:\n"
            "      --system TEXT       a system message at the start of the conversation\n%s%s",
            gen_options_help, daemon_common_help);
}

/* The conversation so far; contents are owned (malloc'd). */
typedef struct chat_history {
    corral_message *messages;
    size_t n, cap;
} chat_history;

static int chat_history_add(chat_history *h, const char *role, char *content) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        corral_message *m = realloc(h->messages, cap * sizeof *m);
        if (!m) return -1;
        h->messages = m;
        h->cap = cap;
    }
    h->messages[h->n].role = role;
    h->messages[h->n].content = content;
    h->n++;
    return 0;
}

static void chat_history_free(chat_history *h) {
    for (size_t i = 0; i < h->n; i++) free((char *)h->messages[i].content);
    free(h->messages);
}

int cmd_chat(int argc, char **argv) {
    static const struct option options[] = {
        GEN_OPTIONS,
        {"system", required_argument, NULL, OPT_SYSTEM},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    gen_options o;
    memset(&o, 0, sizeof o);
    const char *system = NULL;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "n:h", options, NULL)) != -1) {
        if (daemon_common_option(opt)) continue;
        int r = gen_option("chat", opt, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (opt == OPT_SYSTEM) {
            system = optarg;
        } else if (opt == 'h') {
            chat_usage(stdout);
            return 0;
        } else {
            return 2;
        }
    }
    if (argc - optind != 1) {
        chat_usage(stderr);
        return 2;
    }
    o.params.model = argv[optind];
    char session[40];
    if (!o.params.session) {
        random_session_id(session, sizeof session);
        o.params.session = session;
    }
    if (o.schema_path && !strcmp(o.schema_path, "-"))
        return cli_fail("chat", "--json-schema -: chat reads its messages from stdin; name a file");
    if (gen_options_load("chat", &o)) return 1;
    corral_client *c = daemon_connect("chat");
    if (!c) {
        gen_options_release(&o);
        return 1;
    }
    install_sigint();

    chat_history h = {0};
    int rc = 0;
    if (system) {
        char *copy = strdup(system);
        if (!copy || chat_history_add(&h, "system", copy) != 0) {
            free(copy);
            rc = cli_fail("chat", "out of memory");
        }
    }
    bool interactive = isatty(STDIN_FILENO);
    bool turn_failed = false;
    char *line = NULL;
    size_t line_cap = 0;
    while (rc == 0) {
        if (interactive) {
            fputs("> ", stderr);
            fflush(stderr);
        }
        int seen = interrupts;
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) {
            if (interrupts != seen) rc = 130;
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0) break;
        if (n == 0) continue;
        char *content = strdup(line);
        if (!content || chat_history_add(&h, "user", content) != 0) {
            free(content);
            rc = cli_fail("chat", "out of memory");
            break;
        }
        o.params.messages = h.messages;
        o.params.n_messages = h.n;
        text_buf reply = {0};
        corral_done done;
        interrupts = 0;
        int r = stream_generation("chat", c, &o.params, &reply, &done);
        if (r == 0 || r == 130) {
            putchar('\n');
            fflush(stdout);
            if (o.stats && r == 0) print_stats(&done);
            /* A stopped reply stays in the history as far as it got, as the daemon saw it. */
            char *text = reply.data ? reply.data : strdup("");
            if (!text || chat_history_add(&h, "assistant", text) != 0) {
                free(text);
                rc = cli_fail("chat", "out of memory");
            }
        } else {
            /* The turn failed: forget the message so the next one starts from the last reply. */
            turn_failed = true;
            free(reply.data);
            h.n--;
            free((char *)h.messages[h.n].content);
        }
        interrupts = 0;
    }
    free(line);
    chat_history_free(&h);
    corral_client_destroy(&c);
    gen_options_release(&o);
    return rc == 0 && turn_failed ? 1 : rc;
}
