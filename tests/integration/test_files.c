/*
 * test_files.c — black-box tests of corrald when the files under it fail: a served model file
 * truncated or rewritten while corrald runs (under a running request, before the next one, the
 * image of its repacked weights), and system calls made to fail on purpose by the preload library
 * of tests/faultinj (full disks and I/O errors on session and cache images, model reads and
 * mappings that fail, allocations that fail while merging, kill -9 in the middle of writing or
 * reading a session image, then a restart).
 *
 * The rules every test checks: corrald never dies (it answers and exits 0 on SIGTERM), every
 * request ends with exactly one Done or Error (counted on the wire, with a raw ZeroMQ client),
 * errors name the file and what happened, and the daemon serves correctly afterwards — the same
 * text as before the fault, or the new file's text when the file changed.
 *
 * Nothing here depends on timing: a request that must still be running when a file is truncated
 * is made long by tokens (an output constraint that needs thousands of characters), and waits are
 * bounded by generous deadlines that only a broken daemon reaches.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "corral.pb-c.h"
#include "corral/gguf.h"
#include "daemon_harness.h"
#include "testutil.h"

#ifndef FAULTINJ_LIB
#error "FAULTINJ_LIB (the path of libcorral_faultinj.so) must be defined by the build"
#endif

/* Generous bound for one request's final message: only a daemon that lost it gets there. */
#define FINAL_TIMEOUT_MS 60000

/* ---- files --------------------------------------------------------------------------------- */

/* The test's own folder (model copies, swap and cache directories): it outlives a daemon, so that
 * a restarted one finds what the last one left. */
static char work[64];

static void work_setup(void) {
    snprintf(work, sizeof work, "/tmp/corral-it-files-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(work));
}

static void work_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    ck_assert_int_eq(system(cmd), 0);
}

/* work/name, in one of a few rotating buffers. */
static const char *in_work(const char *name) {
    static char bufs[8][300];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", work, name);
    return b;
}

static void copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    ck_assert_msg(in && out, "copy %s -> %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    ck_assert_int_eq(fclose(out), 0);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Names in dir that contain `needle`; the first one into first (may be NULL). */
static int count_in_dir(const char *dir, const char *needle, char *first, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, needle)) continue;
        if (n++ == 0 && first) snprintf(first, size, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    return n;
}

/* Leftovers of writes: temporaries of images ("*.part.*", "*.tmp.*"). */
static int temporaries_in(const char *dir) {
    return count_in_dir(dir, ".part.", NULL, 0) + count_in_dir(dir, ".tmp.", NULL, 0);
}

/* ---- the daemon ---------------------------------------------------------------------------- */

static harness_daemon d;

/* Start corrald with `body`; with `faults` (CORRAL_FAULTINJ rules) it runs under the
 * fault-injection library. */
static void start(const char *body, const char *faults) {
    const char *asan = getenv("ASAN_OPTIONS");
    char saved[512];
    snprintf(saved, sizeof saved, "%s", asan ? asan : "");
    if (faults) {
        setenv("LD_PRELOAD", FAULTINJ_LIB, 1);
        setenv("CORRAL_FAULTINJ", faults, 1);
        /* The library is preloaded ahead of a sanitizer's runtime: tell ASan that is meant. */
        char opts[600];
        snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", saved, saved[0] ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    }
    const int rc = harness_start(&d, body, NULL, 30000);
    if (faults) {
        unsetenv("LD_PRELOAD");
        unsetenv("CORRAL_FAULTINJ");
        if (asan)
            setenv("ASAN_OPTIONS", saved, 1);
        else
            unsetenv("ASAN_OPTIONS");
    }
    ck_assert_int_eq(rc, 0);
}

/* SIGTERM: the daemon must exit 0 (it survived everything the test did). */
static void stop(void) {
    char log[65536];
    harness_read_log(&d, log, sizeof log);
    const int rc = harness_stop(&d, SIGTERM, 10000);
    ck_assert_msg(rc == 0, "corrald exited %d; its log:\n%s", rc, log);
}

static bool log_has(const char *needle) {
    static char log[1 << 20];
    harness_read_log(&d, log, sizeof log);
    return strstr(log, needle) != NULL;
}

static long long now_ms(void);

/* Wait (bounded) until the daemon's log says `needle`: a line is written by the thread that
 * acted, which may come after the answer the test has already read. */
static void wait_for_log(const char *needle) {
    const long long deadline = now_ms() + FINAL_TIMEOUT_MS;
    while (!log_has(needle)) {
        ck_assert_msg(now_ms() < deadline, "the log never said '%s'", needle);
        usleep(10000);
    }
}

/* A config serving `m` (work/m.gguf, context 2048) and `other` (the shared Q4_0 stories, never
 * touched), with swap and cache in the work folder and 2 compute threads; `extra` is appended to
 * the models list. */
static const char *config(const char *extra) {
    static char body[16384];
    snprintf(body, sizeof body,
             "threads: 2\n"
             "limits: {peer_timeout_ms: 60000, stall_timeout_ms: 60000}\n"
             "memory: {swap_dir: \"%s/swap\"}\n"
             "cache: {dir: \"%s/cache\"}\n"
             "models:\n"
             "  - name: m\n    path: %s/m.gguf\n    context: 2048\n"
             "  - name: other\n    path: %s\n    context: 256\n%s",
             work, work, work, test_shared_path("models/stories260K-q4_0.gguf"),
             extra ? extra : "");
    return body;
}

/* ---- a raw client that counts final messages ----------------------------------------------- */

typedef struct request {
    const char *model, *prompt, *session, *constraint;
    uint32_t max_tokens;
    bool stream;
    bool deferred; /* sent only once request 1's first chunk is in (and the hook has run) */
} request;

/* What became of one request. */
typedef struct outcome {
    int finals; /* Done + Error messages: must be exactly 1 */
    bool done;  /* the final one was a Done */
    int code;   /* Error: its code */
    char message[1024];
    char text[8192];
    uint32_t chunks, prompt_tokens, prefilled_tokens;
} outcome;

/* Called on each chunk (id, its index) before the next message is read. */
typedef void (*chunk_hook)(uint64_t id, uint32_t index, void *user);

typedef struct raw {
    void *ctx, *sock;
} raw;

static void raw_open(raw *r) {
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
    ck_assert_int_eq(zmq_connect(r->sock, d.endpoint), 0);
}

static void raw_close(raw *r) {
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

static void raw_send(raw *r, Corral__V1__Request *req) {
    const size_t len = corral__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    corral__v1__request__pack(req, buf);
    ck_assert_int_ge(zmq_send(r->sock, buf, len, 0), 0);
    free(buf);
}

static void send_generate(raw *r, uint64_t id, const request *q) {
    Corral__V1__Generate g = CORRAL__V1__GENERATE__INIT;
    g.model = (char *)q->model;
    g.prompt = (char *)(q->prompt ? q->prompt : "Once upon a time");
    Corral__V1__UInt32Value mt = CORRAL__V1__UINT32_VALUE__INIT;
    mt.value = q->max_tokens ? q->max_tokens : 24;
    g.max_tokens = &mt;
    Corral__V1__FloatValue temp = CORRAL__V1__FLOAT_VALUE__INIT;
    temp.value = 0.0f; /* greedy: the same text every time */
    g.temperature = &temp;
    g.stream = q->stream;
    g.session = (char *)(q->session ? q->session : "");
    g.constraint = (char *)(q->constraint ? q->constraint : "");
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.id = id;
    req.body_case = CORRAL__V1__REQUEST__BODY_GENERATE;
    req.generate = &g;
    raw_send(r, &req);
}

static void send_ping(raw *r) {
    Corral__V1__Ping ping = CORRAL__V1__PING__INIT;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.id = 999999;
    req.body_case = CORRAL__V1__REQUEST__BODY_PING;
    req.ping = &ping;
    raw_send(r, &req);
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Send requests 1..n together and read every response until each has its final message, then a
 * little longer (a Ping's round trip) to catch a second final. out[i] is request i + 1's. Fails
 * the test when a request has no final within FINAL_TIMEOUT_MS. */
static void run_requests(const request *reqs, int n, outcome *out, chunk_hook hook, void *user) {
    raw r;
    raw_open(&r);
    memset(out, 0, (size_t)n * sizeof *out);
    for (int i = 0; i < n; i++)
        if (!reqs[i].deferred) send_generate(&r, (uint64_t)i + 1, &reqs[i]);
    const long long deadline = now_ms() + FINAL_TIMEOUT_MS;
    int open = n;
    bool pinged = false, ponged = false;
    long long last_ping = now_ms();
    while (open > 0 || !ponged) {
        ck_assert_msg(now_ms() < deadline, "%d request(s) got no final message", open);
        if (open == 0 && !pinged) {
            send_ping(&r);
            pinged = true;
        }
        zmq_pollitem_t it = {.socket = r.sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 500) <= 0) {
            /* Keep the requests alive while they wait (the daemon cancels silent peers). */
            if (now_ms() - last_ping > 2000 && open > 0) {
                send_ping(&r);
                last_ping = now_ms();
            }
            continue;
        }
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        ck_assert_int_ge(zmq_msg_recv(&msg, r.sock, 0), 0);
        Corral__V1__Response *resp =
            corral__v1__response__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
        zmq_msg_close(&msg);
        ck_assert_ptr_nonnull(resp);
        if (resp->body_case == CORRAL__V1__RESPONSE__BODY_PONG) {
            if (pinged && open == 0) ponged = true;
            corral__v1__response__free_unpacked(resp, NULL);
            continue;
        }
        ck_assert_msg(resp->id >= 1 && resp->id <= (uint64_t)n, "a response for id %llu",
                      (unsigned long long)resp->id);
        outcome *o = &out[resp->id - 1];
        switch (resp->body_case) {
            case CORRAL__V1__RESPONSE__BODY_CHUNK:
                ck_assert_msg(o->finals == 0, "request %llu: a chunk after its final message",
                              (unsigned long long)resp->id);
                strncat(o->text, resp->chunk->text, sizeof o->text - strlen(o->text) - 1);
                o->chunks++;
                if (hook) hook(resp->id, resp->chunk->index, user);
                if (resp->id == 1 && resp->chunk->index == 0)
                    for (int i = 0; i < n; i++)
                        if (reqs[i].deferred) send_generate(&r, (uint64_t)i + 1, &reqs[i]);
                break;
            case CORRAL__V1__RESPONSE__BODY_DONE:
                o->finals++;
                o->done = true;
                o->prompt_tokens = resp->done->prompt_tokens;
                o->prefilled_tokens = resp->done->prefilled_tokens;
                if (o->finals == 1) open--;
                break;
            case CORRAL__V1__RESPONSE__BODY_ERROR:
                o->finals++;
                o->code = resp->error->code;
                snprintf(o->message, sizeof o->message, "%s", resp->error->message);
                if (o->finals == 1) open--;
                break;
            default:
                break;
        }
        corral__v1__response__free_unpacked(resp, NULL);
    }
    raw_close(&r);
    for (int i = 0; i < n; i++)
        ck_assert_msg(out[i].finals == 1, "request %d got %d final messages", i + 1, out[i].finals);
}

/* One request; its outcome. */
static outcome run_one(const request *q) {
    outcome o;
    run_requests(q, 1, &o, NULL, NULL);
    return o;
}

/* The text of a request that must succeed. */
static const char *text_of(const request *q) {
    static char texts[4][8192];
    static int next;
    const outcome o = run_one(q);
    ck_assert_msg(o.done, "model '%s' failed: %s", q->model, o.message);
    ck_assert_msg(o.text[0], "model '%s' generated nothing", q->model);
    char *t = texts[next++ % 4];
    snprintf(t, sizeof texts[0], "%s", o.text);
    return t;
}

/* ---- Status --------------------------------------------------------------------------------- */

typedef struct model_view {
    int state;
    char error[1024];
} model_view;

static model_view status_of(const char *model) {
    raw r;
    raw_open(&r);
    Corral__V1__Status st = CORRAL__V1__STATUS__INIT;
    st.model = (char *)model;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.id = 77;
    req.body_case = CORRAL__V1__REQUEST__BODY_STATUS;
    req.status = &st;
    raw_send(&r, &req);
    model_view v = {0};
    zmq_pollitem_t it = {.socket = r.sock, .events = ZMQ_POLLIN};
    ck_assert_int_eq(zmq_poll(&it, 1, 10000), 1);
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    ck_assert_int_ge(zmq_msg_recv(&msg, r.sock, 0), 0);
    Corral__V1__Response *resp =
        corral__v1__response__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
    zmq_msg_close(&msg);
    ck_assert_ptr_nonnull(resp);
    ck_assert_int_eq(resp->body_case, CORRAL__V1__RESPONSE__BODY_STATUS);
    ck_assert_uint_eq(resp->status->n_models, 1);
    v.state = resp->status->models[0]->state;
    snprintf(v.error, sizeof v.error, "%s", resp->status->models[0]->error);
    corral__v1__response__free_unpacked(resp, NULL);
    raw_close(&r);
    return v;
}

/* ---- a model that stays busy ----------------------------------------------------------------- */

/* A synthetic model (512 wide, 4 layers, Q8_0) made once per run with `corral synth`: a request
 * on it is made long by an output constraint, not by time. */
static char synth_path[128];

static void make_synth_model(void) {
    snprintf(synth_path, sizeof synth_path, "/tmp/corral-test-files-%d.gguf", (int)getpid());
    const char *cli = getenv("CORRAL_CLI");
    if (!cli || !*cli) {
        fprintf(stderr, "test_files: CORRAL_CLI is not set (run it through ctest)\n");
        exit(EXIT_FAILURE);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' synth --arch llama --n-embd 512 --n-layer 4 --n-head 8 --n-head-kv 4 "
             "--n-ff 1408 --n-vocab 512 --n-ctx 4096 --type q8_0 --seed 7 -o '%s' >/dev/null",
             cli, synth_path);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_files: '%s' failed\n", cmd);
        exit(EXIT_FAILURE);
    }
}

/* An output no generation can complete within max_tokens: the request runs all of them. */
#define ENDLESS "(?:[ -~]{1000}){4}"

static outcome second_turn(const char *first_text);

/* ---- files that change under the daemon ------------------------------------------------------ */

typedef struct truncate_on_chunk {
    const char *path;
    bool done;
} truncate_on_chunk;

static void truncate_after_first_chunk(uint64_t id, uint32_t index, void *user) {
    truncate_on_chunk *t = user;
    if (id != 1 || index != 0 || t->done) return;
    ck_assert_int_eq(truncate(t->path, file_size(t->path) / 2), 0);
    t->done = true;
}

/* A model file truncated to half while a request streams from it: the next step reads a weight
 * past the new end (SIGBUS). The request ends with one Error naming the file; the model shows
 * BROKEN in Status; another model serves meanwhile; the next request loads the file afresh,
 * which the GGUF reader refuses by name; once the file is whole again, it serves as before. */
START_TEST(test_model_truncated_under_a_running_request) {
    copy_file(synth_path, in_work("m.gguf"));
    start(config(NULL), NULL);
    const request short_m = {.model = "m", .max_tokens = 8};
    const char *before = text_of(&short_m);
    const request other = {.model = "other", .max_tokens = 16};
    const char *other_text = text_of(&other);

    const request busy = {.model = "m", .max_tokens = 1500, .stream = true, .constraint = ENDLESS};
    truncate_on_chunk t = {.path = in_work("m.gguf")};
    outcome o;
    run_requests(&busy, 1, &o, truncate_after_first_chunk, &t);
    ck_assert_msg(t.done, "no chunk came: %s", o.message);
    ck_assert_msg(!o.done, "the request finished (%u chunks) on a truncated file", o.chunks);
    ck_assert_int_eq(o.code, CORRAL__V1__ERROR_CODE__IO);
    ck_assert_msg(strstr(o.message, in_work("m.gguf")) && strstr(o.message, "truncated"), "%s",
                  o.message);
    wait_for_log("model broken");

    model_view v = status_of("m");
    ck_assert_int_eq(v.state, CORRAL__V1__MODEL_STATE__MODEL_STATE_BROKEN);
    ck_assert_msg(strstr(v.error, in_work("m.gguf")), "%s", v.error);

    ck_assert_str_eq(text_of(&other), other_text); /* the other model was never touched */

    o = run_one(&short_m); /* a fresh load, refused by the reader */
    ck_assert(!o.done);
    ck_assert_int_eq(o.code, CORRAL__V1__ERROR_CODE__FORMAT);
    ck_assert_msg(strstr(o.message, in_work("m.gguf")) && strstr(o.message, "past end of file"),
                  "%s", o.message);
    v = status_of("m");
    ck_assert_int_eq(v.state, CORRAL__V1__MODEL_STATE__MODEL_STATE_BROKEN);
    ck_assert_msg(strstr(v.error, "past end of file"), "%s", v.error);

    copy_file(synth_path, in_work("m.gguf"));
    ck_assert_str_eq(text_of(&short_m), before);
    ck_assert_int_eq(status_of("m").state, CORRAL__V1__MODEL_STATE__MODEL_STATE_RESIDENT);
    stop();
}
END_TEST

/* The image of the repacked weights (cache.dir) truncated under a resident model: every thread of
 * the pool reads it in the matrix products, and the fault — on a worker or on the compute thread
 * — fails the request, naming the image. The model is reloaded: the image is rewritten, and the
 * output is what it was. */
START_TEST(test_repacked_image_truncated_under_the_model) {
    /* Quantized: its matrices are rearranged into panels (the image); F32 ones may not be. */
    copy_file(test_shared_path("models/stories260K-q8_0.gguf"), in_work("m.gguf"));
    start(config(NULL), NULL);
    const request q = {.model = "m", .max_tokens = 24};
    const char *before = text_of(&q);
    char image[600];
    ck_assert_int_eq(count_in_dir(in_work("cache"), "repack-m-", image, sizeof image), 1);
    ck_assert_int_eq(truncate(image, 4096), 0);

    outcome o = run_one(&q);
    ck_assert(!o.done);
    ck_assert_int_eq(o.code, CORRAL__V1__ERROR_CODE__IO);
    ck_assert_msg(strstr(o.message, image) && strstr(o.message, "SIGBUS"), "%s", o.message);
    ck_assert_int_eq(status_of("m").state, CORRAL__V1__MODEL_STATE__MODEL_STATE_BROKEN);

    ck_assert_str_eq(text_of(&q), before);
    wait_for_log("repacked weights image unusable, writing it again");
    ck_assert_int_eq(file_size(image) > 4096, 1);
    stop();
}
END_TEST

/* The model file overwritten in place by another model (cp: the same inode, truncated and
 * rewritten; here stories260K with a LoRA adapter merged in, whose text differs): the next
 * request sees the change before it starts, and the model serves the new file's weights —
 * exactly what a model configured on the new file serves. */
START_TEST(test_model_overwritten_in_place_serves_the_new_weights) {
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("m.gguf"));
    char extra[4400];
    const char *merged = test_shared_path("lora/stories260K-lora-r8-merged-f32.gguf");
    snprintf(extra, sizeof extra, "  - name: merged\n    path: %s\n    context: 512\n", merged);
    start(config(extra), NULL);
    const request q = {.model = "m", .max_tokens = 32};
    const char *before = text_of(&q);
    const request qm = {.model = "merged", .max_tokens = 32};
    const char *want = text_of(&qm);
    ck_assert_str_ne(before, want);

    struct stat st0, st1;
    ck_assert_int_eq(stat(in_work("m.gguf"), &st0), 0);
    copy_file(test_shared_path("lora/stories260K-lora-r8-merged-f32.gguf"), in_work("m.gguf"));
    ck_assert_int_eq(stat(in_work("m.gguf"), &st1), 0);
    ck_assert(st0.st_ino == st1.st_ino); /* in place */

    ck_assert_str_eq(text_of(&q), want);
    wait_for_log("model broken");
    ck_assert_int_eq(status_of("m").state, CORRAL__V1__MODEL_STATE__MODEL_STATE_RESIDENT);
    stop();
}
END_TEST

/* Rewritten in place with its size, edges and times put back: only the middle of one matrix
 * changed (blk.2.ffn_up.weight, which the kernels read from the image of repacked weights), so
 * only the change time tells. The daemon must not serve the old weights through the image it
 * made from the old file: the output is that of a fresh copy of the new bytes, and differs from
 * the old output. */
START_TEST(test_model_rewritten_with_size_and_times_put_back) {
    const char *path = in_work("m.gguf");
    /* Quantized, so that its matrices are served from an image of repacked weights. */
    copy_file(test_shared_path("models/stories260K-q8_0.gguf"), path);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    char extra[4400];
    snprintf(extra, sizeof extra, "  - name: copy\n    path: %s/copy.gguf\n    context: 512\n",
             work);
    /* The copy the daemon serves as the reference is made now, with the change, below. */
    const long size = st.st_size;
    unsigned char *bytes = malloc((size_t)size);
    FILE *fp = fopen(path, "rb");
    ck_assert_uint_eq(fread(bytes, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    /* Zero the middle half of the matrix (Q8_0 blocks of zeros: valid numbers), far from the
     * file's 64 KiB edges. */
    corral_error err;
    gguf_file *g = gguf_open(path, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    const gguf_tensor *t = gguf_find_tensor(g, "blk.2.ffn_up.weight");
    ck_assert_ptr_nonnull(t);
    const long at = (long)((const char *)t->data - (const char *)gguf_file_data(g));
    const long span = (long)t->size / 2;
    gguf_destroy(&g);
    ck_assert(at > 65536 && at + span < size - 65536);
    memset(bytes + at + span / 2, 0, (size_t)span);
    fp = fopen(in_work("copy.gguf"), "wb");
    ck_assert_uint_eq(fwrite(bytes, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    start(config(extra), NULL);
    const request q = {.model = "m", .max_tokens = 32};
    const char *before = text_of(&q);
    const request ref = {.model = "copy", .max_tokens = 32};
    const char *want = text_of(&ref);
    ck_assert_str_ne(before, want); /* the change matters */

    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    const struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL); /* so that the rewrite gets a change time of its own */
    fp = fopen(path, "r+b");
    ck_assert_int_eq(fseek(fp, at + span / 2, SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(bytes + at + span / 2, 1, (size_t)span, fp), (size_t)span);
    ck_assert_int_eq(fclose(fp), 0);
    ck_assert_int_eq(utimensat(AT_FDCWD, path, times, 0), 0);
    free(bytes);

    ck_assert_str_eq(text_of(&q), want);
    stop();
}
END_TEST

/* Replaced at its path (a new file renamed over it) while a request streams: the request reads
 * the old file, still mapped and intact, and ends with Done; a request that comes after the
 * change waits until the model is idle, is loaded again, and serves the new file's text. */
static void rename_after_first_chunk(uint64_t id, uint32_t index, void *user) {
    (void)user;
    if (id == 1 && index == 0)
        ck_assert_int_eq(rename(in_work("staged.gguf"), in_work("m.gguf")), 0);
}

START_TEST(test_model_replaced_while_a_request_runs) {
    copy_file(synth_path, in_work("m.gguf"));
    char extra[4400];
    snprintf(extra, sizeof extra, "  - name: new\n    path: %s/new.gguf\n    context: 512\n", work);
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("new.gguf"));
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("staged.gguf"));
    start(config(extra), NULL);
    const request fresh = {.model = "new", .max_tokens = 24};
    const char *want = text_of(&fresh);

    const request reqs[2] = {
        {.model = "m", .max_tokens = 400, .stream = true, .constraint = ENDLESS},
        {.model = "m", .max_tokens = 24, .deferred = true},
    };
    outcome o[2];
    run_requests(reqs, 2, o, rename_after_first_chunk, NULL);
    ck_assert_msg(o[0].done, "%s", o[0].message); /* the old mapping served it whole */
    ck_assert_msg(o[1].done, "%s", o[1].message);
    ck_assert_str_eq(o[1].text, want);
    wait_for_log("model file changed on disk");
    ck_assert(!log_has("model broken"));
    stop();
}
END_TEST

/* A conversation whose model file is replaced between two turns: the session's cache, computed
 * by the old model, is written out when the old model goes — after the change — and must not
 * pass for a cache of the new one: the second turn is recomputed, and says what the new model
 * says to the whole conversation. */
START_TEST(test_session_of_a_replaced_model_is_recomputed) {
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("m.gguf"));
    const char *merged = test_shared_path("lora/stories260K-lora-r8-merged-f32.gguf");
    copy_file(merged, in_work("staged.gguf"));
    char extra[4400];
    snprintf(extra, sizeof extra, "  - name: merged\n    path: %s\n    context: 2048\n", merged);
    start(config(extra), NULL);
    const request first = {.model = "m", .session = "s", .max_tokens = 12};
    const char *text = text_of(&first);
    char prompt[4096];
    snprintf(prompt, sizeof prompt, "Once upon a time%s And then", text);
    const request fresh = {.model = "merged", .prompt = prompt, .max_tokens = 12};
    const char *want = text_of(&fresh);

    ck_assert_int_eq(rename(in_work("staged.gguf"), in_work("m.gguf")), 0);
    const outcome o = second_turn(text);
    ck_assert_msg(o.done, "%s", o.message);
    ck_assert_uint_eq(o.prefilled_tokens, o.prompt_tokens); /* nothing from the old cache */
    ck_assert_str_eq(o.text, want);
    stop();
}
END_TEST

/* ---- fault injection --------------------------------------------------------------------------
 */

/* A conversation of two turns on session "s" of model m; the second turn's outcome. */
static outcome second_turn(const char *first_text) {
    char prompt[4096];
    snprintf(prompt, sizeof prompt, "Once upon a time%s And then", first_text);
    const request q = {.model = "m", .prompt = prompt, .session = "s", .max_tokens = 12};
    return run_one(&q);
}

/* Unload m: its sessions' caches are written to the swap directory. */
static void unload_m(void) {
    raw r;
    raw_open(&r);
    Corral__V1__Unload u = CORRAL__V1__UNLOAD__INIT;
    u.model = "m";
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.id = 5;
    req.body_case = CORRAL__V1__REQUEST__BODY_UNLOAD;
    req.unload = &u;
    raw_send(&r, &req);
    zmq_pollitem_t it = {.socket = r.sock, .events = ZMQ_POLLIN};
    ck_assert_int_eq(zmq_poll(&it, 1, 10000), 1);
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    ck_assert_int_ge(zmq_msg_recv(&msg, r.sock, 0), 0);
    Corral__V1__Response *resp =
        corral__v1__response__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
    zmq_msg_close(&msg);
    ck_assert_int_eq(resp->body_case, CORRAL__V1__RESPONSE__BODY_ACK);
    corral__v1__response__free_unpacked(resp, NULL);
    raw_close(&r);
}

/* Session images that cannot be written (a full disk on write, an I/O error on fsync): the state
 * is dropped with a warning, no temporary is left, and the conversation goes on — recomputed
 * from its text, with the same answer. */
static void check_swap_write_fails(const char *faults) {
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("m.gguf"));
    start(config(NULL), faults);
    const request first = {.model = "m", .session = "s", .max_tokens = 12};
    const char *text = text_of(&first);
    const outcome calm = second_turn(text);
    ck_assert(calm.done);
    ck_assert_uint_lt(calm.prefilled_tokens, calm.prompt_tokens); /* the cache was used */

    unload_m(); /* the session's cache is written out: the write fails */
    wait_for_log("session state dropped: it could not be swapped out");
    wait_for_log("faultinj:");
    ck_assert_int_eq(temporaries_in(in_work("swap")), 0);
    ck_assert_int_eq(count_in_dir(in_work("swap"), "session-", NULL, 0), 0);

    const outcome after = second_turn(text);
    ck_assert_msg(after.done, "%s", after.message);
    ck_assert_str_eq(after.text, calm.text);
    ck_assert_uint_eq(after.prefilled_tokens, after.prompt_tokens); /* recomputed */
    stop();
}

START_TEST(test_swap_write_enospc) {
    check_swap_write_fails("call=write,path=*/swap/session-*,errno=ENOSPC");
}
END_TEST

START_TEST(test_swap_fsync_eio) {
    check_swap_write_fails("call=fsync,path=*/swap/session-*,errno=EIO");
}
END_TEST

/* The image of repacked weights cannot be written (a full disk; an I/O error on the rename): the
 * load falls back to rearranging the weights in memory, documented and logged, and serves the
 * same text; no temporary is left in the cache directory. */
static void check_cache_write_fails(const char *faults) {
    /* Quantized: its matrices are rearranged into panels, which the image keeps. */
    copy_file(test_shared_path("models/stories260K-q8_0.gguf"), in_work("m.gguf"));
    start(config(NULL), NULL);
    const request q = {.model = "m", .max_tokens = 24};
    const char *want = text_of(&q);
    stop();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", in_work("cache"));
    ck_assert_int_eq(system(cmd), 0);

    start(config(NULL), faults);
    ck_assert_str_eq(text_of(&q), want);
    wait_for_log("faultinj:");
    wait_for_log("cannot keep repacked weights in the cache directory; repacking in memory");
    ck_assert_int_eq(temporaries_in(in_work("cache")), 0);
    ck_assert_int_eq(count_in_dir(in_work("cache"), "repack-m-", NULL, 0), 0);
    const request other = {.model = "other", .max_tokens = 8};
    text_of(&other);
    stop();
}

START_TEST(test_cache_write_enospc) {
    check_cache_write_fails("call=write,path=*/cache/repack-m-*,errno=ENOSPC");
}
END_TEST

START_TEST(test_cache_rename_eio) {
    check_cache_write_fails("call=rename,path=*/cache/repack-m-*,errno=EIO");
}
END_TEST

/* A config with `v`, a LoRA variant of stories260K (merged into an image in cache.dir). */
static const char *variant_config(void) {
    static char extra[8400];
    char base[4096]; /* test_shared_path's buffer is reused by the next call */
    snprintf(base, sizeof base, "%s", test_shared_path("models/stories260K.gguf"));
    snprintf(extra, sizeof extra,
             "  - name: v\n    path: %s\n    context: 256\n    adapters:\n"
             "      - {path: %s, scale: 1.0}\n",
             base, test_shared_path("lora/stories260K-lora-r8.gguf"));
    return config(extra);
}

/* The variant's text, from a daemon without faults; the cache is emptied afterwards, so that
 * the next daemon merges again. */
static const char *variant_text(void) {
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("m.gguf"));
    start(variant_config(), NULL);
    const request v = {.model = "v", .max_tokens = 24};
    const char *want = text_of(&v);
    stop();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", in_work("cache"));
    ck_assert_int_eq(system(cmd), 0);
    return want;
}

/* The merged image cannot be written (a full disk, once): the request fails with an error that
 * says so, no temporary is left, the other models serve meanwhile, and the next request merges
 * and serves the variant's text. */
START_TEST(test_merged_image_write_enospc) {
    const char *want = variant_text();
    start(variant_config(), "call=write,path=*/cache/lora-*,errno=ENOSPC,count=1");
    const request v = {.model = "v", .max_tokens = 24};
    outcome o = run_one(&v);
    ck_assert_msg(!o.done, "the variant was served through a failed merge");
    ck_assert_int_eq(o.code, CORRAL__V1__ERROR_CODE__IO);
    ck_assert_msg(strstr(o.message, "No space left on device") && strstr(o.message, "lora-"), "%s",
                  o.message);
    wait_for_log("faultinj:");
    ck_assert_int_eq(temporaries_in(in_work("cache")), 0);
    const request other = {.model = "other", .max_tokens = 8};
    text_of(&other);
    ck_assert_str_eq(text_of(&v), want);
    stop();
}
END_TEST

/* Every allocation of 8 KiB or more that the loader thread makes while it merges and loads
 * the variant fails in turn (one daemon per allocation: the k-th fails, once): each ends in one
 * clean Error for the request or in the variant served, never a crash; the request after it is
 * served with the variant's text. The sweep ends at the first k whose request is served (no k-th
 * allocation any more). */
START_TEST(test_allocation_fails_while_merging) {
    const char *want = variant_text();
    const request v = {.model = "v", .max_tokens = 24};
    int failed = 0, k = 0;
    for (;; k++) {
        ck_assert_msg(k < 200, "more than 200 allocations on the loader: the sweep never ends");
        char rule[160];
        snprintf(rule, sizeof rule,
                 "call=malloc,thread=corral-loader,min=8192,after=%d,count=1,errno=ENOMEM", k);
        start(variant_config(), rule);
        const outcome o = run_one(&v);
        const bool injected = log_has("faultinj:");
        if (o.done) {
            ck_assert_str_eq(o.text, want);
        } else {
            ck_assert_msg(o.message[0], "allocation %d: an Error without a message", k);
            failed++;
            ck_assert_str_eq(text_of(&v), want); /* the fault is spent: served */
        }
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", in_work("cache"));
        stop();
        ck_assert_int_eq(system(cmd), 0);
        if (!injected) break; /* fewer than k + 1 such allocations: all were tried */
    }
    fprintf(stderr,
            "test_allocation_fails_while_merging: %d allocations failed in turn, %d of "
            "them failed the request\n",
            k, failed);
    ck_assert_int_gt(failed, 0); /* some allocation failed the request */
}
END_TEST

/* Reading the model file fails: an I/O error on the reads that fingerprint it (the load goes on
 * without caching images of it, and serves), then on opening it and on mapping it (the load fails
 * with an error naming the file; the next request loads it). */
START_TEST(test_model_reads_fail) {
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("m.gguf"));
    start(config(NULL), NULL);
    const request q = {.model = "m", .max_tokens = 24};
    const char *want = text_of(&q);
    stop();

    start(config(NULL), "call=read,path=*/m.gguf,errno=EIO");
    ck_assert_str_eq(text_of(&q), want);
    wait_for_log("cannot fingerprint the model file");
    stop();

    /* The fingerprint's open is the first, the reader's the second: fail both. corrald's check
     * of the model's header at start (config_check.c) opens and maps the file as a load does:
     * those calls go through (after=), the request's fail. */
    start(config(NULL), "call=open,path=*/m.gguf,errno=EIO,after=2,count=2");
    outcome o = run_one(&q);
    ck_assert(!o.done);
    ck_assert_int_eq(o.code, CORRAL__V1__ERROR_CODE__IO);
    ck_assert_msg(strstr(o.message, in_work("m.gguf")) && strstr(o.message, "Input/output error"),
                  "%s", o.message);
    ck_assert_str_eq(text_of(&q), want);
    stop();

    start(config(NULL), "call=mmap,path=*/m.gguf,errno=ENOMEM,after=1,count=1");
    o = run_one(&q);
    ck_assert(!o.done);
    ck_assert_int_eq(o.code, CORRAL__V1__ERROR_CODE__IO);
    ck_assert_msg(strstr(o.message, in_work("m.gguf")) && strstr(o.message, "cannot map"), "%s",
                  o.message);
    ck_assert_str_eq(text_of(&q), want);
    stop();
}
END_TEST

/* ---- kill -9 in the middle of swapping -------------------------------------------------------
 */

/* Points where a daemon dies while a session's cache goes out (Unload) or comes back (the next
 * turn of the conversation). An image is written as: the temporary written, fsync'ed, renamed to
 * "<image>.part.<pid>.<n>", its directory opened and fsync'ed (1st open of the directory), its
 * checksums patched in, fsync'ed, renamed to the image's name, the directory fsync'ed again (2nd
 * open). A death before the last rename loses the image (the next start removes the temporary);
 * after it, or while an image is opened to be read back, the image is whole and comes back. The
 * seed picks how many calls of the kind go through first. */
typedef struct kill_point {
    const char *rule; /* printf format taking the `after` count */
    int after_base;   /* `after` is after_base plus a draw from [0, after_max) */
    int after_max;
    bool on_swap_in; /* at the next turn's read, not at the Unload's write */
    bool restored;   /* the session's image survives */
} kill_point;

static const kill_point kill_points[] = {
    {"call=write,path=*/swap/session-*,after=%d,action=kill", 0, 6, false, false},
    {"call=fsync,path=*/swap/session-*,after=%d,action=kill", 0, 2, false, false},
    {"call=rename,path=*/swap/session-*,after=%d,action=kill", 0, 2, false, false},
    /* The directory's 2nd open: after the image's last rename. */
    {"call=open,path=*/swap,after=%d,action=kill", 1, 1, false, true},
    /* The start's scan opens the image first (to verify it); the read back is the 2nd open. */
    {"call=open,path=*/swap/session-*.gguf,after=%d,action=kill", 1, 1, true, true},
};

static int wait_exit(pid_t pid) {
    const long long deadline = now_ms() + FINAL_TIMEOUT_MS;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        ck_assert_msg(now_ms() < deadline, "corrald did not die at its kill point");
        usleep(10000);
    }
    return status;
}

/* After a crash at the chosen point, a new daemon starts clean: no temporaries, and the session
 * either comes back whole (its cache used: fewer tokens prefilled) or is lost (recomputed: all
 * prefilled), as the point says; the answer is the same either way. */
START_TEST(test_kill_during_swap_then_restart) {
    copy_file(test_shared_path("models/stories260K.gguf"), in_work("m.gguf"));
    start(config(NULL), NULL);
    const request first = {.model = "m", .session = "s", .max_tokens = 12};
    const char *text = text_of(&first);
    const outcome calm = second_turn(text);
    stop();
    const int n_points = (int)(sizeof kill_points / sizeof kill_points[0]);
    for (uint64_t seed = 1; seed <= 2; seed++) {
        uint64_t state = seed;
        for (int p = 0; p < n_points; p++) {
            const kill_point *kp = &kill_points[p];
            const int after =
                kp->after_base + (int)(test_splitmix64(&state) % (uint64_t)kp->after_max);
            char rule[256];
            snprintf(rule, sizeof rule, kp->rule, after);
            char cmd[400];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", in_work("swap"));
            ck_assert_int_eq(system(cmd), 0);
            raw r;
            if (kp->on_swap_in) {
                /* The image is written by an orderly daemon and read back by the one that dies. */
                start(config(NULL), NULL);
                text_of(&first);
                stop(); /* sessions are written out at shutdown */
                ck_assert_int_eq(count_in_dir(in_work("swap"), "session-", NULL, 0), 1);
                start(config(NULL), rule);
                raw_open(&r);
                char prompt[4096];
                snprintf(prompt, sizeof prompt, "Once upon a time%s And then", text);
                const request q = {
                    .model = "m", .prompt = prompt, .session = "s", .max_tokens = 12};
                send_generate(&r, 1, &q);
            } else {
                start(config(NULL), rule);
                text_of(&first);
                raw_open(&r);
                Corral__V1__Unload u = CORRAL__V1__UNLOAD__INIT;
                u.model = "m";
                Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
                req.id = 5;
                req.body_case = CORRAL__V1__REQUEST__BODY_UNLOAD;
                req.unload = &u;
                raw_send(&r, &req);
            }
            const int status = wait_exit(d.pid);
            raw_close(&r);
            ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                          "seed %llu, %s: corrald did not die at its kill point",
                          (unsigned long long)seed, rule);
            d.pid = 0;
            harness_stop(&d, SIGTERM, 1000); /* only removes its folder */

            start(config(NULL), NULL);
            ck_assert_msg(temporaries_in(in_work("swap")) == 0, "seed %llu, %s: temporaries left",
                          (unsigned long long)seed, rule);
            const outcome o = second_turn(text);
            ck_assert_msg(o.done, "seed %llu, %s: %s", (unsigned long long)seed, rule, o.message);
            ck_assert_str_eq(o.text, calm.text);
            const bool restored = o.prefilled_tokens < o.prompt_tokens;
            ck_assert_msg(restored == kp->restored, "seed %llu, %s: the session was %s",
                          (unsigned long long)seed, rule, restored ? "restored" : "lost");
            stop();
        }
    }
}
END_TEST

static Suite *files_suite(void) {
    Suite *s = suite_create("files");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, work_setup, work_teardown);
    tcase_set_timeout(core, 300);
    tcase_add_test(core, test_model_truncated_under_a_running_request);
    tcase_add_test(core, test_repacked_image_truncated_under_the_model);
    tcase_add_test(core, test_model_overwritten_in_place_serves_the_new_weights);
    tcase_add_test(core, test_model_rewritten_with_size_and_times_put_back);
    tcase_add_test(core, test_model_replaced_while_a_request_runs);
    tcase_add_test(core, test_session_of_a_replaced_model_is_recomputed);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, work_setup, work_teardown);
    tcase_set_timeout(limits, 600);
    tcase_add_test(limits, test_kill_during_swap_then_restart);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, work_setup, work_teardown);
    tcase_set_timeout(errors, 300);
    tcase_add_test(errors, test_swap_write_enospc);
    tcase_add_test(errors, test_swap_fsync_eio);
    tcase_add_test(errors, test_cache_write_enospc);
    tcase_add_test(errors, test_cache_rename_eio);
    tcase_add_test(errors, test_merged_image_write_enospc);
    tcase_add_test(errors, test_allocation_fails_while_merging);
    tcase_add_test(errors, test_model_reads_fail);
    suite_add_tcase(s, errors);
    return s;
}

int main(void) {
    make_synth_model();
    SRunner *sr = srunner_create(files_suite());
    srunner_run_all(sr, CK_ENV);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    unlink(synth_path);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
