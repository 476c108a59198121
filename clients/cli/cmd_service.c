/*
 * cmd_service.c — `corral service install|uninstall|start|stop|status`: corrald as a systemd
 * user service, so that it runs while its user is logged in without a terminal kept open.
 *
 * `install` writes corral.service into the user's unit folder ($XDG_CONFIG_HOME/systemd/user,
 * else ~/.config/systemd/user) from the one unit template (corral.service.in, compiled in as
 * CORRAL_SERVICE_UNIT), with ExecStart naming the corrald that sits beside this corral command
 * (PREFIX/bin for an installed corral, build/daemon for the build tree's), then reloads the user
 * manager and enables the unit. The other actions are `systemctl --user ACTION corral.service`.
 * Where systemd is not the init system (a container, another init), nothing can be managed: every
 * action says so plainly and what to do instead, and exits 1 (install still writes the file, for
 * a machine that will boot with systemd).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "corral/paths.h"
#include "service_unit.h"

extern char **environ;

#define SERVICE_NAME "corral.service"

static void service_usage(FILE *out) {
    fprintf(
        out,
        "usage: corral service install|uninstall|start|stop|status\n"
        "\n"
        "Run corrald as a systemd user service (systemctl --user), so that it serves while\n"
        "you are logged in, logging to the journal (journalctl --user -u corral).\n"
        "\n"
        "  install    write ~/.config/systemd/user/" SERVICE_NAME " (ExecStart: the corrald\n"
        "             beside this corral command), reload the user manager, enable it\n"
        "  uninstall  stop and disable the service, remove the unit file\n"
        "  start      start corrald now          stop    stop it (requests in flight end)\n"
        "  status     systemctl --user status " SERVICE_NAME "\n"
        "\n"
        "corrald reads ~/.config/corral/corral.yaml, else the installed\n"
        "PREFIX/etc/corral/corral.yaml, and listens on ipc://$XDG_RUNTIME_DIR/corral/corral.sock,\n"
        "where corral and the client libraries look by default. Without systemd (a\n"
        "container, another init system) run corrald yourself instead.\n");
}

/* Whether systemd is the init system (what sd_booted(3) checks). */
static bool systemd_running(void) {
    struct stat st;
    return lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
}

static int no_systemd(void) {
    return cli_fail("service",
                    "systemd is not running on this machine (no /run/systemd/system), so there is "
                    "no user service manager to run corrald. Start it yourself instead: `corrald "
                    "&` (it logs to stderr; SIGTERM or Ctrl-C stops it, SIGHUP reloads its "
                    "config)");
}

/* systemctl --user ARGS...: its exit status, or 1 after a message when it cannot run. */
static int systemctl_user(const char *a1, const char *a2, const char *a3) {
    char *argv[] = {"systemctl", "--user", (char *)a1, (char *)a2, (char *)a3, NULL};
    pid_t pid;
    const int e = posix_spawnp(&pid, "systemctl", NULL, NULL, argv, environ);
    if (e != 0) return cli_fail("service", "cannot run systemctl: %s", strerror(e));
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return cli_fail("service", "systemctl: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* The user's unit folder and the unit's path in it. */
static int unit_path(char *dir, size_t dir_size, char *path, size_t path_size) {
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(dir, dir_size, "%s/systemd/user", xdg);
    else if (home && home[0] == '/')
        n = snprintf(dir, dir_size, "%s/.config/systemd/user", home);
    else
        return cli_fail("service", "neither XDG_CONFIG_HOME nor HOME is set to an absolute path");
    if (n < 0 || (size_t)n >= dir_size ||
        (size_t)snprintf(path, path_size, "%s/" SERVICE_NAME, dir) >= path_size)
        return cli_fail("service", "the unit folder's path is too long");
    return 0;
}

/* The corrald beside this corral: PREFIX/bin/corrald for an installed corral, or the build
 * tree's build/daemon/corrald for build/clients/cli/corral. */
static int find_corrald(char *out, size_t size) {
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return cli_fail("service", "cannot find this program: %s", strerror(errno));
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return cli_fail("service", "cannot find this program's folder");
    *slash = '\0';
    static const char *const beside[] = {"corrald", "../../daemon/corrald"};
    for (size_t i = 0; i < sizeof beside / sizeof beside[0]; i++) {
        corral_error err;
        if (paths_join(exe, beside[i], out, size, &err) == CORRAL_OK && access(out, X_OK) == 0)
            return 0;
    }
    return cli_fail("service",
                    "no corrald beside %s/corral: install corral (cmake --install) and "
                    "use the installed corral command",
                    exe);
}

/* The unit text with ExecStart naming corrald, into a malloc'ed string (NULL after a message).
 * systemd reads '%' as a specifier and splits on spaces: such paths are refused. */
static char *unit_text(const char *corrald) {
    for (const char *p = corrald; *p; p++)
        if (*p == '%' || *p == ' ' || *p == '\t' || *p == '"' || *p == '\'' || *p == '\\' ||
            *p == '\n') {
            cli_fail("service",
                     "the path %s holds a character a unit file cannot carry as is "
                     "('%c'): install corral under a plain path",
                     corrald, *p);
            return NULL;
        }
    static const char mark[] = "@CORRALD@";
    const char *tmpl = CORRAL_SERVICE_UNIT;
    const char *at = strstr(tmpl, mark);
    if (!at) {
        cli_fail("service", "the built-in unit template has no %s", mark);
        return NULL;
    }
    const size_t head = (size_t)(at - tmpl), tail = strlen(at + sizeof mark - 1);
    char *text = malloc(head + strlen(corrald) + tail + 1);
    if (!text) {
        cli_fail("service", "out of memory");
        return NULL;
    }
    memcpy(text, tmpl, head);
    strcpy(text + head, corrald);
    strcat(text, at + sizeof mark - 1);
    return text;
}

/* Write text to path through a temporary file and a rename, mode 0644. */
static int write_file(const char *path, const char *text) {
    char tmp[PATH_MAX + 16];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp)
        return cli_fail("service", "%s: path too long", path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return cli_fail("service", "cannot write %s: %s", tmp, strerror(errno));
    const size_t len = strlen(text);
    const bool ok = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    const int e = errno;
    if (close(fd) != 0 || !ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return cli_fail("service", "cannot write %s: %s", path, strerror(ok ? errno : e));
    }
    return 0;
}

static int service_install(void) {
    char dir[PATH_MAX], path[PATH_MAX], corrald[PATH_MAX];
    if (unit_path(dir, sizeof dir, path, sizeof path) != 0 ||
        find_corrald(corrald, sizeof corrald) != 0)
        return 1;
    corral_error err;
    if (paths_make_dir(dir, &err) != CORRAL_OK) return cli_fail("service", "%s", err.message);
    char *text = unit_text(corrald);
    if (!text) return 1;
    const int rc = write_file(path, text);
    free(text);
    if (rc != 0) return 1;
    fprintf(stderr, "corral service: wrote %s (ExecStart=%s)\n", path, corrald);
    if (!systemd_running()) return no_systemd();
    int st = systemctl_user("daemon-reload", NULL, NULL);
    if (st == 0) st = systemctl_user("enable", SERVICE_NAME, NULL);
    if (st != 0) return cli_fail("service", "systemctl --user failed (exit %d)", st);
    fprintf(stderr, "corral service: enabled: corrald starts when you log in; `corral service "
                    "start` starts it now\n");
    return 0;
}

static int service_uninstall(void) {
    char dir[PATH_MAX], path[PATH_MAX];
    if (unit_path(dir, sizeof dir, path, sizeof path) != 0) return 1;
    if (systemd_running()) (void)systemctl_user("disable", "--now", SERVICE_NAME);
    if (unlink(path) != 0 && errno != ENOENT)
        return cli_fail("service", "cannot remove %s: %s", path, strerror(errno));
    fprintf(stderr, "corral service: removed %s\n", path);
    if (!systemd_running()) return 0;
    return systemctl_user("daemon-reload", NULL, NULL) == 0 ? 0 : 1;
}

int cmd_service(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        service_usage(stdout);
        return 0;
    }
    if (argc != 2) {
        service_usage(stderr);
        return 2;
    }
    const char *action = argv[1];
    if (strcmp(action, "install") == 0) return service_install();
    if (strcmp(action, "uninstall") == 0) return service_uninstall();
    static const char *const passed[] = {"start", "stop", "status", "restart", "reload"};
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++) {
        if (strcmp(action, passed[i]) != 0) continue;
        if (!systemd_running()) return no_systemd();
        return strcmp(action, "status") == 0 ? systemctl_user("status", "--no-pager", SERVICE_NAME)
                                             : systemctl_user(action, SERVICE_NAME, NULL);
    }
    cli_fail("service", "unknown action '%s'", action);
    service_usage(stderr);
    return 2;
}
