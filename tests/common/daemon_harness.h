/*
 * daemon_harness.h — start a real corrald for a black-box test and stop it again.
 *
 * Each daemon gets a private temporary directory holding its config file, its ipc socket and its
 * log (stderr). The binary comes from $CORRALD (set by ctest).
 */
#ifndef CORRAL_DAEMON_HARNESS_H
#define CORRAL_DAEMON_HARNESS_H

#include <sys/types.h>

typedef struct harness_daemon {
    pid_t pid;
    char dir[64];          /* private temp dir */
    char endpoint[128];    /* ipc://<dir>/sock/corral.sock */
    char config_path[300]; /* <dir>/corral.yaml */
    char log_path[300];    /* <dir>/corrald.log: the daemon's stderr */
} harness_daemon;

/* Write `config_body` (YAML; the harness adds `listen:` with its own endpoint and a `memory:`
 * section with a private swap directory unless the body has them; "$IPC" in the body stands for
 * the harness's endpoint, which it waits on) and start corrald with extra_args
 * (NULL-terminated, may be NULL). Waits up to timeout_ms for the daemon to answer a ping (with a
 * Pong, or by refusing the connection when the config lets nobody of this user in). Returns 0
 * on success; -1 with the log printed to stderr otherwise. */
int harness_start(harness_daemon *d, const char *config_body, const char *const *extra_args,
                  int timeout_ms);

/* Send `signo` and wait up to timeout_ms for exit. Returns the exit status (0..255), 128+signal if
 * it died of a signal, or -1 if it had to be killed after the timeout. Removes the temp dir. */
int harness_stop(harness_daemon *d, int signo, int timeout_ms);

/* Run corrald with args to completion (for --version, bad configs): captures stdout+stderr into
 * out (NUL-terminated, truncated to size). Returns the exit status, or -1. */
int harness_run_corrald(const char *const *args, char *out, size_t size, int timeout_ms);

/* The whole log written so far, into buf (NUL-terminated). */
void harness_read_log(const harness_daemon *d, char *buf, size_t size);

/* Path of the corrald binary under test. */
const char *harness_corrald_path(void);

/* Run argv (argv[0] is the program's path; NULL-terminated) to completion with `input` (may be
 * NULL: empty) on its stdin, capturing stdout into out and stderr into err separately (each
 * NUL-terminated, truncated to its size; err may be NULL). The environment is inherited. Returns
 * the exit status, 128+signal if it died of one, or -1 if it had to be killed after timeout_ms. */
int harness_run_program(const char *const *argv, const char *input, char *out, size_t out_size,
                        char *err, size_t err_size, int timeout_ms);

#endif /* CORRAL_DAEMON_HARNESS_H */
