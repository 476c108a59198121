/*
 * ipc.c — benchmark of corrald's serving path (tests/bench/ipc).
 *
 *   bench_ipc MODEL.gguf [-n TOKENS] [-c CLIENTS] [-s SECONDS] [-t THREADS]
 *
 * Reports, for one model file:
 *   1. the engine alone: greedy generation of TOKENS tokens in this process (the same engine code
 *      the daemon runs), per-token time;
 *   2. the full path: the same generation streamed from a real corrald (spawned here with a
 *      private ipc endpoint; $CORRALD or ./daemon/corrald) through libcorral, per-token time, and
 *      the difference: what the protocol, the scheduler and the two socket hops add per token;
 *   3. small-request throughput: CLIENTS threads, each with its own connection, sending requests
 *      of one generated token back to back for SECONDS; requests per second and latency median
 *      and p99;
 *   4. and 5. the same two through the same corrald's HTTP API (/v1/completions: server-sent
 *      events, then whole answers on kept-alive connections), so that HTTP's cost per streamed
 *      token is set against the ZeroMQ path's in one run.
 * Per-token figures divide the time from the first streamed piece to the end by the tokens after
 * the first (pieces may carry several tokens when the client falls behind). Each measurement is
 * the median of 5 runs. Nothing here is a test: the figures go to README.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "corral.h"
#include "corral/generate.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/threadpool.h"
#include "benchutil.h"
#include "daemon_harness.h"
#include "http_client.h"

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static const char *PROMPT = "Once upon a time";

/* Engine alone: seconds per generated token, greedy, TOKENS tokens. */
static double engine_per_token(const char *path, int n_tokens, int threads) {
    corral_error err;
    model *m = model_load(path, NULL, &err);
    if (!m) {
        fprintf(stderr, "bench_ipc: %s\n", err.message);
        exit(1);
    }
    threadpool *pool = threadpool_new((uint32_t)threads, &err);
    model_runner *r = model_runner_new(m, 64, pool, &err);
    int32_t *ids;
    size_t n_ids;
    prompt_tokenize_text(model_get_tokenizer(m), PROMPT, strlen(PROMPT), &ids, &n_ids, &err);
    double runs[5];
    for (int k = 0; k < 5; k++) {
        kv_cache *kv = kv_cache_new(m, (uint32_t)(n_ids + n_tokens + 1), KV_TYPE_F16, &err);
        gen_params gp = gen_params_default();
        gp.sampling.temperature = 0;
        gp.max_tokens = (uint32_t)n_tokens;
        gp.ignore_eog = 1;
        generator *g = gen_new(m, r, kv, &gp, &err);
        gen_prefill(g, ids, (uint32_t)n_ids, &err);
        gen_token t;
        double t0 = now_s();
        int n = 0;
        do {
            gen_next(g, &t, &err);
            n++;
        } while (t.stop == GEN_STOP_NONE);
        runs[k] = (now_s() - t0) / n;
        gen_destroy(&g);
        kv_cache_destroy(&kv);
    }
    free(ids);
    model_runner_destroy(&r);
    threadpool_destroy(&pool);
    model_destroy(&m);
    return median(runs, 5);
}

typedef struct stream_count {
    int chunks;
    double first;
} stream_count;

static int on_chunk(const corral_chunk *chunk, void *user) {
    (void)chunk;
    stream_count *c = user;
    if (c->chunks++ == 0) c->first = now_s();
    return 0;
}

/* Full path: seconds per streamed token (from the first chunk to Done). */
static double daemon_per_token(const char *endpoint, int n_tokens) {
    corral_error err;
    corral_client *c = corral_client_new(endpoint, &err);
    double runs[5];
    for (int k = 0; k < 5; k++) {
        corral_generate_params p = {.model = "m", .prompt = PROMPT, .has_max_tokens = true,
                                    .max_tokens = (uint32_t)n_tokens, .has_temperature = true,
                                    .temperature = 0};
        stream_count sc = {0};
        corral_done done;
        if (corral_generate(c, &p, on_chunk, &sc, &done, 60000, &err) != CORRAL_OK) {
            fprintf(stderr, "bench_ipc: %s\n", err.message);
            exit(1);
        }
        double end = now_s();
        runs[k] = (end - sc.first) / (done.generated_tokens > 1 ? done.generated_tokens - 1 : 1);
    }
    corral_client_destroy(&c);
    return median(runs, 5);
}

/* An SSE stream of /v1/completions: when the first event came. */
typedef struct sse_count {
    double first;
    bool seen;
} sse_count;

static void on_sse(const char *data, size_t len, void *user) {
    sse_count *sc = user;
    if (!sc->seen && memmem(data, len, "data: ", 6)) {
        sc->seen = true;
        sc->first = now_s();
    }
}

/* The HTTP path: seconds per streamed token, as daemon_per_token. */
static double http_per_token(int port, int n_tokens) {
    http_conn *c = http_conn_open(port, 60);
    if (!c) {
        perror("bench_ipc: HTTP connect");
        exit(1);
    }
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":true}",
             PROMPT, n_tokens);
    double runs[5];
    for (int k = 0; k < 5; k++) {
        sse_count sc = {0};
        if (http_conn_request(c, "POST", "/v1/completions", body, on_sse, &sc) != 200) {
            fprintf(stderr, "bench_ipc: the HTTP stream failed\n");
            exit(1);
        }
        runs[k] = (now_s() - sc.first) / (n_tokens - 1);
    }
    http_conn_close(&c);
    return median(runs, 5);
}

typedef struct load_thread {
    const char *endpoint;
    int port; /* > 0: through the HTTP API */
    double until;
    int requests;
    double *latencies;
    int cap;
} load_thread;

static void *http_load_main(void *arg) {
    load_thread *lt = arg;
    http_conn *c = http_conn_open(lt->port, 60);
    const char *body = "{\"model\":\"m\",\"prompt\":\"Once upon a time\",\"max_tokens\":1,"
                       "\"temperature\":0}";
    while (c && now_s() < lt->until) {
        double t0 = now_s();
        if (http_conn_request(c, "POST", "/v1/completions", body, NULL, NULL) != 200) {
            fprintf(stderr, "bench_ipc: an HTTP request failed\n");
            break;
        }
        if (lt->requests < lt->cap) lt->latencies[lt->requests] = now_s() - t0;
        lt->requests++;
    }
    http_conn_close(&c);
    return NULL;
}

static void *load_main(void *arg) {
    load_thread *lt = arg;
    corral_error err;
    corral_client *c = corral_client_new(lt->endpoint, &err);
    corral_generate_params p = {.model = "m", .prompt = PROMPT, .has_max_tokens = true,
                                .max_tokens = 1, .has_temperature = true, .temperature = 0};
    while (now_s() < lt->until) {
        double t0 = now_s();
        char *text = NULL;
        size_t len;
        if (corral_generate_text(c, &p, &text, &len, NULL, 60000, &err) != CORRAL_OK) {
            fprintf(stderr, "bench_ipc: %s\n", err.message);
            break;
        }
        free(text);
        if (lt->requests < lt->cap) lt->latencies[lt->requests] = now_s() - t0;
        lt->requests++;
    }
    corral_client_destroy(&c);
    return NULL;
}

typedef struct small_load {
    double per_second, median, p99;
} small_load;

/* CLIENTS threads sending one-token requests back to back for SECONDS (port > 0: over HTTP). */
static void run_load(small_load *out, const char *endpoint, int port, int n_clients, int seconds) {
    pthread_t tids[256];
    load_thread lts[256];
    const double until = now_s() + seconds;
    for (int i = 0; i < n_clients; i++) {
        lts[i] = (load_thread){.endpoint = endpoint, .port = port, .until = until, .cap = 1 << 16};
        lts[i].latencies = malloc(sizeof(double) * (size_t)lts[i].cap);
        pthread_create(&tids[i], NULL, port > 0 ? http_load_main : load_main, &lts[i]);
    }
    int total = 0, n_lat = 0;
    double *all = malloc(sizeof(double) * (size_t)n_clients * (1 << 16));
    for (int i = 0; i < n_clients; i++) {
        pthread_join(tids[i], NULL);
        total += lts[i].requests;
        for (int k = 0; k < lts[i].requests && k < lts[i].cap; k++)
            all[n_lat++] = lts[i].latencies[k];
        free(lts[i].latencies);
    }
    qsort(all, (size_t)n_lat, sizeof *all, cmp_double);
    out->per_second = total / (double)seconds;
    out->median = n_lat ? all[n_lat / 2] : NAN;
    out->p99 = n_lat ? all[(int)(n_lat * 0.99)] : NAN;
    free(all);
}

int main(int argc, char **argv) {
    int n_tokens = 128, n_clients = 16, seconds = 5, threads = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) n_clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) seconds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "usage: bench_ipc MODEL.gguf [-n TOKENS] [-c CLIENTS] [-s SECONDS] "
                            "[-t THREADS]\n");
            return 2;
        }
    }
    if (!path || n_tokens < 2 || n_clients < 1 || n_clients > 256 || seconds < 1) {
        fprintf(stderr, "usage: bench_ipc MODEL.gguf [-n TOKENS] [-c CLIENTS] [-s SECONDS] "
                        "[-t THREADS]\n");
        return 2;
    }
    char abs_path[4096];
    if (!realpath(path, abs_path)) {
        perror(path);
        return 1;
    }

    const double engine = engine_per_token(abs_path, n_tokens, threads);

    const int port = http_free_port();
    char body[8192];
    snprintf(body, sizeof body,
             "listen: [\"$IPC\"]\nthreads: %d\nlimits: {queue_per_model: 1024, "
             "queue_per_app: 1024, active_per_model: 64}\nhttp: {listen: [\"127.0.0.1:%d\"]}\n"
             "models:\n  - name: m\n    path: %s\n    preload: true\n",
             threads, port, abs_path);
    harness_daemon d;
    if (harness_start(&d, body, NULL, 20000) != 0) return 1;
    const double full = daemon_per_token(d.endpoint, n_tokens);

    const double http = http_per_token(port, n_tokens);

    small_load zmq_load, http_load;
    run_load(&zmq_load, d.endpoint, 0, n_clients, seconds);
    run_load(&http_load, d.endpoint, port, n_clients, seconds);
    harness_stop(&d, SIGTERM, 5000);

    printf("model: %s\n", abs_path);
    printf("engine alone:        %8.3f ms/token (%.0f tok/s)\n", engine * 1e3, 1.0 / engine);
    printf("through corrald:     %8.3f ms/token (%.0f tok/s)\n", full * 1e3, 1.0 / full);
    printf("serving overhead:    %8.3f ms/token (%+.1f%%)\n", (full - engine) * 1e3,
           100.0 * (full - engine) / engine);
    printf("through HTTP (SSE):  %8.3f ms/token (%.0f tok/s)\n", http * 1e3, 1.0 / http);
    /* Both overheads are a few µs against noise of the same size: the difference of the two
     * paths and their ratio say more than a ratio of two overheads near zero. */
    printf("HTTP overhead:       %8.3f ms/token over the engine, %+.1f µs/token against ZeroMQ "
           "(%.2fx its time per token)\n",
           (http - engine) * 1e3, (http - full) * 1e6, http / full);
    printf("small requests:      %d clients, %.0f requests/s, latency median %.2f ms, p99 %.2f ms\n",
           n_clients, zmq_load.per_second, zmq_load.median * 1e3, zmq_load.p99 * 1e3);
    printf("small HTTP requests: %d clients, %.0f requests/s, latency median %.2f ms, p99 %.2f ms\n",
           n_clients, http_load.per_second, http_load.median * 1e3, http_load.p99 * 1e3);
    return 0;
}
