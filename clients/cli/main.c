/*
 * main.c — `corral`: dispatch to subcommands, global help and version.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "corral/log.h"
#include "corral/paths.h"
#include "corral/version.h"

typedef struct cli_command {
    const char *name;
    cli_command_fn fn;
    const char *summary;
} cli_command;

static const cli_command cli_commands[] = {
    {"run-local", cmd_run_local, "generate text with a model file, no daemon needed"},
    {"tokenize-local", cmd_tokenize_local, "print the token ids of stdin's text for a model file"},
    {"perplexity", cmd_perplexity, "perplexity of a model file over a text file"},
    {"logits", cmd_logits, "a model file's logits of token ids, to compare with references"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensors"},
    {"synth", cmd_synth, "write a synthetic model (a real model's shape, random weights)"},
    {"bench", cmd_bench, "measure a model file's prompt and generation speed, memory bandwidth"},
    {"merge", cmd_merge, "merge LoRA adapters into a model file (GGUF or PEFT adapters)"},
    {"keygen", cmd_keygen, "make a CURVE key pair for corrald's tcp endpoints"},
    {"quantize", cmd_quantize, "quantize a model file (llama-quantize's types and recipes)"},
    {"imatrix", cmd_imatrix, "compute an importance matrix over calibration text"},
    {"run", cmd_run, "generate text with a model of the running corrald"},
    {"chat", cmd_chat, "chat with a model of the running corrald"},
    {"ps", cmd_ps, "the daemon's models: state, memory, last use, queue"},
    {"models", cmd_models, "the models configured in the daemon"},
    {"status", cmd_status, "the daemon's totals and its models' state"},
    {"load", cmd_load, "load a model into the daemon now"},
    {"unload", cmd_unload, "release a model's memory in the daemon"},
    {"pin", cmd_pin, "load a model in the daemon and keep it there"},
    {"unpin", cmd_unpin, "let the daemon unload or swap out a model again"},
    {"add", cmd_add, "add a model to corrald's configuration and reload it"},
    {"rm", cmd_rm, "remove a model from corrald's configuration and reload it"},
    {"show", cmd_show, "a model's metadata, template, adapters and state"},
    {"service", cmd_service,
     "run corrald as a systemd user service (install, start, stop, status)"},
};

static void print_usage(FILE *out) {
    fprintf(out, "usage: corral <command> [options]   (corral <command> --help for details)\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++)
        fprintf(out, "  %-16s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out,
            "\nglobal options (daemon commands): --endpoint URL, --app NAME, and for tcp\n"
            "  endpoints --server-key KEY | --server-key-file FILE, --client-key-file FILE\n"
            "environment: CORRAL_LOG_LEVEL (error, warn, info, debug, trace),\n"
            "             CORRAL_ENDPOINT (corrald's endpoint when --endpoint is not given),\n"
            "             CORRAL_SERVER_KEY, CORRAL_SERVER_KEY_FILE, CORRAL_CLIENT_KEY_FILE\n"
            "             (CURVE keys for tcp endpoints; see SECURITY.md)\n");
}

int cli_fail(const char *cmd, const char *fmt, ...) {
    fprintf(stderr, "corral %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

int cli_cache_dir(const char *cmd, const char *given, char *buf, size_t size, const char **out) {
    *out = NULL;
    if (!given || !*given) given = getenv("CORRAL_CACHE_DIR");
    if (given && *given) {
        if (strcmp(given, "none") == 0) return 0;
        if ((size_t)snprintf(buf, size, "%s", given) >= size)
            return cli_fail(cmd, "cache directory '%s': path too long", given), -1;
    } else {
        corral_error err;
        if (paths_user_cache_dir(buf, size, &err) != CORRAL_OK)
            return cli_fail(cmd, "%s", err.message), -1;
    }
    *out = buf;
    return 0;
}

int cli_parse_long(const char *text, long min, long max, long *out) {
    if (!text || !*text) return -1;
    char *end;
    long v = strtol(text, &end, 10);
    if (*end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

char *cli_read_stream(FILE *fp, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) break;
        cap *= 2;
        char *grown = realloc(buf, cap + 1);
        if (!grown) free(buf);
        buf = grown;
    }
    if (!buf || ferror(fp)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cli_parse_double(const char *text, double min, double max, double *out) {
    if (!text || !*text) return -1;
    char *end;
    double v = strtod(text, &end);
    if (*end || !(v >= min && v <= max)) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    log_set_level(LOG_LEVEL_WARN);
    if (log_level_from_env() != 0) {
        fprintf(stderr, "corral: CORRAL_LOG_LEVEL is not one of error, warn, info, debug, trace\n");
        return 2;
    }
    int globals = cli_parse_global_options(argc, argv); /* --endpoint/--app before the command */
    if (globals < 0) return 2;
    argv[globals] = argv[0];
    argv += globals;
    argc -= globals;
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
        printf("corral %s\n", CORRAL_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++)
        if (strcmp(argv[1], cli_commands[i].name) == 0) {
            /* getopt prefixes its messages with argv[0]: "corral run: unrecognized option", as
             * every other message of the command (cli_fail). */
            char name[64];
            snprintf(name, sizeof name, "corral %s", cli_commands[i].name);
            argv[1] = name;
            return cli_commands[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "corral: unknown command '%s'\n\n", argv[1]);
    print_usage(stderr);
    return 2;
}
