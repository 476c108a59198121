/*
 * test_core.c — Check suite for corrald's protocol-neutral core (daemon/core.h), driven in
 * process as a front end would drive it: jobs built from core requests, events taken from a
 * sink. No ZeroMQ, no daemon: what is tested is the core's own behaviour — one load for a burst
 * of requests, a load cancelled when the last request waiting for it goes, a realtime request
 * answered while another model's merge runs on the loader, events and their order.
 *
 * The slow model (a variant whose merge takes long enough to act on while it runs) is written
 * once per run with corral's synthetic model and adapter writers into a private directory.
 */
#include <check.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "corral/synth.h"
#include "job.h"
#include "lora.h"
#include "sched_impl.h" /* the count of per-app counters, read atomically */
#include "testutil.h"

/* ---- a front end for tests ------------------------------------------------------------------- */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long events;
} waiter;

static waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void notify(void *ctx) {
    waiter *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->events++;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait up to ms for a notification (or return at once if one came since `seen`). */
static void wait_event(unsigned long *seen, int ms) {
    pthread_mutex_lock(&w.mu);
    if (w.events == *seen) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)ms * 1000000L;
        while (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w.cv, &w.mu, &until);
    }
    *seen = w.events;
    pthread_mutex_unlock(&w.mu);
}

typedef struct tjob {
    job *j;
    job_text spare;
    char text[8192];
    size_t len;
    size_t n_ids;
    job_final final;
} tjob;

static core_sink *sink;

static tjob *tjob_new(void) {
    tjob *t = calloc(1, sizeof *t);
    corral_error err;
    ck_assert_ptr_nonnull(t);
    t->j = job_new(sink, &err);
    ck_assert_ptr_nonnull(t->j);
    ck_assert_int_eq(job_text_init(&t->spare, &err), CORRAL_OK);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t->j->received_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    /* This front end's requests come from corrald's owner (auth.h). */
    snprintf(t->j->app, sizeof t->j->app, "%s", AUTH_OWNER_APP);
    t->j->owner = true;
    return t;
}

static void tjob_free(tjob *t) {
    job_text_free(&t->spare);
    job_free(&t->j);
    free(t);
}

/* Take what the core produced for t; true once its final event came. */
static bool tjob_poll(tjob *t) {
    job *ready[64];
    while (core_sink_take_ready(sink, ready, 64) == 64) {
    }
    job_taken got;
    job_take(t->j, true, &t->spare, &got);
    if (t->spare.len && t->len + t->spare.len < sizeof t->text) {
        memcpy(t->text + t->len, t->spare.text, t->spare.len);
        t->len += t->spare.len;
        t->text[t->len] = '\0';
    }
    t->n_ids += t->spare.n_ids;
    job_text_clear(&t->spare);
    t->final = got.final;
    return got.final != JOB_FINAL_NONE;
}

static void tjob_wait(tjob *t, int timeout_ms) {
    unsigned long seen = 0;
    const int64_t until = now_ms() + timeout_ms;
    while (!tjob_poll(t)) {
        ck_assert_msg(now_ms() < until, "no final event within %d ms", timeout_ms);
        wait_event(&seen, 20);
    }
}

static tjob *generate(core *k, const char *model, const char *prompt, uint32_t max_tokens,
                      int priority) {
    tjob *t = tjob_new();
    core_generate *g = &t->j->req.generate;
    t->j->req.kind = CORE_GENERATE;
    g->model = model;
    g->prompt = prompt;
    g->prompt_len = strlen(prompt);
    g->sampling.has_max_tokens = true;
    g->sampling.max_tokens = max_tokens;
    g->sampling.has_temperature = true;
    g->sampling.temperature = 0.0f;
    g->stream = true;
    g->priority = priority;
    g->session = g->constraint = g->sanitizer = g->template_name = "";
    core_submit(k, t->j);
    return t;
}

/* The Status of one model, taken through the core (as a front end asks). */
static core_model_info model_status(core *k, const char *model) {
    tjob *t = tjob_new();
    t->j->req.kind = CORE_STATUS;
    t->j->req.target.model = model;
    core_submit(k, t->j);
    tjob_wait(t, 30000);
    ck_assert_int_eq(t->final, JOB_FINAL_REPLY);
    ck_assert_uint_eq(t->j->reply->n_models, 1);
    core_model_info m = t->j->reply->models[0];
    /* Strings are not needed by the callers. */
    m.name = m.path = m.arch = m.chat_template = NULL;
    m.adapters = NULL;
    tjob_free(t);
    return m;
}

/* Poll Status until the model is in `state` (or the time runs out). */
static bool wait_state(core *k, const char *model, core_model_state state, int timeout_ms) {
    const int64_t until = now_ms() + timeout_ms;
    while (now_ms() < until) {
        if (model_status(k, model).state == state) return true;
        usleep(1000);
    }
    return false;
}

/* ---- the models ------------------------------------------------------------------------------ */

static char dir[64];
static char big_model[128], big_adapter[128];

/* A Q8_0 model of about 45 MB and a rank-32 adapter on every projection: its merge dequantizes,
 * changes and quantizes again 42 M weights on the loader's one thread, long enough to observe
 * and cancel while it runs. */
static void make_models(void) {
    snprintf(dir, sizeof dir, "/tmp/corral-test-core-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(big_model, sizeof big_model, "%s/big.gguf", dir);
    snprintf(big_adapter, sizeof big_adapter, "%s/big-lora.gguf", dir);
    synth_params p = synth_params_default();
    p.n_embd = 768;
    p.n_layer = 6;
    p.n_head = 12;
    p.n_head_kv = 4;
    p.n_ff = 2048;
    p.type = SYNTH_TYPE_Q8_0;
    corral_error err;
    ck_assert_msg(synth_write(&p, big_model, NULL, &err) == CORRAL_OK, "%s", err.message);
    const lora_synth_params lp = {.base_path = big_model,
                                  .rank = 32,
                                  .alpha = 32,
                                  .targets = LORA_SYNTH_ALL_LINEAR,
                                  .seed = 7,
                                  .a_std = 0.02f,
                                  .b_std = 0.02f,
                                  .type = 0 /* F32 */};
    ck_assert_msg(lora_synth_write(&lp, big_adapter, &err) == CORRAL_OK, "%s", err.message);
}

static core *start(const char *extra_models) {
    char stories[4096], stories_q4[4096];
    snprintf(stories, sizeof stories, "%s", test_shared_path("models/stories260K.gguf"));
    snprintf(stories_q4, sizeof stories_q4, "%s", test_shared_path("models/stories260K-q4_0.gguf"));
    char yaml[16384];
    snprintf(yaml, sizeof yaml,
             "memory: {swap_dir: %s/swap}\n"
             "cache: {dir: %s/cache}\n"
             "threads: 2\n"
             "models:\n"
             "  - name: stories\n    path: %s\n    context: 512\n    preload: true\n"
             "  - name: stories-q4\n    path: %s\n    context: 512\n"
             "  - name: big-lora\n    path: %s\n    context: 256\n"
             "    adapters: [{path: %s, scale: 1.0}]\n%s",
             dir, dir, stories, stories_q4, big_model, big_adapter,
             extra_models ? extra_models : "");
    corral_error err;
    cfg *c = cfg_load_string(yaml, strlen(yaml), "test.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    core *k = core_new(c, &err);
    ck_assert_msg(k != NULL, "%s", err.message);
    return k;
}

/* Once, in Check's parent process (the tests run in forked children). */
static void setup_models(void) {
    if (!dir[0]) make_models();
}

static void setup(void) {
    corral_error err;
    sink = core_sink_new(notify, &w, &err);
    ck_assert_ptr_nonnull(sink);
    /* Every test merges afresh. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/cache' '%s/swap'", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void teardown(void) {
    core_sink_destroy(&sink);
}

/* ---- tests ----------------------------------------------------------------------------------- */

START_TEST(test_a_burst_for_an_unloaded_model_loads_it_once) {
    core *k = start(NULL);
    ck_assert_int_eq(model_status(k, "stories-q4").state, CORE_MODEL_UNLOADED);
    enum { N = 16 };
    tjob *t[N];
    for (int i = 0; i < N; i++) t[i] = generate(k, "stories-q4", "Once upon a time", 8, 0);
    for (int i = 0; i < N; i++) {
        tjob_wait(t[i], 60000);
        ck_assert_msg(t[i]->final == JOB_FINAL_DONE, "request %d: %s", i, t[i]->j->error_message);
        ck_assert_uint_eq(t[i]->j->done.generated_tokens, 8);
        /* Every request of the burst got the same greedy text. */
        ck_assert_str_eq(t[i]->text, t[0]->text);
    }
    const core_model_info m = model_status(k, "stories-q4");
    ck_assert_int_eq(m.state, CORE_MODEL_RESIDENT);
    ck_assert_uint_eq(m.loads, 1);
    ck_assert_uint_eq(m.requests_served, N);
    for (int i = 0; i < N; i++) tjob_free(t[i]);
    core_destroy(&k);
}
END_TEST

START_TEST(test_a_realtime_request_is_answered_while_a_merge_runs) {
    core *k = start(NULL);
    tjob *slow = generate(k, "big-lora", "Once upon a time", 4, 0);
    ck_assert_msg(wait_state(k, "big-lora", CORE_MODEL_LOADING, 30000), "the merge never started");
    tjob *rt = generate(k, "stories", "Once upon a time", 8, CFG_PRIORITY_REALTIME);
    tjob_wait(rt, 60000);
    ck_assert_msg(rt->final == JOB_FINAL_DONE, "%s", rt->j->error_message);
    ck_assert_uint_eq(rt->j->done.generated_tokens, 8);
    /* The ordering, not a time: the merge of the other model is still running. */
    ck_assert_int_eq(model_status(k, "big-lora").state, CORE_MODEL_LOADING);
    ck_assert_int_eq(slow->final, JOB_FINAL_NONE);
    tjob_wait(slow, 300000);
    ck_assert_msg(slow->final == JOB_FINAL_DONE, "%s", slow->j->error_message);
    const core_model_info m = model_status(k, "big-lora");
    ck_assert_int_eq(m.state, CORE_MODEL_RESIDENT);
    ck_assert_uint_eq(m.merges, 1);
    tjob_free(rt);
    tjob_free(slow);
    core_destroy(&k);
}
END_TEST

START_TEST(test_cancelling_the_last_request_cancels_its_load) {
    core *k = start(NULL);
    tjob *t = generate(k, "big-lora", "Once upon a time", 4, 0);
    ck_assert_msg(wait_state(k, "big-lora", CORE_MODEL_LOADING, 30000), "the merge never started");
    atomic_store(&t->j->cancel, JOB_CANCEL_CLIENT);
    core_poke(k);
    tjob_wait(t, 60000);
    ck_assert_int_eq(t->final, JOB_FINAL_ERROR);
    ck_assert_int_eq(t->j->error_code, CORRAL_CANCELLED);
    /* The merge stops at its next tensor; nothing stays loaded and no image is left. */
    ck_assert(wait_state(k, "big-lora", CORE_MODEL_UNLOADED, 120000));
    const core_model_info m = model_status(k, "big-lora");
    ck_assert_uint_eq(m.loads, 1);
    ck_assert_uint_eq(m.merges, 0);
    ck_assert_uint_eq(m.bytes, 0);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls '%s'/cache/lora-*.gguf >/dev/null 2>&1", dir);
    ck_assert_msg(system(cmd) != 0, "a merged image was left in the cache");
    tjob_free(t);
    /* Another request loads it from scratch. */
    t = generate(k, "big-lora", "Once upon a time", 2, 0);
    tjob_wait(t, 300000);
    ck_assert_msg(t->final == JOB_FINAL_DONE, "%s", t->j->error_message);
    ck_assert_uint_eq(model_status(k, "big-lora").loads, 2);
    tjob_free(t);
    core_destroy(&k);
}
END_TEST

START_TEST(test_a_load_still_wanted_by_another_request_goes_on) {
    core *k = start(NULL);
    tjob *a = generate(k, "big-lora", "Once upon a time", 2, 0);
    tjob *b = generate(k, "big-lora", "Once upon a time", 2, 0);
    ck_assert(wait_state(k, "big-lora", CORE_MODEL_LOADING, 30000));
    atomic_store(&a->j->cancel, JOB_CANCEL_CLIENT);
    core_poke(k);
    tjob_wait(a, 60000);
    ck_assert_int_eq(a->j->error_code, CORRAL_CANCELLED);
    tjob_wait(b, 300000);
    ck_assert_msg(b->final == JOB_FINAL_DONE, "%s", b->j->error_message);
    const core_model_info m = model_status(k, "big-lora");
    ck_assert_uint_eq(m.loads, 1);
    ck_assert_uint_eq(m.merges, 1);
    tjob_free(a);
    tjob_free(b);
    core_destroy(&k);
}
END_TEST

/* What one job heard, for test_every_waiting_request_hears_the_load_phase_by_phase. */
typedef struct heard {
    tjob *t;
    job_progress seen[256];
    size_t n;
    bool text_before_progress;
} heard;

/* Take h's events; true once its final event came. */
static bool heard_poll(heard *h) {
    job *ready[64];
    while (core_sink_take_ready(sink, ready, 64) == 64) {
    }
    job_taken got;
    job_take(h->t->j, true, &h->t->spare, &got);
    for (uint32_t i = 0; i < got.n_progress && h->n < 256; i++) h->seen[h->n++] = got.progress[i];
    if (h->t->spare.len && h->n == 0) h->text_before_progress = true;
    job_text_clear(&h->t->spare);
    h->t->final = got.final;
    return got.final != JOB_FINAL_NONE;
}

/* The phases of a load, as h heard them: loading first, then each phase in order, never back,
 * merging and rearranging to their last tensor. */
static void check_load_phases(const heard *h, const char *who) {
    ck_assert_msg(h->n > 2, "%s heard %zu reports", who, h->n);
    ck_assert_int_eq(h->seen[0].phase, JOB_PHASE_LOADING);
    ck_assert_uint_eq(h->seen[0].total, 0);
    bool merged = false, repacked = false;
    for (size_t i = 1; i < h->n; i++) {
        const job_progress *p = &h->seen[i], *q = &h->seen[i - 1];
        ck_assert_int_ge(p->phase, q->phase); /* in order, never back */
        if (p->phase == q->phase) ck_assert_uint_ge(p->done, q->done);
        ck_assert_uint_le(p->done, p->total);
        const bool last_of_phase = i + 1 == h->n || h->seen[i + 1].phase != p->phase;
        if (p->phase == JOB_PHASE_MERGING && last_of_phase)
            merged = p->total > 0 && p->done == p->total;
        if (p->phase == JOB_PHASE_REPACKING && last_of_phase)
            repacked = p->total > 0 && p->done == p->total;
    }
    ck_assert_msg(merged, "%s: the merge's end was not reported", who);
    ck_assert_msg(repacked, "%s: the rearranging's end was not reported", who);
}

/* Issue 20, finding 2: every request waiting for a variant — two generations and a Load that
 * asked for progress — hears its one load phase by phase, in order: loading, the merge of its
 * adapters to the last tensor, the rearranging of the merged weights, however fast each went,
 * and a generation hears it before its first token. */
START_TEST(test_every_waiting_request_hears_the_load_phase_by_phase) {
    core *k = start(NULL);
    enum { N = 3 };
    static heard h[N];
    memset(h, 0, sizeof h);
    h[0].t = generate(k, "big-lora", "Once upon a time", 2, 0);
    h[1].t = generate(k, "big-lora", "Once upon a time", 2, 0);
    h[2].t = tjob_new();
    h[2].t->j->req.kind = CORE_LOAD;
    h[2].t->j->req.target.model = "big-lora";
    h[2].t->j->req.target.progress = true;
    core_submit(k, h[2].t->j);
    unsigned long events = 0;
    const int64_t until = now_ms() + 300000;
    bool done[N] = {false};
    for (int left = N; left > 0;) {
        for (int i = 0; i < N; i++)
            if (!done[i] && heard_poll(&h[i])) done[i] = true, left--;
        ck_assert_msg(now_ms() < until, "no final event");
        if (left) wait_event(&events, 20);
    }
    ck_assert_msg(h[0].t->final == JOB_FINAL_DONE, "%s", h[0].t->j->error_message);
    ck_assert_msg(h[1].t->final == JOB_FINAL_DONE, "%s", h[1].t->j->error_message);
    ck_assert_msg(h[2].t->final == JOB_FINAL_REPLY, "%s", h[2].t->j->error_message);
    ck_assert_uint_eq(model_status(k, "big-lora").loads, 1); /* one load, heard by all */
    const char *const who[N] = {"the first generation", "the second generation", "the Load"};
    for (int i = 0; i < N; i++) {
        ck_assert_msg(!h[i].text_before_progress, "%s: text came before progress", who[i]);
        check_load_phases(&h[i], who[i]);
        tjob_free(h[i].t);
    }
    core_destroy(&k);
}
END_TEST

/* Issue 20, finding 7: a pin loads the model and keeps it; an unload refuses a pinned model,
 * naming the pin, unless forced, which unpins it. */
START_TEST(test_pin_loads_and_unload_respects_it) {
    core *k = start(NULL);
    ck_assert_int_eq(model_status(k, "stories-q4").state, CORE_MODEL_UNLOADED);
    tjob *t = tjob_new();
    t->j->req.kind = CORE_PIN;
    t->j->req.target.model = "stories-q4";
    core_submit(k, t->j);
    tjob_wait(t, 60000);
    ck_assert_int_eq(t->final, JOB_FINAL_REPLY);
    ck_assert_str_eq(t->j->reply->message, "model 'stories-q4' is resident and pinned");
    tjob_free(t);
    core_model_info m = model_status(k, "stories-q4");
    ck_assert_int_eq(m.state, CORE_MODEL_RESIDENT);
    ck_assert(m.pinned);
    for (int force = 0; force <= 1; force++) {
        t = tjob_new();
        t->j->req.kind = CORE_UNLOAD;
        t->j->req.target.model = "stories-q4";
        t->j->req.target.force = force;
        core_submit(k, t->j);
        tjob_wait(t, 60000);
        if (!force) {
            ck_assert_int_eq(t->final, JOB_FINAL_ERROR);
            ck_assert_int_eq(t->j->error_code, CORRAL_FAILED_PRECONDITION);
            ck_assert_msg(strstr(t->j->error_message, "model 'stories-q4' is pinned: unpin it "
                                                      "first (corral unpin stories-q4), or "
                                                      "unload it with --force"),
                          "%s", t->j->error_message);
            ck_assert_int_eq(model_status(k, "stories-q4").state, CORE_MODEL_RESIDENT);
        } else {
            ck_assert_int_eq(t->final, JOB_FINAL_REPLY);
            ck_assert_str_eq(t->j->reply->message, "model 'stories-q4' unpinned and unloaded");
        }
        tjob_free(t);
    }
    m = model_status(k, "stories-q4");
    ck_assert_int_eq(m.state, CORE_MODEL_UNLOADED);
    ck_assert(!m.pinned);
    core_destroy(&k);
}
END_TEST

/* A job keeps one progress report per phase until its front end takes them: a slow reader still
 * sees every phase, in order, with each phase's latest figures. */
START_TEST(test_a_job_keeps_the_latest_report_of_each_phase) {
    corral_error err;
    job *j = job_new(sink, &err);
    ck_assert_ptr_nonnull(j);
    job_emit_progress(j, JOB_PHASE_LOADING, 0, 0);
    job_emit_progress(j, JOB_PHASE_MERGING, 1, 10);
    job_emit_progress(j, JOB_PHASE_MERGING, 10, 10);
    job_emit_progress(j, JOB_PHASE_REPACKING, 3, 3);
    job_text spare;
    ck_assert_int_eq(job_text_init(&spare, &err), CORRAL_OK);
    job_taken got;
    job_take(j, true, &spare, &got);
    ck_assert_uint_eq(got.n_progress, 3);
    ck_assert_int_eq(got.progress[0].phase, JOB_PHASE_LOADING);
    ck_assert_int_eq(got.progress[1].phase, JOB_PHASE_MERGING);
    ck_assert_uint_eq(got.progress[1].done, 10);
    ck_assert_int_eq(got.progress[2].phase, JOB_PHASE_REPACKING);
    job_take(j, true, &spare, &got);
    ck_assert_uint_eq(got.n_progress, 0); /* each once */
    /* More changes of phase than it holds: the last slot takes the newest. */
    for (int i = 0; i < 6; i++) job_emit_progress(j, (job_phase)(1 + i % 4), (uint64_t)i, 9);
    job_take(j, true, &spare, &got);
    ck_assert_uint_eq(got.n_progress, JOB_PROGRESS_MAX);
    ck_assert_uint_eq(got.progress[JOB_PROGRESS_MAX - 1].done, 5);
    job_text_free(&spare);
    job_free(&j);
}
END_TEST

START_TEST(test_requests_the_core_refuses) {
    core *k = start(NULL);
    tjob *t = generate(k, "nope", "Once upon a time", 4, 0);
    tjob_wait(t, 10000);
    ck_assert_int_eq(t->final, JOB_FINAL_ERROR);
    ck_assert_int_eq(t->j->error_code, CORRAL_NOT_FOUND);
    ck_assert_msg(strstr(t->j->error_message, "'nope'"), "%s", t->j->error_message);
    tjob_free(t);
    /* Neither prompt nor messages. */
    t = generate(k, "stories", "", 4, 0);
    tjob_wait(t, 10000);
    ck_assert_int_eq(t->j->error_code, CORRAL_INVALID_ARGUMENT);
    tjob_free(t);
    /* A name with bytes that are not UTF-8 comes back escaped. */
    t = generate(k, "\xff\xfe", "Once upon a time", 4, 0);
    tjob_wait(t, 10000);
    ck_assert_msg(strstr(t->j->error_message, "'\\xff\\xfe'"), "%s", t->j->error_message);
    tjob_free(t);
    core_destroy(&k);
}
END_TEST

START_TEST(test_app_counters_are_dropped_when_idle) {
    /* Each app's counter (requests in flight, rate bucket) goes once the app is idle: app names
     * that come and go leave nothing behind (issue 18, row 11: 79 bytes each, never freed). A
     * rate-limited app's counter stays until its bucket is full again: "slow" (one a minute)
     * keeps its own, "bursty" (a hundred thousand a second) is full again at once. */
    core *k = start("apps:\n"
                    "  - name: slow\n    requests_per_minute: 1\n"
                    "  - name: bursty\n    requests_per_minute: 6000000\n"
                    "limits: {queue_per_model: 1000, queue_per_app: 1000}\n");
    enum { N = 300 };
    tjob *t[N];
    for (int i = 0; i < N; i++) {
        t[i] = tjob_new();
        core_generate *g = &t[i]->j->req.generate;
        t[i]->j->req.kind = CORE_GENERATE;
        g->model = "stories";
        g->prompt = "Once upon a time";
        g->prompt_len = strlen(g->prompt);
        g->sampling.has_max_tokens = true;
        g->sampling.max_tokens = 1;
        g->session = g->constraint = g->sanitizer = g->template_name = "";
        /* The owner may label its requests with any app name. */
        if (i == 0)
            snprintf(t[i]->j->app, sizeof t[i]->j->app, "slow");
        else if (i <= 20)
            snprintf(t[i]->j->app, sizeof t[i]->j->app, "bursty");
        else
            snprintf(t[i]->j->app, sizeof t[i]->j->app, "app-%d", i);
        core_submit(k, t[i]->j);
    }
    for (int i = 0; i < N; i++) {
        tjob_wait(t[i], 60000);
        ck_assert_msg(t[i]->final == JOB_FINAL_DONE, "%d: %s", i, t[i]->j->error_message);
    }
    const int64_t until = now_ms() + 30000;
    while (atomic_load(&((struct core *)k)->n_apps) != 1 && now_ms() < until) usleep(1000);
    ck_assert_uint_eq(atomic_load(&((struct core *)k)->n_apps), 1);
    for (int i = 0; i < N; i++) tjob_free(t[i]);
    core_destroy(&k);
}
END_TEST

START_TEST(test_the_default_app_is_not_the_owner) {
    /* A front end's unauthenticated clients run as the default app "": every model up to
     * interactive, no admin operation. Only a job marked as the owner's has more. */
    core *k = start(NULL);
    tjob *t = tjob_new();
    t->j->app[0] = '\0';
    t->j->owner = false;
    t->j->req.kind = CORE_PIN;
    t->j->req.target.model = "stories";
    core_submit(k, t->j);
    tjob_wait(t, 10000);
    ck_assert_int_eq(t->j->error_code, CORRAL_PERMISSION_DENIED);
    ck_assert_msg(strstr(t->j->error_message, "may not pin models") &&
                      strstr(t->j->error_message, "apps[].admin"),
                  "%s", t->j->error_message);
    tjob_free(t);
    for (int owner = 0; owner < 2; owner++) {
        t = tjob_new();
        core_generate *g = &t->j->req.generate;
        t->j->req.kind = CORE_GENERATE;
        if (!owner) {
            t->j->app[0] = '\0';
            t->j->owner = false;
        }
        g->model = "stories";
        g->prompt = "Once upon a time";
        g->prompt_len = strlen(g->prompt);
        g->sampling.has_max_tokens = true;
        g->sampling.max_tokens = 2;
        g->priority = CFG_PRIORITY_REALTIME;
        g->session = g->constraint = g->sanitizer = g->template_name = "";
        core_submit(k, t->j);
        tjob_wait(t, 30000);
        if (owner) {
            ck_assert_msg(t->final == JOB_FINAL_DONE, "%s", t->j->error_message);
        } else {
            ck_assert_int_eq(t->j->error_code, CORRAL_PERMISSION_DENIED);
            ck_assert_msg(strstr(t->j->error_message, "app '(default)' may not ask for priority "
                                                      "realtime: its ceiling is interactive"),
                          "%s", t->j->error_message);
        }
        tjob_free(t);
    }
    core_destroy(&k);
    /* auth.default_app gives the default app an entry's rules: here, admin operations. */
    k = start("auth: {default_app: local}\napps:\n  - name: local\n    admin: true\n");
    t = tjob_new();
    t->j->app[0] = '\0';
    t->j->owner = false;
    t->j->req.kind = CORE_PIN;
    t->j->req.target.model = "stories";
    core_submit(k, t->j);
    tjob_wait(t, 10000);
    ck_assert_msg(t->final == JOB_FINAL_REPLY, "%s", t->j->error_message);
    tjob_free(t);
    core_destroy(&k);
}
END_TEST

static Suite *core_suite(void) {
    Suite *s = suite_create("core");
    TCase *core = tcase_create("core");
    tcase_add_unchecked_fixture(core, setup_models, NULL);
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_set_timeout(core, 600);
    tcase_add_test(core, test_a_burst_for_an_unloaded_model_loads_it_once);
    tcase_add_test(core, test_a_realtime_request_is_answered_while_a_merge_runs);
    tcase_add_test(core, test_every_waiting_request_hears_the_load_phase_by_phase);
    tcase_add_test(core, test_pin_loads_and_unload_respects_it);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_unchecked_fixture(limits, setup_models, NULL);
    tcase_add_checked_fixture(limits, setup, teardown);
    tcase_set_timeout(limits, 600);
    tcase_add_test(limits, test_cancelling_the_last_request_cancels_its_load);
    tcase_add_test(limits, test_a_load_still_wanted_by_another_request_goes_on);
    tcase_add_test(limits, test_app_counters_are_dropped_when_idle);
    tcase_add_test(limits, test_a_job_keeps_the_latest_report_of_each_phase);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_unchecked_fixture(errors, setup_models, NULL);
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_requests_the_core_refuses);
    tcase_add_test(errors, test_the_default_app_is_not_the_owner);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(core_suite)
