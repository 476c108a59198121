/*
 * daemon_cli.h — what the `corral` commands that talk to corrald share (private to clients/cli):
 * connecting (the global options, the first ping, the "is it running?" message), the options
 * every daemon command takes, error printing, and human-readable numbers. cmd_daemon.c defines
 * them and the residency and listing commands; cmd_generate.c has run and chat; cmd_config.c
 * add, rm and show.
 */
#ifndef CORRAL_CLI_DAEMON_CLI_H
#define CORRAL_CLI_DAEMON_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corral.h"

/* Timeout of the quick requests (status, list, tokenize, unpin). Load and pin may take long: no
 * limit. */
#define DAEMON_CALL_TIMEOUT_MS 30000
/* How often run/chat look at the Ctrl-C flag (and the progress) while they wait. */
#define DAEMON_POLL_MS         100

/* getopt_long values of the options every daemon command takes. */
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

/* The --help lines of those options. */
extern const char cli_daemon_help[];

/* Handle one of the shared options inside a getopt loop; true if opt was one of them. */
bool cli_daemon_option(int opt);

/* Connect, name the app, and check that the daemon answers. NULL after printing why (a daemon
 * that is not running gets one clear message). Caller owns the result. */
corral_client *cli_daemon_connect(const char *cmd);

/* Print `corral <cmd>: CODE: message`; returns 1. */
int cli_daemon_error(const char *cmd, corral_status st, const corral_error *err);

/* "1.1 MiB", "3m 20s", "42s ago" / "just now" / "never" (a Unix time in ms). */
void cli_format_bytes(uint64_t bytes, char *buf, size_t size);
void cli_format_duration(uint64_t ms, char *buf, size_t size);
void cli_format_age(uint64_t unix_ms, char *buf, size_t size);

/* Draw a Progress report of the daemon (a load, a merge, a prefill) on the terminal's progress
 * line: "stories: loading", "stories: repacking [####....] 40%". */
void cli_show_daemon_progress(const corral_progress_info *p, void *user);

#endif /* CORRAL_CLI_DAEMON_CLI_H */
