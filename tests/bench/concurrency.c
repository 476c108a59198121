/*
 * concurrency.c — many apps on one corrald at once (build/tests/bench/concurrency; never run by
 * the tests).
 *
 * The daemon is meant to serve many local apps from one engine. This program measures how well it
 * does, with real libcorral clients against a real corrald that it starts itself, using nothing
 * but the protocol, so that the same program measures today's daemon and any later one:
 *
 *   streams  N = 1, 2, 4, 8, 16 clients start together (after a warm-up request), each greedily
 *            generating -n tokens from a prompt of its own on the TinyLlama-1.1B-shaped Q4_0 model:
 *            aggregate tokens/s (all tokens / first send to last Done), each client's tokens/s
 *            (its tokens / its send to its Done; min, median, max), time to first token.
 *   ttft     the time to first token of a short realtime request on that model when the daemon is
 *            (a) idle, (b) serving 8 background-priority streams, (c) loading another model (the
 *            TinyLlama Q8_0, its file and cached images dropped from the page cache) that another
 *            client has just asked for, (d) merging a LoRA variant for the first time; with the
 *            ratio to (a) and how long the load or merge took, so that one sees whether the
 *            realtime request waited for it.
 *   burst    16 clients ask for the unloaded Q8_0 model at once: how many loads the daemon started
 *            (ModelStatus.loads before and after) and whether all 16 got their answer.
 *   llama    with LLAMA_SERVER=PATH (or --llama-server PATH), the streams workload on llama-server
 *            with as many slots as streams, run for run alternating with corral's, and the ratio of
 *            the two aggregate rates from each pair of runs.
 *
 * Each app is a thread with a corral_client of its own, calling the blocking corral_generate with
 * a chunk callback: that is what an app does, the clients are as independent as separate
 * processes (separate sockets, no shared library state), and a thread that waits on its own
 * socket sees its first chunk the moment it arrives. The non-blocking API would put all streams
 * behind one poll loop whose turn order would become part of the measurement.
 *
 * Inputs are made on first use and reused (delete them to regenerate), in --dir (default
 * $CORRAL_BENCH_DIR or /var/tmp/corral-bench): tinyllama-1.1b-q4_0.gguf and
 * tinyllama-1.1b-q8_0.gguf
 * (`corral synth --like tinyllama-1.1b --type q4_0|q8_0`, the files tests/bench/run-all uses) and
 * tinyllama-1.1b-lora-r16.gguf (lora_synth_write as tests/bench/merge.c makes it). The second
 * model is the same shape in Q8_0: the only difference from the streaming model is that it has
 * twice the bytes to read (1.1 GB), so its cold load is many token steps long (`corral bench`
 * gives 0.4 s to its first token from a cold page cache on the 2-core machine class, more on a
 * busy one), while SmolLM2-135M's would be about one. Every
 * run works in a fresh directory under --dir (removed at the end unless --keep; on disk, not in
 * /tmp, so that dropping a file from the page cache really makes it cold): each corrald gets its
 * config, log, socket and swap directory there, and a cache directory of its own, so that the
 * variant really merges and the cold model really loads. Case (d) starts a fresh corrald with a
 * fresh cache directory for each repetition (holding hard links to the base model's rearranged
 * image, so only the variant is new).
 *
 *   concurrency [-t THREADS] [-n TOKENS] [-r RUNS] [--streams 1,2,4,8,16] [--only PHASE]
 *               [--dir DIR] [--llama-server PATH] [--keep] [--json]
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "corral.h"
#include "corral/bench.h"
#include "corral/gguf.h"
#include "corral/synth.h"
#include "corral/tensor.h"
#include "corral/tokenizer.h"
#include "lora.h"
#include "benchutil.h"
#include "concurrency.h"
#include "http_client.h"
#include "spawn.h"

enum { MAX_CACHE_FILES = 32 };

/* Every wait for the daemon or llama-server: long enough for a first load that repacks weights. */
#define CALL_TIMEOUT_MS 600000
/* A Status that takes longer than this is taken as "the daemon is busy with the load". */
#define STATUS_PROBE_MS 25
/* Pause before each measured run, so that the other server's spinning threads have gone to sleep.
 */
#define SETTLE_US       300000

static const char *const APP = "bench"; /* the config's app allowed realtime priority */
static const char *const BASE_MODEL = "tinyllama";
static const char *const COLD_MODEL = "cold";
static const char *const VARIANT_MODEL = "variant";
static const char *const REALTIME_PROMPT = "Turn on the kitchen lights.";
static const uint32_t REALTIME_TOKENS = 4;
static const char *const BACKGROUND_PROMPT = "Summarize the day's news in one line.";

/* The run directory once it exists (see main). */
static char g_run_dir[PATH_MAX];

/* After a failure the run directory stays for its logs, without the daemons' caches (gigabytes of
 * images that the next run makes again). */
static void keep_logs(void) {
    DIR *d = opendir(g_run_dir);
    if (!d) return;
    const struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, "daemon-", 7) == 0) {
            char cache[PATH_MAX + NAME_MAX + 8];
            snprintf(cache, sizeof cache, "%s/%s/cache", g_run_dir, de->d_name);
            spawn_remove_tree(cache);
        }
    closedir(d);
    spawn_set_run_dir(g_run_dir, true);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Report and exit(1); the spawn cleanup then stops the servers. */
static void fail(const char *fmt, ...) {
    /* Stopped by a signal: the servers are going away under the requests; the signal's thread
     * ends the process. */
    while (spawn_cleaning_up()) pause();
    va_list ap;
    va_start(ap, fmt);
    fputs("concurrency: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (g_run_dir[0]) keep_logs();
    exit(1);
}

/* ---- files ------------------------------------------------------------------------------------
 */

/* dir/name into out (size bytes); fails the run when it does not fit. */
static void path_join(char *out, size_t size, const char *dir, const char *name) {
    if ((size_t)snprintf(out, size, "%s/%s", dir, name) >= size)
        fail("path too long: %s/%s", dir, name);
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void drop_page_cache(const char *path) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* The regular files of a directory, by name. */
typedef struct file_list {
    char names[MAX_CACHE_FILES][NAME_MAX + 1];
    int n;
} file_list;

static void file_list_read(const char *dir, file_list *out) {
    out->n = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    const struct dirent *de;
    while ((de = readdir(d)) != NULL && out->n < MAX_CACHE_FILES) {
        char path[PATH_MAX + NAME_MAX + 2];
        struct stat sb;
        path_join(path, sizeof path, dir, de->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            snprintf(out->names[out->n++], NAME_MAX + 1, "%s", de->d_name);
    }
    closedir(d);
}

static bool file_list_has(const file_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0) return true;
    return false;
}

/* ---- inputs ------------------------------------------------------------------------------------
 */

/* Make `corral synth --like preset --type type` at path unless it is there. */
static void input_ensure_model(const char *path, const char *preset, synth_type type) {
    if (file_exists(path)) return;
    fprintf(stderr, "concurrency: generating %s\n", path);
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    synth_params p = synth_params_default();
    p.type = type;
    corral_error err;
    if (synth_params_set_preset(&p, preset, &err) != CORRAL_OK ||
        synth_write(&p, tmp, NULL, &err) != CORRAL_OK)
        fail("%s: %s", path, err.message);
    if (rename(tmp, path) != 0) fail("%s: %s", path, strerror(errno));
}

/* Make the rank-16 adapter of tests/bench/merge.c for base at path unless it is there. */
static void input_ensure_adapter(const char *path, const char *base) {
    if (file_exists(path)) return;
    fprintf(stderr, "concurrency: generating %s\n", path);
    const lora_synth_params p = {.base_path = base,
                                 .rank = 16,
                                 .alpha = 32.0f,
                                 .targets = LORA_SYNTH_ALL_LINEAR,
                                 .seed = 1,
                                 .a_std = 0.02f,
                                 .b_std = 0.02f,
                                 .type = TENSOR_TYPE_F32};
    corral_error err;
    if (lora_synth_write(&p, path, &err) != CORRAL_OK) fail("%s: %s", path, err.message);
}

/* ---- the run and its daemons -------------------------------------------------------------------
 */

/* What every phase needs: the options, the facts (the inputs' paths among them), the run
 * directory and what the main cache holds. */
typedef struct bench {
    conc_opts o;
    conc_facts f;
    char run_dir[PATH_MAX];
    int n_daemons; /* started so far: daemon K lives in RUN/daemon-K */
    char main_cache[PATH_MAX + 16];
    file_list base_files; /* the main cache after the base model's first load */
    file_list cold_files; /* what the cold model's first load added to it */
} bench;

static conc_results g_results;
/* Prompt lengths as the daemon counted them (Done.prompt_tokens), for the facts. */
static uint32_t g_stream_prompt_min = UINT32_MAX, g_stream_prompt_max, g_realtime_prompt;

typedef struct daemon_proc {
    pid_t pid;
    char dir[PATH_MAX]; /* RUN/daemon-K: config, log, socket, swap */
    char endpoint[160]; /* ipc://RUN/daemon-K/sock/corral.sock */
    char log_path[PATH_MAX + 16];
} daemon_proc;

/* Where corrald is: $CORRALD, else build/daemon/corrald beside this program's build tree. */
static void find_corrald(char *out, size_t size) {
    const char *env = getenv("CORRALD");
    if (env && *env) {
        snprintf(out, size, "%s", env);
    } else {
        char self[PATH_MAX];
        const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) *slash = '\0';
        /* build/tests/bench/concurrency -> build/daemon/corrald */
        path_join(out, size, self, "../../daemon/corrald");
        char real[PATH_MAX];
        if (realpath(out, real)) snprintf(out, size, "%s", real);
    }
    if (access(out, X_OK) != 0)
        fail("corrald not found at %s (build it, or set CORRALD=PATH)", out);
}

/* Start a corrald on a private endpoint with the benchmark's three models and the realtime app,
 * and a fresh cache directory of its own (d->dir/cache) that holds hard links to `seed`'s files
 * of the main cache (NULL: none). Fails the run, with the daemon's log, when it does not answer a
 * ping within a minute. */
static void daemon_start(bench *b, daemon_proc *d, const file_list *seed) {
    memset(d, 0, sizeof *d);
    char name[32];
    snprintf(name, sizeof name, "daemon-%d", ++b->n_daemons);
    path_join(d->dir, sizeof d->dir, b->run_dir, name);
    if (mkdir(d->dir, 0700) != 0) fail("%s: %s", d->dir, strerror(errno));
    char cache_dir[PATH_MAX + 16];
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", d->dir);
    if (mkdir(cache_dir, 0700) != 0) fail("%s: %s", cache_dir, strerror(errno));
    for (int i = 0; seed && i < seed->n; i++) {
        char from[PATH_MAX + NAME_MAX + 2], to[PATH_MAX + NAME_MAX + 2];
        snprintf(from, sizeof from, "%s/%s", b->main_cache, seed->names[i]);
        snprintf(to, sizeof to, "%s/%s", cache_dir, seed->names[i]);
        /* Without the link the daemon only rearranges the base again, untimed. */
        if (link(from, to) != 0)
            fprintf(stderr, "concurrency: cannot link %s: %s\n", from, strerror(errno));
    }
    const int endpoint_len =
        snprintf(d->endpoint, sizeof d->endpoint, "ipc://%s/sock/corral.sock", d->dir);
    if (endpoint_len < 0 || (size_t)endpoint_len >= sizeof d->endpoint ||
        strlen(d->endpoint) - strlen("ipc://") >= 100)
        fail("%s: the run directory's path is too long for an ipc socket (use a shorter --dir)",
             d->endpoint);
    snprintf(d->log_path, sizeof d->log_path, "%s/corrald.log", d->dir);
    char config[PATH_MAX + 16];
    snprintf(config, sizeof config, "%s/corral.yaml", d->dir);
    FILE *fp = fopen(config, "w");
    if (!fp) fail("%s: %s", config, strerror(errno));
    /* All streams run at once (active_per_model), none is refused (the queue limits); the app
     * loads its models itself (admin). */
    fprintf(fp,
            "# written by tests/bench/concurrency\n"
            "listen: [\"%s\"]\n"
            "threads: %d\n"
            "limits: {queue_per_model: 256, queue_per_app: 256, active_per_model: %d}\n"
            "memory: {swap_dir: \"%s/swap\"}\n"
            "cache: {dir: \"%s\"}\n"
            "models:\n"
            "  - name: %s\n    path: \"%s\"\n"
            "  - name: %s\n    path: \"%s\"\n"
            "  - name: %s\n    path: \"%s\"\n"
            "    adapters:\n      - {path: \"%s\", scale: 1.0}\n"
            "apps:\n  - name: %s\n    max_priority: realtime\n    admin: true\n",
            d->endpoint, b->o.threads, CONC_MAX_STREAMS, d->dir, cache_dir, BASE_MODEL, b->f.base,
            COLD_MODEL, b->f.cold, VARIANT_MODEL, b->f.base, b->f.adapter, APP);
    fclose(fp);

    const char *argv[] = {b->f.corrald, "-c", config, NULL};
    d->pid = spawn_child(argv, d->log_path);
    if (d->pid < 0) fail("cannot start %s: %s", b->f.corrald, strerror(errno));
    corral_error err;
    corral_client *c = corral_client_new(d->endpoint, &err);
    if (!c) fail("%s: %s", d->endpoint, err.message);
    const double until = now_s() + 60;
    corral_pong pong;
    while (corral_client_ping(c, 200, &pong, &err) != CORRAL_OK) {
        if (spawn_exited(d->pid) || now_s() > until) {
            spawn_print_log_tail(d->log_path);
            fail("corrald (%s) %s; its log: %s", b->f.corrald,
                 now_s() > until ? "did not answer a ping within 60 s" : "exited at start",
                 d->log_path);
        }
    }
    corral_client_destroy(&c);
    snprintf(b->f.version, sizeof b->f.version, "%s", pong.version);
    b->f.protocol = pong.protocol_version;
}

static void daemon_stop(daemon_proc *d) {
    spawn_stop(d->pid, 10.0);
    d->pid = 0;
}

/* A client of the benchmark's app, connected (one ping answered). */
static corral_client *client_open(const char *endpoint) {
    corral_error err;
    corral_client *c = corral_client_new(endpoint, &err);
    if (!c) fail("%s: %s", endpoint, err.message);
    corral_client_set_app(c, APP);
    if (corral_client_ping(c, 10000, NULL, &err) != CORRAL_OK)
        fail("%s: ping: %s", endpoint, err.message);
    return c;
}

/* One model's entry of the daemon's Status; fails the run when it cannot be had in timeout_ms
 * unless `may_time_out` (then false). */
static bool model_status(corral_client *c, const char *name, int timeout_ms, bool may_time_out,
                         corral_model_status *out) {
    corral_status_report *rep = NULL;
    corral_error err;
    const corral_status st = corral_client_status(c, name, timeout_ms, &rep, &err);
    if (st == CORRAL_DEADLINE_EXCEEDED && may_time_out) return false;
    if (st != CORRAL_OK) fail("status of %s: %s", name, err.message);
    bool found = false;
    for (size_t i = 0; i < rep->n_models && !found; i++)
        if (strcmp(rep->models[i].name, name) == 0) {
            *out = rep->models[i];
            out->name = NULL, out->base_path = NULL, out->adapters = NULL, out->n_adapters = 0;
            found = true;
        }
    corral_status_report_destroy(&rep);
    if (!found) fail("status: the daemon does not list model %s", name);
    return true;
}

static void model_load(corral_client *c, const char *name) {
    corral_error err;
    if (corral_load(c, name, CALL_TIMEOUT_MS, &err) != CORRAL_OK)
        fail("load %s: %s", name, err.message);
}

/* Unload the cold model and drop its file and its images in the cache from the page cache. */
static void cold_model_reset(const bench *b, corral_client *c) {
    corral_error err;
    if (corral_unload(c, COLD_MODEL, CALL_TIMEOUT_MS, &err) != CORRAL_OK)
        fail("unload %s: %s", COLD_MODEL, err.message);
    drop_page_cache(b->f.cold);
    for (int i = 0; i < b->cold_files.n; i++) {
        char path[PATH_MAX + NAME_MAX + 2];
        snprintf(path, sizeof path, "%s/%s", b->main_cache, b->cold_files.names[i]);
        drop_page_cache(path);
    }
}

/* ---- generations ------------------------------------------------------------------------------
 *
 * A gen_job is one app's request: on a thread with a client of its own (gen_jobs_launch), or on a
 * client the caller holds (gen_job_exec). Times are now_s() seconds.
 */

typedef struct gen_job {
    /* what to ask */
    const char *endpoint;
    const char *model;
    char prompt[160];
    uint32_t max_tokens;
    corral_priority priority;
    pthread_barrier_t *start; /* the thread waits here, connected, before it sends; NULL: none */
    atomic_bool *stop;        /* once set, the next chunk cancels the generation; NULL: never */
    atomic_int *streaming;    /* incremented at the first chunk; NULL: none */
    /* what happened */
    double sent, first, done; /* first: 0 when no chunk came */
    corral_done result;
    corral_status status;
    char error[CORRAL_ERROR_MESSAGE_MAX];
    pthread_t thread;
} gen_job;

static int gen_on_chunk(const corral_chunk *chunk, void *user) {
    (void)chunk;
    gen_job *j = user;
    if (j->first == 0) {
        j->first = now_s();
        if (j->streaming) atomic_fetch_add(j->streaming, 1);
    }
    return j->stop && atomic_load(j->stop);
}

/* Greedy generation of j on c, streamed; fills the job's results. */
static void gen_job_exec(gen_job *j, corral_client *c) {
    const corral_generate_params p = {.model = j->model,
                                      .prompt = j->prompt,
                                      .has_max_tokens = true,
                                      .max_tokens = j->max_tokens,
                                      .has_temperature = true,
                                      .temperature = 0,
                                      .stream = CORRAL_STREAM_ON,
                                      .priority = j->priority};
    corral_error err = {0};
    j->first = 0;
    j->sent = now_s();
    j->status = corral_generate(c, &p, gen_on_chunk, j, &j->result, CALL_TIMEOUT_MS, &err);
    j->done = now_s();
    if (j->status != CORRAL_OK) snprintf(j->error, sizeof j->error, "%s", err.message);
}

static void *gen_job_main(void *arg) {
    gen_job *j = arg;
    corral_client *c = client_open(j->endpoint);
    if (j->start) pthread_barrier_wait(j->start);
    gen_job_exec(j, c);
    corral_client_destroy(&c);
    return NULL;
}

/* Start a thread per job, each connecting its own client, and return once all are connected:
 * they send their requests together as this returns. */
static void gen_jobs_launch(gen_job *jobs, int n, pthread_barrier_t *start) {
    pthread_barrier_init(start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        jobs[i].start = start;
        if (pthread_create(&jobs[i].thread, NULL, gen_job_main, &jobs[i]) != 0)
            fail("cannot start a client thread");
    }
    pthread_barrier_wait(start);
}

static void gen_jobs_join(gen_job *jobs, int n, pthread_barrier_t *start) {
    for (int i = 0; i < n; i++) pthread_join(jobs[i].thread, NULL);
    pthread_barrier_destroy(start);
}

static void gen_job_check(const gen_job *j) {
    if (j->status != CORRAL_OK)
        fail("generation on %s failed: %s: %s", j->model, corral_status_name(j->status), j->error);
    if (j->first == 0) fail("generation on %s streamed no chunk", j->model);
}

/* Distinct short prompts of about the same length. */
static void stream_prompt(char *out, size_t size, int i) {
    static const char *const topics[] = {
        "a lighthouse keeper",  "the first snow",     "a lost robot",       "an old bridge",
        "a baker at dawn",      "two chess players",  "a ship in a bottle", "the last train",
        "a garden on the moon", "a clockmaker",       "a quiet library",    "a storm at sea",
        "a fox in the city",    "a forgotten letter", "a street musician",  "a map with no names"};
    const int n_topics = (int)(sizeof topics / sizeof *topics);
    snprintf(out, size, "Tell a short story about %s (story %d).", topics[i % n_topics], i + 1);
}

/* ---- streams -----------------------------------------------------------------------------------
 */

/* Fill run from each stream's send and Done times and token count (ttft: ms, or NULL). */
static void stream_run_fill(conc_stream_run *run, const double *sent, const double *done,
                            const uint32_t *tokens, const double *ttft, int n, uint32_t want) {
    double first = sent[0], last = done[0], per[CONC_MAX_STREAMS];
    memset(run, 0, sizeof *run);
    for (int i = 0; i < n; i++) {
        if (sent[i] < first) first = sent[i];
        if (done[i] > last) last = done[i];
        run->tokens += tokens[i];
        run->short_streams += tokens[i] < want;
        per[i] = tokens[i] / (done[i] - sent[i]);
    }
    run->agg = run->tokens / (last - first);
    const conc_spread p = conc_spread_of(per, n);
    run->per_min = p.lo, run->per_med = p.med, run->per_max = p.hi;
    run->ttft_ms = ttft ? conc_spread_of(ttft, n).med : 0;
}

/* Generate with one short request on c, so that the run starts from a served model. */
static void corral_warm_up(corral_client *c) {
    gen_job w = {.model = BASE_MODEL,
                 .prompt = "Hello",
                 .max_tokens = 4,
                 .priority = CORRAL_PRIORITY_INTERACTIVE};
    gen_job_exec(&w, c);
    gen_job_check(&w);
}

static void corral_streams_once(const bench *b, const daemon_proc *d, corral_client *ctl, int n,
                                conc_stream_run *run) {
    usleep(SETTLE_US);
    corral_warm_up(ctl);
    gen_job jobs[CONC_MAX_STREAMS];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < n; i++) {
        jobs[i].endpoint = d->endpoint;
        jobs[i].model = BASE_MODEL;
        stream_prompt(jobs[i].prompt, sizeof jobs[i].prompt, i);
        jobs[i].max_tokens = b->o.n_tokens;
        jobs[i].priority = CORRAL_PRIORITY_INTERACTIVE;
    }
    pthread_barrier_t start;
    gen_jobs_launch(jobs, n, &start);
    gen_jobs_join(jobs, n, &start);
    double sent[CONC_MAX_STREAMS], done[CONC_MAX_STREAMS], ttft[CONC_MAX_STREAMS];
    uint32_t tokens[CONC_MAX_STREAMS];
    for (int i = 0; i < n; i++) {
        gen_job_check(&jobs[i]);
        sent[i] = jobs[i].sent;
        done[i] = jobs[i].done;
        ttft[i] = (jobs[i].first - jobs[i].sent) * 1e3;
        tokens[i] = jobs[i].result.generated_tokens;
        const uint32_t pt = jobs[i].result.prompt_tokens;
        if (pt < g_stream_prompt_min) g_stream_prompt_min = pt;
        if (pt > g_stream_prompt_max) g_stream_prompt_max = pt;
    }
    stream_run_fill(run, sent, done, tokens, ttft, n, b->o.n_tokens);
}

/* ---- llama-server -------------------------------------------------------------------------------
 *
 * One llama-server per N, with N slots (-np N) and N × 512 positions of context, on the same model
 * file and thread count. Each client thread POSTs /completion over a plain HTTP/1.1 connection of
 * its own (Connection: close, read to EOF) with n_predict = -n, temperature 0, ignore_eos (so that
 * every stream generates all its tokens, as corral's do on these prompts) and cache_prompt false
 * (corral keeps no prompt cache without a session either), and reads tokens_predicted from the
 * JSON answer. The answer is not streamed, so there is no time to first token on this side.
 *
 * One deviation: the synthetic model's vocabulary has the 256 byte tokens, and greedy decoding
 * of random weights emits lone ones, which makes invalid UTF-8; this llama-server runs the output
 * of /completion through its chat content parser, which refuses that with HTTP 500 ("does not
 * match the expected Content-only format"; --no-jinja does not help, nor does streaming). So
 * its requests carry a logit_bias that bans the byte tokens. That changes which tokens win, not
 * the work per token: the same forward pass over the same number of positions.
 */

typedef struct llama_proc {
    pid_t pid;
    int port;
    char log_path[PATH_MAX + 32];
} llama_proc;

/* `"logit_bias": [[id, false], ...],` for every byte token of the model at path (its
 * tokenizer.ggml.token_type says which), into out; "" when it has none. */
static void byte_token_ban(const char *path, char *out, size_t size) {
    out[0] = '\0';
    corral_error err;
    gguf_file *g = gguf_open(path, &err);
    if (!g) fail("%s: %s", path, err.message);
    gguf_type type;
    uint64_t n = 0;
    if (gguf_get_array(g, "tokenizer.ggml.token_type", &type, &n, &err) != CORRAL_OK)
        fail("%s: %s", path, err.message);
    int32_t *types = malloc((n ? n : 1) * sizeof *types);
    if (!types || gguf_array_copy_i32(g, "tokenizer.ggml.token_type", types, n, &err) != CORRAL_OK)
        fail("%s: token types: %s", path, types ? err.message : "out of memory");
    size_t len = 0;
    for (uint64_t id = 0; id < n; id++) {
        if (types[id] != TOK_TYPE_BYTE) continue;
        const int w = snprintf(out + len, size - len, "%s[%llu, false]",
                               len ? ", " : "\"logit_bias\": [", (unsigned long long)id);
        if (w < 0 || (size_t)w >= size - len) fail("%s: too many byte tokens", path);
        len += (size_t)w;
    }
    if (len && len + 3 > size) fail("%s: too many byte tokens", path);
    if (len) memcpy(out + len, "],", 3);
    free(types);
    gguf_destroy(&g);
}

/* The /completion request for prompt (plain ASCII without quotes or backslashes); ban is a
 * byte_token_ban fragment. */
static void completion_body(char *out, size_t size, const char *prompt, uint32_t n_predict,
                            const char *ban) {
    if ((size_t)snprintf(out, size,
                         "{\"prompt\": \"%s\", \"n_predict\": %u, \"temperature\": 0, "
                         "\"ignore_eos\": true, %s \"cache_prompt\": false, \"stream\": false}",
                         prompt, n_predict, ban) >= size)
        fail("the /completion request does not fit its buffer");
}

static void llama_start(bench *b, llama_proc *lp, int slots) {
    lp->port = http_free_port();
    if (lp->port < 0) fail("no free TCP port: %s", strerror(errno));
    snprintf(lp->log_path, sizeof lp->log_path, "%s/llama-server-np%d.log", b->run_dir, slots);
    char threads[16], np[16], ctx[16], port[16];
    snprintf(threads, sizeof threads, "%d", b->o.threads);
    snprintf(np, sizeof np, "%d", slots);
    snprintf(ctx, sizeof ctx, "%d", slots * 512);
    snprintf(port, sizeof port, "%d", lp->port);
    const char *argv[] = {b->o.llama,  "-m",     b->f.base, "-t",         threads,
                          "-np",       np,       "-c",      ctx,          "--host",
                          "127.0.0.1", "--port", port,      "--no-webui", NULL};
    lp->pid = spawn_child(argv, lp->log_path);
    if (lp->pid < 0) fail("cannot start %s: %s", b->o.llama, strerror(errno));
    const double until = now_s() + 300;
    char reply[4096];
    while (http_request(lp->port, "GET", "/health", NULL, reply, sizeof reply, 10) != 200) {
        if (spawn_exited(lp->pid) || now_s() > until) {
            spawn_print_log_tail(lp->log_path);
            fail("llama-server (%s) %s; its log: %s", b->o.llama,
                 now_s() > until ? "was not healthy within 300 s" : "exited at start",
                 lp->log_path);
        }
        usleep(100000);
    }
}

static void llama_stop(llama_proc *lp) {
    spawn_stop(lp->pid, 10.0);
    lp->pid = 0;
}

typedef struct http_job {
    int port;
    char body[8192];
    pthread_barrier_t *start;
    double sent, done;
    long tokens;
    int http_status;
    char reply[65536];
    pthread_t thread;
} http_job;

static void *http_job_main(void *arg) {
    http_job *j = arg;
    if (j->start) pthread_barrier_wait(j->start);
    j->sent = now_s();
    j->http_status = http_request(j->port, "POST", "/completion", j->body, j->reply,
                                  sizeof j->reply, CALL_TIMEOUT_MS / 1000);
    j->done = now_s();
    j->tokens = http_json_integer(j->reply, "tokens_predicted");
    return NULL;
}

static void http_job_check(const http_job *j) {
    if (j->http_status != 200 || j->tokens < 0)
        fail("llama-server /completion: HTTP %d: %.300s", j->http_status, j->reply);
}

static void llama_streams_once(const bench *b, const llama_proc *lp, int n, conc_stream_run *run) {
    usleep(SETTLE_US);
    static http_job jobs[CONC_MAX_STREAMS + 1];
    http_job *warm = &jobs[CONC_MAX_STREAMS];
    memset(warm, 0, sizeof *warm);
    warm->port = lp->port;
    static char ban[6144];
    if (!ban[0]) byte_token_ban(b->f.base, ban, sizeof ban);
    completion_body(warm->body, sizeof warm->body, "Hello", 4, ban);
    http_job_main(warm);
    http_job_check(warm);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].port = lp->port;
        jobs[i].start = &start;
        char prompt[160];
        stream_prompt(prompt, sizeof prompt, i);
        completion_body(jobs[i].body, sizeof jobs[i].body, prompt, b->o.n_tokens, ban);
        if (pthread_create(&jobs[i].thread, NULL, http_job_main, &jobs[i]) != 0)
            fail("cannot start a client thread");
    }
    pthread_barrier_wait(&start);
    for (int i = 0; i < n; i++) pthread_join(jobs[i].thread, NULL);
    pthread_barrier_destroy(&start);
    double sent[CONC_MAX_STREAMS], done[CONC_MAX_STREAMS];
    uint32_t tokens[CONC_MAX_STREAMS];
    for (int i = 0; i < n; i++) {
        http_job_check(&jobs[i]);
        sent[i] = jobs[i].sent;
        done[i] = jobs[i].done;
        tokens[i] = (uint32_t)jobs[i].tokens;
    }
    stream_run_fill(run, sent, done, tokens, NULL, n, b->o.n_tokens);
}

/* `corral bench MODEL -t T -p 512 -n 16 -r R --json` on the streams' model with the daemon's
 * cache (its rearranged weights), the daemon idle meanwhile: the pp512 tok/s median it reports.
 * The CLI is beside corrald in the build tree ($CORRAL, else build/clients/cli/corral). */
static double prefill_ceiling(const bench *b) {
    char cli[PATH_MAX];
    const char *env = getenv("CORRAL");
    if (env && *env) {
        snprintf(cli, sizeof cli, "%s", env);
    } else {
        snprintf(cli, sizeof cli, "%s", b->f.corrald);
        char *slash = strrchr(cli, '/');
        if (slash) *slash = '\0';
        char rel[PATH_MAX];
        path_join(rel, sizeof rel, cli, "../clients/cli/corral");
        if (!realpath(rel, cli)) fail("corral not found at %s (or set CORRAL=PATH)", rel);
    }
    char threads[16], reps[16], out_path[PATH_MAX];
    snprintf(threads, sizeof threads, "%d", b->o.threads);
    snprintf(reps, sizeof reps, "%d", b->o.reps);
    path_join(out_path, sizeof out_path, b->run_dir, "pp512.json");
    unlink(out_path);
    const char *argv[] = {cli,         "bench",       b->f.base,     "-t", threads, "-p",
                          "512",       "-n",          "16",          "-r", reps,    "--json",
                          "--no-cold", "--cache-dir", b->main_cache, NULL};
    const pid_t pid = spawn_child(argv, out_path);
    if (pid < 0) fail("cannot run %s: %s", cli, strerror(errno));
    while (!spawn_exited(pid)) usleep(20000);
    FILE *fp = fopen(out_path, "r");
    if (!fp) fail("%s: %s", out_path, strerror(errno));
    static char text[1 << 16];
    const size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    const char *key = strstr(text, "\"pp_tok_s\": ");
    if (!key) fail("corral bench gave no pp_tok_s (%s):\n%s", out_path, text);
    return strtod(key + strlen("\"pp_tok_s\": "), NULL);
}

/* For each N: corral and llama-server runs in turn (corral, llama-server, corral, ...), between
 * two measurements of the engine's prefill rate. */
static void phase_streams(bench *b, const daemon_proc *d, corral_client *ctl) {
    g_results.pp512[0] = prefill_ceiling(b);
    fprintf(stderr, "concurrency: corral bench pp512 %.1f tok/s\n", g_results.pp512[0]);
    for (int k = 0; k < b->o.n_ns; k++) {
        const int n = b->o.ns[k];
        conc_streams *sr = &g_results.streams[k];
        sr->n = n;
        llama_proc lp = {0};
        if (b->o.llama) llama_start(b, &lp, n);
        for (int r = 0; r < b->o.reps; r++) {
            corral_streams_once(b, d, ctl, n, &sr->corral[r]);
            fprintf(stderr, "concurrency: %2d streams, run %d: corral %.1f tok/s", n, r + 1,
                    sr->corral[r].agg);
            if (b->o.llama) {
                llama_streams_once(b, &lp, n, &sr->llama[r]);
                fprintf(stderr, ", llama-server %.1f tok/s", sr->llama[r].agg);
            }
            fputc('\n', stderr);
            sr->runs = r + 1;
        }
        if (b->o.llama) llama_stop(&lp);
    }
    g_results.pp512[1] = prefill_ceiling(b);
    fprintf(stderr, "concurrency: corral bench pp512 %.1f tok/s\n", g_results.pp512[1]);
}

/* ---- time to first token of a realtime request -------------------------------------------------
 *
 * (c) and (d) need the realtime request to arrive while the daemon is loading or merging for
 * another client. The program sends that client's request, then asks for the model's Status
 * every half millisecond: once it says LOADING, the realtime request goes out. A daemon that loads
 * on its compute thread cannot answer Status meanwhile, so a Status unanswered after
 * STATUS_PROBE_MS also sends it (the daemon is busy with the load: that is the situation). If the
 * first Status that answers already shows the model resident, the load was over before the
 * realtime request could be sent, and the run says so.
 */

/* The realtime request on c (a client of the realtime app), checked. */
static void realtime_request(corral_client *c, gen_job *rt) {
    memset(rt, 0, sizeof *rt);
    rt->model = BASE_MODEL;
    snprintf(rt->prompt, sizeof rt->prompt, "%s", REALTIME_PROMPT);
    rt->max_tokens = REALTIME_TOKENS;
    rt->priority = CORRAL_PRIORITY_REALTIME;
    gen_job_exec(rt, c);
    gen_job_check(rt);
    g_realtime_prompt = rt->result.prompt_tokens;
}

static void ttft_fill(conc_ttft_run *run, const gen_job *rt) {
    run->ttft_ms = (rt->first - rt->sent) * 1e3;
    run->total_ms = (rt->done - rt->sent) * 1e3;
}

/* (b): eight background streams generating, then the realtime request; the streams are cancelled
 * after it. */
static void ttft_streams_once(const daemon_proc *d, corral_client *rtc, conc_ttft_run *run) {
    atomic_bool stop = false;
    atomic_int streaming = 0;
    gen_job bg[CONC_BG_STREAMS];
    memset(bg, 0, sizeof bg);
    for (int i = 0; i < CONC_BG_STREAMS; i++) {
        bg[i].endpoint = d->endpoint;
        bg[i].model = BASE_MODEL;
        stream_prompt(bg[i].prompt, sizeof bg[i].prompt, i);
        bg[i].max_tokens = 1024;
        bg[i].priority = CORRAL_PRIORITY_BACKGROUND;
        bg[i].stop = &stop;
        bg[i].streaming = &streaming;
    }
    pthread_barrier_t start;
    gen_jobs_launch(bg, CONC_BG_STREAMS, &start);
    const double until = now_s() + 120;
    while (atomic_load(&streaming) < CONC_BG_STREAMS && now_s() < until) usleep(1000);
    if (atomic_load(&streaming) < CONC_BG_STREAMS) fail("the background streams did not all start");
    usleep(200000); /* into the steady state */
    gen_job rt;
    realtime_request(rtc, &rt);
    atomic_store(&stop, true);
    gen_jobs_join(bg, CONC_BG_STREAMS, &start);
    ttft_fill(run, &rt);
    run->overlapped = true;
    for (int i = 0; i < CONC_BG_STREAMS; i++) {
        gen_job_check(&bg[i]);
        run->overlapped &= bg[i].done > rt.first;
    }
}

/* Poll model's Status until the realtime request should go (see the top of this section). */
static conc_trigger wait_for_load(corral_client *mon, const char *model) {
    const double until = now_s() + 10;
    while (now_s() < until) {
        corral_model_status ms;
        if (!model_status(mon, model, STATUS_PROBE_MS, true, &ms)) return CONC_TRIGGER_BUSY;
        if (ms.state == CORRAL_MODEL_LOADING) return CONC_TRIGGER_LOADING;
        if (ms.state == CORRAL_MODEL_RESIDENT) return CONC_TRIGGER_LATE;
        usleep(500);
    }
    return CONC_TRIGGER_TIMEOUT;
}

/* (c), (d): another client asks for `model` (not resident: it must load or merge first), then
 * the realtime request on the base model goes out as wait_for_load says. */
static void ttft_background_once(const daemon_proc *d, corral_client *rtc, corral_client *mon,
                                 const char *model, conc_ttft_run *run) {
    corral_model_status before, after;
    model_status(mon, model, CALL_TIMEOUT_MS, false, &before);
    if (before.state == CORRAL_MODEL_RESIDENT) fail("model %s is already resident", model);
    gen_job bg = {.endpoint = d->endpoint,
                  .model = model,
                  .max_tokens = REALTIME_TOKENS,
                  .priority = CORRAL_PRIORITY_INTERACTIVE};
    snprintf(bg.prompt, sizeof bg.prompt, "%s", BACKGROUND_PROMPT);
    pthread_barrier_t start;
    gen_jobs_launch(&bg, 1, &start);
    run->how = wait_for_load(mon, model);
    gen_job rt;
    realtime_request(rtc, &rt);
    gen_jobs_join(&bg, 1, &start);
    gen_job_check(&bg);
    ttft_fill(run, &rt);
    run->rt_sent_ms = (rt.sent - bg.sent) * 1e3;
    run->rt_first_ms = (rt.first - bg.sent) * 1e3;
    run->bg_first_ms = (bg.first - bg.sent) * 1e3;
    run->bg_done_ms = (bg.done - bg.sent) * 1e3;
    run->bg_load_ms = bg.result.timings.load_us / 1e3;
    run->bg_prefill_ms = bg.result.timings.prefill_us / 1e3;
    model_status(mon, model, CALL_TIMEOUT_MS, false, &after);
    run->last_load_ms = after.last_load_ms;
    run->loads = after.loads - before.loads;
    run->merges = after.merges - before.merges;
}

static void ttft_report(int which, int r) {
    const conc_ttft_run *run = &g_results.ttft[which][r];
    fprintf(stderr, "concurrency: ttft %s, run %d: %.1f ms", conc_case_names[which], r + 1,
            run->ttft_ms);
    if (which >= CONC_LOAD)
        fprintf(stderr, " (sent %.0f ms after the background request, %s; its load took %.0f ms)",
                run->rt_sent_ms, conc_trigger_names[run->how], run->bg_load_ms);
    fputc('\n', stderr);
    g_results.ttft_runs[which] = r + 1;
}

/* (a), (b), (c) on the main daemon. */
static void phase_ttft(const bench *b, const daemon_proc *d, corral_client *ctl) {
    corral_client *rtc = client_open(d->endpoint);
    corral_client *mon = client_open(d->endpoint);
    gen_job rt;
    realtime_request(rtc, &rt); /* warm-up */
    for (int r = 0; r < b->o.reps; r++) {
        usleep(SETTLE_US);
        realtime_request(rtc, &rt);
        ttft_fill(&g_results.ttft[CONC_IDLE][r], &rt);
        ttft_report(CONC_IDLE, r);
    }
    for (int r = 0; r < b->o.reps; r++) {
        usleep(SETTLE_US);
        ttft_streams_once(d, rtc, &g_results.ttft[CONC_STREAMS][r]);
        ttft_report(CONC_STREAMS, r);
    }
    for (int r = 0; r < b->o.reps; r++) {
        cold_model_reset(b, ctl);
        usleep(SETTLE_US);
        ttft_background_once(d, rtc, mon, COLD_MODEL, &g_results.ttft[CONC_LOAD][r]);
        ttft_report(CONC_LOAD, r);
    }
    corral_client_destroy(&mon);
    corral_client_destroy(&rtc);
}

/* (d): a fresh corrald and cache directory per run, the base resident, the variant never merged. */
static void phase_merge(bench *b) {
    for (int r = 0; r < b->o.reps; r++) {
        daemon_proc d;
        daemon_start(b, &d, &b->base_files);
        corral_client *rtc = client_open(d.endpoint);
        corral_client *mon = client_open(d.endpoint);
        model_load(mon, BASE_MODEL);
        gen_job rt;
        realtime_request(rtc, &rt); /* warm-up */
        usleep(SETTLE_US);
        ttft_background_once(&d, rtc, mon, VARIANT_MODEL, &g_results.ttft[CONC_MERGE][r]);
        ttft_report(CONC_MERGE, r);
        if (g_results.ttft[CONC_MERGE][r].merges != 1)
            fprintf(stderr, "concurrency: the variant was merged %llu times in run %d\n",
                    (unsigned long long)g_results.ttft[CONC_MERGE][r].merges, r + 1);
        corral_client_destroy(&mon);
        corral_client_destroy(&rtc);
        daemon_stop(&d);
        if (!b->o.keep) spawn_remove_tree(d.dir); /* the merged image: ~0.6 GB a run */
    }
}

/* ---- burst -------------------------------------------------------------------------------------
 */

static void phase_burst(const bench *b, const daemon_proc *d, corral_client *ctl) {
    for (int r = 0; r < b->o.reps; r++) {
        conc_burst_run *run = &g_results.burst[r];
        cold_model_reset(b, ctl);
        corral_model_status before, after;
        model_status(ctl, COLD_MODEL, CALL_TIMEOUT_MS, false, &before);
        usleep(SETTLE_US);
        gen_job jobs[CONC_BURST_CLIENTS];
        memset(jobs, 0, sizeof jobs);
        for (int i = 0; i < CONC_BURST_CLIENTS; i++) {
            jobs[i].endpoint = d->endpoint;
            jobs[i].model = COLD_MODEL;
            stream_prompt(jobs[i].prompt, sizeof jobs[i].prompt, i);
            jobs[i].max_tokens = REALTIME_TOKENS;
            jobs[i].priority = CORRAL_PRIORITY_INTERACTIVE;
        }
        pthread_barrier_t start;
        gen_jobs_launch(jobs, CONC_BURST_CLIENTS, &start);
        gen_jobs_join(jobs, CONC_BURST_CLIENTS, &start);
        model_status(ctl, COLD_MODEL, CALL_TIMEOUT_MS, false, &after);
        double first = jobs[0].sent, last = jobs[0].done, lat[CONC_BURST_CLIENTS];
        for (int i = 0; i < CONC_BURST_CLIENTS; i++) {
            if (jobs[i].status == CORRAL_OK)
                run->ok++;
            else if (!run->error[0])
                snprintf(run->error, sizeof run->error, "%s: %s",
                         corral_status_name(jobs[i].status), jobs[i].error);
            if (jobs[i].sent < first) first = jobs[i].sent;
            if (jobs[i].done > last) last = jobs[i].done;
            lat[i] = (jobs[i].done - jobs[i].sent) * 1e3;
        }
        const conc_spread l = conc_spread_of(lat, CONC_BURST_CLIENTS);
        run->wall_ms = (last - first) * 1e3;
        run->lat_med_ms = l.med;
        run->lat_max_ms = l.hi;
        run->loads = after.loads - before.loads;
        g_results.burst_runs = r + 1;
        fprintf(stderr, "concurrency: burst, run %d: %d/%d succeeded, %llu load(s), %.0f ms\n",
                r + 1, run->ok, CONC_BURST_CLIENTS, (unsigned long long)run->loads, run->wall_ms);
    }
}

/* ---- main --------------------------------------------------------------------------------------
 */

/* The rest of the line that starts with `prefix` in text, into out ("" when none). */
static void line_after(const char *text, const char *prefix, char *out, size_t size) {
    out[0] = '\0';
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            p += strlen(prefix);
            const size_t n = strcspn(p, "\n");
            snprintf(out, size, "%.*s", (int)n, p);
            return;
        }
}

static void machine_facts(bench *b) {
    char text[8192];
    const char *corrald_argv[] = {b->f.corrald, "--version", NULL};
    spawn_capture(corrald_argv, text, sizeof text);
    line_after(text, "cpu features: ", b->f.cpu_features, sizeof b->f.cpu_features);
    corral_error err;
    const char *path = bench_kernel_path(&err);
    snprintf(b->f.kernel_path, sizeof b->f.kernel_path, "%.31s", path ? path : err.message);
    getloadavg(&b->f.load_before, 1);
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(b->f.uname, sizeof b->f.uname, "%s %s %s", u.sysname, u.release, u.machine);
    if (b->o.llama) {
        const char *llama_argv[] = {b->o.llama, "--version", NULL};
        spawn_capture(llama_argv, text, sizeof text);
        char version[80], built[120];
        line_after(text, "version: ", version, sizeof version);
        line_after(text, "built with ", built, sizeof built);
        snprintf(b->f.llama_version, sizeof b->f.llama_version, "version %s, built with %s",
                 version, built);
    }
}

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: concurrency [-t THREADS] [-n TOKENS] [-r RUNS] [--streams 1,2,4,8,16]\n"
            "                   [--only streams|ttft|burst] [--dir DIR] [--llama-server PATH]\n"
            "                   [--keep] [--json]\n"
            "  -t THREADS          compute threads of corrald and llama-server (default 2)\n"
            "  -n TOKENS           tokens each stream generates (default 64)\n"
            "  -r RUNS             runs of every measurement (default 3)\n"
            "  --streams LIST      concurrent streams to measure (default 1,2,4,8,16)\n"
            "  --only PHASE        one phase: streams, ttft (realtime time to first token) or "
            "burst\n"
            "  --dir DIR           inputs and run directory (default $CORRAL_BENCH_DIR or\n"
            "                      /var/tmp/corral-bench)\n"
            "  --llama-server PATH run the streams on llama-server too (default $LLAMA_SERVER)\n"
            "  --keep              keep the run directory (configs, logs, caches)\n"
            "  --json              print JSON instead of the tables\n"
            "corrald: $CORRALD, else build/daemon/corrald of this build tree\n");
}

static int parse_int(const char *s, int lo, int hi, const char *what) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "concurrency: %s must be an integer in %d..%d (got '%s')\n", what, lo, hi,
                s);
        exit(2);
    }
    return (int)v;
}

static void parse_options(conc_opts *o, int argc, char **argv) {
    const char *env_dir = getenv("CORRAL_BENCH_DIR");
    const char *env_llama = getenv("LLAMA_SERVER");
    *o = (conc_opts){.threads = 2,
                     .n_tokens = 64,
                     .reps = 3,
                     .ns = {1, 2, 4, 8, 16},
                     .n_ns = 5,
                     .phases = CONC_PHASE_STREAMS | CONC_PHASE_TTFT | CONC_PHASE_BURST,
                     .dir = env_dir && *env_dir ? env_dir : "/var/tmp/corral-bench",
                     .llama = env_llama && *env_llama ? env_llama : NULL};
    static const struct option options[] = {
        {"streams", required_argument, NULL, 's'}, {"only", required_argument, NULL, 'o'},
        {"dir", required_argument, NULL, 'd'},     {"llama-server", required_argument, NULL, 'l'},
        {"keep", no_argument, NULL, 'k'},          {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "t:n:r:h", options, NULL)) != -1) {
        switch (c) {
            case 't':
                o->threads = parse_int(optarg, 1, 512, "-t");
                break;
            case 'n':
                o->n_tokens = (uint32_t)parse_int(optarg, 1, 1024, "-n");
                break;
            case 'r':
                o->reps = parse_int(optarg, 1, CONC_MAX_REPS, "-r");
                break;
            case 's': {
                char list[256];
                snprintf(list, sizeof list, "%s", optarg);
                o->n_ns = 0;
                char *save = NULL;
                for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                    if (o->n_ns == CONC_MAX_NS) {
                        fprintf(stderr, "concurrency: at most %d entries in --streams\n",
                                CONC_MAX_NS);
                        exit(2);
                    }
                    o->ns[o->n_ns++] = parse_int(t, 1, CONC_MAX_STREAMS, "each --streams entry");
                }
                if (o->n_ns == 0) parse_int("", 1, CONC_MAX_STREAMS, "each --streams entry");
                break;
            }
            case 'o':
                if (strcmp(optarg, "streams") == 0)
                    o->phases = CONC_PHASE_STREAMS;
                else if (strcmp(optarg, "ttft") == 0)
                    o->phases = CONC_PHASE_TTFT;
                else if (strcmp(optarg, "burst") == 0)
                    o->phases = CONC_PHASE_BURST;
                else {
                    fprintf(stderr, "concurrency: --only takes streams, ttft or burst\n");
                    exit(2);
                }
                break;
            case 'd':
                o->dir = optarg;
                break;
            case 'l':
                o->llama = optarg;
                break;
            case 'k':
                o->keep = true;
                break;
            case 'j':
                o->json = true;
                break;
            case 'h':
                usage(stdout);
                exit(0);
            default:
                usage(stderr);
                exit(2);
        }
    }
    if (optind != argc) {
        usage(stderr);
        exit(2);
    }
    if (o->llama && access(o->llama, X_OK) != 0)
        fail("llama-server %s is not executable: %s", o->llama, strerror(errno));
}

int main(int argc, char **argv) {
    static bench b;
    parse_options(&b.o, argc, argv);
    if (spawn_install("concurrency") != 0) fail("cannot install the cleanup: %s", strerror(errno));

    /* The inputs: made on first use, then reused. */
    if (mkdir(b.o.dir, 0755) != 0 && errno != EEXIST) fail("%s: %s", b.o.dir, strerror(errno));
    char dir[PATH_MAX];
    if (!realpath(b.o.dir, dir)) fail("%s: %s", b.o.dir, strerror(errno));
    path_join(b.f.base, sizeof b.f.base, dir, "tinyllama-1.1b-q4_0.gguf");
    path_join(b.f.cold, sizeof b.f.cold, dir, "tinyllama-1.1b-q8_0.gguf");
    path_join(b.f.adapter, sizeof b.f.adapter, dir, "tinyllama-1.1b-lora-r16.gguf");
    input_ensure_model(b.f.base, "tinyllama-1.1b", SYNTH_TYPE_Q4_0);
    input_ensure_model(b.f.cold, "tinyllama-1.1b", SYNTH_TYPE_Q8_0);
    input_ensure_adapter(b.f.adapter, b.f.base);
    find_corrald(b.f.corrald, sizeof b.f.corrald);
    machine_facts(&b);

    path_join(b.run_dir, sizeof b.run_dir, dir, "run-XXXXXX");
    if (!mkdtemp(b.run_dir)) fail("%s: %s", b.run_dir, strerror(errno));
    spawn_set_run_dir(b.run_dir, b.o.keep);
    snprintf(g_run_dir, sizeof g_run_dir, "%s", b.run_dir);

    daemon_proc d;
    daemon_start(&b, &d, NULL);
    snprintf(b.main_cache, sizeof b.main_cache, "%s/cache", d.dir);
    fprintf(stderr, "concurrency: corrald %s at %s (log %s)\n", b.f.version, d.endpoint,
            d.log_path);
    corral_client *ctl = client_open(d.endpoint);
    fprintf(stderr,
            "concurrency: loading %s (its first load in a fresh cache rearranges its "
            "weights)\n",
            base_name(b.f.base));
    model_load(ctl, BASE_MODEL);
    file_list_read(b.main_cache, &b.base_files);

    if (b.o.phases & CONC_PHASE_STREAMS) phase_streams(&b, &d, ctl);
    if (b.o.phases & (CONC_PHASE_TTFT | CONC_PHASE_BURST)) {
        /* Once, untimed: the cold model's first load writes its images to the cache. */
        fprintf(stderr, "concurrency: loading %s once\n", base_name(b.f.cold));
        model_load(ctl, COLD_MODEL);
        file_list all;
        file_list_read(b.main_cache, &all);
        for (int i = 0; i < all.n; i++)
            if (!file_list_has(&b.base_files, all.names[i]))
                snprintf(b.cold_files.names[b.cold_files.n++], NAME_MAX + 1, "%s", all.names[i]);
    }
    if (b.o.phases & CONC_PHASE_TTFT) phase_ttft(&b, &d, ctl);
    if (b.o.phases & CONC_PHASE_BURST) phase_burst(&b, &d, ctl);
    corral_client_destroy(&ctl);
    daemon_stop(&d);
    if (b.o.phases & CONC_PHASE_TTFT) phase_merge(&b);

    if (g_stream_prompt_max) {
        b.f.stream_prompt_min = g_stream_prompt_min;
        b.f.stream_prompt_max = g_stream_prompt_max;
    }
    b.f.realtime_prompt = g_realtime_prompt;
    getloadavg(&b.f.load_after, 1);
    b.f.realtime_text = REALTIME_PROMPT;
    b.f.realtime_tokens = REALTIME_TOKENS;
    if (b.o.json)
        conc_report_json(stdout, &b.o, &b.f, &g_results);
    else
        conc_report_text(stdout, &b.o, &b.f, &g_results);
    return 0;
}
