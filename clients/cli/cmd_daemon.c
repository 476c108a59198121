/*
 * cmd_daemon.c — the `corral` commands that talk to a running corrald through libcorral: ps,
 * models, status, load, unload, pin, unpin; and what every daemon command shares (daemon_cli.h):
 * connecting, the common options, errors, readable numbers. run and chat are in cmd_generate.c,
 * add, rm and show in cmd_config.c.
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
#include "daemon_cli.h"
#include "json.h"

const char *cli_endpoint = NULL;
const char *cli_app = NULL;
const char *cli_server_key = NULL;
const char *cli_server_key_file = NULL;
const char *cli_client_key_file = NULL;

/* How long the first ping may take before the daemon counts as not running. */
#define DAEMON_CONNECT_TIMEOUT_MS 3000

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

int cli_daemon_error(const char *cmd, corral_status st, const corral_error *err) {
    return cli_fail(cmd, "%s: %s", corral_status_name(st) ? corral_status_name(st) : "ERROR",
                    err->message);
}

static int daemon_not_running(const char *cmd, const char *endpoint) {
    return cli_fail(cmd,
                    "no answer from corrald at %s (is it running? start it with `make run` or "
                    "corrald -c FILE)",
                    endpoint);
}

corral_client *cli_daemon_connect(const char *cmd) {
    corral_error err;
    const corral_connect_options options = {.endpoint = cli_endpoint,
                                            .server_key = cli_server_key,
                                            .server_key_file = cli_server_key_file,
                                            .client_key_file = cli_client_key_file};
    corral_client *c = corral_client_new_with(&options, &err);
    if (!c) {
        cli_daemon_error(cmd, err.status, &err);
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
        if (st == CORRAL_DEADLINE_EXCEEDED || st == CORRAL_UNAVAILABLE) /* (nothing accepted it) */
            daemon_not_running(cmd, endpoint);
        else
            cli_daemon_error(cmd, st, &err);
        corral_client_destroy(&c);
        return NULL;
    }
    return c;
}

const char cli_daemon_help[] =
    "      --endpoint URL      corrald's endpoint (default: $CORRAL_ENDPOINT, else the\n"
    "                          default ipc socket)\n"
    "      --app NAME          act as this app (one of those corrald lets this client be)\n"
    "      --server-key KEY    tcp: corrald's CURVE public key (default: $CORRAL_SERVER_KEY)\n"
    "      --server-key-file F tcp: a file holding it (default: $CORRAL_SERVER_KEY_FILE)\n"
    "      --client-key-file F tcp: this client's CURVE secret key file (default:\n"
    "                          $CORRAL_CLIENT_KEY_FILE; `corral keygen` makes key pairs)\n"
    "  -h, --help              this help\n";

bool cli_daemon_option(int opt) {
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

void cli_format_bytes(uint64_t bytes, char *buf, size_t size) {
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

void cli_format_duration(uint64_t ms, char *buf, size_t size) {
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
void cli_format_age(uint64_t unix_ms, char *buf, size_t size) {
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
        cli_format_bytes(m->bytes, mem, sizeof mem);
        cli_format_age(m->last_used_ms, age, sizeof age);
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
        if (cli_daemon_option(opt)) continue;
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
                   cli_daemon_help);
            return 0;
        } else {
            return 2;
        }
    }
    if (argc - optind > 1) return cli_fail(cmd, "at most one MODEL"), 2;
    const char *model = optind < argc ? argv[optind] : NULL;
    corral_client *c = cli_daemon_connect(cmd);
    if (!c) return 1;
    corral_error err;
    corral_status_report *r = NULL;
    corral_status st = corral_client_status(c, model, DAEMON_CALL_TIMEOUT_MS, &r, &err);
    corral_client_destroy(&c);
    if (st != CORRAL_OK) return cli_daemon_error(cmd, st, &err);
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
            cli_format_duration(d->uptime_ms, up, sizeof up);
            cli_format_bytes(d->total_bytes, total, sizeof total);
            cli_format_bytes(d->limit_bytes, limit, sizeof limit);
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
        if (cli_daemon_option(opt)) continue;
        if (opt == OPT_JSON) {
            json = true;
        } else if (opt == 'h') {
            printf("usage: corral models [--json]\n\n"
                   "The models configured in corrald: state, context, chat template, "
                   "architecture,\npinned, file.\n\noptions:\n"
                   "      --json              one JSON object instead of a table\n%s",
                   cli_daemon_help);
            return 0;
        } else {
            return 2;
        }
    }
    if (optind < argc) return cli_fail("models", "unexpected argument '%s'", argv[optind]), 2;
    corral_client *c = cli_daemon_connect("models");
    if (!c) return 1;
    corral_error err;
    corral_model_list *l = NULL;
    corral_status st = corral_list_models(c, DAEMON_CALL_TIMEOUT_MS, &l, &err);
    corral_client_destroy(&c);
    if (st != CORRAL_OK) return cli_daemon_error("models", st, &err);
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

/* The four residency commands: which call each makes, and what it prints when done. */
typedef enum model_op { MODEL_OP_LOAD, MODEL_OP_UNLOAD, MODEL_OP_PIN, MODEL_OP_UNPIN } model_op;

void cli_show_daemon_progress(const corral_progress_info *p, void *user) {
    cli_progress *line = user;
    if (strcmp(line->label, p->model) != 0 && p->model[0])
        snprintf(line->label, sizeof line->label, "%s", p->model);
    cli_progress_show(line, corral_progress_phase_name(p->phase), p->done, p->total);
}

static int model_command(const char *cmd, model_op op, const char *done_word, const char *summary,
                         int argc, char **argv) {
    enum { OPT_FORCE = 2000 };
    static const struct option options[] = {
        {"force", no_argument, NULL, OPT_FORCE},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    bool force = false;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (cli_daemon_option(opt)) continue;
        if (opt == OPT_FORCE && op == MODEL_OP_UNLOAD) {
            force = true;
            continue;
        }
        if (opt == 'h') {
            printf("usage: corral %s MODEL%s\n\n%s\n\noptions:\n%s%s", cmd,
                   op == MODEL_OP_UNLOAD ? " [--force]" : "", summary,
                   op == MODEL_OP_UNLOAD ? "      --force             unpin a pinned model first\n"
                                         : "",
                   cli_daemon_help);
            return 0;
        }
        if (opt == OPT_FORCE) cli_fail(cmd, "--force applies to unload only");
        return 2;
    }
    if (argc - optind != 1) return cli_fail(cmd, "give one MODEL (see corral %s --help)", cmd), 2;
    const char *model = argv[optind];
    corral_client *c = cli_daemon_connect(cmd);
    if (!c) return 1;
    corral_error err;
    corral_status st = CORRAL_OK;
    /* A load (or the load a pin makes) shows its phases on the progress line; it takes as long
     * as it takes. */
    cli_progress line;
    cli_progress_init(&line, model);
    switch (op) {
        case MODEL_OP_LOAD:
            st = corral_load_with_progress(c, model, -1, cli_show_daemon_progress, &line, &err);
            break;
        case MODEL_OP_PIN:
            st = corral_pin_with_progress(c, model, -1, cli_show_daemon_progress, &line, &err);
            break;
        case MODEL_OP_UNLOAD:
            st = corral_unload_force(c, model, force, DAEMON_CALL_TIMEOUT_MS, &err);
            break;
        case MODEL_OP_UNPIN:
            st = corral_unpin(c, model, DAEMON_CALL_TIMEOUT_MS, &err);
            break;
    }
    cli_progress_clear(&line);
    corral_client_destroy(&c);
    if (st != CORRAL_OK) return cli_daemon_error(cmd, st, &err);
    printf("%s %s\n", done_word, model);
    return 0;
}

int cmd_load(int argc, char **argv) {
    return model_command("load", MODEL_OP_LOAD, "loaded",
                         "Load a model now and wait until it is resident (a terminal shows the\n"
                         "load's progress: loading, merging a variant's adapters, rearranging its\n"
                         "weights the first time).",
                         argc, argv);
}

int cmd_unload(int argc, char **argv) {
    return model_command("unload", MODEL_OP_UNLOAD, "unloaded",
                         "Release a model's memory (refused while requests use it; its sessions'\n"
                         "caches go to the swap directory). A pinned model is refused, naming the\n"
                         "pin, unless --force unpins it first.",
                         argc, argv);
}

int cmd_pin(int argc, char **argv) {
    return model_command("pin", MODEL_OP_PIN, "pinned",
                         "Load a model (as `corral load` does) and keep it: it is never unloaded\n"
                         "or swapped out to make room until `corral unpin` (or unload --force).",
                         argc, argv);
}

int cmd_unpin(int argc, char **argv) {
    return model_command("unpin", MODEL_OP_UNPIN, "unpinned",
                         "Unpin a model: it may be unloaded or swapped out to make room again.",
                         argc, argv);
}
