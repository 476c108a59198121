/*
 * faultinj.c — a test-only LD_PRELOAD library that makes chosen system calls fail: the I/O errors,
 * full disks, failed mappings, exhausted memory and sudden deaths that corrald must survive,
 * reproduced on demand, call by call. Built with the tests, never installed.
 *
 * It wraps open/openat (and their 64 variants), read/pread, write/pwrite, fsync/fdatasync,
 * mmap, rename/renameat and the allocator (malloc, calloc, realloc, posix_memalign,
 * aligned_alloc); every wrapper forwards to the next definition (dlsym RTLD_NEXT: libc, or a
 * sanitizer's or jemalloc's), unless a rule says to fail that call. The rules come from the
 * environment variable CORRAL_FAULTINJ, read once when the library is loaded:
 *
 *   CORRAL_FAULTINJ="RULE;RULE;..."     RULE = key=value,key=value,...
 *     call=NAME     open, read, write, fsync, mmap, rename or malloc (required). read covers
 *                   pread, write pwrite, fsync fdatasync, rename renameat, malloc every
 *                   allocation function.
 *     path=GLOB     only calls on a file whose path matches ('*' any run of characters, '?' one
 *                   character; the whole path must match): the path given to open, the path a file
 *                   descriptor was opened with (read, write, fsync, mmap), either path of a rename.
 *                   Calls on descriptors opened otherwise (fopen, inherited) never match a rule
 *                   with a path. Default: every call.
 *     thread=GLOB   only calls made on a thread whose name (pthread_setname_np) matches.
 *     min=BYTES     malloc: only allocations of at least this many bytes.
 *     after=N       let the first N matching calls through (default 0).
 *     count=N       fail this many matching calls after those, then none (default: all of them).
 *     errno=NAME    the error: ENOSPC, EIO, ENOMEM, EACCES, EROFS, EDQUOT, or a number (default
 *                   EIO). Failed calls return -1 (MAP_FAILED, NULL) with errno set.
 *     action=kill   instead of failing the call, the process kills itself with SIGKILL right
 *                   before it: a crash at exactly that point (default action=fail).
 *
 * Example: fail every write to a session image with ENOSPC, after the first two:
 *   CORRAL_FAULTINJ='call=write,path=*\/swap/session-*,after=2,errno=ENOSPC'
 *
 * Every injected failure is reported on stderr ("faultinj: write(/x/y) failed with ENOSPC ..."),
 * so that a test can tell that its fault really happened. Matching calls are counted per rule,
 * across threads. The library allocates nothing of its own (fixed tables), so that it can wrap
 * the allocator and stays out of leak checkers' reports.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#define FI_MAX_RULES  8
#define FI_GLOB_MAX   256
#define FI_MAX_FDS    4096
#define FI_PATH_MAX   512
#define FI_BOOT_BYTES (64u * 1024u)

typedef enum fi_call {
    FI_OPEN,
    FI_READ,
    FI_WRITE,
    FI_FSYNC,
    FI_MMAP,
    FI_RENAME,
    FI_MALLOC,
    FI_N
} fi_call;

static const char *const fi_call_names[FI_N] = {
    [FI_OPEN] = "open", [FI_READ] = "read",     [FI_WRITE] = "write",   [FI_FSYNC] = "fsync",
    [FI_MMAP] = "mmap", [FI_RENAME] = "rename", [FI_MALLOC] = "malloc",
};

static const struct {
    const char *name;
    int value;
} fi_errnos[] = {
    {"ENOSPC", ENOSPC}, {"EIO", EIO},       {"ENOMEM", ENOMEM}, {"EACCES", EACCES},
    {"EROFS", EROFS},   {"EDQUOT", EDQUOT}, {"EINTR", EINTR},   {"EAGAIN", EAGAIN},
};

typedef struct fi_rule {
    fi_call call;
    char path[FI_GLOB_MAX]; /* "" = any */
    char thread[32];        /* "" = any */
    size_t min;
    long after, count; /* count < 0: unlimited */
    int err;
    bool kill;
    atomic_long seen; /* matching calls so far */
} fi_rule;

static fi_rule fi_rules[FI_MAX_RULES];
static int fi_n_rules;
/* Set once the rules are read (the constructor): calls before that are never failed. */
static atomic_int fi_ready;

/* The path each descriptor was opened with (by a wrapped open), "" otherwise. */
static char fi_fd_paths[FI_MAX_FDS][FI_PATH_MAX];
static pthread_mutex_t fi_fd_mu = PTHREAD_MUTEX_INITIALIZER;

/* Set while this thread is inside the library (resolving a symbol, reporting): its own calls
 * are never matched. */
static __thread int fi_inside __attribute__((tls_model("initial-exec")));

/* ---- the next definitions ------------------------------------------------------------------ */

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static int (*next_open)(const char *, int, ...);
static int (*next_open64)(const char *, int, ...);
static int (*next_openat)(int, const char *, int, ...);
static int (*next_openat64)(int, const char *, int, ...);
static int (*next_close)(int);
static ssize_t (*next_read)(int, void *, size_t);
static ssize_t (*next_pread)(int, void *, size_t, off_t);
static ssize_t (*next_pread64)(int, void *, size_t, off_t);
static ssize_t (*next_write)(int, const void *, size_t);
static ssize_t (*next_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*next_pwrite64)(int, const void *, size_t, off_t);
static int (*next_fsync)(int);
static int (*next_fdatasync)(int);
static void *(*next_mmap)(void *, size_t, int, int, int, off_t);
static void *(*next_mmap64)(void *, size_t, int, int, int, off_t);
static int (*next_rename)(const char *, const char *);
static int (*next_renameat)(int, const char *, int, const char *);

/* dlsym may allocate while the next definitions are looked up: those allocations come from here
 * and are never freed. */
static _Alignas(64) unsigned char fi_boot[FI_BOOT_BYTES];
static atomic_size_t fi_boot_used;
static __thread int fi_resolving __attribute__((tls_model("initial-exec")));
static atomic_int fi_resolved;

static void *boot_alloc(size_t n) {
    n = (n + 63) & ~(size_t)63;
    const size_t at = atomic_fetch_add(&fi_boot_used, n);
    return at + n <= FI_BOOT_BYTES ? fi_boot + at : NULL;
}

static bool is_boot(const void *p) {
    return (const unsigned char *)p >= fi_boot &&
           (const unsigned char *)p < fi_boot + FI_BOOT_BYTES;
}

#define RESOLVE(name) next_##name = (__typeof__(next_##name))dlsym(RTLD_NEXT, #name)

/* Look every next definition up, once: at load (the constructor), or at the first wrapped call
 * if that comes earlier. The allocator's go last, so that whatever dlsym allocates meanwhile
 * comes from the boot buffer. */
static void resolve_all(void) {
    if (atomic_load(&fi_resolved)) return;
    fi_resolving++;
    RESOLVE(open);
    RESOLVE(open64);
    RESOLVE(openat);
    RESOLVE(openat64);
    RESOLVE(close);
    RESOLVE(read);
    RESOLVE(pread);
    RESOLVE(pread64);
    RESOLVE(write);
    RESOLVE(pwrite);
    RESOLVE(pwrite64);
    RESOLVE(fsync);
    RESOLVE(fdatasync);
    RESOLVE(mmap);
    RESOLVE(mmap64);
    RESOLVE(rename);
    RESOLVE(renameat);
    RESOLVE(calloc);
    RESOLVE(realloc);
    RESOLVE(free);
    RESOLVE(posix_memalign);
    RESOLVE(aligned_alloc);
    RESOLVE(malloc);
    fi_resolving--;
    atomic_store(&fi_resolved, 1);
}

static void load_rules(void);

/* At load, after the C library's own start (environ is set): the next definitions, then the
 * rules. */
__attribute__((constructor)) static void fi_init(void) {
    resolve_all();
    load_rules();
    atomic_store_explicit(&fi_ready, 1, memory_order_release);
}

/* ---- rules --------------------------------------------------------------------------------- */

/* Whether s matches the glob p as a whole ('*', '?'). */
static bool glob_match(const char *p, const char *s) {
    const char *star = NULL, *back = NULL;
    while (*s) {
        if (*p == '*') {
            star = p++;
            back = s;
        } else if (*p == '?' || *p == *s) {
            p++;
            s++;
        } else if (star) {
            p = star + 1;
            s = ++back;
        } else {
            return false;
        }
    }
    while (*p == '*') p++;
    return *p == '\0';
}

static void report(const char *fmt, ...) {
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    fi_inside++;
    next_write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    fi_inside--;
}

/* The rules are parsed with the helpers below, not with libc's string functions: the first
 * wrapped call may come while a sanitizer's runtime is still setting up its interceptors of those
 * (its allocations during its own start), when calling them would fail. */

/* Whether the n bytes at a equal the NUL-terminated b. */
static bool span_is(const char *a, size_t n, const char *b) {
    size_t i = 0;
    for (; i < n && b[i]; i++)
        if (a[i] != b[i]) return false;
    return i == n && b[i] == '\0';
}

static void span_copy(char *dst, size_t cap, const char *a, size_t n) {
    size_t i = 0;
    for (; i < n && i + 1 < cap; i++) dst[i] = a[i];
    dst[i] = '\0';
}

static long span_number(const char *a, size_t n) {
    long v = 0;
    for (size_t i = 0; i < n && a[i] >= '0' && a[i] <= '9'; i++) v = v * 10 + (a[i] - '0');
    return v;
}

static int parse_errno(const char *v, size_t n) {
    for (size_t i = 0; i < sizeof fi_errnos / sizeof fi_errnos[0]; i++)
        if (span_is(v, n, fi_errnos[i].name)) return fi_errnos[i].value;
    const long e = span_number(v, n);
    return e > 0 ? (int)e : EIO;
}

/* Set one key of r from `key=value` (n bytes at kv). */
static void parse_key(fi_rule *r, const char *kv, size_t n) {
    size_t eq = 0;
    while (eq < n && kv[eq] != '=') eq++;
    if (eq == n) return;
    const char *v = kv + eq + 1;
    const size_t vn = n - eq - 1;
    if (span_is(kv, eq, "call")) {
        for (int c = 0; c < FI_N; c++)
            if (span_is(v, vn, fi_call_names[c])) r->call = (fi_call)c;
    } else if (span_is(kv, eq, "path")) {
        span_copy(r->path, sizeof r->path, v, vn);
    } else if (span_is(kv, eq, "thread")) {
        span_copy(r->thread, sizeof r->thread, v, vn);
    } else if (span_is(kv, eq, "min")) {
        r->min = (size_t)span_number(v, vn);
    } else if (span_is(kv, eq, "after")) {
        r->after = span_number(v, vn);
    } else if (span_is(kv, eq, "count")) {
        r->count = span_number(v, vn);
    } else if (span_is(kv, eq, "errno")) {
        r->err = parse_errno(v, vn);
    } else if (span_is(kv, eq, "action")) {
        r->kill = span_is(v, vn, "kill");
    }
}

/* Parse one rule (n bytes at text); false when it names no known call. */
static bool parse_rule(const char *text, size_t n, fi_rule *r) {
    *r = (fi_rule){.call = FI_N, .count = -1, .err = EIO};
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && text[j] != ',') j++;
        parse_key(r, text + i, j - i);
        i = j + 1;
    }
    return r->call != FI_N;
}

extern char **environ;

static void load_rules(void) {
    static const char name[] = "CORRAL_FAULTINJ=";
    const char *env = NULL;
    for (char **e = environ; e && *e && !env; e++) {
        size_t i = 0;
        while (name[i] && (*e)[i] == name[i]) i++;
        if (!name[i]) env = *e + i;
    }
    for (size_t i = 0; env && env[i] && fi_n_rules < FI_MAX_RULES;) {
        size_t j = i;
        while (env[j] && env[j] != ';') j++;
        if (parse_rule(env + i, j - i, &fi_rules[fi_n_rules])) fi_n_rules++;
        i = env[j] ? j + 1 : j;
    }
}

static const char *errno_name(int e) {
    for (size_t i = 0; i < sizeof fi_errnos / sizeof fi_errnos[0]; i++)
        if (fi_errnos[i].value == e) return fi_errnos[i].name;
    return "?";
}

/* Whether this call must fail (errno set, reported) — or the process dies here (action=kill).
 * path may be NULL (a descriptor not opened by a wrapped open, an allocation); other is a second
 * path a rule may match instead (a rename's destination). */
static bool inject2(fi_call call, const char *path, const char *other, size_t bytes) {
    if (fi_inside || fi_resolving || !atomic_load_explicit(&fi_ready, memory_order_acquire))
        return false;
    for (int i = 0; i < fi_n_rules; i++) {
        fi_rule *r = &fi_rules[i];
        if (r->call != call) continue;
        if (r->path[0] && !(path && glob_match(r->path, path)) &&
            !(other && glob_match(r->path, other)))
            continue;
        if (call == FI_MALLOC && bytes < r->min) continue;
        if (r->thread[0]) {
            char name[32] = "";
            prctl(PR_GET_NAME, name, 0, 0, 0);
            if (!glob_match(r->thread, name)) continue;
        }
        const long n = atomic_fetch_add(&r->seen, 1);
        if (n < r->after || (r->count >= 0 && n >= r->after + r->count)) continue;
        if (r->kill) {
            report("faultinj: %s(%s): killing the process (rule %d, call %ld)\n",
                   fi_call_names[call], path ? path : "-", i + 1, n + 1);
            raise(SIGKILL);
        }
        report("faultinj: %s(%s%s%zu) failed with %s (rule %d, call %ld)\n", fi_call_names[call],
               path ? path : "", path ? ", " : "", bytes, errno_name(r->err), i + 1, n + 1);
        errno = r->err;
        return true;
    }
    return false;
}

static bool inject(fi_call call, const char *path, size_t bytes) {
    return inject2(call, path, NULL, bytes);
}

/* The path fd was opened with, copied into buf; NULL when unknown. */
static const char *fd_path(int fd, char *buf, size_t size) {
    if (fd < 0 || fd >= FI_MAX_FDS) return NULL;
    pthread_mutex_lock(&fi_fd_mu);
    snprintf(buf, size, "%s", fi_fd_paths[fd]);
    pthread_mutex_unlock(&fi_fd_mu);
    return buf[0] ? buf : NULL;
}

static void fd_remember(int fd, const char *path) {
    if (fd < 0 || fd >= FI_MAX_FDS) return;
    pthread_mutex_lock(&fi_fd_mu);
    snprintf(fi_fd_paths[fd], FI_PATH_MAX, "%s", path ? path : "");
    pthread_mutex_unlock(&fi_fd_mu);
}

/* ---- the wrappers: files ------------------------------------------------------------------- */

static mode_t open_mode(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = open_mode(flags, ap);
    va_end(ap);
    resolve_all();
    if (inject(FI_OPEN, path, 0)) return -1;
    const int fd = next_open(path, flags, mode);
    fd_remember(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = open_mode(flags, ap);
    va_end(ap);
    resolve_all();
    if (inject(FI_OPEN, path, 0)) return -1;
    const int fd = next_open64(path, flags, mode);
    fd_remember(fd, path);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = open_mode(flags, ap);
    va_end(ap);
    resolve_all();
    if (inject(FI_OPEN, path, 0)) return -1;
    const int fd = next_openat(dirfd, path, flags, mode);
    fd_remember(fd, path);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = open_mode(flags, ap);
    va_end(ap);
    resolve_all();
    if (inject(FI_OPEN, path, 0)) return -1;
    const int fd = next_openat64(dirfd, path, flags, mode);
    fd_remember(fd, path);
    return fd;
}

int close(int fd) {
    resolve_all();
    fd_remember(fd, NULL);
    return next_close(fd);
}

ssize_t read(int fd, void *buf, size_t n) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_READ, fd_path(fd, path, sizeof path), n)) return -1;
    return next_read(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_READ, fd_path(fd, path, sizeof path), n)) return -1;
    return next_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_READ, fd_path(fd, path, sizeof path), n)) return -1;
    return next_pread64(fd, buf, n, off);
}

ssize_t write(int fd, const void *buf, size_t n) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_WRITE, fd_path(fd, path, sizeof path), n)) return -1;
    return next_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_WRITE, fd_path(fd, path, sizeof path), n)) return -1;
    return next_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_WRITE, fd_path(fd, path, sizeof path), n)) return -1;
    return next_pwrite64(fd, buf, n, off);
}

int fsync(int fd) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_FSYNC, fd_path(fd, path, sizeof path), 0)) return -1;
    return next_fsync(fd);
}

int fdatasync(int fd) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (inject(FI_FSYNC, fd_path(fd, path, sizeof path), 0)) return -1;
    return next_fdatasync(fd);
}

void *mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off) {
    resolve_all();
    /* Anonymous mappings (the allocator's) have no path and never match a path rule. */
    char path[FI_PATH_MAX];
    if (fd >= 0 && inject(FI_MMAP, fd_path(fd, path, sizeof path), n)) return MAP_FAILED;
    return next_mmap(addr, n, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t n, int prot, int flags, int fd, off_t off) {
    resolve_all();
    char path[FI_PATH_MAX];
    if (fd >= 0 && inject(FI_MMAP, fd_path(fd, path, sizeof path), n)) return MAP_FAILED;
    return next_mmap64(addr, n, prot, flags, fd, off);
}

int rename(const char *from, const char *to) {
    resolve_all();
    /* A rule's path may name either end: the temporary or the final name. */
    if (inject2(FI_RENAME, from, to, 0)) return -1;
    return next_rename(from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
    resolve_all();
    if (inject2(FI_RENAME, from, to, 0)) return -1;
    return next_renameat(fromfd, from, tofd, to);
}

/* ---- the wrappers: the allocator ----------------------------------------------------------- */

void *malloc(size_t n) {
    if (fi_resolving) return boot_alloc(n);
    resolve_all();
    if (inject(FI_MALLOC, NULL, n)) return NULL;
    return next_malloc(n);
}

void *calloc(size_t count, size_t size) {
    if (fi_resolving) {
        /* The boot buffer is zero and never reused. */
        return size && count > FI_BOOT_BYTES / size ? NULL : boot_alloc(count * size);
    }
    resolve_all();
    if (inject(FI_MALLOC, NULL, count * size)) return NULL;
    return next_calloc(count, size);
}

void *realloc(void *p, size_t n) {
    if (fi_resolving) return boot_alloc(n);
    resolve_all();
    if (is_boot(p)) {
        /* The old block's size is unknown: copy what the boot buffer holds from it on. */
        void *q = next_malloc(n);
        const size_t left = (size_t)(fi_boot + FI_BOOT_BYTES - (unsigned char *)p);
        if (q) memcpy(q, p, n < left ? n : left);
        return q;
    }
    if (inject(FI_MALLOC, NULL, n)) return NULL;
    return next_realloc(p, n);
}

void free(void *p) {
    if (!p || is_boot(p)) return;
    resolve_all();
    next_free(p);
}

int posix_memalign(void **out, size_t alignment, size_t n) {
    resolve_all();
    if (inject(FI_MALLOC, NULL, n)) return ENOMEM;
    return next_posix_memalign(out, alignment, n);
}

void *aligned_alloc(size_t alignment, size_t n) {
    resolve_all();
    if (inject(FI_MALLOC, NULL, n)) return NULL;
    return next_aligned_alloc(alignment, n);
}
