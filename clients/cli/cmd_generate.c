/*
 * cmd_generate.c — `corral run` and `corral chat`: generation on a running corrald, streamed to
 * the terminal, with the daemon's progress (the model's load, a long prompt) on a one-line
 * progress bar on stderr when it is a terminal, and Ctrl-C to stop a generation.
 *
 * chat is a small REPL over one session: each turn sends the whole conversation, and the daemon
 * computes only what is new (its session keeps the KV cache). Lines that start with '/' are its
 * commands (/help lists them); when the conversation outgrows the model's context the daemon
 * drops its oldest turns and says so in Done, which the REPL reports.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"
#include "corral.h"
#include "corral/suggest.h"
#include "daemon_cli.h"

#define DAEMON_STOP_MAX 16

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
 * given). Until the first chunk, the daemon's progress (its model loading, a long prompt) is on
 * the progress line (stderr, a terminal only). Ctrl-C cancels it. Returns 0 with *done filled,
 * 130 if Ctrl-C cancelled it (after the daemon confirmed), or 1 after printing the error. */
static int stream_generation(const char *cmd, corral_client *c, const corral_generate_params *p,
                             text_buf *reply, corral_done *done) {
    corral_error err;
    corral_generation *g = corral_generate_start(c, p, &err);
    if (!g) return cli_daemon_error(cmd, err.status, &err);
    int interrupts_seen = interrupts;
    bool cancelled = false;
    int rc;
    cli_progress line;
    cli_progress_init(&line, p->model);
    bool text_seen = false;
    for (;;) {
        if (interrupts != interrupts_seen && !cancelled) {
            cancelled = true;
            corral_status st = corral_generation_cancel(g, &err);
            if (st != CORRAL_OK) {
                rc = cli_daemon_error(cmd, st, &err);
                break;
            }
        }
        corral_chunk chunk;
        int r = corral_generation_poll(g, DAEMON_POLL_MS, &chunk, done, &err);
        if (!text_seen) {
            corral_progress_info info;
            corral_generation_progress_info(g, &info);
            if (info.phase != CORRAL_PHASE_UNSPECIFIED) cli_show_daemon_progress(&info, &line);
        }
        if (r == CORRAL_POLL_NOTHING) continue;
        cli_progress_clear(&line);
        if (r == CORRAL_POLL_CHUNK) {
            text_seen = true;
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
            rc = cli_daemon_error(cmd, (corral_status)r, &err);
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
    if (d->dropped_messages)
        fprintf(stderr, "; %" PRIu32 " oldest messages left out", d->dropped_messages);
    fprintf(stderr, "]\n");
    if (d->sanitizer_report[0]) fprintf(stderr, "[sanitizers: %s]\n", d->sanitizer_report);
}

/* Read --json-schema's file (after every option is known good, so nothing leaks on a usage
 * error). 0, or 1 after a message. */
static int gen_options_load(const char *cmd, gen_options *o) {
    if (!o->schema_path) return 0;
    size_t len;
    if (strcmp(o->schema_path, "-") == 0) {
        o->schema = cli_read_stream(stdin, &len);
        if (!o->schema) return cli_fail(cmd, "--json-schema: reading stdin failed");
    } else {
        FILE *f = fopen(o->schema_path, "rb");
        if (!f) return cli_fail(cmd, "--json-schema: %s: %s", o->schema_path, strerror(errno));
        o->schema = cli_read_stream(f, &len);
        fclose(f);
        if (!o->schema) return cli_fail(cmd, "--json-schema: reading %s failed", o->schema_path);
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
            gen_options_help, cli_daemon_help);
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
        if (cli_daemon_option(opt)) continue;
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
        size_t len;
        owned_prompt = cli_read_stream(stdin, &len);
        if (!owned_prompt) {
            gen_options_release(&o);
            return cli_fail("run", "reading the prompt from stdin failed");
        }
        o.params.prompt = owned_prompt;
    } else {
        o.params.prompt = argv[optind + 1];
    }
    corral_client *c = cli_daemon_connect("run");
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
            "and press Enter; the reply streams back. /exit (or Ctrl-D) ends the chat; Ctrl-C\n"
            "stops a reply, or ends the chat at the prompt; /help lists the other commands.\n"
            "The whole conversation is sent each turn on one session (by default a random id),\n"
            "so the daemon keeps its state and only computes what is new; when it outgrows the\n"
            "model's context, the daemon leaves the oldest turns out (the system message stays)\n"
            "and the chat says so. A reply cut short by --max-tokens ends with \"[...]\" on a\n"
            "terminal, and a note on stderr. A turn\n"
            "that fails is reported and dropped; the exit status is then 1. A MODEL the daemon\n"
            "does not serve is refused at start.\n\n"
            "options:\n"
            "      --system TEXT       a system message at the start of the conversation\n%s%s",
            gen_options_help, cli_daemon_help);
}

/* The REPL's commands, for /help and dispatch. */
static const struct {
    const char *name, *args, *help;
} chat_commands[] = {
    {"/help", "", "this list"},
    {"/clear", "", "forget the conversation (the system message stays)"},
    {"/system", "[TEXT]", "set the system message (no TEXT: show it; \"/system -\": remove it)"},
    {"/stats", "", "token counts and timings of the last reply; the conversation's size"},
    {"/exit", "", "end the chat (also /quit, Ctrl-D)"},
};

/* The conversation so far; contents are owned (malloc'd). A system message, when there is one,
 * is messages[0]. */
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

static bool chat_has_system(const chat_history *h) {
    return h->n > 0 && strcmp(h->messages[0].role, "system") == 0;
}

/* Forget every turn; the system message stays. */
static void chat_history_clear(chat_history *h) {
    const size_t keep = chat_has_system(h) ? 1 : 0;
    for (size_t i = keep; i < h->n; i++) free((char *)h->messages[i].content);
    h->n = keep;
}

/* Set (text non-NULL) or remove the system message. -1 when out of memory. */
static int chat_set_system(chat_history *h, const char *text) {
    if (chat_has_system(h)) {
        free((char *)h->messages[0].content);
        if (text) {
            if (!(h->messages[0].content = strdup(text))) return -1;
            return 0;
        }
        memmove(h->messages, h->messages + 1, (h->n - 1) * sizeof *h->messages);
        h->n--;
        return 0;
    }
    if (!text) return 0;
    char *copy = strdup(text);
    if (!copy || chat_history_add(h, "system", copy) != 0) {
        free(copy);
        return -1;
    }
    /* The new message went last: move it to the front. */
    const corral_message sys = h->messages[h->n - 1];
    memmove(h->messages + 1, h->messages, (h->n - 1) * sizeof *h->messages);
    h->messages[0] = sys;
    return 0;
}

static void chat_history_free(chat_history *h) {
    for (size_t i = 0; i < h->n; i++) free((char *)h->messages[i].content);
    free(h->messages);
}

/* The model as the daemon lists it, or an error naming the models it serves (with the likeliest
 * one) when it has none by that name: a chat with a model that cannot answer ends at once, not
 * at every turn. Returns 0 and fills the banner's facts, else prints why and returns 1. */
static int chat_check_model(corral_client *c, const char *name, char *facts, size_t size) {
    corral_error err;
    corral_model_list *l = NULL;
    corral_status st = corral_list_models(c, DAEMON_CALL_TIMEOUT_MS, &l, &err);
    if (st != CORRAL_OK) return cli_daemon_error("chat", st, &err);
    const corral_model_info *m = NULL;
    char known[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < l->n_models; i++) {
        if (strcmp(l->models[i].name, name) == 0) m = &l->models[i];
        if (len < sizeof known)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "",
                                    l->models[i].name);
    }
    if (!m) {
        const char **names = calloc(l->n_models ? l->n_models : 1, sizeof *names);
        for (size_t i = 0; names && i < l->n_models; i++) names[i] = l->models[i].name;
        const char *close = names ? suggest_closest(name, names, l->n_models) : NULL;
        char hint[160] = "";
        if (close) snprintf(hint, sizeof hint, "; did you mean '%s'?", close);
        cli_fail("chat", "NOT_FOUND: model '%s' is not configured (corrald serves: %s)%s", name,
                 l->n_models ? known : "no models", hint);
        free(names);
        corral_model_list_destroy(&l);
        return 1;
    }
    char ctx[32] = "";
    if (m->context) snprintf(ctx, sizeof ctx, ", context %" PRIu32, m->context);
    snprintf(facts, size, "%s%s%s%s%s", m->arch[0] ? m->arch : "not loaded yet", ctx,
             m->chat_template[0] ? ", template " : "", m->chat_template,
             strcmp(m->context_overflow, "error") == 0 ? ", long chats fail" : "");
    corral_model_list_destroy(&l);
    return 0;
}

/* The conversation's figures, for /stats. */
typedef struct chat_stats {
    bool any;
    corral_done last;
    uint32_t turns;
} chat_stats;

static void chat_print_help(void) {
    fprintf(stderr, "commands:\n");
    for (size_t i = 0; i < sizeof chat_commands / sizeof chat_commands[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s %s", chat_commands[i].name, chat_commands[i].args);
        fprintf(stderr, "  %-16s %s\n", name, chat_commands[i].help);
    }
    fprintf(stderr, "anything else is a message to the model (start it with \"//\" to send a "
                    "leading '/').\n");
}

/* What a turn's end says beside the reply: a marker right after a reply that was cut short,
 * on a terminal (where a person reads the reply; a script reading stdout gets the reply's text
 * alone), and notes on stderr: the cut, the daemon leaving old turns out. */
static void chat_after_reply(const corral_done *d, int rc) {
    const bool tty = isatty(STDOUT_FILENO);
    if (tty && rc == 0 && d->stop_reason == CORRAL_STOP_MAX_TOKENS)
        fputs(" [...]", stdout);
    else if (tty && rc == 0 && d->stop_reason == CORRAL_STOP_CONTEXT_FULL)
        fputs(" [context full]", stdout);
    putchar('\n');
    fflush(stdout);
    if (rc == 0 && d->stop_reason == CORRAL_STOP_MAX_TOKENS)
        fprintf(stderr, "(the reply was cut at %" PRIu32 " tokens: raise -n for longer ones)\n",
                d->generated_tokens);
    if (rc == 0 && d->dropped_messages)
        fprintf(stderr,
                "(the conversation outgrew the model's context: its %" PRIu32
                " oldest messages were left out)\n",
                d->dropped_messages);
}

/* A line that is a REPL command: handled here. Returns 1 to go on, 0 to end the chat, -1 when
 * out of memory. */
static int chat_command(const char *line, chat_history *h, const chat_stats *st) {
    if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0) return 0;
    if (strcmp(line, "/help") == 0 || strcmp(line, "/?") == 0) {
        chat_print_help();
    } else if (strcmp(line, "/clear") == 0) {
        chat_history_clear(h);
        fprintf(stderr, "(conversation cleared%s)\n",
                chat_has_system(h) ? "; the system message stays" : "");
    } else if (strcmp(line, "/system") == 0) {
        if (chat_has_system(h))
            fprintf(stderr, "system: %s\n", h->messages[0].content);
        else
            fprintf(stderr, "(no system message)\n");
    } else if (strncmp(line, "/system ", 8) == 0) {
        const char *text = line + 8;
        while (*text == ' ') text++;
        if (chat_set_system(h, strcmp(text, "-") == 0 ? NULL : text) != 0) return -1;
        fprintf(stderr, "(system message %s)\n", strcmp(text, "-") == 0 ? "removed" : "set");
    } else if (strcmp(line, "/stats") == 0) {
        size_t turns = 0;
        for (size_t i = 0; i < h->n; i++) turns += strcmp(h->messages[i].role, "user") == 0;
        fprintf(stderr, "conversation: %zu messages (%zu of yours)%s\n", h->n, turns,
                chat_has_system(h) ? ", with a system message" : "");
        if (st->any)
            print_stats(&st->last);
        else
            fprintf(stderr, "(no reply yet)\n");
    } else {
        const char **names = malloc(sizeof chat_commands / sizeof chat_commands[0] * sizeof *names);
        size_t n = 0;
        for (size_t i = 0; names && i < sizeof chat_commands / sizeof chat_commands[0]; i++)
            names[n++] = chat_commands[i].name;
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)strcspn(line, " "), line);
        const char *close = names ? suggest_closest(word, names, n) : NULL;
        fprintf(stderr, "unknown command %s%s%s%s; /help lists them\n", word,
                close ? " (did you mean " : "", close ? close : "", close ? "?)" : "");
        free(names);
    }
    return 1;
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
        if (cli_daemon_option(opt)) continue;
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
    corral_client *c = cli_daemon_connect("chat");
    if (!c) {
        gen_options_release(&o);
        return 1;
    }
    char facts[256];
    if (chat_check_model(c, o.params.model, facts, sizeof facts) != 0) {
        corral_client_destroy(&c);
        gen_options_release(&o);
        return 1;
    }
    install_sigint();

    chat_history h = {0};
    int rc = 0;
    if (system && chat_set_system(&h, system) != 0) rc = cli_fail("chat", "out of memory");
    const bool interactive = isatty(STDIN_FILENO);
    if (interactive)
        fprintf(stderr,
                "corral chat with %s (%s) on %s\n"
                "Type a message and press Enter. /help lists the commands; /exit or Ctrl-D "
                "ends the chat.\n",
                o.params.model, facts, corral_client_endpoint(c));
    bool turn_failed = false;
    chat_stats stats = {0};
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
            /* End of input (Ctrl-D) leaves the cursor after the prompt: end its line. */
            if (interactive) fputc('\n', stderr);
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n == 0) continue;
        const char *text = line;
        if (line[0] == '/' && line[1] == '/') {
            text = line + 1; /* "//x" sends "/x" */
        } else if (line[0] == '/') {
            const int r = chat_command(line, &h, &stats);
            if (r < 0) rc = cli_fail("chat", "out of memory");
            if (r <= 0) break;
            continue;
        }
        char *content = strdup(text);
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
            chat_after_reply(&done, r);
            if (r == 0) {
                stats.any = true;
                stats.last = done;
                stats.turns++;
                if (o.stats) print_stats(&done);
            }
            /* A stopped reply stays in the history as far as it got, as the daemon saw it. */
            char *reply_text = reply.data ? reply.data : strdup("");
            if (!reply_text || chat_history_add(&h, "assistant", reply_text) != 0) {
                free(reply_text);
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
