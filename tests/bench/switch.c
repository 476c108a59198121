/*
 * switch.c — how fast corrald switches between models (tests/bench/switch runs it).
 *
 *   bench_switch A.gguf B.gguf C.gguf --cache-dir DIR [-r RUNS] [-t THREADS]
 *
 * Starts a real corrald ($CORRALD) serving the three models under a memory limit that holds two
 * of them, and measures time to first token (request sent → first streamed chunk, one token, a
 * short prompt) for model A when it is:
 *   resident      already in memory;
 *   swapped, warm evicted to make room, its file still in the page cache;
 *   swapped, cold evicted, and its file dropped from the page cache (posix_fadvise DONTNEED);
 *   from scratch  the first request of a fresh daemon, file cold;
 * and the disk's sequential read time of A's file, cold, for comparison. Then the smart-speaker
 * scenario: requests alternating over the three models (two fit), and the latency of the requests
 * that had to bring their model back (p50, p95). Each figure is the median of RUNS (default 5).
 *
 * The daemons share the cache directory DIR (cache.dir), as one corrald's successive runs do: the
 * weights rearranged for the kernels are written there on the very first load (an untimed
 * warm-up) and mapped by every later one. "Cold" drops those images from the page cache too.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral.h"
#include "daemon_harness.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)(p * (n - 1) + 0.5);
    return v[k];
}

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Drop every file of dir from the page cache. */
static void drop_dir_cache(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) drop_cache(path);
    }
    closedir(d);
}

/* Milliseconds to read the whole file sequentially, from a cold cache. */
static double cold_read_ms(const char *path) {
    drop_cache(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    enum { CHUNK = 8 << 20 };
    char *buf = malloc(CHUNK);
    double t0 = now_ms();
    while (read(fd, buf, CHUNK) > 0) {
    }
    double t = now_ms() - t0;
    free(buf);
    close(fd);
    return t;
}

typedef struct first_chunk {
    double at;
} first_chunk;

static int on_chunk(const corral_chunk *chunk, void *user) {
    (void)chunk;
    first_chunk *f = user;
    if (f->at == 0) f->at = now_ms();
    return 0;
}

/* Time to first token of one short request on model name. */
static double ttft(corral_client *c, const char *name) {
    corral_generate_params p = {.model = name, .prompt = "Once upon a time",
                                .has_max_tokens = true, .max_tokens = 1,
                                .has_temperature = true, .temperature = 0};
    first_chunk f = {0};
    corral_error err;
    const double t0 = now_ms();
    if (corral_generate(c, &p, on_chunk, &f, NULL, 600000, &err) != CORRAL_OK) {
        fprintf(stderr, "bench_switch: %s: %s\n", name, err.message);
        exit(1);
    }
    return f.at - t0;
}

static double median(double *v, int n) {
    return percentile(v, n, 0.5);
}

static uint64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

int main(int argc, char **argv) {
    const char *paths[3] = {0};
    const char *cache_dir = NULL;
    int n_paths = 0, runs = 5, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cache-dir") && i + 1 < argc) cache_dir = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (n_paths < 3 && argv[i][0] != '-') paths[n_paths++] = argv[i];
        else n_paths = 99;
    }
    if (n_paths != 3 || !cache_dir || runs < 1 || runs > 100) {
        fprintf(stderr, "usage: bench_switch A.gguf B.gguf C.gguf --cache-dir DIR [-r RUNS] "
                        "[-t THREADS]\n");
        return 2;
    }
    char abs[3][4096];
    for (int i = 0; i < 3; i++)
        if (!realpath(paths[i], abs[i])) {
            perror(paths[i]);
            return 1;
        }
    /* Two of the three fit: the limit is 2.6 model files (the heap and KV take the rest). */
    const uint64_t limit = file_size(abs[0]) * 26 / 10;
    char body[16384];
    snprintf(body, sizeof body,
             "threads: %d\nmemory: {limit: %llu, high_watermark: 0.95, low_watermark: 0.9}\n"
             "cache: {dir: \"%s\"}\n"
             "models:\n  - name: A\n    path: %s\n  - name: B\n    path: %s\n"
             "  - name: C\n    path: %s\n",
             threads, (unsigned long long)limit, cache_dir, abs[0], abs[1], abs[2]);

    double scratch[100], resident[100], warm[100], cold[100], disk[100];
    corral_error err;
    {
        /* Warm-up, untimed: the first load of each file writes its image to the cache. */
        harness_daemon d;
        if (harness_start(&d, body, NULL, 600000) != 0) return 1;
        corral_client *c = corral_client_new(d.endpoint, &err);
        ttft(c, "A");
        ttft(c, "B");
        ttft(c, "C");
        corral_client_destroy(&c);
        harness_stop(&d, SIGTERM, 10000);
    }
    for (int r = 0; r < runs; r++) {
        for (int i = 0; i < 3; i++) drop_cache(abs[i]);
        drop_dir_cache(cache_dir);
        harness_daemon d;
        if (harness_start(&d, body, NULL, 60000) != 0) return 1;
        corral_client *c = corral_client_new(d.endpoint, &err);
        scratch[r] = ttft(c, "A");
        resident[r] = ttft(c, "A");
        ttft(c, "B");
        ttft(c, "C"); /* A is evicted: B and C hold the memory */
        warm[r] = ttft(c, "A");
        ttft(c, "B");
        ttft(c, "C");
        drop_cache(abs[0]);
        drop_dir_cache(cache_dir);
        cold[r] = ttft(c, "A");
        corral_client_destroy(&c);
        harness_stop(&d, SIGTERM, 10000);
        disk[r] = cold_read_ms(abs[0]);
    }

    /* The smart speaker: 3 models, 2 fit, short requests alternating. */
    const char *pattern = "ABCABACBCACBABCCAB";
    double switches[256];
    int n_switch = 0;
    harness_daemon d;
    if (harness_start(&d, body, NULL, 60000) != 0) return 1;
    corral_client *c = corral_client_new(d.endpoint, &err);
    char resident_set[3] = {0};
    int n_resident = 0;
    for (int round = 0; round < runs; round++)
        for (const char *m = pattern; *m; m++) {
            char name[2] = {*m, 0};
            const bool was_resident = memchr(resident_set, *m, (size_t)n_resident) != NULL;
            double t = ttft(c, name);
            if (!was_resident && n_switch < 256) switches[n_switch++] = t;
            /* Track residency as the LRU of capacity 2 the daemon implements. */
            if (was_resident) {
                char *at = memchr(resident_set, *m, (size_t)n_resident);
                memmove(at, at + 1, (size_t)(resident_set + n_resident - at - 1));
                n_resident--;
            } else if (n_resident == 2) {
                memmove(resident_set, resident_set + 1, 1);
                n_resident--;
            }
            resident_set[n_resident++] = *m;
        }
    corral_client_destroy(&c);
    harness_stop(&d, SIGTERM, 10000);

    printf("models: %s (%.0f MiB), limit %.0f MiB (two fit), %d runs\n", abs[0],
           file_size(abs[0]) / 1048576.0, limit / 1048576.0, runs);
    printf("time to first token, median:\n");
    printf("  resident                 %8.1f ms\n", median(resident, runs));
    printf("  swapped in, page cache   %8.1f ms  (resident + %.1f ms)\n", median(warm, runs),
           median(warm, runs) - median(resident, runs));
    printf("  swapped in, cold         %8.1f ms  (%.2fx the disk's sequential read)\n",
           median(cold, runs), median(cold, runs) / median(disk, runs));
    printf("  loaded from scratch      %8.1f ms\n", median(scratch, runs));
    printf("  disk sequential read     %8.1f ms  (%.0f MB/s)\n", median(disk, runs),
           file_size(abs[0]) / 1e6 / (median(disk, runs) / 1e3));
    printf("smart speaker (%d switching requests): p50 %.1f ms, p95 %.1f ms\n", n_switch,
           percentile(switches, n_switch, 0.5), percentile(switches, n_switch, 0.95));
    return 0;
}
