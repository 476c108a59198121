/*
 * dirlock.c — exclusive locks on the directories a corrald writes (see dirlock.h).
 */
#include "dirlock.h"

#include "corral/paths.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIRLOCK_FILE ".corrald.lock"

struct dirlock {
    int fd;
};

dirlock *dirlock_take(const char *dir, const char *what, corral_error *err) {
    corral_error_clear(err);
    corral_error why;
    if (paths_make_dir(dir, &why) != CORRAL_OK) return NULL; /* missing parents too, mode 0700 */
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, DIRLOCK_FILE) >= (int)sizeof path) return NULL;
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return NULL; /* unwritable: the caller goes on without a lock */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        const ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(fd);
        corral_error_set(err, CORRAL_UNAVAILABLE,
                         "%s %s is in use by another corrald (pid %s): give each daemon "
                         "directories of its own",
                         what, dir, pid[0] ? pid : "unknown");
        return NULL;
    }
    dirlock *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    l->fd = fd;
    char pid[32];
    const int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        /* The lock holds all the same; only the holder's name in a refusal is lost. */
    }
    return l;
}

void dirlock_release(dirlock **pl) {
    if (!pl || !*pl) return;
    close((*pl)->fd); /* drops the flock */
    free(*pl);
    *pl = NULL;
}
