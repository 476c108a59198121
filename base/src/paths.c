/*
 * paths.c — per-user default directories, `mkdir -p` with private modes, and joining a relative
 * path to its folder without the `..` detours (contract in corral/paths.h).
 */
#include "corral/paths.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The user's home: $HOME when absolute, else the passwd entry's; NULL when neither. */
static const char *home_dir(void) {
    const char *home = getenv("HOME");
    if (home && home[0] == '/') return home;
    const struct passwd *pw = getpwuid(getuid());
    return pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : NULL;
}

/* $xdg_var/leaf when that variable is absolute, else $HOME/home_rel/leaf, else
 * /tmp/corral-$UID/fallback_leaf. */
static corral_status user_dir(const char *xdg_var, const char *home_rel, const char *leaf,
                              const char *fallback_leaf, char *buf, size_t size,
                              corral_error *err) {
    const char *xdg = getenv(xdg_var);
    const char *home = home_dir();
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, size, "%s/%s", xdg, leaf);
    else if (home)
        n = snprintf(buf, size, "%s/%s/%s", strcmp(home, "/") == 0 ? "" : home, home_rel, leaf);
    else
        n = snprintf(buf, size, "/tmp/corral-%u/%s", (unsigned)getuid(), fallback_leaf);
    if (n < 0 || (size_t)n >= size)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the per-user %s folder is longer than %zu bytes (set %s to a "
                                "shorter path)",
                                leaf, size - 1, xdg_var);
    return CORRAL_OK;
}

corral_status paths_user_swap_dir(char *buf, size_t size, corral_error *err) {
    return user_dir("XDG_STATE_HOME", ".local/state", "corral/swap", "state", buf, size, err);
}

corral_status paths_user_cache_dir(char *buf, size_t size, corral_error *err) {
    return user_dir("XDG_CACHE_HOME", ".cache", "corral", "cache", buf, size, err);
}

corral_status paths_make_dir(const char *dir, corral_error *err) {
    char path[PATH_MAX];
    const int n = dir ? snprintf(path, sizeof path, "%s", dir) : -1;
    if (n <= 0 || (size_t)n >= sizeof path)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "directory '%s': %s",
                                dir ? dir : "(null)", n <= 0 ? "empty path" : "path too long");
    /* Each prefix that ends a component, from the first below the root to the whole path. */
    for (char *p = path + 1;; p++) {
        const char c = *p;
        if (c != '/' && c != '\0') continue;
        *p = '\0';
        if (p[-1] != '/' && mkdir(path, 0700) != 0 && errno != EEXIST)
            return corral_error_set(err, CORRAL_IO, "cannot create the directory %s: %s", path,
                                    strerror(errno));
        *p = c;
        if (c == '\0') break;
    }
    struct stat st;
    if (stat(path, &st) != 0)
        return corral_error_set(err, CORRAL_IO, "directory %s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return corral_error_set(err, CORRAL_IO, "%s exists and is not a directory", path);
    return CORRAL_OK;
}

/* Append "/comp" (or "comp" at the start of a relative path, or after the root) to out. */
static bool append_component(char *out, size_t size, size_t *len, size_t root_len, const char *comp,
                             size_t comp_len) {
    const size_t sep = *len > root_len ? 1 : 0;
    if (*len + sep + comp_len + 1 > size) return false;
    if (sep) out[(*len)++] = '/';
    memcpy(out + *len, comp, comp_len);
    *len += comp_len;
    out[*len] = '\0';
    return true;
}

/* Whether the last component of out can be taken back by a following "..": it is a name (not
 * "..") and, on disk, a directory rather than a symbolic link (whose ".." is its target's). */
static bool can_pop(const char *out, size_t len, size_t root_len, size_t *last_start) {
    if (len <= root_len) return false;
    size_t start = len;
    while (start > root_len && out[start - 1] != '/') start--;
    if (len - start == 2 && out[start] == '.' && out[start + 1] == '.') return false;
    struct stat st;
    if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    *last_start = start;
    return true;
}

corral_status paths_join(const char *base, const char *rel, char *out, size_t size,
                         corral_error *err) {
    if (!rel || size < 2)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "paths_join: no path or no room");
    const bool use_base = base && base[0] && rel[0] != '/';
    const char *parts[2] = {use_base ? base : rel, use_base ? rel : NULL};
    const size_t root_len = parts[0][0] == '/' ? 1 : 0;
    size_t len = root_len;
    out[0] = '/';
    out[len] = '\0';
    for (int k = 0; k < 2 && parts[k]; k++) {
        for (const char *p = parts[k]; *p;) {
            while (*p == '/') p++;
            const char *end = p + strcspn(p, "/");
            const size_t n = (size_t)(end - p);
            if (n == 0 || (n == 1 && p[0] == '.')) {
                p = end;
                continue;
            }
            size_t last_start;
            if (n == 2 && p[0] == '.' && p[1] == '.') {
                if (can_pop(out, len, root_len, &last_start)) {
                    len = last_start > root_len ? last_start - 1 : root_len;
                    out[len] = '\0';
                    p = end;
                    continue;
                }
                if (root_len && len == root_len) { /* "/.." is "/" */
                    p = end;
                    continue;
                }
            }
            if (!append_component(out, size, &len, root_len, p, n))
                return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                        "path longer than %zu bytes: '%s%s%s'", size - 1, parts[0],
                                        parts[1] ? "/" : "", parts[1] ? parts[1] : "");
            p = end;
        }
    }
    if (len == 0) snprintf(out, size, ".");
    return CORRAL_OK;
}
