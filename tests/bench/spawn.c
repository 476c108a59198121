/*
 * spawn.c — child servers of a benchmark and the cleanup that stops them (see spawn.h).
 */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchutil.h"

enum { SPAWN_MAX_CHILDREN = 16 };

static struct {
    pthread_mutex_t mu;
    const char *who;
    pid_t pids[SPAWN_MAX_CHILDREN]; /* 0: a free entry */
    char run_dir[PATH_MAX];
    bool keep;
    bool done;
    sigset_t stop_signals;
} g_spawn = {.mu = PTHREAD_MUTEX_INITIALIZER, .who = "bench"};

static void spawn_forget(pid_t pid) {
    pthread_mutex_lock(&g_spawn.mu);
    for (int i = 0; i < SPAWN_MAX_CHILDREN; i++)
        if (g_spawn.pids[i] == pid) g_spawn.pids[i] = 0;
    pthread_mutex_unlock(&g_spawn.mu);
}

/* Send signo, wait up to timeout_s for the exit, then SIGKILL and wait. */
static void spawn_reap(pid_t pid, int signo, double timeout_s) {
    kill(pid, signo);
    const double until = now_s() + timeout_s;
    for (;;) {
        const pid_t r = waitpid(pid, NULL, WNOHANG);
        if (r == pid || r < 0) return;
        if (now_s() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return;
        }
        usleep(10000);
    }
}

static int spawn_remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void spawn_remove_tree(const char *dir) {
    nftw(dir, spawn_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void spawn_cleanup(void) {
    pthread_mutex_lock(&g_spawn.mu);
    if (g_spawn.done) {
        pthread_mutex_unlock(&g_spawn.mu);
        return;
    }
    g_spawn.done = true;
    for (int i = 0; i < SPAWN_MAX_CHILDREN; i++)
        if (g_spawn.pids[i] > 0) {
            spawn_reap(g_spawn.pids[i], SIGTERM, 10.0);
            g_spawn.pids[i] = 0;
        }
    if (g_spawn.run_dir[0]) {
        if (g_spawn.keep)
            fprintf(stderr, "%s: kept %s\n", g_spawn.who, g_spawn.run_dir);
        else
            spawn_remove_tree(g_spawn.run_dir);
    }
    pthread_mutex_unlock(&g_spawn.mu);
}

bool spawn_cleaning_up(void) {
    pthread_mutex_lock(&g_spawn.mu);
    const bool done = g_spawn.done;
    pthread_mutex_unlock(&g_spawn.mu);
    return done;
}

static void *spawn_signal_main(void *arg) {
    (void)arg;
    int sig = 0;
    if (sigwait(&g_spawn.stop_signals, &sig) == 0) {
        fprintf(stderr, "%s: %s: stopping the servers\n", g_spawn.who, strsignal(sig));
        spawn_cleanup();
        _exit(128 + sig);
    }
    return NULL;
}

int spawn_install(const char *who) {
    g_spawn.who = who;
    sigemptyset(&g_spawn.stop_signals);
    sigaddset(&g_spawn.stop_signals, SIGINT);
    sigaddset(&g_spawn.stop_signals, SIGTERM);
    sigaddset(&g_spawn.stop_signals, SIGHUP);
    const int rc = pthread_sigmask(SIG_BLOCK, &g_spawn.stop_signals, NULL);
    if (rc != 0) return errno = rc, -1;
    signal(SIGPIPE, SIG_IGN); /* a server that dies mid-request shows in that request's result */
    pthread_t t;
    const int created = pthread_create(&t, NULL, spawn_signal_main, NULL);
    if (created != 0) return errno = created, -1;
    pthread_detach(t);
    return atexit(spawn_cleanup) == 0 ? 0 : -1;
}

void spawn_set_run_dir(const char *dir, bool keep) {
    pthread_mutex_lock(&g_spawn.mu);
    snprintf(g_spawn.run_dir, sizeof g_spawn.run_dir, "%s", dir);
    g_spawn.keep = keep;
    pthread_mutex_unlock(&g_spawn.mu);
}

/* In a child between fork and exec: undo what the parent set up for itself. Only
 * async-signal-safe calls: the parent has other threads. */
static void spawn_child_reset(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
}

pid_t spawn_child(const char *const *argv, const char *log_path) {
    const int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return -1;
    pthread_mutex_lock(&g_spawn.mu);
    int slot = -1;
    for (int i = 0; i < SPAWN_MAX_CHILDREN && slot < 0; i++)
        if (g_spawn.pids[i] == 0) slot = i;
    const pid_t pid = slot < 0 || g_spawn.done ? -1 : fork();
    if (pid == 0) {
        spawn_child_reset();
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        const int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
        dup2(log_fd, STDOUT_FILENO);
        dup2(log_fd, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        static const char msg[] = "spawn: exec failed\n";
        if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) _exit(127);
        _exit(127);
    }
    const int fork_errno = slot < 0 ? EAGAIN : g_spawn.done ? ECANCELED : errno;
    if (pid > 0) g_spawn.pids[slot] = pid;
    pthread_mutex_unlock(&g_spawn.mu);
    close(log_fd);
    if (pid < 0) errno = fork_errno;
    return pid;
}

bool spawn_exited(pid_t pid) {
    if (pid <= 0) return true;
    const pid_t r = waitpid(pid, NULL, WNOHANG);
    if (r == 0) return false;
    spawn_forget(pid);
    return true;
}

void spawn_stop(pid_t pid, double timeout_s) {
    if (pid <= 0) return;
    spawn_reap(pid, SIGTERM, timeout_s);
    spawn_forget(pid);
}

void spawn_capture(const char *const *argv, char *out, size_t size) {
    out[0] = '\0';
    int fds[2];
    if (size == 0 || pipe2(fds, O_CLOEXEC) != 0) return;
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        spawn_child_reset();
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        char scratch[1024];
        const size_t room = size - 1 - len;
        const ssize_t r = read(fds[0], room ? out + len : scratch, room ? room : sizeof scratch);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (room) len += (size_t)r;
    }
    out[len] = '\0';
    close(fds[0]);
    waitpid(pid, NULL, 0);
}

void spawn_print_log_tail(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) return;
    char buf[4096];
    fseek(fp, 0, SEEK_END);
    const long size = ftell(fp);
    fseek(fp, size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0, SEEK_SET);
    const size_t n = fread(buf, 1, sizeof buf - 1, fp);
    buf[n] = '\0';
    fclose(fp);
    fprintf(stderr, "--- the end of %s ---\n%s--- end ---\n", path, buf);
}
