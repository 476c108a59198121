/*
 * cli.h — the `corral` command-line tool: shared declarations of its subcommands.
 *
 * Each subcommand is a function taking the arguments after its name (argv[0] is the subcommand)
 * and returning the process exit status: 0 success, 1 failure of the operation, 2 bad usage.
 * Results go to stdout; statistics, logs and errors to stderr.
 */
#ifndef CORRAL_CLI_H
#define CORRAL_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int (*cli_command_fn)(int argc, char **argv);

int cmd_inspect(int argc, char **argv);
int cmd_run_local(int argc, char **argv);
int cmd_tokenize_local(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_imatrix(int argc, char **argv);
int cmd_logits(int argc, char **argv);
/* corrald as a systemd user service (cmd_service.c). */
int cmd_service(int argc, char **argv);

/* Commands that talk to corrald (cmd_daemon.c). */
int cmd_ps(int argc, char **argv);
int cmd_models(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_load(int argc, char **argv);
int cmd_unload(int argc, char **argv);
int cmd_pin(int argc, char **argv);
int cmd_unpin(int argc, char **argv);

/* Commands that edit the user's configuration, and show one model (cmd_config.c). */
int cmd_add(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_show(int argc, char **argv);

/* Global options of the daemon commands (NULL: not given): --endpoint URL, --app NAME, and the
 * CURVE keys of tcp endpoints --server-key KEY, --server-key-file FILE, --client-key-file FILE. */
extern const char *cli_endpoint;
extern const char *cli_app;
extern const char *cli_server_key;
extern const char *cli_server_key_file;
extern const char *cli_client_key_file;

/* Take the global options that come before the command name (argv[1], argv[2], ...). Returns how
 * many arguments they took, or -1 after a message if one lacks its value. */
int cli_parse_global_options(int argc, char **argv);

/* The progress line on stderr (progress.c): drawn in place while long work runs, only when
 * stderr is a terminal; erased with cli_progress_clear before anything else is printed. */
typedef struct cli_progress {
    bool tty;                /* stderr is a terminal: draw; otherwise every call does nothing */
    bool shown;              /* a line is on the screen */
    char label[128];         /* what the work is for ("stories", a file name) */
    char what[64];           /* the phase last drawn */
    const char *engine_what; /* cli_progress_engine's phase word ("writing", "merging") */
    int64_t drawn_ms;
} cli_progress;

/* Start a progress line for `label` (may be NULL). */
void cli_progress_init(cli_progress *p, const char *label);
/* Show `what` (a phase: "loading", "repacking") at done of total (total 0: no fraction). */
void cli_progress_show(cli_progress *p, const char *what, uint64_t done, uint64_t total);
/* Erase the line, if one is shown. */
void cli_progress_clear(cli_progress *p);
/* A corral_progress_fn (corral/progress.h) for the engine's work: user is a cli_progress whose
 * engine_what names the phase. */
void cli_progress_engine(void *user, uint64_t done, uint64_t total);

/* Print "corral <cmd>: <message>" to stderr; returns 1 (for `return cli_fail(...)`). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The folder where the local tools (run-local, bench) keep the weights rearranged for the kernels,
 * as corrald keeps them in its cache.dir: `given` (a --cache-dir value; may be NULL), else
 * $CORRAL_CACHE_DIR, else the user's own cache folder ($XDG_CACHE_HOME/corral, else
 * ~/.cache/corral; corral/paths.h). *out is buf holding it, or NULL for "none" (rearranged in
 * memory at every load). Returns 0, or -1 after a message for `cmd` when it does not fit. */
int cli_cache_dir(const char *cmd, const char *given, char *buf, size_t size, const char **out);

/* Parse a whole decimal number in [min, max] from text into *out; 0 on success, -1 otherwise. */
int cli_parse_long(const char *text, long min, long max, long *out);
int cli_parse_double(const char *text, double min, double max, double *out);

/* All of a stream, in a malloc'ed buffer of *len bytes plus a NUL; NULL on a read error or when
 * out of memory. */
char *cli_read_stream(FILE *fp, size_t *len);

/* Parse token ids (decimal, separated by whitespace or commas) from text[0..len) into a malloc'ed
 * array (*ids, *n; caller frees). 0 on success; -1 with why filled (what and where) for anything
 * else in the text, an id over INT32_MAX, or no ids at all (cmd_logits.c). Ids are not checked
 * against a vocabulary. */
int cli_parse_ids(const char *text, size_t len, int32_t **ids, size_t *n, char *why,
                  size_t why_size);

#endif /* CORRAL_CLI_H */
