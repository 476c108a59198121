/*
 * daemon_harness.c — fork/exec of corrald with a private config, readiness by ping, clean stop.
 */
#include "daemon_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corral.h"

const char *harness_corrald_path(void) {
    const char *p = getenv("CORRALD");
    return p && *p ? p : "corrald";
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void harness_read_log(const harness_daemon *d, char *buf, size_t size) {
    buf[0] = '\0';
    FILE *fp = fopen(d->log_path, "r");
    if (!fp) return;
    size_t n = fread(buf, 1, size - 1, fp);
    buf[n] = '\0';
    fclose(fp);
}

static void remove_tree(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "harness: could not remove %s\n", dir);
}

int harness_start(harness_daemon *d, const char *config_body, const char *const *extra_args,
                  int timeout_ms) {
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/corral-it-XXXXXX");
    if (!mkdtemp(d->dir)) return -1;
    snprintf(d->endpoint, sizeof d->endpoint, "ipc://%s/sock/corral.sock", d->dir);
    snprintf(d->config_path, sizeof d->config_path, "%s/corral.yaml", d->dir);
    snprintf(d->log_path, sizeof d->log_path, "%s/corrald.log", d->dir);

    FILE *fp = fopen(d->config_path, "w");
    if (!fp) return -1;
    if (!config_body || !strstr(config_body, "listen:"))
        fprintf(fp, "listen: [\"%s\"]\n", d->endpoint);
    /* A private swap directory too: sessions swapped out at shutdown must not leak into other
     * tests' daemons through the user's default folders. */
    if (!config_body || !strstr(config_body, "memory:"))
        fprintf(fp, "memory: {swap_dir: \"%s/swap\"}\n", d->dir);
    /* Likewise the cache of merged and rearranged weights. */
    if (!config_body || !strstr(config_body, "cache:"))
        fprintf(fp, "cache: {dir: \"%s/cache\"}\n", d->dir);
    /* "$IPC" in the body stands for the harness's own endpoint (a listen list of the body's may
     * name it beside others). */
    for (const char *s = config_body; s && *s;) {
        const char *at = strstr(s, "$IPC");
        if (!at) {
            fputs(s, fp);
            break;
        }
        fwrite(s, 1, (size_t)(at - s), fp);
        fputs(d->endpoint, fp);
        s = at + 4;
    }
    fclose(fp);

    const char *argv[64];
    int argc = 0;
    argv[argc++] = harness_corrald_path();
    argv[argc++] = "-c";
    argv[argc++] = d->config_path;
    for (int i = 0; extra_args && extra_args[i] && argc < 62; i++) argv[argc++] = extra_args[i];
    argv[argc] = NULL;

    d->pid = fork();
    if (d->pid < 0) return -1;
    if (d->pid == 0) {
        int fd = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            dup2(fd, STDOUT_FILENO);
            close(fd);
        }
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "harness: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }

    corral_error err;
    corral_client *c = corral_client_new(d->endpoint, &err);
    if (!c) return -1;
    long long deadline = now_ms() + timeout_ms;
    int ready = 0;
    while (!ready && now_ms() < deadline) {
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            break;
        }
        /* A refusal is an answer too: a daemon whose configuration refuses this user (the tests
         * of access control) is up. */
        const corral_status st = corral_client_ping(c, 200, NULL, &err);
        ready = st == CORRAL_OK || st == CORRAL_PERMISSION_DENIED;
    }
    corral_client_destroy(&c);
    if (!ready) {
        char log[8192];
        harness_read_log(d, log, sizeof log);
        fprintf(stderr, "harness: corrald did not become ready; its log:\n%s\n", log);
        if (d->pid > 0) harness_stop(d, SIGKILL, 1000);
        return -1;
    }
    return 0;
}

int harness_stop(harness_daemon *d, int signo, int timeout_ms) {
    int result = -1;
    if (d->pid > 0) {
        kill(d->pid, signo);
        long long deadline = now_ms() + timeout_ms;
        int status;
        for (;;) {
            pid_t r = waitpid(d->pid, &status, WNOHANG);
            if (r == d->pid) {
                result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                break;
            }
            if (now_ms() >= deadline) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, &status, 0);
                break;
            }
            usleep(5000);
        }
        d->pid = 0;
    }
    if (d->dir[0]) remove_tree(d->dir);
    d->dir[0] = '\0';
    return result;
}

int harness_run_corrald(const char *const *args, char *out, size_t size, int timeout_ms) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    const char *argv[64];
    int argc = 0;
    argv[argc++] = harness_corrald_path();
    for (int i = 0; args && args[i] && argc < 63; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    long long deadline = now_ms() + timeout_ms;
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    int status = 0, done = 0;
    while (!done) {
        ssize_t n = read(fds[0], out + len, size - 1 - len);
        if (n > 0) len += (size_t)n;
        if (len >= size - 1) len = size - 1;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            while ((n = read(fds[0], out + len, size - 1 - len)) > 0) len += (size_t)n;
            done = 1;
        } else if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            close(fds[0]);
            out[len] = '\0';
            return -1;
        } else if (n <= 0) {
            usleep(2000);
        }
    }
    close(fds[0]);
    out[len] = '\0';
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Append what fd has to buf (keeping a NUL at the end); returns 0 at EOF, 1 otherwise. */
static int harness_drain(int fd, char *buf, size_t size, size_t *len) {
    char scratch[4096];
    ssize_t n = read(fd, scratch, sizeof scratch);
    if (n == 0) return 0;
    if (n < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
    if (buf && size > 0) {
        size_t room = size - 1 - *len;
        size_t take = (size_t)n < room ? (size_t)n : room;
        memcpy(buf + *len, scratch, take);
        *len += take;
        buf[*len] = '\0';
    }
    return 1;
}

int harness_run_program(const char *const *argv, const char *input, char *out, size_t out_size,
                        char *err, size_t err_size, int timeout_ms) {
    int in_fds[2], out_fds[2], err_fds[2];
    if (pipe(in_fds) != 0) return -1;
    if (pipe(out_fds) != 0) {
        close(in_fds[0]);
        close(in_fds[1]);
        return -1;
    }
    if (pipe(err_fds) != 0) {
        close(in_fds[0]);
        close(in_fds[1]);
        close(out_fds[0]);
        close(out_fds[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(in_fds[0], STDIN_FILENO);
        dup2(out_fds[1], STDOUT_FILENO);
        dup2(err_fds[1], STDERR_FILENO);
        close(in_fds[0]);
        close(in_fds[1]);
        close(out_fds[0]);
        close(out_fds[1]);
        close(err_fds[0]);
        close(err_fds[1]);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "harness: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(in_fds[0]);
    close(out_fds[1]);
    close(err_fds[1]);
    /* Inputs are small (well under a pipe's buffer): write them whole, then close. */
    signal(SIGPIPE, SIG_IGN);
    if (input) {
        size_t left = strlen(input);
        const char *p = input;
        while (left > 0) {
            ssize_t n = write(in_fds[1], p, left);
            if (n <= 0) break;
            p += n;
            left -= (size_t)n;
        }
    }
    close(in_fds[1]);
    if (out && out_size) out[0] = '\0';
    if (err && err_size) err[0] = '\0';
    size_t out_len = 0, err_len = 0;
    int out_open = 1, err_open = 1;
    long long deadline = now_ms() + timeout_ms;
    while (out_open || err_open) {
        long long left = deadline - now_ms();
        if (left <= 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            close(out_fds[0]);
            close(err_fds[0]);
            return -1;
        }
        struct pollfd fds[2] = {{.fd = out_open ? out_fds[0] : -1, .events = POLLIN},
                                {.fd = err_open ? err_fds[0] : -1, .events = POLLIN}};
        if (poll(fds, 2, (int)(left < 100 ? left : 100)) < 0 && errno != EINTR) break;
        if (out_open && (fds[0].revents & (POLLIN | POLLHUP)))
            out_open = harness_drain(out_fds[0], out, out_size, &out_len);
        if (err_open && (fds[1].revents & (POLLIN | POLLHUP)))
            err_open = harness_drain(err_fds[0], err, err_size, &err_len);
    }
    close(out_fds[0]);
    close(err_fds[0]);
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(2000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
