/*
 * quantize.c — the quantization benchmark (build target bench_quantize; never run by the tests):
 * `corral quantize` against `llama-quantize` in the same run, on a TinyLlama-1.1B-shaped F16 file.
 *
 * Each tool runs as a child process on the same input and type (Q4_K_M by default) with the same
 * thread count, alternately (corral first in odd rounds, llama-quantize first in even ones, so
 * that neither always meets the warmer machine), and the benchmark takes from wait4 the wall time
 * and the peak resident memory (ru_maxrss) of each run; the table gives the medians and their
 * ratios. The input is read once before the first round, so every run reads it from the page
 * cache. At the end the two outputs are compared byte for byte (the same file is expected: corral
 * writes llama-quantize's bytes).
 *
 * The input is made on first use and reused (delete it to regenerate): `corral synth --like
 * tinyllama-1.1b --type f16`, 2.2 GB, deterministic.
 *
 *   bench_quantize [--dir DIR] [-t THREADS] [-r ROUNDS] [--type TYPE] [--corral PATH]
 *                  [--llama-quantize PATH]
 *   DIR defaults to $CORRAL_BENCH_DIR or /var/tmp/corral-bench (2.2 GB of input, two outputs of
 *   about 0.7 GB); corral defaults to the build tree's, llama-quantize to $LLAMA_QUANTIZE or
 *   ../shared/tools/llama.cpp/llama-quantize.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corral/synth.h"

#define MAX_ROUNDS 32

typedef struct run_stats {
    double seconds;
    double peak_mib;
} run_stats;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Run argv (its output to log) and measure it; exits on failure. */
static run_stats run(char *const *argv, const char *log) {
    const double t0 = now();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("wait4");
        exit(1);
    }
    run_stats s = {now() - t0, (double)ru.ru_maxrss / 1024.0};
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench_quantize: %s failed (see %s)\n", argv[0], log);
        exit(1);
    }
    return s;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Read a whole file once (into the page cache). */
static void warm(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    static char buf[1 << 20];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    static char x[1 << 16], y[1 << 16];
    while (same) {
        size_t na = fread(x, 1, sizeof x, fa), nb = fread(y, 1, sizeof y, fb);
        if (na != nb || memcmp(x, y, na) != 0) same = 0;
        if (na == 0) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int main(int argc, char **argv) {
    const char *dir =
        getenv("CORRAL_BENCH_DIR") ? getenv("CORRAL_BENCH_DIR") : "/var/tmp/corral-bench";
    const char *type = "Q4_K_M";
    const char *llama = getenv("LLAMA_QUANTIZE");
    char corral[PATH_MAX] = "", threads[16] = "2";
    int rounds = 3;
    static const struct option options[] = {{"dir", required_argument, NULL, 'd'},
                                            {"threads", required_argument, NULL, 't'},
                                            {"rounds", required_argument, NULL, 'r'},
                                            {"type", required_argument, NULL, 'y'},
                                            {"corral", required_argument, NULL, 'c'},
                                            {"llama-quantize", required_argument, NULL, 'l'},
                                            {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "d:t:r:", options, NULL)) != -1) {
        switch (c) {
            case 'd':
                dir = optarg;
                break;
            case 't':
                snprintf(threads, sizeof threads, "%s", optarg);
                break;
            case 'r':
                rounds = atoi(optarg);
                break;
            case 'y':
                type = optarg;
                break;
            case 'c':
                snprintf(corral, sizeof corral, "%s", optarg);
                break;
            case 'l':
                llama = optarg;
                break;
            default:
                fprintf(stderr, "usage: bench_quantize [--dir DIR] [-t THREADS] [-r ROUNDS] "
                                "[--type TYPE] [--corral PATH] [--llama-quantize PATH]\n");
                return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 3;
    if (!corral[0]) {
        /* build/tests/bench/quantize -> build/clients/cli/corral */
        char self[PATH_MAX - 64];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            char *slash = strrchr(self, '/');
            if (slash) *slash = '\0';
            snprintf(corral, sizeof corral, "%s/../../clients/cli/corral", self);
        }
    }
    char shared_llama[PATH_MAX];
    if (!llama) {
        snprintf(shared_llama, sizeof shared_llama, "%s/../shared/tools/llama.cpp/llama-quantize",
                 getenv("PWD") ? getenv("PWD") : ".");
        llama = shared_llama;
    }
    if (access(corral, X_OK) != 0 || access(llama, X_OK) != 0) {
        fprintf(stderr, "bench_quantize: need corral (%s) and llama-quantize (%s)\n", corral,
                llama);
        return 1;
    }
    mkdir(dir, 0755);
    char in[PATH_MAX], out_c[PATH_MAX], out_l[PATH_MAX], log_c[PATH_MAX], log_l[PATH_MAX];
    snprintf(in, sizeof in, "%s/tinyllama-1.1b-f16.gguf", dir);
    snprintf(out_c, sizeof out_c, "%s/quantize-corral.gguf", dir);
    snprintf(out_l, sizeof out_l, "%s/quantize-llama.gguf", dir);
    snprintf(log_c, sizeof log_c, "%s/quantize-corral.log", dir);
    snprintf(log_l, sizeof log_l, "%s/quantize-llama.log", dir);
    if (!exists(in)) {
        synth_params p = synth_params_default();
        corral_error err;
        if (synth_params_set_preset(&p, "tinyllama-1.1b", &err) != CORRAL_OK) {
            fprintf(stderr, "bench_quantize: %s\n", err.message);
            return 1;
        }
        p.type = SYNTH_TYPE_F16;
        fprintf(stderr, "bench_quantize: making %s\n", in);
        if (synth_write(&p, in, NULL, &err) != CORRAL_OK) {
            fprintf(stderr, "bench_quantize: %s\n", err.message);
            return 1;
        }
    }
    warm(in);
    char *argv_c[] = {corral, "quantize", "-q", in, out_c, (char *)type, "-t", threads, NULL};
    char *argv_l[] = {(char *)llama, in, out_l, (char *)type, threads, NULL};
    double tc[MAX_ROUNDS], tl[MAX_ROUNDS], mc[MAX_ROUNDS], ml[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            const int corral_turn = (r % 2 == 0) == (k == 0);
            const run_stats s = corral_turn ? run(argv_c, log_c) : run(argv_l, log_l);
            if (corral_turn) {
                tc[r] = s.seconds;
                mc[r] = s.peak_mib;
            } else {
                tl[r] = s.seconds;
                ml[r] = s.peak_mib;
            }
            fprintf(stderr, "round %d: %-14s %7.2f s, peak RSS %7.0f MiB\n", r + 1,
                    corral_turn ? "corral" : "llama-quantize", s.seconds, s.peak_mib);
        }
    }
    const double c_s = median(tc, rounds), l_s = median(tl, rounds);
    const double c_m = median(mc, rounds), l_m = median(ml, rounds);
    printf("TinyLlama-1.1B-shaped F16 -> %s, %s threads, median of %d alternating rounds\n", type,
           threads, rounds);
    printf("| tool           | time (s) | peak RSS (MiB) |\n");
    printf("|----------------|---------:|---------------:|\n");
    printf("| corral         | %8.2f | %14.0f |\n", c_s, c_m);
    printf("| llama-quantize | %8.2f | %14.0f |\n", l_s, l_m);
    printf("| corral / llama | %8.2f | %14.2f |\n", c_s / l_s, c_m / l_m);
    printf("outputs byte-identical: %s\n", same_file(out_c, out_l) ? "yes" : "NO");
    return 0;
}
