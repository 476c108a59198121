/*
 * spawn.h — the servers a benchmark program starts (corrald, llama-server), and stopping them on
 * every way out.
 *
 * A benchmark that dies with a daemon still running leaves a process that holds gigabytes and
 * skews the next measurement on the machine. So every child started here is tracked, and
 * spawn_cleanup — which stops every tracked child (SIGTERM, then SIGKILL after 10 s) and removes
 * the run directory — runs at exit (a normal end, or exit(1) from any thread on an error) and on
 * SIGINT, SIGTERM and SIGHUP. Those signals are blocked in every thread and taken by one thread
 * in sigwait, so that the cleanup runs as ordinary code, not in a signal handler. Children also
 * get PR_SET_PDEATHSIG, for the case of this process being killed outright.
 *
 * Thread-safety: every function may be called from any thread, after spawn_install.
 */
#ifndef CORRAL_BENCH_SPAWN_H
#define CORRAL_BENCH_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Install the cleanup (atexit and the signal thread) and ignore SIGPIPE. Call it before any other
 * thread is started: the stop signals are blocked in the calling thread and inherited from it.
 * `who` (static) prefixes the messages. Returns 0, or -1 with errno set. */
int spawn_install(const char *who);

/* Have the cleanup remove dir (the whole tree), or, with keep, say that it was kept. The path is
 * copied. */
void spawn_set_run_dir(const char *dir, bool keep);

/* Start argv[0] (a path; argv NULL-terminated) with stdin from /dev/null and stdout and stderr
 * appended to log_path, and track it. Returns its pid, or -1 with errno set. */
pid_t spawn_child(const char *const *argv, const char *log_path);

/* Whether a tracked child has exited (it is then reaped and forgotten). Never waits. */
bool spawn_exited(pid_t pid);

/* Stop a tracked child: SIGTERM, up to timeout_s for it to exit, then SIGKILL; then forget it.
 * pid <= 0 does nothing. */
void spawn_stop(pid_t pid, double timeout_s);

/* Stop every tracked child and remove the run directory (see spawn_set_run_dir). Runs once; later
 * calls return at once. */
void spawn_cleanup(void);

/* Whether spawn_cleanup has begun (the servers may be gone: a request failing now is no news). */
bool spawn_cleaning_up(void);

/* Run argv (argv[0] a path) to completion and keep the first size-1 bytes of its stdout and
 * stderr, NUL-terminated, in out ("" when it could not run). */
void spawn_capture(const char *const *argv, char *out, size_t size);

/* Print the last few KiB of a log file to stderr, between marker lines. */
void spawn_print_log_tail(const char *path);

/* Remove a directory tree, never following symlinks. */
void spawn_remove_tree(const char *dir);

#endif /* CORRAL_BENCH_SPAWN_H */
