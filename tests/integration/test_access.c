/*
 * test_access.c — black-box tests of who may use a real corrald, and what each app may do, over
 * real ZeroMQ through libcorral (issue 18: "Access-control tests"; SECURITY.md).
 *
 * No root is needed: the test's own uid is mapped to apps (an app listing corrald's own uid takes
 * it away from the owner), or to nothing (auth.owner: false). tcp clients use CURVE keys made
 * here. Every refusal is checked twice: the client gets PERMISSION_DENIED with a message naming
 * the rule, and corrald's log has a line saying so.
 *
 * Fairness between apps is checked in counts and orderings, never times: which request started
 * first, and whose requests were refused to make room.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "corral.h"
#include "daemon_harness.h"
#include "testutil.h"

/* ---- helpers ---------------------------------------------------------------------------------
 */

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A synthetic model big enough that one token takes about a millisecond or more (as in
 * test_scheduler.c), made once per run with `corral synth`: a long generation on it outlasts any
 * message exchange of the test by hundreds of steps. */
static char slow_model[128];

static void make_slow_model(void) {
    snprintf(slow_model, sizeof slow_model, "/tmp/corral-test-access-%d.gguf", (int)getpid());
    const char *cli = getenv("CORRAL_CLI");
    if (!cli || !*cli) {
        fprintf(stderr, "test_access: CORRAL_CLI is not set (run it through ctest)\n");
        exit(EXIT_FAILURE);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' synth --arch llama --n-embd 1024 --n-layer 4 --n-head 8 --n-head-kv 8 "
             "--n-ff 2816 --n-vocab 512 --n-ctx 512 --type q8_0 -o '%s' >/dev/null",
             cli, slow_model);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_access: '%s' failed\n", cmd);
        exit(EXIT_FAILURE);
    }
}

static harness_daemon d;

/* Start corrald with stories, stories-q4 and the slow model, and `apps` (YAML, with "$UID" for
 * this test's uid wherever it appears) followed by `raw` (YAML taken as it is: keys). */
static void start_with_raw(const char *apps, const char *raw) {
    char body[16384], apps_text[4096];
    const unsigned me = (unsigned)geteuid();
    size_t len = 0;
    for (const char *s = apps; *s && len < sizeof apps_text - 16; s++) {
        if (strncmp(s, "$UID", 4) == 0) {
            len += (size_t)snprintf(apps_text + len, sizeof apps_text - len, "%u", me);
            s += 3;
        } else {
            apps_text[len++] = *s;
        }
    }
    apps_text[len] = '\0';
    /* Clients of these tests wait without pinging for a while at times: generous timeouts, unless
     * the test sets limits of its own. */
    snprintf(body, sizeof body,
             "%s"
             "models:\n"
             "  - name: stories\n    path: %s\n    context: 512\n"
             "  - name: stories-q4\n    path: %s\n    context: 128\n"
             "  - name: synth\n    path: %s\n    context: 512\n"
             "%s%s",
             strstr(apps_text, "limits:") ? ""
                                          : "limits: {peer_timeout_ms: 60000, "
                                            "stall_timeout_ms: 60000}\n",
             test_shared_path("models/stories260K.gguf"),
             test_shared_path("models/stories260K-q4_0.gguf"), slow_model, apps_text,
             raw ? raw : "");
    ck_assert_int_eq(harness_start(&d, body, NULL, 20000), 0);
}

static void start_with(const char *apps) {
    start_with_raw(apps, NULL);
}

static void stop(void) {
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
}

/* The apps every test of the first daemon knows: this uid is "notes" by default, and may act as
 * the others that list it. */
static const char access_apps[] = "apps:\n"
                                  "  - name: notes\n"
                                  "    uids: [$UID]\n"
                                  "    models: [stories, synth]\n"
                                  "    max_priority: interactive\n"
                                  "    max_tokens: 8\n"
                                  "  - name: single\n"
                                  "    uids: [$UID]\n"
                                  "    max_concurrent: 1\n"
                                  "  - name: ratey\n"
                                  "    uids: [$UID]\n"
                                  "    requests_per_minute: 2\n"
                                  "  - name: ops\n"
                                  "    uids: [$UID]\n"
                                  "    admin: true\n"
                                  "  - name: others\n"
                                  "    uids: [4000000000]\n";

static void setup(void) {
    start_with(access_apps);
}

static corral_client *connect_as(const char *app) {
    corral_error err;
    corral_client *c = corral_client_new(d.endpoint, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_int_eq(corral_client_set_app(c, app), CORRAL_OK);
    return c;
}

static corral_generate_params params(const char *model, uint32_t max_tokens) {
    corral_generate_params p = {.model = model, .prompt = "Once upon a time"};
    p.has_temperature = true;
    p.temperature = 0;
    if (max_tokens) {
        p.has_max_tokens = true;
        p.max_tokens = max_tokens;
    }
    return p;
}

/* Expect st to be PERMISSION_DENIED with `words` in its message. */
static void expect_denied(corral_status st, const corral_error *err, const char *words) {
    ck_assert_msg(st == CORRAL_PERMISSION_DENIED, "got %s (%s), want PERMISSION_DENIED for '%s'",
                  corral_status_name(st), err->message, words);
    ck_assert_msg(strstr(err->message, words), "message '%s' lacks '%s'", err->message, words);
}

/* How many times text occurs in s. */
static int occurrences(const char *s, const char *text) {
    int n = 0;
    for (const char *p = strstr(s, text); p; p = strstr(p + 1, text)) n++;
    return n;
}

/* Wait up to timeout_ms for corrald's log to contain text at least `times` times (log lines of a
 * refusal written by another thread of corrald than the one that answered may land a moment
 * later). */
static void expect_log_times(const char *text, int times, int timeout_ms) {
    static char log[1 << 18];
    const long long until = now_ms() + timeout_ms;
    for (;;) {
        harness_read_log(&d, log, sizeof log);
        if (occurrences(log, text) >= times) return;
        ck_assert_msg(now_ms() < until, "the log has '%s' fewer than %d times:\n%s", text, times,
                      log);
        usleep(20000);
    }
}

static void expect_log(const char *text, int timeout_ms) {
    expect_log_times(text, 1, timeout_ms);
}

static corral_status generate(corral_client *c, const corral_generate_params *p, corral_done *done,
                              corral_error *err) {
    return corral_generate(c, p, NULL, NULL, done, 120000, err);
}

/* ---- who may use which models, and how -------------------------------------------------------
 */

START_TEST(test_an_app_is_held_to_its_models) {
    corral_client *c = connect_as(""); /* its default: notes */
    corral_error err;
    corral_done done;
    corral_generate_params p = params("stories", 4);
    ck_assert_msg(generate(c, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    p.model = "stories-q4";
    expect_denied(generate(c, &p, &done, &err), &err,
                  "app 'notes' may not use model 'stories-q4' (apps[].models)");
    expect_log("msg=\"permission denied\" app=notes rule=models model=stories-q4", 5000);
    /* It does not even see the model. */
    corral_model_list *list;
    ck_assert_int_eq(corral_list_models(c, 10000, &list, &err), CORRAL_OK);
    ck_assert_uint_eq(list->n_models, 2);
    for (size_t i = 0; i < list->n_models; i++)
        ck_assert_str_ne(list->models[i].name, "stories-q4");
    corral_model_list_destroy(&list);
    corral_status_report *report;
    expect_denied(corral_client_status(c, "stories-q4", 10000, &report, &err), &err,
                  "may not use model 'stories-q4'");
    corral_client_destroy(&c);
}
END_TEST

START_TEST(test_a_priority_above_the_ceiling_is_refused) {
    corral_client *c = connect_as("notes");
    corral_error err;
    corral_done done;
    corral_generate_params p = params("stories", 4);
    p.priority = CORRAL_PRIORITY_REALTIME;
    expect_denied(generate(c, &p, &done, &err), &err,
                  "app 'notes' may not ask for priority realtime: its ceiling is interactive "
                  "(apps[].max_priority)");
    expect_log("msg=\"permission denied\" app=notes rule=max_priority model=stories", 5000);
    p.priority = CORRAL_PRIORITY_INTERACTIVE;
    ck_assert_msg(generate(c, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&c);
}
END_TEST

START_TEST(test_max_tokens_per_request) {
    corral_client *c = connect_as("notes");
    corral_error err;
    corral_done done;
    corral_generate_params p = params("stories", 9);
    expect_denied(generate(c, &p, &done, &err), &err,
                  "app 'notes' may ask for at most 8 tokens, not 9 (apps[].max_tokens)");
    expect_log("msg=\"permission denied\" app=notes rule=max_tokens model=stories", 5000);
    /* A request naming no limit gets the app's: 8 tokens of greedy text, cut by the limit. */
    p = params("stories", 0);
    ck_assert_msg(generate(c, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_int_eq(done.stop_reason, CORRAL_STOP_MAX_TOKENS);
    ck_assert_uint_eq(done.generated_tokens, 8);
    corral_client_destroy(&c);
}
END_TEST

START_TEST(test_over_the_rate) {
    /* Two a minute, in a burst of two: the third within the minute is refused. */
    corral_client *c = connect_as("ratey");
    corral_error err;
    corral_done done;
    corral_generate_params p = params("stories", 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(generate(c, &p, &done, &err) == CORRAL_OK, "%d: %s", i, err.message);
    expect_denied(generate(c, &p, &done, &err), &err,
                  "app 'ratey' is over its rate of 2 requests per minute "
                  "(apps[].requests_per_minute)");
    expect_log("msg=\"permission denied\" app=ratey rule=requests_per_minute", 5000);
    /* Other apps of the same user are not held to ratey's rate. */
    corral_client *n = connect_as("notes");
    ck_assert_msg(generate(n, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&n);
    corral_client_destroy(&c);
}
END_TEST

START_TEST(test_over_its_concurrency) {
    /* "single" may have one Generate in flight: a long one on the slow model, then a second sent
     * right behind it on the same connection (so admitted after it, hundreds of steps before the
     * first can end). */
    corral_client *c = connect_as("single");
    corral_error err;
    corral_generate_params p = params("synth", 480);
    p.constraint = "(?:[ -~]{1000}){4}"; /* no end-of-generation can come early */
    p.has_temperature = true;
    p.temperature = 1.0f;
    corral_generation *first = corral_generate_start(c, &p, &err);
    ck_assert_ptr_nonnull(first);
    corral_generate_params q = params("stories", 2);
    corral_generation *second = corral_generate_start(c, &q, &err);
    ck_assert_ptr_nonnull(second);
    corral_done done;
    int r;
    while ((r = corral_generation_poll(second, 60000, NULL, &done, &err)) == CORRAL_POLL_CHUNK) {
    }
    expect_denied(r, &err,
                  "app 'single' has 1 requests in flight, its most "
                  "(apps[].max_concurrent)");
    expect_log("msg=\"permission denied\" app=single rule=max_concurrent model=stories", 5000);
    corral_generation_destroy(&second);
    /* The first is still going; once it ends, the app may send another. */
    corral_chunk chunk;
    ck_assert_int_eq(corral_generation_poll(first, 60000, &chunk, &done, &err), CORRAL_POLL_CHUNK);
    ck_assert_int_eq(corral_generation_cancel(first, &err), CORRAL_OK);
    while ((r = corral_generation_poll(first, 60000, &chunk, &done, &err)) == CORRAL_POLL_CHUNK) {
    }
    ck_assert_int_eq(r, CORRAL_POLL_DONE);
    corral_generation_destroy(&first);
    ck_assert_msg(generate(c, &q, &done, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&c);
}
END_TEST

START_TEST(test_admin_operations_need_admin) {
    corral_client *c = connect_as("notes");
    corral_error err;
    typedef corral_status (*admin_fn)(corral_client *, const char *, int, corral_error *);
    static const struct {
        admin_fn fn;
        const char *verb;
    } ops[] = {{corral_load, "load"},
               {corral_unload, "unload"},
               {corral_pin, "pin"},
               {corral_unpin, "unpin"}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        char words[128], line[160];
        snprintf(words, sizeof words,
                 "app 'notes' may not %s models: admin operations need "
                 "apps[].admin",
                 ops[i].verb);
        expect_denied(ops[i].fn(c, "stories", 10000, &err), &err, words);
        /* Each refusal is logged: one line more per operation. */
        snprintf(line, sizeof line, "msg=\"permission denied\" app=notes rule=admin model=stories");
        expect_log_times(line, (int)i + 1, 5000);
    }
    corral_client_destroy(&c);
    /* An admin app may. */
    c = connect_as("ops");
    ck_assert_msg(corral_load(c, "stories", 60000, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_msg(corral_pin(c, "stories", 10000, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_msg(corral_unpin(c, "stories", 10000, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&c);
}
END_TEST

START_TEST(test_request_app_only_selects_among_the_connections_apps) {
    /* "others" exists but does not list this uid; "ghost" does not exist: the same answer. */
    static const char *const names[] = {"others", "ghost"};
    for (size_t i = 0; i < 2; i++) {
        corral_client *c = connect_as(names[i]);
        corral_error err;
        corral_done done;
        corral_generate_params p = params("stories", 2);
        char words[160], line[160];
        snprintf(words, sizeof words, "Request.app '%s' is not an app this connection may act as",
                 names[i]);
        expect_denied(generate(c, &p, &done, &err), &err, words);
        ck_assert_msg(strstr(err.message, "may act as: notes, single, ratey, ops"), "%s",
                      err.message);
        snprintf(line, sizeof line, "msg=\"permission denied\" app=%s rule=Request.app", names[i]);
        expect_log(line, 5000);
        corral_client_destroy(&c);
    }
}
END_TEST

START_TEST(test_another_apps_session_is_refused) {
    /* A session belongs to the app that made it: another app naming its id is refused (and
     * learns nothing of its cache), and the first app's session is left as it was. */
    corral_client *a = connect_as("notes");
    corral_client *b = connect_as("ops");
    corral_error err;
    corral_done done;
    corral_generate_params p = params("stories", 4);
    p.session = "private";
    ck_assert_msg(generate(a, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_uint_eq(done.prefilled_tokens, done.prompt_tokens);
    expect_denied(generate(b, &p, &done, &err), &err, "session 'private' belongs to another app");
    ck_assert_msg(!strstr(err.message, "notes"), "the refusal names the owner: %s", err.message);
    expect_log("msg=\"permission denied\" app=ops rule=sessions model=stories", 5000);
    ck_assert_msg(generate(a, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_msg(done.prefilled_tokens < done.prompt_tokens, "notes' session lost its cache");
    /* Another id is ops' own. */
    p.session = "ops-own";
    ck_assert_msg(generate(b, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&a);
    corral_client_destroy(&b);
}
END_TEST

START_TEST(test_another_apps_session_is_refused_after_a_restart) {
    /* The session outlives its daemon (swapped out at shutdown, an image on disk): the next
     * corrald refuses another app naming it before any request of the owner has claimed it, and
     * the owner continues it from the image. */
    char swap_dir[128], raw[256];
    snprintf(swap_dir, sizeof swap_dir, "/tmp/corral-test-access-swap-%d", (int)getpid());
    snprintf(raw, sizeof raw, "memory: {swap_dir: \"%s\"}\n", swap_dir);
    stop();
    start_with_raw(access_apps, raw);
    corral_client *a = connect_as("notes");
    corral_error err;
    corral_done done;
    corral_generate_params p = params("stories", 4);
    p.session = "kept";
    ck_assert_msg(generate(a, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&a);
    stop();
    start_with_raw(access_apps, raw);
    corral_client *b = connect_as("ops");
    expect_denied(generate(b, &p, &done, &err), &err, "session 'kept' belongs to another app");
    expect_log("msg=\"permission denied\" app=ops rule=sessions model=stories", 5000);
    a = connect_as("notes");
    ck_assert_msg(generate(a, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    ck_assert_msg(done.prefilled_tokens < done.prompt_tokens,
                  "notes' session did not come back from its image (%u of %u computed)",
                  done.prefilled_tokens, done.prompt_tokens);
    corral_client_destroy(&a);
    corral_client_destroy(&b);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", swap_dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- who may connect ---------------------------------------------------------------------------
 */

START_TEST(test_a_uid_no_app_lists_is_refused) {
    /* This uid is corrald's own; with auth.owner false and no app listing it, it is nobody. */
    stop();
    start_with("auth: {owner: false}\napps:\n  - name: someone\n    uids: [4000000000]\n");
    corral_error err;
    corral_client *c = corral_client_new(d.endpoint, &err);
    ck_assert_ptr_nonnull(c);
    const long long t0 = now_ms();
    corral_status st = corral_client_ping(c, 60000, NULL, &err);
    expect_denied(st, &err, "refused this connection: no app lists this user");
    /* At once: the refused handshake, not a timeout (60 s). */
    ck_assert_int_lt(now_ms() - t0, 30000);
    corral_generate_params p = params("stories", 2);
    corral_done done;
    expect_denied(generate(c, &p, &done, &err), &err, "refused this connection");
    corral_client_destroy(&c);
    char line[256];
    snprintf(line, sizeof line, "msg=\"connection refused\" peer=\"uid %u gid %u pid %u\"",
             (unsigned)geteuid(), (unsigned)getegid(), (unsigned)getpid());
    expect_log(line, 5000);
    expect_log("auth.owner is false and no app lists", 5000);
}
END_TEST

/* A CURVE key pair in dir: NAME.key (mode 600) and NAME.pub; the public key into pub. */
static void write_keypair(const char *dir, const char *name, char pub[41]) {
    char secret[41], path[256];
    ck_assert_int_eq(zmq_curve_keypair(pub, secret), 0);
    const char *texts[2] = {secret, pub};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s.%s", dir, name, i ? "pub" : "key");
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, i ? 0644 : 0600);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, texts[i], 40), 40);
        close(fd);
    }
}

START_TEST(test_tcp_clients_need_a_key_an_app_lists) {
    stop();
    char keys[] = "/tmp/corral-it-keys-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(keys));
    char server_pub[41], known_pub[41], unknown_pub[41], known[128], unknown[128];
    write_keypair(keys, "server", server_pub);
    write_keypair(keys, "known", known_pub);
    write_keypair(keys, "unknown", unknown_pub);
    snprintf(known, sizeof known, "%s/known.key", keys);
    snprintf(unknown, sizeof unknown, "%s/unknown.key", keys);
    const int port = 20000 + (int)((getpid() * 7) % 20000);
    char endpoint[64], apps[1024];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    snprintf(apps, sizeof apps,
             "listen: [\"$IPC\", \"%s\"]\n"
             "auth: {server_key_file: %s/server.key}\n"
             "apps:\n  - name: remote\n    models: [stories]\n    curve_keys: ['%s']\n",
             endpoint, keys, known_pub);
    start_with_raw("", apps);

    /* No key at all: refused at once, told what is missing. */
    corral_error err;
    corral_client *c = corral_client_new(endpoint, &err);
    ck_assert_ptr_nonnull(c);
    long long t0 = now_ms();
    expect_denied(corral_client_ping(c, 60000, NULL, &err), &err, "tcp needs CURVE keys");
    ck_assert_int_lt(now_ms() - t0, 30000);
    corral_client_destroy(&c);
    expect_log("msg=\"connection refused\" endpoint=tcp://", 10000);

    /* A key no app lists. */
    corral_connect_options o = {
        .endpoint = endpoint, .server_key = server_pub, .client_key_file = unknown};
    c = corral_client_new_with(&o, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    t0 = now_ms();
    expect_denied(corral_client_ping(c, 60000, NULL, &err), &err,
                  "refused this client's CURVE key: no app lists its public key");
    ck_assert_int_lt(now_ms() - t0, 30000);
    corral_client_destroy(&c);
    char line[256];
    snprintf(line, sizeof line, "reason=\"CURVE key %s is not in any app's curve_keys\"",
             unknown_pub);
    expect_log(line, 5000);

    /* The key of "remote": served, as remote (held to remote's models). */
    o.client_key_file = known;
    c = corral_client_new_with(&o, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    corral_generate_params p = params("stories", 2);
    corral_done done;
    ck_assert_msg(generate(c, &p, &done, &err) == CORRAL_OK, "%s", err.message);
    p.model = "stories-q4";
    expect_denied(generate(c, &p, &done, &err), &err, "app 'remote' may not use model");
    corral_client_destroy(&c);

    /* The same environment variables as the CLI and Python use. */
    setenv("CORRAL_SERVER_KEY", server_pub, 1);
    setenv("CORRAL_CLIENT_KEY_FILE", known, 1);
    c = corral_client_new(endpoint, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_msg(corral_client_ping(c, 10000, NULL, &err) == CORRAL_OK, "%s", err.message);
    corral_client_destroy(&c);
    /* A secret key file others may read is refused by the client, by name. */
    ck_assert_int_eq(chmod(known, 0644), 0);
    ck_assert_ptr_null(corral_client_new(endpoint, &err));
    ck_assert_int_eq(err.status, CORRAL_PERMISSION_DENIED);
    ck_assert_msg(strstr(err.message, known) && strstr(err.message, "chmod 600"), "%s",
                  err.message);
    unsetenv("CORRAL_SERVER_KEY");
    unsetenv("CORRAL_CLIENT_KEY_FILE");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", keys);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---- fair shares between apps ---------------------------------------------------------------
 */

/* Requests of the slow model waiting or running, from its Status. */
static uint32_t in_flight(corral_client *c) {
    corral_status_report *r;
    corral_error err;
    ck_assert_int_eq(corral_client_status(c, "synth", 10000, &r, &err), CORRAL_OK);
    const uint32_t n = r->models[0].queue_depth + r->models[0].active;
    corral_status_report_destroy(&r);
    return n;
}

static void wait_in_flight(corral_client *c, uint32_t n) {
    const long long until = now_ms() + 120000;
    while (in_flight(c) != n) {
        ck_assert_msg(now_ms() < until, "never %u requests in flight on synth", n);
        usleep(5000);
    }
}

/* A long generation on the slow model (never ended early by end-of-generation). */
static corral_generation *start_long(corral_client *c) {
    corral_generate_params p = params("synth", 480);
    p.constraint = "(?:[ -~]{1000}){4}";
    p.temperature = 1.0f;
    corral_error err;
    corral_generation *g = corral_generate_start(c, &p, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    return g;
}

/* Poll g without waiting: its chunks are dropped; returns true once it ended (Done or Error). */
static bool drained_end(corral_generation *g, corral_status *final) {
    corral_chunk chunk;
    corral_done done;
    corral_error err;
    for (;;) {
        const int r = corral_generation_poll(g, 0, &chunk, &done, &err);
        if (r == CORRAL_POLL_CHUNK) continue;
        if (r == CORRAL_POLL_NOTHING) return false;
        *final = r == CORRAL_POLL_DONE ? CORRAL_OK : (corral_status)r;
        return true;
    }
}

START_TEST(test_one_app_cannot_fill_a_models_queue) {
    /* Four places on the model, one slot: alpha takes them all. beta's request still gets in —
     * alpha's newest waiting request is refused to make room — and alpha's fifth is refused. */
    stop();
    start_with("limits: {queue_per_model: 4, active_per_model: 1, peer_timeout_ms: 60000}\n"
               "apps:\n  - name: alpha\n  - name: beta\n");
    corral_client *alpha = connect_as("alpha"), *beta = connect_as("beta");
    corral_generation *a[4];
    for (int i = 0; i < 4; i++) a[i] = start_long(alpha);
    wait_in_flight(beta, 4);
    corral_generate_params p = params("synth", 2);
    corral_error err;
    corral_generation *b = corral_generate_start(beta, &p, &err);
    ck_assert_ptr_nonnull(b);
    /* alpha's newest is refused, naming the rule. */
    corral_status final = CORRAL_OK;
    const long long until = now_ms() + 120000;
    while (!drained_end(a[3], &final)) {
        ck_assert_msg(now_ms() < until, "alpha's newest request was not refused");
        corral_client_ping(beta, 1000, NULL, &err); /* keep beta alive while waiting */
        usleep(5000);
    }
    ck_assert_int_eq(final, CORRAL_RESOURCE_EXHAUSTED);
    corral_done done;
    ck_assert_int_eq(corral_generation_poll(a[3], 0, NULL, &done, &err), CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_msg(strstr(err.message, "app 'alpha' held 4 of its 4 places, more than its share "
                                      "of 2 (limits.queue_per_model)"),
                  "%s", err.message);
    expect_log("msg=\"queue share: a waiting request makes room for another app's\" model=synth "
               "app=alpha held=4 share=2",
               5000);
    /* beta's is in; alpha, over its share of a full queue, cannot add one. */
    corral_generation *a5 = start_long(alpha);
    int r;
    while ((r = corral_generation_poll(a5, 60000, NULL, &done, &err)) == CORRAL_POLL_CHUNK) {
    }
    ck_assert_int_eq(r, CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_msg(strstr(err.message, "limits.queue_per_model"), "%s", err.message);
    corral_generation_destroy(&a5);
    /* Cancel alpha's: beta's runs to its end. */
    for (int i = 0; i < 3; i++) corral_generation_cancel(a[i], &err);
    while ((r = corral_generation_poll(b, 120000, NULL, &done, &err)) == CORRAL_POLL_CHUNK) {
    }
    ck_assert_msg(r == CORRAL_POLL_DONE, "beta: %s", err.message);
    for (int i = 0; i < 4; i++) corral_generation_destroy(&a[i]);
    corral_generation_destroy(&b);
    corral_client_destroy(&alpha);
    corral_client_destroy(&beta);
}
END_TEST

START_TEST(test_a_freed_slot_goes_to_the_app_below_its_share) {
    /* Two slots; alpha runs two long streams and has a third waiting; then beta's short request
     * comes. When alpha's first stream is cancelled, the slot goes to beta (alpha already runs
     * its share, one of two), not to alpha's older waiting request: beta's request ends while
     * alpha's second stream, hundreds of tokens from its end, still runs. */
    stop();
    start_with("limits: {queue_per_model: 16, active_per_model: 2, peer_timeout_ms: 60000}\n"
               "apps:\n  - name: alpha\n  - name: beta\n");
    corral_client *a1c = connect_as("alpha"), *a2c = connect_as("alpha"),
                  *a3c = connect_as("alpha"), *beta = connect_as("beta");
    corral_generation *a1 = start_long(a1c), *a2 = start_long(a2c);
    corral_error err;
    corral_chunk chunk;
    corral_done done;
    ck_assert_int_eq(corral_generation_poll(a1, 120000, &chunk, &done, &err), CORRAL_POLL_CHUNK);
    ck_assert_int_eq(corral_generation_poll(a2, 120000, &chunk, &done, &err), CORRAL_POLL_CHUNK);
    corral_generation *a3 = start_long(a3c);
    wait_in_flight(beta, 3);
    corral_generate_params p = params("synth", 2);
    corral_generation *b = corral_generate_start(beta, &p, &err);
    ck_assert_ptr_nonnull(b);
    wait_in_flight(beta, 4);
    ck_assert_int_eq(corral_generation_cancel(a1, &err), CORRAL_OK);
    int r;
    while ((r = corral_generation_poll(b, 120000, &chunk, &done, &err)) == CORRAL_POLL_CHUNK) {
        corral_status ignored;
        drained_end(a2, &ignored);
        drained_end(a3, &ignored);
    }
    ck_assert_msg(r == CORRAL_POLL_DONE, "beta: %s", err.message);
    /* Everything alpha's second stream was sent before beta's Done is in its queue once a ping
     * on its connection is answered: it must not have ended. */
    ck_assert_int_eq(corral_client_ping(a2c, 10000, NULL, &err), CORRAL_OK);
    corral_status a2_final;
    ck_assert_msg(!drained_end(a2, &a2_final),
                  "alpha's second stream ended before beta's request: beta waited for it");
    for (corral_generation **g = (corral_generation *[]){a1, a2, a3, NULL}; *g; g++)
        corral_generation_cancel(*g, &err);
    corral_generation_destroy(&a1);
    corral_generation_destroy(&a2);
    corral_generation_destroy(&a3);
    corral_generation_destroy(&b);
    corral_client_destroy(&a1c);
    corral_client_destroy(&a2c);
    corral_client_destroy(&a3c);
    corral_client_destroy(&beta);
}
END_TEST

static Suite *access_suite(void) {
    Suite *s = suite_create("access");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, stop);
    tcase_set_timeout(core, 180);
    tcase_add_test(core, test_an_app_is_held_to_its_models);
    tcase_add_test(core, test_another_apps_session_is_refused);
    tcase_add_test(core, test_another_apps_session_is_refused_after_a_restart);
    tcase_add_test(core, test_tcp_clients_need_a_key_an_app_lists);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, setup, stop);
    tcase_set_timeout(limits, 300);
    tcase_add_test(limits, test_max_tokens_per_request);
    tcase_add_test(limits, test_over_the_rate);
    tcase_add_test(limits, test_over_its_concurrency);
    tcase_add_test(limits, test_one_app_cannot_fill_a_models_queue);
    tcase_add_test(limits, test_a_freed_slot_goes_to_the_app_below_its_share);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, stop);
    tcase_set_timeout(errors, 180);
    tcase_add_test(errors, test_a_priority_above_the_ceiling_is_refused);
    tcase_add_test(errors, test_admin_operations_need_admin);
    tcase_add_test(errors, test_request_app_only_selects_among_the_connections_apps);
    tcase_add_test(errors, test_a_uid_no_app_lists_is_refused);
    suite_add_tcase(s, errors);
    return s;
}

int main(void) {
    /* Check forks a child per test: make the model once, here, so every child reuses it. */
    make_slow_model();
    SRunner *sr = srunner_create(access_suite());
    srunner_run_all(sr, CK_ENV);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    unlink(slow_model);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
