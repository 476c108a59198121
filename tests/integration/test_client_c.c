/*
 * test_client_c.c — libcorral and the corral CLI, black-box.
 *
 * Three kinds of peer:
 *  - a fake daemon: a ROUTER socket served by a thread of this test, scripted per test, for what
 *    a real daemon cannot be made to do on demand (malformed replies, interleaved streams, a
 *    stream that outgrows the client's queue, silence);
 *  - no daemon at all (timeouts and the CLI's "is it running?" message);
 *  - a real corrald ($CORRALD) with the tiny stories models from $CORRAL_SHARED_DIR: greedy
 *    output equals llama.cpp's reference byte for byte, the contract's errors, tokenize, models,
 *    status, load/unload/pin/unpin, sessions across apps, and the CLI ($CORRAL_CLI) on top.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "corral.h"
#include "corral.pb-c.h"
#include "daemon_harness.h"
#include "testutil.h"

/* ---- small helpers ----------------------------------------------------------------------- */

static long long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The whole file as a NUL-terminated string (caller frees); fails the test if unreadable. */
static char *read_text_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)size, fp), (size_t)size);
    buf[size] = '\0';
    fclose(fp);
    if (len) *len = (size_t)size;
    return buf;
}

/* Whitespace-separated integers of a reference file into ids (at most max). Returns the count. */
static size_t read_ids_file(const char *path, int32_t *ids, size_t max) {
    char *text = read_text_file(path, NULL);
    size_t n = 0;
    char *p = text, *end;
    for (;;) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ck_assert_uint_lt(n, max);
        ids[n++] = (int32_t)v;
        p = end;
    }
    free(text);
    return n;
}

/* An absolute path of a shared data file (the daemon's config needs absolute paths). */
static void shared_abs_path(const char *relative, char *out, size_t size) {
    const char *path = test_shared_path(relative);
    char resolved[PATH_MAX];
    ck_assert_msg(realpath(path, resolved) != NULL, "missing %s", path);
    ck_assert_int_lt(snprintf(out, size, "%s", resolved), (int)size);
}

static char *reference_greedy(size_t *len) {
    return read_text_file(test_shared_path("reference/stories260K.greedy.txt"), len);
}

#define GREEDY_PROMPT     "Once upon a time"
#define GREEDY_MAX_TOKENS 256

static corral_generate_params greedy_params(const char *model) {
    corral_generate_params p = {.model = model, .prompt = GREEDY_PROMPT};
    p.has_temperature = true;
    p.temperature = 0;
    p.has_max_tokens = true;
    p.max_tokens = GREEDY_MAX_TOKENS;
    return p;
}

/* Collects chunks handed to a corral_chunk_fn, checking that indices count 0, 1, 2, ... */
typedef struct collector {
    char text[1 << 16];
    size_t len;
    int32_t ids[4096];
    size_t n_ids;
    uint32_t calls;
    bool index_ok;
    uint32_t cancel_at_call; /* return nonzero on this call (1-based); 0: never */
} collector;

static void collector_init(collector *c) {
    memset(c, 0, sizeof *c);
    c->index_ok = true;
}

static void collector_add(collector *c, const corral_chunk *chunk) {
    if (chunk->index != c->calls) c->index_ok = false;
    c->calls++;
    ck_assert_uint_lt(c->len + chunk->text_len, sizeof c->text);
    ck_assert_uint_eq(strlen(chunk->text), chunk->text_len);
    memcpy(c->text + c->len, chunk->text, chunk->text_len);
    c->len += chunk->text_len;
    c->text[c->len] = '\0';
    for (size_t i = 0; i < chunk->n_token_ids && c->n_ids < 4096; i++)
        c->ids[c->n_ids++] = chunk->token_ids[i];
}

static int collector_fn(const corral_chunk *chunk, void *user) {
    collector *c = user;
    collector_add(c, chunk);
    return c->cancel_at_call && c->calls == c->cancel_at_call;
}

/* A minimal JSON syntax check (RFC 8259 grammar, no semantics): returns 1 for a valid document. */
static const char *json_skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return s;
}

static const char *json_value(const char *s, int depth);

static const char *json_string_end(const char *s) {
    if (*s != '"') return NULL;
    for (s++; *s && *s != '"'; s++) {
        if ((unsigned char)*s < 0x20) return NULL;
        if (*s == '\\') {
            s++;
            if (*s == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", s[i]) || !s[i]) return NULL;
                s += 4;
            } else if (!*s || !strchr("\"\\/bfnrt", *s)) {
                return NULL;
            }
        }
    }
    return *s == '"' ? s + 1 : NULL;
}

static const char *json_number_end(const char *s) {
    if (*s == '-') s++;
    if (*s == '0') {
        s++;
    } else if (*s >= '1' && *s <= '9') {
        while (*s >= '0' && *s <= '9') s++;
    } else {
        return NULL;
    }
    if (*s == '.') {
        s++;
        if (!(*s >= '0' && *s <= '9')) return NULL;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) return NULL;
        while (*s >= '0' && *s <= '9') s++;
    }
    return s;
}

static const char *json_value(const char *s, int depth) {
    if (depth > 64) return NULL;
    s = json_skip_ws(s);
    if (*s == '{' || *s == '[') {
        char close = *s == '{' ? '}' : ']';
        s = json_skip_ws(s + 1);
        if (*s == close) return s + 1;
        for (;;) {
            if (close == '}') {
                s = json_string_end(json_skip_ws(s));
                if (!s) return NULL;
                s = json_skip_ws(s);
                if (*s++ != ':') return NULL;
            }
            s = json_value(s, depth + 1);
            if (!s) return NULL;
            s = json_skip_ws(s);
            if (*s == close) return s + 1;
            if (*s++ != ',') return NULL;
        }
    }
    if (*s == '"') return json_string_end(s);
    if (strncmp(s, "true", 4) == 0) return s + 4;
    if (strncmp(s, "false", 5) == 0) return s + 5;
    if (strncmp(s, "null", 4) == 0) return s + 4;
    return json_number_end(s);
}

static int json_valid(const char *doc) {
    const char *end = json_value(doc, 0);
    return end && *json_skip_ws(end) == '\0';
}

/* ---- the fake daemon --------------------------------------------------------------------- */

#define FAKE_MAX_RECORDS 32

typedef struct fake_server fake_server;
/* Called on the server thread for every decoded Request except Ping (answered with Pong). */
typedef void (*fake_handler)(fake_server *fs, const Corral__V1__Request *req);

struct fake_server {
    void *ctx, *router;
    char dir[64];
    char endpoint[128];
    pthread_t thread;
    atomic_int stop;
    fake_handler handler;
    unsigned char peer[256]; /* routing id of the (one) client */
    size_t peer_len;
    /* What the server saw; read by the test after fake_stop (the join orders the accesses). */
    int pings;
    char app[CORRAL_APP_NAME_MAX];
    uint32_t protocol_version;
    uint64_t generate_ids[FAKE_MAX_RECORDS];
    Corral__V1__Request *generates[FAKE_MAX_RECORDS]; /* kept copies */
    int n_generates;
    uint64_t cancelled[FAKE_MAX_RECORDS]; /* Cancel.request_id values */
    int n_cancels;
    long long first_request_ms, first_ping_ms;
};

static void fake_send(fake_server *fs, const Corral__V1__Response *resp) {
    size_t len = corral__v1__response__get_packed_size(resp);
    uint8_t *buf = malloc(len ? len : 1);
    corral__v1__response__pack(resp, buf);
    zmq_send(fs->router, fs->peer, fs->peer_len, ZMQ_SNDMORE);
    zmq_send(fs->router, buf, len, 0);
    free(buf);
}

static void fake_send_raw(fake_server *fs, const void *bytes, size_t len) {
    zmq_send(fs->router, fs->peer, fs->peer_len, ZMQ_SNDMORE);
    zmq_send(fs->router, bytes, len, 0);
}

static void fake_chunk(fake_server *fs, uint64_t id, uint32_t index, const char *text) {
    Corral__V1__Chunk chunk = CORRAL__V1__CHUNK__INIT;
    chunk.text = (char *)text;
    chunk.index = index;
    int32_t ids[1] = {(int32_t)index + 100};
    chunk.n_token_ids = 1;
    chunk.token_ids = ids;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_CHUNK;
    resp.chunk = &chunk;
    fake_send(fs, &resp);
}

static void fake_done(fake_server *fs, uint64_t id, Corral__V1__StopReason reason,
                      uint32_t generated) {
    Corral__V1__Timings timings = CORRAL__V1__TIMINGS__INIT;
    timings.total_us = 1234;
    timings.decode_us = 1000;
    Corral__V1__Done done = CORRAL__V1__DONE__INIT;
    done.stop_reason = reason;
    done.prompt_tokens = 5;
    done.prefilled_tokens = 4;
    done.generated_tokens = generated;
    done.timings = &timings;
    done.model = "fake-model";
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_DONE;
    resp.done = &done;
    fake_send(fs, &resp);
}

static void fake_error(fake_server *fs, uint64_t id, int code, const char *message) {
    Corral__V1__Error e = CORRAL__V1__ERROR__INIT;
    e.code = (Corral__V1__ErrorCode)code;
    e.message = (char *)message;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_ERROR;
    resp.error = &e;
    fake_send(fs, &resp);
}

static void fake_ack(fake_server *fs, uint64_t id) {
    Corral__V1__Ack ack = CORRAL__V1__ACK__INIT;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_ACK;
    resp.ack = &ack;
    fake_send(fs, &resp);
}

static void fake_pong(fake_server *fs, uint64_t id) {
    Corral__V1__Pong pong = CORRAL__V1__PONG__INIT;
    pong.version = "9.9.9";
    pong.protocol_version = 1;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_PONG;
    resp.pong = &pong;
    fake_send(fs, &resp);
}

static void *fake_main(void *arg) {
    fake_server *fs = arg;
    while (!atomic_load(&fs->stop)) {
        zmq_pollitem_t item = {.socket = fs->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 20) <= 0) continue;
        int n = zmq_recv(fs->router, fs->peer, sizeof fs->peer, 0);
        if (n < 0) continue;
        fs->peer_len = (size_t)n;
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, fs->router, 0) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        Corral__V1__Request *req =
            corral__v1__request__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
        zmq_msg_close(&msg);
        if (!req) continue;
        if (!fs->first_request_ms) fs->first_request_ms = mono_ms();
        snprintf(fs->app, sizeof fs->app, "%s", req->app ? req->app : "");
        fs->protocol_version = req->protocol_version;
        if (req->body_case == CORRAL__V1__REQUEST__BODY_PING) {
            fs->pings++;
            if (!fs->first_ping_ms) fs->first_ping_ms = mono_ms();
            fake_pong(fs, req->id);
            corral__v1__request__free_unpacked(req, NULL);
            continue;
        }
        if (req->body_case == CORRAL__V1__REQUEST__BODY_CANCEL && fs->n_cancels < FAKE_MAX_RECORDS)
            fs->cancelled[fs->n_cancels++] = req->cancel->request_id;
        bool keep = false;
        if (req->body_case == CORRAL__V1__REQUEST__BODY_GENERATE &&
            fs->n_generates < FAKE_MAX_RECORDS) {
            fs->generate_ids[fs->n_generates] = req->id;
            fs->generates[fs->n_generates++] = req;
            keep = true;
        }
        if (fs->handler) fs->handler(fs, req);
        if (!keep) corral__v1__request__free_unpacked(req, NULL);
    }
    return NULL;
}

static void fake_start(fake_server *fs, fake_handler handler) {
    memset(fs, 0, sizeof *fs);
    snprintf(fs->dir, sizeof fs->dir, "/tmp/corral-fake-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(fs->dir));
    snprintf(fs->endpoint, sizeof fs->endpoint, "ipc://%s/fake.sock", fs->dir);
    fs->handler = handler;
    fs->ctx = zmq_ctx_new();
    fs->router = zmq_socket(fs->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(fs->router, ZMQ_LINGER, &linger, sizeof linger);
    ck_assert_int_eq(zmq_bind(fs->router, fs->endpoint), 0);
    atomic_store(&fs->stop, 0);
    ck_assert_int_eq(pthread_create(&fs->thread, NULL, fake_main, fs), 0);
}

static void fake_stop(fake_server *fs) {
    atomic_store(&fs->stop, 1);
    pthread_join(fs->thread, NULL);
    zmq_close(fs->router);
    zmq_ctx_term(fs->ctx);
    char path[200];
    snprintf(path, sizeof path, "%s/fake.sock", fs->dir);
    unlink(path);
    rmdir(fs->dir);
}

static void fake_free_records(fake_server *fs) {
    for (int i = 0; i < fs->n_generates; i++)
        corral__v1__request__free_unpacked(fs->generates[i], NULL);
    fs->n_generates = 0;
}

static bool fake_saw_cancel_of(const fake_server *fs, uint64_t id) {
    for (int i = 0; i < fs->n_cancels; i++)
        if (fs->cancelled[i] == id) return true;
    return false;
}

/* ---- fake daemon: plain requests --------------------------------------------------------- */

static void handle_plain(fake_server *fs, const Corral__V1__Request *req) {
    static const unsigned char garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
    switch (req->body_case) {
        case CORRAL__V1__REQUEST__BODY_TOKENIZE:
            fake_error(fs, req->id, CORRAL__V1__ERROR_CODE__NOT_FOUND,
                       "model 'nosuch' is not configured");
            break;
        case CORRAL__V1__REQUEST__BODY_LIST_MODELS:
            fake_send_raw(fs, garbage, sizeof garbage);
            break;
        case CORRAL__V1__REQUEST__BODY_STATUS:
            fake_pong(fs, req->id); /* the wrong kind of answer */
            break;
        case CORRAL__V1__REQUEST__BODY_LOAD:
            fake_error(fs, req->id, 99, "a code from the future");
            break;
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
            fake_ack(fs, req->id);
            break;
        case CORRAL__V1__REQUEST__BODY_PIN:
            fake_error(fs, 0, CORRAL__V1__ERROR_CODE__PROTOCOL, "undecodable request");
            break;
        case CORRAL__V1__REQUEST__BODY_UNPIN:
            fake_ack(fs, req->id + 1000); /* an answer to nothing: dropped */
            fake_error(fs, req->id, CORRAL__V1__ERROR_CODE__PERMISSION_DENIED,
                       "app 'speaker' may not unpin");
            break;
        default:
            break;
    }
}

START_TEST(test_fake_errors_map_to_status_and_app_is_sent) {
    fake_server fs;
    fake_start(&fs, handle_plain);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    ck_assert_ptr_nonnull(c);
    char long_name[CORRAL_APP_NAME_MAX + 1];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    ck_assert_int_eq(corral_client_set_app(c, long_name), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(corral_client_set_app(c, "speaker"), CORRAL_OK);

    corral_pong pong;
    ck_assert_int_eq(corral_client_ping(c, 5000, &pong, &err), CORRAL_OK);
    ck_assert_str_eq(pong.version, "9.9.9");

    corral_tokens *t = (corral_tokens *)1;
    ck_assert_int_eq(corral_tokenize(c, "nosuch", "x", true, 5000, &t, &err), CORRAL_NOT_FOUND);
    ck_assert_ptr_null(t);
    ck_assert_str_eq(err.message, "model 'nosuch' is not configured");
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);

    corral_model_list *l = NULL;
    ck_assert_int_eq(corral_list_models(c, 5000, &l, &err), CORRAL_PROTOCOL);
    ck_assert_ptr_null(l);
    ck_assert_msg(strstr(err.message, fs.endpoint) != NULL, "%s", err.message);

    corral_status_report *r = NULL;
    ck_assert_int_eq(corral_client_status(c, NULL, 5000, &r, &err), CORRAL_PROTOCOL);
    ck_assert_msg(strstr(err.message, "Status") && strstr(err.message, "Pong"), "%s", err.message);

    ck_assert_int_eq(corral_load(c, "m", 5000, &err), CORRAL_PROTOCOL);
    ck_assert_msg(strstr(err.message, "99") != NULL, "%s", err.message);
    ck_assert_int_eq(corral_unload(c, "m", 5000, &err), CORRAL_OK);
    ck_assert_int_eq(corral_pin(c, "m", 5000, &err), CORRAL_PROTOCOL);
    ck_assert_str_eq(err.message, "undecodable request");
    ck_assert_int_eq(corral_unpin(c, "m", 5000, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_str_eq(err.message, "app 'speaker' may not unpin");
    corral_client_destroy(&c);
    ck_assert_ptr_null(c);
    corral_client_destroy(&c); /* NULL-safe */
    fake_stop(&fs);
    ck_assert_str_eq(fs.app, "speaker");
    ck_assert_uint_eq(fs.protocol_version, 1);
}
END_TEST

/* Replies with fixed, known content, to check how results are copied out. */
static void handle_results(fake_server *fs, const Corral__V1__Request *req) {
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = req->id;
    if (req->body_case == CORRAL__V1__REQUEST__BODY_TOKENIZE) {
        Corral__V1__TokenizeReply tr = CORRAL__V1__TOKENIZE_REPLY__INIT;
        int32_t ids[] = {1, 403, 407};
        char *pieces[] = {"<s>", "\xe2\x96\x81Once", "\xe2\x96\x81upon"};
        tr.n_ids = 3;
        tr.ids = ids;
        tr.n_pieces = strcmp(req->tokenize->text, "no pieces") == 0 ? 0 : 3;
        tr.pieces = pieces;
        if (strcmp(req->tokenize->text, "bad pieces") == 0) tr.n_pieces = 2;
        resp.body_case = CORRAL__V1__RESPONSE__BODY_TOKENIZE;
        resp.tokenize = &tr;
        fake_send(fs, &resp);
    } else if (req->body_case == CORRAL__V1__REQUEST__BODY_LIST_MODELS) {
        Corral__V1__ModelInfo a = CORRAL__V1__MODEL_INFO__INIT, b = CORRAL__V1__MODEL_INFO__INIT;
        a.name = "alpha";
        a.path = "/m/alpha.gguf";
        a.arch = "llama";
        a.context = 512;
        a.chat_template = "none";
        a.state = CORRAL__V1__MODEL_STATE__MODEL_STATE_RESIDENT;
        a.pinned = 1;
        b.name = "beta";
        b.path = "/m/beta.gguf";
        b.context = 2048;
        b.chat_template = "chatml";
        b.state = (Corral__V1__ModelState)42; /* a state from a newer daemon */
        Corral__V1__ModelInfo *models[] = {&a, &b};
        Corral__V1__ModelList ml = CORRAL__V1__MODEL_LIST__INIT;
        ml.n_models = 2;
        ml.models = models;
        resp.body_case = CORRAL__V1__RESPONSE__BODY_MODELS;
        resp.models = &ml;
        fake_send(fs, &resp);
    } else if (req->body_case == CORRAL__V1__REQUEST__BODY_STATUS) {
        Corral__V1__ModelStatus m = CORRAL__V1__MODEL_STATUS__INIT;
        m.name = req->status->model[0] ? req->status->model : "alpha";
        m.state = CORRAL__V1__MODEL_STATE__MODEL_STATE_SWAPPED;
        m.bytes = 3u << 20;
        m.last_used_ms = 1700000000123ull;
        m.queue_depth = 2;
        m.active = 1;
        m.requests_served = 77;
        m.pinned = 1;
        m.sessions = 3;
        m.swap_ins = 4;
        m.swap_outs = 5;
        Corral__V1__ModelStatus *models[] = {&m};
        Corral__V1__DaemonStatus d = CORRAL__V1__DAEMON_STATUS__INIT;
        d.version = "0.1.0";
        d.uptime_ms = 61000;
        d.total_bytes = 3u << 20;
        d.limit_bytes = 1u << 30;
        d.active = 1;
        d.queued = 2;
        d.requests_served = 77;
        d.sessions = 3;
        d.threads = 2;
        Corral__V1__StatusReply sr = CORRAL__V1__STATUS_REPLY__INIT;
        sr.n_models = 1;
        sr.models = models;
        sr.daemon = &d;
        resp.body_case = CORRAL__V1__RESPONSE__BODY_STATUS;
        resp.status = &sr;
        fake_send(fs, &resp);
    }
}

START_TEST(test_fake_results_are_copied_out) {
    fake_server fs;
    fake_start(&fs, handle_results);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    ck_assert_ptr_nonnull(c);

    corral_tokens *t = NULL;
    ck_assert_int_eq(corral_tokenize(c, "alpha", "Once upon", true, 5000, &t, &err), CORRAL_OK);
    ck_assert_uint_eq(t->n, 3);
    ck_assert_int_eq(t->ids[0], 1);
    ck_assert_int_eq(t->ids[2], 407);
    ck_assert_ptr_nonnull(t->pieces);
    ck_assert_str_eq(t->pieces[0], "<s>");
    ck_assert_str_eq(t->pieces[2], "\xe2\x96\x81upon");
    corral_tokens_destroy(&t);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(corral_tokenize(c, "alpha", "no pieces", true, 5000, &t, &err), CORRAL_OK);
    ck_assert_ptr_null(t->pieces);
    ck_assert_uint_eq(t->n, 3);
    corral_tokens_destroy(&t);
    ck_assert_int_eq(corral_tokenize(c, "alpha", "bad pieces", true, 5000, &t, &err),
                     CORRAL_PROTOCOL);
    ck_assert_ptr_null(t);

    corral_model_list *l = NULL;
    ck_assert_int_eq(corral_list_models(c, 5000, &l, &err), CORRAL_OK);
    ck_assert_uint_eq(l->n_models, 2);
    ck_assert_str_eq(l->models[0].name, "alpha");
    ck_assert_str_eq(l->models[0].path, "/m/alpha.gguf");
    ck_assert_str_eq(l->models[0].arch, "llama");
    ck_assert_uint_eq(l->models[0].context, 512);
    ck_assert_str_eq(l->models[0].chat_template, "none");
    ck_assert_int_eq(l->models[0].state, CORRAL_MODEL_RESIDENT);
    ck_assert(l->models[0].pinned);
    ck_assert_str_eq(l->models[1].arch, "");
    ck_assert_str_eq(corral_model_state_name(l->models[1].state), "unknown");
    ck_assert(!l->models[1].pinned);
    corral_model_list_destroy(&l);
    ck_assert_ptr_null(l);

    corral_status_report *r = NULL;
    ck_assert_int_eq(corral_client_status(c, "gamma", 5000, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(r->n_models, 1);
    ck_assert_str_eq(r->models[0].name, "gamma"); /* the model asked for was sent */
    ck_assert_int_eq(r->models[0].state, CORRAL_MODEL_SWAPPED);
    ck_assert_uint_eq(r->models[0].bytes, 3u << 20);
    ck_assert_uint_eq(r->models[0].last_used_ms, 1700000000123ull);
    ck_assert_uint_eq(r->models[0].queue_depth, 2);
    ck_assert_uint_eq(r->models[0].requests_served, 77);
    ck_assert_uint_eq(r->models[0].swap_outs, 5);
    ck_assert_str_eq(r->daemon.version, "0.1.0");
    ck_assert_uint_eq(r->daemon.limit_bytes, 1u << 30);
    ck_assert_uint_eq(r->daemon.threads, 2);
    corral_status_report_destroy(&r);
    ck_assert_ptr_null(r);
    corral_client_destroy(&c);
    fake_stop(&fs);
}
END_TEST

/* ---- fake daemon: generations ------------------------------------------------------------ */

/* Every Generate gets one chunk "x" and Done. */
static void handle_generate_once(fake_server *fs, const Corral__V1__Request *req) {
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE) return;
    fake_chunk(fs, req->id, 0, "x");
    fake_done(fs, req->id, CORRAL__V1__STOP_REASON__STOP_REASON_EOG, 1);
}

START_TEST(test_fake_generate_request_fields) {
    fake_server fs;
    fake_start(&fs, handle_generate_once);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    ck_assert_ptr_nonnull(c);

    /* 1: minimal, no callback: nothing optional is sent, and no streaming. */
    corral_generate_params p = {.model = "m", .prompt = "hello"};
    corral_done done;
    ck_assert_int_eq(corral_generate(c, &p, NULL, NULL, &done, 5000, &err), CORRAL_OK);
    ck_assert_int_eq(done.stop_reason, CORRAL_STOP_EOG);
    ck_assert_uint_eq(done.prompt_tokens, 5);
    ck_assert_uint_eq(done.prefilled_tokens, 4);
    ck_assert_uint_eq(done.generated_tokens, 1);
    ck_assert_uint_eq(done.timings.total_us, 1234);
    ck_assert_str_eq(done.model, "fake-model");

    /* 2: everything set, with a callback: streams. */
    const char *stops[] = {"THE END", "\n\n"};
    corral_message msgs[] = {{"system", "be brief"}, {"user", "hi"}};
    corral_generate_params q = {.model = "m2", .messages = msgs, .n_messages = 2};
    q.chat_template = "chatml";
    q.has_max_tokens = true, q.max_tokens = 0; /* present although zero */
    q.has_temperature = true, q.temperature = 0.5f;
    q.has_top_k = true, q.top_k = 40;
    q.has_top_p = true, q.top_p = 0.9f;
    q.has_min_p = true, q.min_p = 0.05f;
    q.has_repeat_penalty = true, q.repeat_penalty = 1.1f;
    q.has_presence_penalty = true, q.presence_penalty = -0.5f;
    q.has_frequency_penalty = true, q.frequency_penalty = 0.25f;
    q.has_penalty_last_n = true, q.penalty_last_n = 64;
    q.has_seed = true, q.seed = 0xfedcba9876543210ull;
    q.stop = stops, q.n_stop = 2;
    q.priority = CORRAL_PRIORITY_REALTIME;
    q.session = "s1";
    q.deadline_ms = 1500;
    q.constraint = "[a-z]+";
    q.sanitizer = "strict";
    collector col;
    collector_init(&col);
    ck_assert_int_eq(corral_generate(c, &q, collector_fn, &col, &done, 5000, &err), CORRAL_OK);
    ck_assert_str_eq(col.text, "x");

    /* 3: a callback but stream off; 4: no callback but stream on. */
    p.stream = CORRAL_STREAM_OFF;
    ck_assert_int_eq(corral_generate(c, &p, collector_fn, &col, &done, 5000, &err), CORRAL_OK);
    p.stream = CORRAL_STREAM_ON;
    ck_assert_int_eq(corral_generate(c, &p, NULL, NULL, NULL, 5000, &err), CORRAL_OK);
    /* 5: corral_chat puts its messages in; it refuses params that carry a prompt. */
    corral_generate_params cp = {.model = "m3"};
    ck_assert_int_eq(corral_chat(c, &cp, msgs + 1, 1, NULL, NULL, &done, 5000, &err), CORRAL_OK);
    ck_assert_int_eq(corral_chat(c, &p, msgs, 1, NULL, NULL, &done, 5000, &err),
                     CORRAL_INVALID_ARGUMENT);
    /* 6: corral_generate_text gets the whole text. */
    char *text = NULL;
    size_t text_len = 0;
    p.stream = CORRAL_STREAM_AUTO;
    ck_assert_int_eq(corral_generate_text(c, &p, &text, &text_len, &done, 5000, &err), CORRAL_OK);
    ck_assert_str_eq(text, "x");
    ck_assert_uint_eq(text_len, 1);
    free(text);
    corral_client_destroy(&c);
    fake_stop(&fs);

    ck_assert_int_ge(fs.n_generates, 5);
    const Corral__V1__Generate *g1 = fs.generates[0]->generate;
    ck_assert_str_eq(g1->model, "m");
    ck_assert_str_eq(g1->prompt, "hello");
    ck_assert_uint_eq(g1->n_messages, 0);
    ck_assert(!g1->stream);
    ck_assert_ptr_null(g1->max_tokens);
    ck_assert_ptr_null(g1->temperature);
    ck_assert_ptr_null(g1->top_k);
    ck_assert_ptr_null(g1->top_p);
    ck_assert_ptr_null(g1->min_p);
    ck_assert_ptr_null(g1->repeat_penalty);
    ck_assert_ptr_null(g1->presence_penalty);
    ck_assert_ptr_null(g1->frequency_penalty);
    ck_assert_ptr_null(g1->penalty_last_n);
    ck_assert_ptr_null(g1->seed);
    ck_assert_uint_eq(g1->n_stop, 0);
    ck_assert_int_eq(g1->priority, CORRAL__V1__PRIORITY__PRIORITY_UNSPECIFIED);
    ck_assert_str_eq(g1->session, "");
    ck_assert_uint_eq(g1->deadline_ms, 0);
    ck_assert_str_eq(g1->template_, "");

    const Corral__V1__Generate *g2 = fs.generates[1]->generate;
    ck_assert_str_eq(g2->model, "m2");
    ck_assert_str_eq(g2->prompt, "");
    ck_assert_uint_eq(g2->n_messages, 2);
    ck_assert_str_eq(g2->messages[0]->role, "system");
    ck_assert_str_eq(g2->messages[0]->content, "be brief");
    ck_assert_str_eq(g2->messages[1]->role, "user");
    ck_assert_str_eq(g2->messages[1]->content, "hi");
    ck_assert_str_eq(g2->template_, "chatml");
    ck_assert(g2->stream);
    ck_assert_ptr_nonnull(g2->max_tokens);
    ck_assert_uint_eq(g2->max_tokens->value, 0);
    ck_assert_float_eq(g2->temperature->value, 0.5f);
    ck_assert_int_eq(g2->top_k->value, 40);
    ck_assert_float_eq(g2->top_p->value, 0.9f);
    ck_assert_float_eq(g2->min_p->value, 0.05f);
    ck_assert_float_eq(g2->repeat_penalty->value, 1.1f);
    ck_assert_float_eq(g2->presence_penalty->value, -0.5f);
    ck_assert_float_eq(g2->frequency_penalty->value, 0.25f);
    ck_assert_int_eq(g2->penalty_last_n->value, 64);
    ck_assert_uint_eq(g2->seed->value, 0xfedcba9876543210ull);
    ck_assert_uint_eq(g2->n_stop, 2);
    ck_assert_str_eq(g2->stop[0], "THE END");
    ck_assert_str_eq(g2->stop[1], "\n\n");
    ck_assert_int_eq(g2->priority, CORRAL__V1__PRIORITY__PRIORITY_REALTIME);
    ck_assert_str_eq(g2->session, "s1");
    ck_assert_uint_eq(g2->deadline_ms, 1500);
    ck_assert_str_eq(g2->constraint, "[a-z]+");
    ck_assert_str_eq(g2->sanitizer, "strict");

    ck_assert(!fs.generates[2]->generate->stream);
    ck_assert(fs.generates[3]->generate->stream);
    const Corral__V1__Generate *g5 = fs.generates[4]->generate;
    ck_assert_str_eq(g5->model, "m3");
    ck_assert_uint_eq(g5->n_messages, 1);
    ck_assert_str_eq(g5->messages[0]->content, "hi");
    ck_assert(!fs.generates[5]->generate->stream); /* generate_text: one chunk */
    ck_assert_int_eq(fs.n_generates, 6);           /* the refused corral_chat sent nothing */
    fake_free_records(&fs);
}
END_TEST

/* Chunk 0, then chunk 2: one went missing. */
static void handle_index_gap(fake_server *fs, const Corral__V1__Request *req) {
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE) return;
    fake_chunk(fs, req->id, 0, "a");
    fake_chunk(fs, req->id, 2, "c");
    fake_done(fs, req->id, CORRAL__V1__STOP_REASON__STOP_REASON_EOG, 3);
}

START_TEST(test_fake_chunk_gap_is_protocol_error) {
    fake_server fs;
    fake_start(&fs, handle_index_gap);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    corral_generate_params p = {.model = "m", .prompt = "x"};
    corral_generation *g = corral_generate_start(c, &p, &err);
    ck_assert_ptr_nonnull(g);
    corral_chunk chunk;
    corral_done done;
    ck_assert_int_eq(corral_generation_poll(g, 5000, &chunk, &done, &err), CORRAL_POLL_CHUNK);
    ck_assert_str_eq(chunk.text, "a");
    ck_assert_int_eq(corral_generation_poll(g, 5000, &chunk, &done, &err), CORRAL_PROTOCOL);
    ck_assert_msg(strstr(err.message, "chunk 2") != NULL, "%s", err.message);
    /* The end is sticky. */
    ck_assert_int_eq(corral_generation_poll(g, 0, &chunk, &done, &err), CORRAL_PROTOCOL);
    uint64_t id = corral_generation_id(g);
    corral_generation_destroy(&g);
    ck_assert_ptr_null(g);
    corral_generation_destroy(&g);
    /* A round trip: everything sent before it has reached the server. */
    ck_assert_int_eq(corral_client_ping(c, 5000, NULL, &err), CORRAL_OK);
    corral_client_destroy(&c);
    fake_stop(&fs);
    ck_assert(fake_saw_cancel_of(&fs, id));
    fake_free_records(&fs);
}
END_TEST

/* The first Generate (A) is answered only when the second (B) arrives, interleaved with B. */
static void handle_interleave(fake_server *fs, const Corral__V1__Request *req) {
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE || fs->n_generates != 2) return;
    uint64_t a = fs->generate_ids[0], b = fs->generate_ids[1];
    fake_chunk(fs, b, 0, "b0");
    fake_chunk(fs, a, 0, "a0");
    fake_chunk(fs, b, 1, "b1");
    fake_chunk(fs, a, 1, "a1");
    fake_chunk(fs, a, 2, "a2");
    fake_chunk(fs, b, 2, "b2");
    fake_done(fs, a, CORRAL__V1__STOP_REASON__STOP_REASON_MAX_TOKENS, 3);
    fake_done(fs, b, CORRAL__V1__STOP_REASON__STOP_REASON_EOG, 3);
}

/* Drain a generation into col; returns the final poll result. */
static int drain(corral_generation *g, collector *col, corral_done *done, corral_error *err) {
    for (;;) {
        corral_chunk chunk;
        int r = corral_generation_poll(g, 10000, &chunk, done, err);
        if (r != CORRAL_POLL_CHUNK) return r;
        collector_add(col, &chunk);
    }
}

START_TEST(test_fake_two_generations_are_demultiplexed) {
    fake_server fs;
    fake_start(&fs, handle_interleave);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    corral_generate_params p = {.model = "m", .prompt = "x"};
    corral_generation *a = corral_generate_start(c, &p, &err);
    corral_generation *b = corral_generate_start(c, &p, &err);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_ne(corral_generation_id(a), corral_generation_id(b));
    collector ca, cb;
    collector_init(&ca);
    collector_init(&cb);
    corral_done da, db;
    ck_assert_int_eq(drain(a, &ca, &da, &err), CORRAL_POLL_DONE);
    ck_assert_str_eq(ca.text, "a0a1a2");
    ck_assert(ca.index_ok);
    ck_assert_int_eq(da.stop_reason, CORRAL_STOP_MAX_TOKENS);
    ck_assert_int_eq(drain(b, &cb, &db, &err), CORRAL_POLL_DONE);
    ck_assert_str_eq(cb.text, "b0b1b2");
    ck_assert(cb.index_ok);
    ck_assert_int_eq(db.stop_reason, CORRAL_STOP_EOG);
    ck_assert_int_eq(cb.ids[1], 101);
    /* Done again on later polls. */
    ck_assert_int_eq(corral_generation_poll(a, 0, NULL, &da, &err), CORRAL_POLL_DONE);
    corral_generation_destroy(&a);
    corral_generation_destroy(&b);
    corral_client_destroy(&c);
    fake_stop(&fs);
    ck_assert_int_eq(fs.n_cancels, 0); /* finished generations are not cancelled */
    fake_free_records(&fs);
}
END_TEST

/* B streams 20 chunks before A's only chunk; B is cancelled by the client when its queue
 * overflows, and then ends with Done(CANCELLED). */
static void handle_overflow(fake_server *fs, const Corral__V1__Request *req) {
    if (req->body_case == CORRAL__V1__REQUEST__BODY_CANCEL) {
        fake_ack(fs, req->id);
        fake_done(fs, req->cancel->request_id, CORRAL__V1__STOP_REASON__STOP_REASON_CANCELLED, 20);
        return;
    }
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE || fs->n_generates != 2) return;
    uint64_t a = fs->generate_ids[0], b = fs->generate_ids[1];
    for (uint32_t i = 0; i < 20; i++) fake_chunk(fs, b, i, "0123456789012345678901234567890");
    fake_chunk(fs, a, 0, "A");
    fake_done(fs, a, CORRAL__V1__STOP_REASON__STOP_REASON_EOG, 1);
}

START_TEST(test_fake_queue_overflow_cancels_the_unread_generation) {
    fake_server fs;
    fake_start(&fs, handle_overflow);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    corral_client_set_queue_limit(c, 250); /* about two of B's chunks */
    corral_generate_params p = {.model = "m", .prompt = "x"};
    corral_generation *a = corral_generate_start(c, &p, &err);
    corral_generation *b = corral_generate_start(c, &p, &err);
    collector ca, cb;
    collector_init(&ca);
    collector_init(&cb);
    corral_done done;
    ck_assert_int_eq(drain(a, &ca, &done, &err), CORRAL_POLL_DONE);
    ck_assert_str_eq(ca.text, "A");
    int r = drain(b, &cb, &done, &err);
    ck_assert_int_eq(r, CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_msg(strstr(err.message, "queue") != NULL, "%s", err.message);
    ck_assert_uint_ge(cb.calls, 1); /* what was queued is still delivered, in order */
    ck_assert_uint_le(cb.calls, 3);
    ck_assert(cb.index_ok);
    uint64_t b_id = corral_generation_id(b);
    corral_generation_destroy(&a);
    corral_generation_destroy(&b);
    corral_client_destroy(&c);
    fake_stop(&fs);
    ck_assert(fake_saw_cancel_of(&fs, b_id));
    ck_assert_int_eq(fs.n_cancels, 1);
    fake_free_records(&fs);
}
END_TEST

/* Three chunks, no Done until a Cancel comes. */
static void handle_until_cancel(fake_server *fs, const Corral__V1__Request *req) {
    if (req->body_case == CORRAL__V1__REQUEST__BODY_CANCEL) {
        fake_ack(fs, req->id);
        fake_done(fs, req->cancel->request_id, CORRAL__V1__STOP_REASON__STOP_REASON_CANCELLED, 3);
        return;
    }
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE) return;
    for (uint32_t i = 0; i < 3; i++) fake_chunk(fs, req->id, i, "t");
}

START_TEST(test_fake_callback_cancels_and_waits_for_done) {
    fake_server fs;
    fake_start(&fs, handle_until_cancel);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    corral_generate_params p = {.model = "m", .prompt = "x"};
    collector col;
    collector_init(&col);
    col.cancel_at_call = 1;
    corral_done done;
    ck_assert_int_eq(corral_generate(c, &p, collector_fn, &col, &done, 10000, &err), CORRAL_OK);
    ck_assert_int_eq(done.stop_reason, CORRAL_STOP_CANCELLED);
    ck_assert_uint_eq(col.calls, 1); /* no callbacks after the cancelling one */

    /* The non-blocking handle: cancel, then Done comes through poll. */
    corral_generation *g = corral_generate_start(c, &p, &err);
    corral_chunk chunk;
    ck_assert_int_eq(corral_generation_poll(g, 10000, &chunk, &done, &err), CORRAL_POLL_CHUNK);
    ck_assert_int_eq(corral_generation_cancel(g, &err), CORRAL_OK);
    ck_assert_int_eq(corral_generation_cancel(g, &err), CORRAL_OK); /* sent once */
    int r;
    while ((r = corral_generation_poll(g, 10000, &chunk, &done, &err)) == CORRAL_POLL_CHUNK) {
    }
    ck_assert_int_eq(r, CORRAL_POLL_DONE);
    ck_assert_int_eq(done.stop_reason, CORRAL_STOP_CANCELLED);
    corral_generation_destroy(&g);
    corral_client_destroy(&c);
    fake_stop(&fs);
    ck_assert_int_eq(fs.n_cancels, 2);
    fake_free_records(&fs);
}
END_TEST

/* Generate requests get nothing back but an occasional Progress; pings are answered. */
static void handle_silent_generate(fake_server *fs, const Corral__V1__Request *req) {
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE) return;
    Corral__V1__Progress progress = CORRAL__V1__PROGRESS__INIT;
    progress.prefilled_tokens = 3;
    progress.total_tokens = 10;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = req->id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_PROGRESS;
    resp.progress = &progress;
    fake_send(fs, &resp);
}

START_TEST(test_fake_pings_while_blocked_and_deadline_names_endpoint) {
    fake_server fs;
    fake_start(&fs, handle_silent_generate);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    corral_generate_params p = {.model = "m", .prompt = "x"};
    long long t0 = mono_ms();
    const int timeout = CORRAL_PING_INTERVAL_MS + 1500;
    ck_assert_int_eq(corral_generate(c, &p, NULL, NULL, NULL, timeout, &err),
                     CORRAL_DEADLINE_EXCEEDED);
    long long took = mono_ms() - t0;
    ck_assert_int_ge(took, timeout - 50);
    ck_assert_int_lt(took, timeout + 2000);
    ck_assert_msg(strstr(err.message, fs.endpoint) != NULL, "%s", err.message);

    /* Progress is visible on a handle; destroying a running generation cancels it. */
    corral_generation *g = corral_generate_start(c, &p, &err);
    corral_chunk chunk;
    ck_assert_int_eq(corral_generation_poll(g, 300, &chunk, NULL, &err), CORRAL_POLL_NOTHING);
    uint32_t prefilled = 0, total = 0;
    corral_generation_progress(g, &prefilled, &total);
    ck_assert_uint_eq(prefilled, 3);
    ck_assert_uint_eq(total, 10);
    uint64_t id = corral_generation_id(g);
    corral_generation_destroy(&g);
    ck_assert_int_eq(corral_client_ping(c, 5000, NULL, &err), CORRAL_OK);

    /* A generation whose client goes away fails with UNAVAILABLE and can still be destroyed. */
    g = corral_generate_start(c, &p, &err);
    corral_client_destroy(&c);
    ck_assert_int_eq(corral_generation_poll(g, 1000, &chunk, NULL, &err), CORRAL_UNAVAILABLE);
    corral_generation_destroy(&g);
    fake_stop(&fs);
    /* The first ping came from the library while corral_generate waited (the test's own pings
     * come after the timeout). */
    ck_assert_int_ge(fs.pings, 1);
    long long first_ping = fs.first_ping_ms - fs.first_request_ms;
    ck_assert_int_ge(first_ping, CORRAL_PING_INTERVAL_MS - 100);
    ck_assert_int_lt(first_ping, timeout);
    ck_assert(fake_saw_cancel_of(&fs, fs.generate_ids[0])); /* the timed-out one */
    ck_assert(fake_saw_cancel_of(&fs, id));
    fake_free_records(&fs);
}
END_TEST

/* A fake daemon that takes Generate requests and never answers them (pings it answers). */
static void handle_mute_generate(fake_server *fs, const Corral__V1__Request *req) {
    (void)fs;
    (void)req;
}

/* Issue 20, finding 4: a generation the daemon never took up ends with a message saying so, not
 * "did not end"; a Progress (with its phase, from a daemon from before phases: prefill) shows
 * through corral_generation_progress_info. */
START_TEST(test_fake_generation_that_never_started_says_so) {
    fake_server fs;
    fake_start(&fs, handle_mute_generate);
    corral_error err;
    corral_client *c = corral_client_new(fs.endpoint, &err);
    corral_generate_params p = {.model = "m", .prompt = "x"};
    ck_assert_int_eq(corral_generate(c, &p, NULL, NULL, NULL, 300, &err), CORRAL_DEADLINE_EXCEEDED);
    ck_assert_msg(strstr(err.message, "sent nothing for the generation within 300 ms: it did not "
                                      "start") != NULL,
                  "%s", err.message);
    corral_client_destroy(&c);
    fake_stop(&fs);
    fake_free_records(&fs);

    fake_start(&fs, handle_silent_generate);
    c = corral_client_new(fs.endpoint, &err);
    ck_assert_int_eq(corral_generate(c, &p, NULL, NULL, NULL, 300, &err), CORRAL_DEADLINE_EXCEEDED);
    ck_assert_msg(strstr(err.message, "did not end within 300 ms") != NULL, "%s", err.message);
    corral_generation *g = corral_generate_start(c, &p, &err);
    corral_chunk chunk;
    ck_assert_int_eq(corral_generation_poll(g, 300, &chunk, NULL, &err), CORRAL_POLL_NOTHING);
    corral_progress_info info;
    corral_generation_progress_info(g, &info);
    ck_assert_int_eq(info.phase, CORRAL_PHASE_PREFILL);
    ck_assert_uint_eq(info.done, 3);
    ck_assert_uint_eq(info.total, 10);
    ck_assert_str_eq(corral_progress_phase_name(info.phase), "prefill");
    corral_generation_destroy(&g);
    corral_client_destroy(&c);
    fake_stop(&fs);
    fake_free_records(&fs);
}
END_TEST

/* ---- no daemon --------------------------------------------------------------------------- */

/* Issue 20, finding 4: with no daemon, a call that may wait a minute (or forever) fails within
 * about a second (CORRAL_CONNECT_TIMEOUT_MS) with the CLI's message, not after its timeout. */
START_TEST(test_no_daemon_is_unavailable_at_once) {
    corral_error err;
    const char *endpoint = "ipc:///tmp/corral-it-nobody-here/corral.sock";
    corral_client *c = corral_client_new(endpoint, &err);
    ck_assert_ptr_nonnull(c);
    long long t0 = mono_ms();
    corral_generate_params p = {.model = "stories", .prompt = "x"};
    char *text = NULL;
    ck_assert_int_eq(corral_generate_text(c, &p, &text, NULL, NULL, 60000, &err),
                     CORRAL_UNAVAILABLE);
    ck_assert_msg(strstr(err.message, "no answer from corrald at "
                                      "ipc:///tmp/corral-it-nobody-here/corral.sock (is it "
                                      "running?") != NULL,
                  "%s", err.message);
    ck_assert_ptr_null(text);
    /* No timeout at all: the same. */
    ck_assert_int_eq(corral_load(c, "stories", -1, &err), CORRAL_UNAVAILABLE);
    ck_assert_int_lt(mono_ms() - t0, 20000); /* before: 60 s, then forever */
    corral_client_destroy(&c);
}
END_TEST

/* A tcp endpoint whose connections stay pending: a listener on 127.0.0.1 whose backlog is full
 * (the kernel then drops new connections' SYNs), as a daemon too busy to be reached at once looks.
 * fds[0] is the listener, the others fill its backlog; close them all afterwards. */
static void pending_endpoint(char *endpoint, size_t size, int fds[4]) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fds[0], 0);
    ck_assert_int_eq(bind(fds[0], (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fds[0], 0), 0);
    ck_assert_int_eq(getsockname(fds[0], (struct sockaddr *)&a, &len), 0);
    for (int i = 1; i < 4; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        ck_assert_int_ge(fds[i], 0);
        const int rc = connect(fds[i], (struct sockaddr *)&a, sizeof a);
        ck_assert(rc == 0 || errno == EINPROGRESS);
    }
    snprintf(endpoint, size, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
}

/* Fail fast only on evidence: an attempt refused (above). A connection still pending — a daemon
 * on a machine too busy to take it at once — waits out the call's own timeout instead of being
 * reported "is it running?" after CORRAL_CONNECT_TIMEOUT_MS. */
START_TEST(test_a_connection_not_made_yet_is_not_called_a_missing_daemon) {
    char endpoint[64];
    int fds[4];
    pending_endpoint(endpoint, sizeof endpoint, fds);
    corral_error err;
    corral_client *c = corral_client_new(endpoint, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_int_eq(corral_client_ping(c, 3000, NULL, &err), CORRAL_DEADLINE_EXCEEDED);
    corral_client_destroy(&c);
    for (int i = 0; i < 4; i++) close(fds[i]);
}
END_TEST

START_TEST(test_no_daemon_times_out_naming_endpoint) {
    corral_error err;
    ck_assert_ptr_null(corral_client_new("http://example.com", &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    const char *endpoint = "ipc:///tmp/corral-it-nobody-here/corral.sock";
    corral_client *c = corral_client_new(endpoint, &err);
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(corral_client_endpoint(c), endpoint);
    ck_assert_int_eq(corral_client_ping(c, 200, NULL, &err), CORRAL_DEADLINE_EXCEEDED);
    ck_assert_msg(strstr(err.message, endpoint) != NULL, "%s", err.message);
    corral_status_report *r = NULL;
    ck_assert_int_eq(corral_client_status(c, NULL, 200, &r, &err), CORRAL_DEADLINE_EXCEEDED);
    ck_assert_msg(strstr(err.message, endpoint) != NULL, "%s", err.message);
    corral_client_destroy(&c);
}
END_TEST

static const char *cli_path(void) {
    const char *p = getenv("CORRAL_CLI");
    return p && *p ? p : "corral";
}

START_TEST(test_cli_without_daemon) {
    char out[8192], errbuf[8192];
    const char *endpoint = "ipc:///tmp/corral-it-nobody-here/corral.sock";
    const char *ps[] = {cli_path(), "ps", "--endpoint", endpoint, NULL};
    ck_assert_int_eq(harness_run_program(ps, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000),
                     1);
    char want[512];
    snprintf(want, sizeof want,
             "corral ps: no answer from corrald at %s (is it running? start it with `make run` or "
             "corrald -c FILE)",
             endpoint);
    ck_assert_msg(strstr(errbuf, want) != NULL, "%s", errbuf);
    ck_assert_str_eq(out, "");

    /* --endpoint before the command name, and CORRAL_ENDPOINT. */
    const char *status[] = {cli_path(), "--endpoint", endpoint, "status", "--json", NULL};
    ck_assert_int_eq(
        harness_run_program(status, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000), 1);
    ck_assert_msg(strstr(errbuf, "corral status: no answer from corrald at ipc:///tmp/corral-it-"),
                  "%s", errbuf);
    setenv("CORRAL_ENDPOINT", "ipc:///tmp/corral-it-from-env/corral.sock", 1);
    const char *models[] = {cli_path(), "models", NULL};
    ck_assert_int_eq(
        harness_run_program(models, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000), 1);
    unsetenv("CORRAL_ENDPOINT");
    ck_assert_msg(strstr(errbuf, "ipc:///tmp/corral-it-from-env/corral.sock") != NULL, "%s",
                  errbuf);
    /* A tcp endpoint nobody listens on: the short ping times out with the same message. */
    const char *tcp[] = {cli_path(), "load", "stories", "--endpoint=tcp://127.0.0.1:9", NULL};
    ck_assert_int_eq(harness_run_program(tcp, NULL, out, sizeof out, errbuf, sizeof errbuf, 20000),
                     1);
    ck_assert_msg(strstr(errbuf, "no answer from corrald at tcp://127.0.0.1:9 (is it running?"),
                  "%s", errbuf);

    /* Usage errors exit 2; --help exits 0 and documents what run prints. */
    const char *bare[] = {cli_path(), "run", NULL};
    ck_assert_int_eq(harness_run_program(bare, "", out, sizeof out, errbuf, sizeof errbuf, 10000),
                     2);
    const char *bogus[] = {cli_path(), "ps", "--bogus", NULL};
    ck_assert_int_eq(
        harness_run_program(bogus, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000), 2);
    const char *badnum[] = {cli_path(), "run", "m", "p", "-n", "many", NULL};
    ck_assert_int_eq(
        harness_run_program(badnum, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000), 2);
    const char *help[] = {cli_path(), "run", "--help", NULL};
    ck_assert_int_eq(harness_run_program(help, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000),
                     0);
    ck_assert_msg(strstr(out, "only the generated text") != NULL, "%s", out);
    const char *top[] = {cli_path(), "--help", NULL};
    ck_assert_int_eq(harness_run_program(top, NULL, out, sizeof out, errbuf, sizeof errbuf, 10000),
                     0);
    const char *cmds[] = {"run ",  "chat ",   "ps ",  "models ", "status ",
                          "load ", "unload ", "pin ", "unpin "};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        ck_assert_msg(strstr(out, cmds[i]) != NULL, "corral --help lacks %s", cmds[i]);
}
END_TEST

/* ---- a real corrald ---------------------------------------------------------------------- */

/* The models section every daemon test uses, plus `extra` YAML. "synth" (a slower synthetic
 * model that does not stop early) gives cancellation tests time to act mid-stream. */
static void start_daemon(harness_daemon *d, const char *extra) {
    char stories[1024], q4[1024], synth[1024];
    shared_abs_path("models/stories260K.gguf", stories, sizeof stories);
    shared_abs_path("models/stories260K-q4_0.gguf", q4, sizeof q4);
    shared_abs_path("models/synth-llama-f32.gguf", synth, sizeof synth);
    static char yaml[8192];
    snprintf(yaml, sizeof yaml,
             "models:\n"
             "  - name: stories\n"
             "    path: %s\n"
             "    context: 512\n"
             "  - name: stories-q4\n"
             "    path: %s\n"
             "    context: 512\n"
             "  - name: synth\n"
             "    path: %s\n"
             "    context: 512\n"
             "%s",
             stories, q4, synth, extra ? extra : "");
    ck_assert_msg(harness_start(d, yaml, NULL, 15000) == 0, "corrald did not start with:\n%s",
                  yaml);
}

static corral_client *connect_daemon(const harness_daemon *d) {
    corral_error err;
    corral_client *c = corral_client_new(d->endpoint, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    return c;
}

static void assert_ok(corral_status st, const corral_error *err, const char *what) {
    ck_assert_msg(st == CORRAL_OK, "%s: %s: %s", what, corral_status_name(st), err->message);
}

START_TEST(test_daemon_greedy_blocking_equals_reference) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    size_t ref_len;
    char *ref = reference_greedy(&ref_len);
    int32_t ref_ids[512];
    size_t n_ref_ids =
        read_ids_file(test_shared_path("reference/stories260K.greedy.ids.txt"), ref_ids, 512);
    corral_error err;
    corral_done done;

    corral_generate_params p = greedy_params("stories");
    char *text = NULL;
    size_t len = 0;
    assert_ok(corral_generate_text(c, &p, &text, &len, &done, 60000, &err), &err, "generate_text");
    ck_assert_uint_eq(len, ref_len);
    ck_assert_msg(memcmp(text, ref, ref_len) == 0, "got:\n%s\nwant:\n%s", text, ref);
    free(text);
    ck_assert_uint_eq(done.prompt_tokens, 5);
    ck_assert_uint_eq(done.generated_tokens, n_ref_ids);
    ck_assert_int_eq(done.stop_reason,
                     n_ref_ids == GREEDY_MAX_TOKENS ? CORRAL_STOP_MAX_TOKENS : CORRAL_STOP_EOG);
    ck_assert_str_eq(done.model, "stories");
    ck_assert_uint_ge(done.timings.total_us, done.timings.decode_us);

    /* Not streamed, with a callback: exactly one chunk holding the whole text. */
    collector col;
    collector_init(&col);
    p.stream = CORRAL_STREAM_OFF;
    assert_ok(corral_generate(c, &p, collector_fn, &col, &done, 60000, &err), &err, "generate");
    ck_assert_uint_eq(col.calls, 1);
    ck_assert(col.index_ok);
    ck_assert_uint_eq(col.len, ref_len);
    ck_assert(memcmp(col.text, ref, ref_len) == 0);
    free(ref);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_greedy_streamed_equals_reference) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    size_t ref_len;
    char *ref = reference_greedy(&ref_len);
    int32_t ref_ids[512];
    size_t n_ref_ids =
        read_ids_file(test_shared_path("reference/stories260K.greedy.ids.txt"), ref_ids, 512);
    corral_error err;
    corral_done done;
    corral_generate_params p = greedy_params("stories");
    collector col;
    collector_init(&col);
    assert_ok(corral_generate(c, &p, collector_fn, &col, &done, 60000, &err), &err, "generate");
    ck_assert_msg(col.index_ok, "chunk indices do not count 0..n-1");
    ck_assert_uint_gt(col.calls, 1);
    ck_assert_uint_eq(col.len, ref_len);
    ck_assert_msg(memcmp(col.text, ref, ref_len) == 0, "got:\n%s\nwant:\n%s", col.text, ref);
    /* The chunks' token ids are the generated tokens, in order. */
    ck_assert_uint_eq(col.n_ids, n_ref_ids);
    for (size_t i = 0; i < n_ref_ids; i++) ck_assert_int_eq(col.ids[i], ref_ids[i]);
    ck_assert_uint_eq(done.generated_tokens, n_ref_ids);
    free(ref);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_two_generations_in_flight) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    size_t ref_len;
    char *ref = reference_greedy(&ref_len);
    corral_error err;
    corral_generate_params p = greedy_params("stories");

    /* Polled in turns. */
    corral_generation *g[2];
    collector col[2];
    int result[2] = {CORRAL_POLL_NOTHING, CORRAL_POLL_NOTHING};
    corral_done done[2];
    for (int i = 0; i < 2; i++) {
        g[i] = corral_generate_start(c, &p, &err);
        ck_assert_msg(g[i] != NULL, "%s", err.message);
        collector_init(&col[i]);
    }
    long long deadline = mono_ms() + 60000;
    while ((result[0] <= CORRAL_POLL_CHUNK || result[1] <= CORRAL_POLL_CHUNK) &&
           mono_ms() < deadline) {
        for (int i = 0; i < 2; i++) {
            if (result[i] > CORRAL_POLL_CHUNK || result[i] < 0) continue;
            corral_chunk chunk;
            result[i] = corral_generation_poll(g[i], 10, &chunk, &done[i], &err);
            if (result[i] == CORRAL_POLL_CHUNK) collector_add(&col[i], &chunk);
            ck_assert_msg(result[i] >= 0, "generation %d: %s", i, err.message);
        }
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(result[i], CORRAL_POLL_DONE);
        ck_assert(col[i].index_ok);
        ck_assert_uint_eq(col[i].len, ref_len);
        ck_assert_msg(memcmp(col[i].text, ref, ref_len) == 0, "generation %d:\n%s", i, col[i].text);
        corral_generation_destroy(&g[i]);
    }

    /* One drained completely before the other is looked at (its chunks queue meanwhile). */
    for (int i = 0; i < 2; i++) {
        g[i] = corral_generate_start(c, &p, &err);
        collector_init(&col[i]);
    }
    for (int i = 1; i >= 0; i--) {
        ck_assert_int_eq(drain(g[i], &col[i], &done[i], &err), CORRAL_POLL_DONE);
        ck_assert(col[i].index_ok);
        ck_assert_uint_eq(col[i].len, ref_len);
        ck_assert(memcmp(col[i].text, ref, ref_len) == 0);
        corral_generation_destroy(&g[i]);
    }
    free(ref);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_cancel_mid_stream) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    corral_error err;
    corral_generate_params p = {.model = "synth", .prompt = GREEDY_PROMPT};
    p.has_temperature = true;
    p.temperature = 0;
    p.has_max_tokens = true;
    p.max_tokens = 500;
    corral_generation *g = corral_generate_start(c, &p, &err);
    ck_assert_ptr_nonnull(g);
    corral_chunk chunk;
    corral_done done;
    int r = corral_generation_poll(g, 60000, &chunk, &done, &err);
    ck_assert_msg(r == CORRAL_POLL_CHUNK, "first poll: %d %s", r, err.message);
    long long t0 = mono_ms();
    assert_ok(corral_generation_cancel(g, &err), &err, "cancel");
    uint32_t after = 0;
    while ((r = corral_generation_poll(g, 10000, &chunk, &done, &err)) == CORRAL_POLL_CHUNK)
        after++;
    long long took = mono_ms() - t0;
    ck_assert_msg(r == CORRAL_POLL_DONE, "after cancel: %d %s", r, err.message);
    ck_assert_int_eq(done.stop_reason, CORRAL_STOP_CANCELLED);
    ck_assert_uint_lt(done.generated_tokens, 500);
    ck_assert_msg(took < 2000, "Done came %lld ms after Cancel", took);
    corral_generation_destroy(&g);

    /* From a callback: the blocking call returns OK with the cancelled Done. */
    collector col;
    collector_init(&col);
    col.cancel_at_call = 2;
    assert_ok(corral_generate(c, &p, collector_fn, &col, &done, 60000, &err), &err, "generate");
    ck_assert_int_eq(done.stop_reason, CORRAL_STOP_CANCELLED);
    ck_assert_uint_eq(col.calls, 2);

    /* The daemon serves the next request normally. */
    corral_generate_params q = greedy_params("stories");
    char *text = NULL;
    assert_ok(corral_generate_text(c, &q, &text, NULL, &done, 60000, &err), &err, "after");
    free(text);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

/* Generate with p and expect the error `want` whose message contains `fragment` (may be NULL). */
static void expect_generate_error(corral_client *c, const corral_generate_params *p,
                                  corral_status want, const char *fragment, const char *what) {
    corral_error err;
    corral_done done;
    corral_error_clear(&err);
    corral_status st = corral_generate(c, p, NULL, NULL, &done, 60000, &err);
    ck_assert_msg(st == want, "%s: got %s (%s), want %s", what, corral_status_name(st), err.message,
                  corral_status_name(want));
    ck_assert_msg(err.message[0] != '\0', "%s: empty error message", what);
    if (fragment)
        ck_assert_msg(strstr(err.message, fragment) != NULL, "%s: message '%s' lacks '%s'", what,
                      err.message, fragment);
}

START_TEST(test_daemon_generate_errors) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    corral_generate_params p = greedy_params("nosuch");
    expect_generate_error(c, &p, CORRAL_NOT_FOUND, "nosuch", "unknown model");

    p = greedy_params("stories");
    p.temperature = -1;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, NULL, "negative temperature");
    p = greedy_params("stories");
    p.has_top_p = true;
    p.top_p = 1.5f;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, NULL, "top_p > 1");
    p = greedy_params("stories");
    p.max_tokens = 0;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, NULL, "max_tokens 0");
    p = greedy_params("stories");
    p.max_tokens = 513;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, NULL, "max_tokens over the context");

    corral_message user = {"user", "Once upon a time"};
    p = greedy_params("stories");
    p.messages = &user;
    p.n_messages = 1;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, NULL, "both prompt and messages");
    p.prompt = NULL;
    p.messages = NULL;
    p.n_messages = 0;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, NULL, "neither prompt nor messages");
    corral_message wizard = {"wizard", "hello"};
    p.messages = &wizard;
    p.n_messages = 1;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, "wizard", "bad role");

    /* ~800 tokens of prompt for a 512-token context. */
    static char long_prompt[16384];
    long_prompt[0] = '\0';
    for (int i = 0; i < 200; i++) strcat(long_prompt, "Once upon a time ");
    p = greedy_params("stories");
    p.prompt = long_prompt;
    p.max_tokens = 16;
    expect_generate_error(c, &p, CORRAL_INVALID_ARGUMENT, "512", "prompt longer than context");

    /* The daemon still works after all that. */
    corral_error err;
    ck_assert_int_eq(corral_client_ping(c, 5000, NULL, &err), CORRAL_OK);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_deadline) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    /* A 1 ms deadline on a 400-token prompt and 100 tokens: either the daemon gives up with
     * DEADLINE_EXCEEDED, or it really finished within 1 ms (then Done's total says so). */
    static char prompt[8192];
    prompt[0] = '\0';
    for (int i = 0; i < 100; i++) strcat(prompt, "Once upon a time ");
    corral_generate_params p = greedy_params("synth");
    p.prompt = prompt;
    p.max_tokens = 100;
    p.deadline_ms = 1;
    collector col;
    collector_init(&col);
    corral_done done;
    corral_error err;
    corral_status st = corral_generate(c, &p, collector_fn, &col, &done, 60000, &err);
    if (st == CORRAL_OK)
        ck_assert_msg(
            done.timings.total_us <= 1000, "deadline 1 ms ignored: Done after %llu us, stop %s",
            (unsigned long long)done.timings.total_us, corral_stop_reason_name(done.stop_reason));
    else
        ck_assert_msg(st == CORRAL_DEADLINE_EXCEEDED, "got %s: %s", corral_status_name(st),
                      err.message);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_queue_full) {
    harness_daemon d;
    start_daemon(&d, "limits:\n  queue_per_model: 1\n");
    corral_client *c = connect_daemon(&d);
    corral_error err;
    /* The first request occupies synth's one place for about a second... */
    corral_generate_params p = greedy_params("synth");
    p.max_tokens = 500;
    corral_generation *first = corral_generate_start(c, &p, &err);
    ck_assert_ptr_nonnull(first);
    corral_chunk chunk;
    ck_assert_int_eq(corral_generation_poll(first, 60000, &chunk, NULL, &err), CORRAL_POLL_CHUNK);
    /* ...so the second is refused at once, naming the limit's cause. */
    p.max_tokens = 4;
    expect_generate_error(c, &p, CORRAL_RESOURCE_EXHAUSTED, NULL, "queue full");
    /* Another model has its own queue. */
    corral_generate_params q = greedy_params("stories");
    q.max_tokens = 4;
    corral_done done;
    assert_ok(corral_generate(c, &q, NULL, NULL, &done, 60000, &err), &err, "other model");
    corral_generation_destroy(&first);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_cancel_and_model_command_errors) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    corral_error err;
    ck_assert_int_eq(corral_load(c, "nosuch", 30000, &err), CORRAL_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "nosuch") != NULL, "%s", err.message);
    ck_assert_int_eq(corral_unload(c, "nosuch", 30000, &err), CORRAL_NOT_FOUND);
    ck_assert_int_eq(corral_pin(c, "nosuch", 30000, &err), CORRAL_NOT_FOUND);
    ck_assert_int_eq(corral_unpin(c, "nosuch", 30000, &err), CORRAL_NOT_FOUND);
    corral_tokens *t = NULL;
    ck_assert_int_eq(corral_tokenize(c, "nosuch", "x", true, 30000, &t, &err), CORRAL_NOT_FOUND);
    corral_client_destroy(&c);

    /* Cancel of a request that is not in flight: Error NOT_FOUND (the library never sends one,
     * so speak the protocol directly). */
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, timeout = 5000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    ck_assert_int_eq(zmq_connect(sock, d.endpoint), 0);
    Corral__V1__Cancel cancel = CORRAL__V1__CANCEL__INIT;
    cancel.request_id = 999;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.id = 7;
    req.protocol_version = 1;
    req.body_case = CORRAL__V1__REQUEST__BODY_CANCEL;
    req.cancel = &cancel;
    uint8_t buf[256];
    size_t len = corral__v1__request__pack(&req, buf);
    ck_assert_int_ge(zmq_send(sock, buf, len, 0), 0);
    int n = zmq_recv(sock, buf, sizeof buf, 0);
    ck_assert_int_gt(n, 0);
    Corral__V1__Response *resp = corral__v1__response__unpack(NULL, (size_t)n, buf);
    ck_assert_ptr_nonnull(resp);
    ck_assert_uint_eq(resp->id, 7);
    ck_assert_int_eq(resp->body_case, CORRAL__V1__RESPONSE__BODY_ERROR);
    ck_assert_int_eq(resp->error->code, CORRAL__V1__ERROR_CODE__NOT_FOUND);
    corral__v1__response__free_unpacked(resp, NULL);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_tokenize_equals_reference) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    int32_t want[64];
    size_t n_want =
        read_ids_file(test_shared_path("reference/stories260K.greedy.prompt_ids.txt"), want, 64);
    corral_error err;
    corral_tokens *t = NULL;
    assert_ok(corral_tokenize(c, "stories", GREEDY_PROMPT, true, 30000, &t, &err), &err,
              "tokenize");
    ck_assert_uint_eq(t->n, n_want);
    for (size_t i = 0; i < n_want; i++) ck_assert_int_eq(t->ids[i], want[i]);
    ck_assert_ptr_nonnull(t->pieces);
    for (size_t i = 0; i < t->n; i++) ck_assert_ptr_nonnull(t->pieces[i]);
    corral_tokens_destroy(&t);
    /* Without special tokens: the same ids less the BOS the reference starts with. */
    assert_ok(corral_tokenize(c, "stories", GREEDY_PROMPT, false, 30000, &t, &err), &err,
              "tokenize");
    ck_assert_int_eq(want[0], 1);
    ck_assert_uint_eq(t->n, n_want - 1);
    for (size_t i = 1; i < n_want; i++) ck_assert_int_eq(t->ids[i - 1], want[i]);
    corral_tokens_destroy(&t);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

static const corral_model_status *find_status(const corral_status_report *r, const char *name) {
    for (size_t i = 0; i < r->n_models; i++)
        if (strcmp(r->models[i].name, name) == 0) return &r->models[i];
    return NULL;
}

static const corral_model_info *find_info(const corral_model_list *l, const char *name) {
    for (size_t i = 0; i < l->n_models; i++)
        if (strcmp(l->models[i].name, name) == 0) return &l->models[i];
    return NULL;
}

START_TEST(test_daemon_models_status_load_pin_round_trip) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    corral_error err;

    corral_model_list *l = NULL;
    assert_ok(corral_list_models(c, 30000, &l, &err), &err, "list");
    ck_assert_uint_eq(l->n_models, 3);
    const corral_model_info *q4 = find_info(l, "stories-q4");
    ck_assert_ptr_nonnull(q4);
    ck_assert_uint_eq(q4->context, 512);
    ck_assert_msg(strstr(q4->path, "stories260K-q4_0.gguf") != NULL, "%s", q4->path);
    ck_assert_int_eq(q4->state, CORRAL_MODEL_UNLOADED); /* models load on first use */
    ck_assert(!q4->pinned);
    ck_assert_ptr_nonnull(find_info(l, "stories"));
    corral_model_list_destroy(&l);

    corral_status_report *r = NULL;
    assert_ok(corral_client_status(c, NULL, 30000, &r, &err), &err, "status");
    ck_assert_uint_eq(r->n_models, 3);
    ck_assert_str_eq(r->daemon.version, "0.1.0");
    ck_assert_int_eq(find_status(r, "stories-q4")->state, CORRAL_MODEL_UNLOADED);
    ck_assert_uint_eq(find_status(r, "stories-q4")->requests_served, 0);
    corral_status_report_destroy(&r);

    assert_ok(corral_load(c, "stories-q4", -1, &err), &err, "load");
    assert_ok(corral_client_status(c, "stories-q4", 30000, &r, &err), &err, "status one");
    ck_assert_uint_eq(r->n_models, 1);
    ck_assert_str_eq(r->models[0].name, "stories-q4");
    ck_assert_int_eq(r->models[0].state, CORRAL_MODEL_RESIDENT);
    ck_assert_uint_gt(r->models[0].bytes, 0);
    ck_assert_uint_ge(r->daemon.total_bytes, r->models[0].bytes);
    corral_status_report_destroy(&r);

    assert_ok(corral_pin(c, "stories-q4", 30000, &err), &err, "pin");
    assert_ok(corral_list_models(c, 30000, &l, &err), &err, "list");
    ck_assert(find_info(l, "stories-q4")->pinned);
    ck_assert_int_eq(find_info(l, "stories-q4")->state, CORRAL_MODEL_RESIDENT);
    corral_model_list_destroy(&l);
    assert_ok(corral_client_status(c, NULL, 30000, &r, &err), &err, "status");
    ck_assert(find_status(r, "stories-q4")->pinned);
    corral_status_report_destroy(&r);
    assert_ok(corral_unpin(c, "stories-q4", 30000, &err), &err, "unpin");
    assert_ok(corral_unload(c, "stories-q4", 30000, &err), &err, "unload");
    assert_ok(corral_client_status(c, NULL, 30000, &r, &err), &err, "status");
    ck_assert(!find_status(r, "stories-q4")->pinned);
    ck_assert_int_eq(find_status(r, "stories-q4")->state, CORRAL_MODEL_UNLOADED);
    corral_status_report_destroy(&r);

    /* A generation shows up in the model's counters. */
    corral_generate_params p = greedy_params("stories");
    p.max_tokens = 8;
    corral_done done;
    assert_ok(corral_generate(c, &p, NULL, NULL, &done, 60000, &err), &err, "generate");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t now_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
    assert_ok(corral_client_status(c, NULL, 30000, &r, &err), &err, "status");
    const corral_model_status *s = find_status(r, "stories");
    ck_assert_int_eq(s->state, CORRAL_MODEL_RESIDENT);
    ck_assert_uint_ge(s->requests_served, 1);
    ck_assert_uint_ge(r->daemon.requests_served, 1);
    ck_assert_msg(s->last_used_ms + 60000 > now_ms && s->last_used_ms <= now_ms + 1000,
                  "last_used_ms %llu, now %llu", (unsigned long long)s->last_used_ms,
                  (unsigned long long)now_ms);
    corral_status_report_destroy(&r);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_chat_and_session) {
    harness_daemon d;
    start_daemon(&d, NULL);
    corral_client *c = connect_daemon(&d);
    size_t ref_len;
    char *ref = reference_greedy(&ref_len);
    corral_error err;
    /* stories has no chat template ("none": the messages' text concatenated), so a chat of one
     * user message "Once upon a time" is the greedy reference prompt. */
    corral_generate_params p = greedy_params("stories");
    p.prompt = NULL;
    p.session = "story-1";
    corral_message turn1[] = {{"user", GREEDY_PROMPT}};
    collector col;
    collector_init(&col);
    corral_done done;
    assert_ok(corral_chat(c, &p, turn1, 1, collector_fn, &col, &done, 60000, &err), &err, "chat");
    ck_assert_uint_eq(col.len, ref_len);
    ck_assert_msg(memcmp(col.text, ref, ref_len) == 0, "got:\n%s", col.text);
    ck_assert_uint_eq(done.prompt_tokens, 5);

    /* The next turn starts with the same text: the session's cache saves part of the prefill. */
    corral_message turn2[] = {
        {"user", GREEDY_PROMPT}, {"assistant", col.text}, {"user", " The end."}};
    p.max_tokens = 8;
    assert_ok(corral_chat(c, &p, turn2, 3, NULL, NULL, &done, 60000, &err), &err, "chat 2");
    ck_assert_msg(done.prefilled_tokens < done.prompt_tokens,
                  "session reuse: %u of %u prompt tokens computed", done.prefilled_tokens,
                  done.prompt_tokens);
    free(ref);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_daemon_refuses_another_apps_session) {
    /* A session belongs to the app that made it: editor naming speaker's session id gets
     * PERMISSION_DENIED through the library, and speaker's session still saves its prefill. */
    harness_daemon d;
    start_daemon(&d, "apps:\n"
                     "  - name: speaker\n"
                     "    models: [stories]\n"
                     "    max_priority: realtime\n"
                     "  - name: editor\n"
                     "    models: [stories]\n");
    corral_client *a = connect_daemon(&d);
    corral_client *b = connect_daemon(&d);
    ck_assert_int_eq(corral_client_set_app(a, "speaker"), CORRAL_OK);
    ck_assert_int_eq(corral_client_set_app(b, "editor"), CORRAL_OK);
    corral_generate_params p = greedy_params("stories");
    p.max_tokens = 4;
    p.session = "shared-name";
    corral_error err;
    corral_done done;
    assert_ok(corral_generate(a, &p, NULL, NULL, &done, 60000, &err), &err, "speaker");
    const corral_status st = corral_generate(b, &p, NULL, NULL, &done, 60000, &err);
    ck_assert_msg(st == CORRAL_PERMISSION_DENIED, "editor got %s (%s)", corral_status_name(st),
                  err.message);
    ck_assert_msg(strstr(err.message, "session 'shared-name' belongs to another app"), "%s",
                  err.message);
    assert_ok(corral_generate(a, &p, NULL, NULL, &done, 60000, &err), &err, "speaker again");
    ck_assert_msg(done.prefilled_tokens < done.prompt_tokens, "speaker lost its session");
    corral_client_destroy(&a);
    corral_client_destroy(&b);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

/* ---- the CLI against a real corrald ------------------------------------------------------ */

static char cli_out[1 << 16], cli_err[1 << 14];

/* Run the CLI with --endpoint of d and the given arguments (NULL-terminated list). */
static int run_cli(const harness_daemon *d, const char *input, const char *const *args) {
    const char *argv[32];
    int n = 0;
    argv[n++] = cli_path();
    for (int i = 0; args[i] && n < 28; i++) argv[n++] = args[i];
    argv[n++] = "--endpoint";
    argv[n++] = d->endpoint;
    argv[n] = NULL;
    return harness_run_program(argv, input, cli_out, sizeof cli_out, cli_err, sizeof cli_err,
                               60000);
}

START_TEST(test_cli_run_ps_models_status) {
    harness_daemon d;
    start_daemon(&d, NULL);
    size_t ref_len;
    char *ref = reference_greedy(&ref_len);

    const char *run[] = {"run", "stories", GREEDY_PROMPT, "-n", "256", "--temp", "0", NULL};
    ck_assert_msg(run_cli(&d, NULL, run) == 0, "stderr: %s", cli_err);
    ck_assert_msg(strcmp(cli_out, ref) == 0, "corral run printed:\n%s", cli_out);
    const char *run2[] = {"run",    "stories", GREEDY_PROMPT, "-n",      "256",
                          "--temp", "0",       "--no-stream", "--stats", NULL};
    ck_assert_msg(run_cli(&d, NULL, run2) == 0, "stderr: %s", cli_err);
    ck_assert_str_eq(cli_out, ref);
    ck_assert_msg(strstr(cli_err, "generated") != NULL, "%s", cli_err);
    /* The prompt from stdin. */
    const char *run3[] = {"run", "stories", "-n", "256", "--temp", "0", NULL};
    ck_assert_msg(run_cli(&d, GREEDY_PROMPT, run3) == 0, "stderr: %s", cli_err);
    ck_assert_str_eq(cli_out, ref);

    const char *bad[] = {"run", "nosuch", "x", NULL};
    ck_assert_int_eq(run_cli(&d, NULL, bad), 1);
    ck_assert_msg(strncmp(cli_err, "corral run: NOT_FOUND: ", 23) == 0, "%s", cli_err);
    /* NOT_FOUND names the models there are, so that a typo shows what was meant. */
    ck_assert_msg(strstr(cli_err, "configured: stories, stories-q4, synth") != NULL, "%s", cli_err);
    /* getopt's messages carry the same prefix as the command's own. */
    const char *badopt[] = {"run", "stories", "x", "--no-such-option", NULL};
    ck_assert_int_eq(run_cli(&d, NULL, badopt), 2);
    ck_assert_msg(strncmp(cli_err, "corral run: unrecognized option", 31) == 0, "%s", cli_err);
    const char *badtemp[] = {"run", "stories", "x", "--temp", "-1", NULL};
    ck_assert_int_eq(run_cli(&d, NULL, badtemp), 1);
    ck_assert_msg(strncmp(cli_err, "corral run: INVALID_ARGUMENT: ", 30) == 0, "%s", cli_err);

    const char *load[] = {"load", "stories-q4", NULL};
    ck_assert_msg(run_cli(&d, NULL, load) == 0, "%s", cli_err);
    const char *pin[] = {"pin", "stories-q4", NULL};
    ck_assert_msg(run_cli(&d, NULL, pin) == 0, "%s", cli_err);
    const char *load_bad[] = {"load", "nosuch", NULL};
    ck_assert_int_eq(run_cli(&d, NULL, load_bad), 1);
    ck_assert_msg(strncmp(cli_err, "corral load: NOT_FOUND: ", 24) == 0, "%s", cli_err);

    const char *ps_json[] = {"ps", "--json", NULL};
    ck_assert_msg(run_cli(&d, NULL, ps_json) == 0, "%s", cli_err);
    ck_assert_msg(json_valid(cli_out), "not JSON: %s", cli_out);
    const char *keys[] = {
        "\"limit_bytes\":",  "\"total_bytes\":", "\"models\":[",  "\"name\":\"stories\"",
        "\"last_used_ms\":", "\"swap_ins\":",    "\"swap_outs\":"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_msg(strstr(cli_out, keys[i]) != NULL, "ps --json lacks %s: %s", keys[i], cli_out);
    ck_assert_msg(strstr(cli_out, "{\"name\":\"stories-q4\",\"state\":\"resident\"") != NULL, "%s",
                  cli_out);
    ck_assert_msg(strstr(cli_out, "\"pinned\":true") != NULL, "%s", cli_out);

    const char *ps[] = {"ps", NULL};
    ck_assert_msg(run_cli(&d, NULL, ps) == 0, "%s", cli_err);
    const char *cols[] = {"NAME",   "STATE",  "MEMORY",     "LAST-USED", "QUEUE", "ACTIVE",
                          "SERVED", "PINNED", "stories-q4", "resident",  "MiB"};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        ck_assert_msg(strstr(cli_out, cols[i]) != NULL, "ps lacks %s:\n%s", cols[i], cli_out);

    const char *models[] = {"models", NULL};
    ck_assert_msg(run_cli(&d, NULL, models) == 0, "%s", cli_err);
    ck_assert_msg(strstr(cli_out, "stories-q4") && strstr(cli_out, "stories260K.gguf"), "%s",
                  cli_out);
    const char *models_json[] = {"models", "--json", NULL};
    ck_assert_msg(run_cli(&d, NULL, models_json) == 0, "%s", cli_err);
    ck_assert_msg(json_valid(cli_out), "not JSON: %s", cli_out);
    ck_assert_msg(strstr(cli_out, "\"context\":512") != NULL, "%s", cli_out);

    const char *status_json[] = {"status", "--json", NULL};
    ck_assert_msg(run_cli(&d, NULL, status_json) == 0, "%s", cli_err);
    ck_assert_msg(json_valid(cli_out), "not JSON: %s", cli_out);
    ck_assert_msg(strstr(cli_out, "\"daemon\":{\"version\":\"0.1.0\"") != NULL, "%s", cli_out);
    const char *status[] = {"status", NULL};
    ck_assert_msg(run_cli(&d, NULL, status) == 0, "%s", cli_err);
    ck_assert_msg(strstr(cli_out, "corrald 0.1.0") != NULL, "%s", cli_out);

    const char *unpin[] = {"unpin", "stories-q4", NULL};
    ck_assert_msg(run_cli(&d, NULL, unpin) == 0, "%s", cli_err);
    const char *unload[] = {"unload", "stories-q4", NULL};
    ck_assert_msg(run_cli(&d, NULL, unload) == 0, "%s", cli_err);
    ck_assert_msg(run_cli(&d, NULL, ps_json) == 0, "%s", cli_err);
    ck_assert_msg(strstr(cli_out, "{\"name\":\"stories-q4\",\"state\":\"unloaded\"") != NULL, "%s",
                  cli_out);
    free(ref);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_cli_chat) {
    harness_daemon d;
    start_daemon(&d, NULL);
    size_t ref_len;
    char *ref = reference_greedy(&ref_len);
    const char *chat[] = {"chat", "stories", "-n", "256", "--temp", "0", NULL};
    ck_assert_msg(run_cli(&d, GREEDY_PROMPT "\n/exit\nnot sent\n", chat) == 0, "%s", cli_err);
    char want[1 << 14];
    snprintf(want, sizeof want, "%s\n", ref);
    ck_assert_msg(strcmp(cli_out, want) == 0, "corral chat printed:\n%s", cli_out);
    /* Two turns, then end of input. */
    const char *chat2[] = {"chat", "stories", "-n", "8", "--temp", "0", "--session", "s", NULL};
    ck_assert_msg(run_cli(&d, "Once upon a time\nThe end.\n", chat2) == 0, "%s", cli_err);
    int lines = 0;
    for (const char *p = cli_out; *p; p++) lines += *p == '\n';
    ck_assert_int_ge(lines, 2);
    free(ref);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

START_TEST(test_cli_run_ctrl_c_cancels) {
    harness_daemon d;
    start_daemon(&d, NULL);
    int out_fds[2];
    ck_assert_int_eq(pipe(out_fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(out_fds[1], STDOUT_FILENO);
        close(out_fds[0]);
        close(out_fds[1]);
        execl(cli_path(), cli_path(), "run", "synth", GREEDY_PROMPT, "-n", "500", "--temp", "0",
              "--endpoint", d.endpoint, (char *)NULL);
        _exit(127);
    }
    close(out_fds[1]);
    char buf[256];
    struct pollfd pfd = {.fd = out_fds[0], .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 30000), 1);
    ck_assert_int_gt(read(out_fds[0], buf, sizeof buf), 0); /* it is streaming */
    long long t0 = mono_ms();
    kill(pid, SIGINT);
    /* Keep reading so the stream is not held up by a full pipe. */
    while (read(out_fds[0], buf, sizeof buf) > 0) {
    }
    close(out_fds[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "corral run died of signal %d", WTERMSIG(status));
    ck_assert_int_eq(WEXITSTATUS(status), 130);
    ck_assert_int_lt(mono_ms() - t0, 5000);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}
END_TEST

static Suite *client_c_suite(void) {
    Suite *s = suite_create("client_c");
    TCase *fake = tcase_create("fake");
    tcase_set_timeout(fake, 120);
    tcase_add_test(fake, test_fake_errors_map_to_status_and_app_is_sent);
    tcase_add_test(fake, test_fake_results_are_copied_out);
    tcase_add_test(fake, test_fake_generate_request_fields);
    tcase_add_test(fake, test_fake_chunk_gap_is_protocol_error);
    tcase_add_test(fake, test_fake_two_generations_are_demultiplexed);
    tcase_add_test(fake, test_fake_queue_overflow_cancels_the_unread_generation);
    tcase_add_test(fake, test_fake_callback_cancels_and_waits_for_done);
    tcase_add_test(fake, test_fake_pings_while_blocked_and_deadline_names_endpoint);
    tcase_add_test(fake, test_fake_generation_that_never_started_says_so);
    suite_add_tcase(s, fake);

    TCase *offline = tcase_create("offline");
    tcase_set_timeout(offline, 120);
    tcase_add_test(offline, test_no_daemon_times_out_naming_endpoint);
    tcase_add_test(offline, test_no_daemon_is_unavailable_at_once);
    tcase_add_test(offline, test_a_connection_not_made_yet_is_not_called_a_missing_daemon);
    tcase_add_test(offline, test_cli_without_daemon);
    suite_add_tcase(s, offline);

    TCase *daemon = tcase_create("daemon");
    tcase_set_timeout(daemon, 300);
    tcase_add_test(daemon, test_daemon_greedy_blocking_equals_reference);
    tcase_add_test(daemon, test_daemon_greedy_streamed_equals_reference);
    tcase_add_test(daemon, test_daemon_two_generations_in_flight);
    tcase_add_test(daemon, test_daemon_cancel_mid_stream);
    tcase_add_test(daemon, test_daemon_generate_errors);
    tcase_add_test(daemon, test_daemon_deadline);
    tcase_add_test(daemon, test_daemon_queue_full);
    tcase_add_test(daemon, test_daemon_cancel_and_model_command_errors);
    tcase_add_test(daemon, test_daemon_tokenize_equals_reference);
    tcase_add_test(daemon, test_daemon_models_status_load_pin_round_trip);
    tcase_add_test(daemon, test_daemon_chat_and_session);
    tcase_add_test(daemon, test_daemon_refuses_another_apps_session);
    suite_add_tcase(s, daemon);

    TCase *cli = tcase_create("cli");
    tcase_set_timeout(cli, 300);
    tcase_add_test(cli, test_cli_run_ps_models_status);
    tcase_add_test(cli, test_cli_chat);
    tcase_add_test(cli, test_cli_run_ctrl_c_cancels);
    suite_add_tcase(s, cli);
    return s;
}

CORRAL_CHECK_MAIN(client_c_suite)
