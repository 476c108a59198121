/*
 * test_config.c — Check suite for corrald's configuration: defaults, a file found and loaded, a
 * file not found, and every kind of bad content reported as file:line:column.
 */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "testutil.h"

static char tmp_dir[] = "/tmp/corral-test-config-XXXXXX";

static void setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void teardown(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-config-XXXXXX");
}

static const char *write_file(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
    return path;
}

/* Load text and expect failure with a message containing `want`. */
static void expect_error(const char *text, const char *want) {
    corral_error err;
    cfg *c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c == NULL, "accepted: %s", text);
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, want) != NULL, "message '%s' lacks '%s'", err.message, want);
}

START_TEST(test_defaults) {
    corral_error err;
    cfg *c = cfg_new_defaults(&err);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(c->n_listen, 0);
    ck_assert_int_eq(c->log_level, LOG_LEVEL_INFO);
    ck_assert_uint_eq(c->max_message_bytes, 1u << 20);
    ck_assert_ptr_null(c->source_path);
    cfg_destroy(&c);
    ck_assert_ptr_null(c);
    cfg_destroy(&c); /* NULL-safe */
}
END_TEST

START_TEST(test_file_found_and_loaded) {
    const char *path = write_file("corral.yaml", "# comment\n"
                                                 "listen: [\"ipc:///tmp/a/corral.sock\", "
                                                 "\"tcp://127.0.0.1:7000\"]\n"
                                                 "log_level: debug\n"
                                                 "limits:\n"
                                                 "  max_message_bytes: 2MiB\n");
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_str_eq(c->source_path, path);
    ck_assert_uint_eq(c->n_listen, 2);
    ck_assert_str_eq(c->listen[1], "tcp://127.0.0.1:7000");
    ck_assert_int_eq(c->log_level, LOG_LEVEL_DEBUG);
    ck_assert_uint_eq(c->max_message_bytes, 2u << 20);
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_file_not_found) {
    char path[512];
    snprintf(path, sizeof path, "%s/missing.yaml", tmp_dir);
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, path));
}
END_TEST

START_TEST(test_special_files_are_refused_without_blocking) {
    /* A FIFO nobody writes to: opening it for reading would block forever; it is refused by
     * kind instead. A directory too. */
    char dir[] = "/tmp/corral-test-cfg-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/fifo.yaml", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    corral_error err;
    ck_assert_ptr_null(cfg_load_file(fifo, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "not a regular file"), "%s", err.message);
    ck_assert_ptr_null(cfg_load_file(dir, &err));
    ck_assert_msg(strstr(err.message, "not a regular file"), "%s", err.message);
    unlink(fifo);
    rmdir(dir);
}
END_TEST

START_TEST(test_default_file_search) {
    char buf[1024];
    setenv("CORRAL_CONFIG", "/x/y.yaml", 1);
    ck_assert_int_eq(cfg_find_default_file(buf, sizeof buf), 1);
    ck_assert_str_eq(buf, "/x/y.yaml");
    unsetenv("CORRAL_CONFIG");

    setenv("XDG_CONFIG_HOME", tmp_dir, 1);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/corral", tmp_dir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    const char *path = write_file("corral/corral.yaml", "log_level: warn\n");
    ck_assert_int_eq(cfg_find_default_file(buf, sizeof buf), 1);
    ck_assert_str_eq(buf, path);
    unsetenv("XDG_CONFIG_HOME");
}
END_TEST

START_TEST(test_empty_and_comment_only_files) {
    corral_error err;
    cfg *c = cfg_load_string("", 0, "empty.yaml", &err);
    ck_assert_ptr_nonnull(c);
    cfg_destroy(&c);
    c = cfg_load_string("# nothing\n", 10, "c.yaml", &err);
    ck_assert_ptr_nonnull(c);
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_byte_size_bounds) {
    corral_error err;
    const char *ok = "limits: {max_message_bytes: 1KiB}\n";
    cfg *c = cfg_load_string(ok, strlen(ok), "t.yaml", &err);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(c->max_message_bytes, 1024);
    cfg_destroy(&c);
    expect_error("limits: {max_message_bytes: 1023}\n", "out of range");
    expect_error("limits: {max_message_bytes: 257MiB}\n", "out of range");
    expect_error("limits: {max_message_bytes: 99999999999999999999999}\n", "byte size");
    expect_error("limits: {max_message_bytes: 16777216TiB}\n", "byte size");
}
END_TEST

/* Nesting is bounded before libyaml composes the document: its scanner's cost grows with the
 * square of the depth (a 32768-deep flow sequence took 9 s), so a deep file is refused at the
 * first collection past the limit, by line:column. 64 levels are still read. */
START_TEST(test_nesting_bounded) {
    enum { DEEP = 32768 };
    char *text = malloc(2 * DEEP + 8);
    ck_assert_ptr_nonnull(text);
    memcpy(text, "x: ", 3);
    memset(text + 3, '[', DEEP);
    memset(text + 3 + DEEP, ']', DEEP);
    strcpy(text + 3 + 2 * DEEP, "\n");
    /* the top mapping is level 1: the 64th '[' (column 67) is level 65 */
    expect_error(text, "t.yaml:1:67: nesting deeper than 64 levels");
    /* 63 sequences in the top mapping: at the limit, so the key is what is wrong */
    memset(text + 3 + 63, ']', 63);
    strcpy(text + 3 + 126, "\n");
    expect_error(text, "t.yaml:1:1: unknown key 'x'");
    free(text);
    /* block style counts the same way */
    char block[64 * 70 + 16] = "";
    size_t len = 0;
    for (int d = 0; d < 65; d++) len += (size_t)sprintf(block + len, "%*sk%d:\n", d, "", d);
    expect_error(block, "t.yaml:65:65: nesting deeper than 64 levels");
}
END_TEST

/* Aliases are refused by position: the walk reads an aliased node once per reference, so a few
 * hundred aliases of a list of a few hundred adapters became 90000 entries (and 1000 of 1000 took
 * minutes and hundreds of MB). */
START_TEST(test_aliases_refused) {
    enum { N = 300 };
    char *text = malloc((size_t)N * 80 + 256);
    ck_assert_ptr_nonnull(text);
    size_t len = (size_t)sprintf(text, "models:\n  - name: m0\n    path: /etc/hostname\n"
                                       "    adapters: &ads\n");
    for (int i = 0; i < N; i++) len += (size_t)sprintf(text + len, "      - {path: a%d}\n", i);
    for (int i = 1; i < N; i++)
        len += (size_t)sprintf(text + len, "  - {name: m%d, path: /etc/hostname, adapters: *ads}\n",
                               i);
    expect_error(text, "t.yaml:305:47: YAML aliases (*ads) are not supported");
    free(text);
    expect_error("memory: &m {policy: lru}\ncache: *m\n", "t.yaml:2:8: YAML aliases (*m)");
}
END_TEST

START_TEST(test_unknown_key_has_position) {
    expect_error("log_level: info\nlimits:\n  max_mesage_bytes: 10\n",
                 "t.yaml:3:3: unknown key 'limits.max_mesage_bytes'");
    expect_error("colour: blue\n", "t.yaml:1:1: unknown key 'colour'");
}
END_TEST

START_TEST(test_wrong_types) {
    expect_error("limits: 5\n", "t.yaml:1:9: limits: expected a mapping");
    expect_error("limits: {max_message_bytes: \"1MiB\"}\n", "expected a plain value, got a quoted");
    expect_error("limits: {max_message_bytes: [1]}\n", "got a list");
    expect_error("limits: {max_message_bytes: -5}\n", "expected a byte size");
    expect_error("log_level: loud\n", "t.yaml:1:12: log_level: expected one of");
    expect_error("listen: {a: b}\n", "expected an endpoint or a list");
    expect_error("listen: [\"tcp://8.8.8.8:80\"]\n", "loopback");
    expect_error("- a\n- b\n", "top level must be a mapping");
}
END_TEST

/* Without memory.swap_dir and cache.dir a daemon keeps its state in its user's own folders; a
 * file (a system-wide daemon's) names others. */
START_TEST(test_per_user_dirs) {
    setenv("XDG_STATE_HOME", "/srv/ann/state", 1);
    setenv("XDG_CACHE_HOME", "/srv/ann/cache", 1);
    corral_error err;
    cfg *c = cfg_new_defaults(&err);
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->swap_dir, "/srv/ann/state/corral/swap");
    ck_assert_str_eq(c->cache_dir, "/srv/ann/cache/corral");
    cfg_destroy(&c);
    unsetenv("XDG_STATE_HOME");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/ann", 1);
    const char *text = "log_level: warn\n";
    c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_str_eq(c->swap_dir, "/home/ann/.local/state/corral/swap");
    ck_assert_str_eq(c->cache_dir, "/home/ann/.cache/corral");
    cfg_destroy(&c);
    text = "memory: {swap_dir: /var/lib/corral/swap}\ncache: {dir: /var/cache/corral}\n";
    c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_str_eq(c->swap_dir, "/var/lib/corral/swap");
    ck_assert_str_eq(c->cache_dir, "/var/cache/corral");
    cfg_destroy(&c);
}
END_TEST

/* Paths relative to the file's folder are shown as plain paths: <dir>/models/m.gguf, not
 * <dir>/config/../models/m.gguf. */
START_TEST(test_relative_paths_without_detours) {
    char sub[512], text[512];
    snprintf(sub, sizeof sub, "%s/config", tmp_dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    snprintf(sub, sizeof sub, "%s/models", tmp_dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    write_file("models/m.gguf", "not checked here");
    snprintf(text, sizeof text,
             "memory: {swap_dir: ../state/./swap}\n"
             "models:\n"
             "  - name: m\n"
             "    path: ../models//m.gguf\n");
    const char *path = write_file("config/corral.yaml", text);
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    char want[512];
    snprintf(want, sizeof want, "%s/models/m.gguf", tmp_dir);
    ck_assert_str_eq(cfg_find_model(c, "m")->path, want);
    snprintf(want, sizeof want, "%s/state/swap", tmp_dir);
    ck_assert_str_eq(c->swap_dir, want);
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_syntax_and_duplicates) {
    expect_error("log_level: [info\n", "YAML syntax error");
    expect_error("log_level: info\nlog_level: debug\n",
                 "t.yaml:2:1: duplicate key 'log_level' (first at line 1)");
}
END_TEST

START_TEST(test_models_and_apps) {
    char text[2048];
    snprintf(text, sizeof text,
             "threads: 2\n"
             "memory: {limit: 2GiB, high_watermark: 0.9, low_watermark: 0.5, swap_dir: swap}\n"
             "models:\n"
             "  - name: a\n"
             "    path: %s/m.gguf\n"
             "    context: 256\n"
             "    kv_type: f32\n"
             "    priority: background\n"
             "    pin: true\n"
             "    defaults: {temperature: 0.25, top_k: 5, max_tokens: 64}\n"
             "  - name: b\n"
             "    path: m.gguf\n"
             "apps:\n"
             "  - name: speaker\n"
             "    models: [a]\n"
             "    max_priority: realtime\n"
             "  - name: all\n",
             tmp_dir);
    write_file("m.gguf", "not checked here");
    const char *path = write_file("corral.yaml", text);
    corral_error err;
    cfg *c = cfg_load_file(path, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_int_eq(c->threads, 2);
    ck_assert_uint_eq(c->memory_limit, 2ull << 30);
    ck_assert_uint_eq(c->n_models, 2);
    const cfg_model *a = cfg_find_model(c, "a");
    ck_assert_int_eq(a->context, 256);
    ck_assert(a->kv_f32 && a->pin && !a->preload);
    ck_assert_int_eq(a->priority, CFG_PRIORITY_BACKGROUND);
    ck_assert(a->defaults.has_temperature && a->defaults.has_top_k && a->defaults.has_max_tokens);
    ck_assert(!a->defaults.has_top_p && !a->defaults.has_min_p);
    ck_assert(a->defaults.temperature == 0.25f);
    ck_assert_int_eq(a->defaults.max_tokens, 64);
    /* Relative paths resolve against the config file's folder. */
    char want[512];
    snprintf(want, sizeof want, "%s/m.gguf", tmp_dir);
    ck_assert_str_eq(cfg_find_model(c, "b")->path, want);
    snprintf(want, sizeof want, "%s/swap", tmp_dir);
    ck_assert_str_eq(c->swap_dir, want);
    ck_assert_int_eq(cfg_find_model(c, "b")->priority, CFG_PRIORITY_INTERACTIVE);
    const cfg_app *sp = cfg_find_app(c, "speaker");
    ck_assert_int_eq(sp->max_priority, CFG_PRIORITY_REALTIME);
    ck_assert(cfg_app_allows_model(sp, "a") && !cfg_app_allows_model(sp, "b"));
    ck_assert(cfg_app_allows_model(cfg_find_app(c, "all"), "b"));
    ck_assert(cfg_app_allows_model(NULL, "b")); /* the default app */
    ck_assert_ptr_null(cfg_find_app(c, "nobody"));
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_memory_share_of_ram) {
    corral_error err;
    const char *text = "memory: {limit: 25%}\n";
    cfg *c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_ptr_nonnull(c);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    ck_assert_uint_eq(c->memory_limit, (uint64_t)((double)pages * page * 0.25));
    cfg_destroy(&c);
    expect_error("memory: {limit: 150%}\n", "share of RAM");
    expect_error("memory: {low_watermark: 0.9, high_watermark: 0.8}\n", "must be below");
}
END_TEST

START_TEST(test_model_entry_errors) {
    expect_error("models:\n  - name: x\n    path: /nonexistent/m.gguf\n",
                 "t.yaml:3:11: model 'x': file /nonexistent/m.gguf"); /* at its path */
    expect_error("models:\n  - path: /etc/hostname\n", "t.yaml:2:5: models: entry 1 lacks the "
                                                       "required key 'name'");
    expect_error("models:\n  - name: x\n    path: /etc/hostname\n    colour: red\n",
                 "t.yaml:4:5: unknown key 'colour'");
    expect_error(
        "models:\n  - name: x\n    path: /etc/hostname\n  - name: x\n    path: /etc/hostname\n",
        "'x' is listed twice");
    expect_error("models:\n  - name: x\n    path: /etc/hostname\n    context: lots\n",
                 "t.yaml:4:14: context: expected an integer, got 'lots'");
    expect_error("models:\n  - name: x\n    path: /etc/hostname\n    defaults: {top_p: 2}\n",
                 "defaults.top_p: 2 is out of range");
    expect_error("models:\n  - name: x\n    path: /etc/hostname\n    kv_type: q8\n",
                 "expected f16 or f32");
    expect_error("models: {name: x}\n", "models: expected a list of mappings");
    expect_error("apps:\n  - name: s\n    models: [ghost]\n", "app 's' names model 'ghost'");
    expect_error("apps:\n  - name: s\n    max_priority: urgent\n", "one of background");
}
END_TEST

START_TEST(test_http_section) {
    corral_error err;
    cfg *c = cfg_new_defaults(&err);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(c->n_http_listen, 0); /* off unless configured */
    ck_assert_uint_eq(c->http_max_body_bytes, 1u << 20);
    ck_assert_int_eq(c->http_request_timeout_ms, 10000);
    ck_assert_int_eq(c->http_idle_timeout_ms, 60000);
    cfg_destroy(&c);
    const char *text = "http:\n  listen: [\"127.0.0.1:11435\", \"[::1]:11435\", \"0.0.0.0:80\"]\n"
                       "  keys:\n    - {key_file: /k/speaker.key, app: speaker}\n"
                       "    - {key_file: k2, app: other}\n"
                       "  cors: [\"http://localhost:3000\"]\n  max_body_bytes: 64KiB\n";
    c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_uint_eq(c->n_http_listen, 3);
    ck_assert_str_eq(c->http_listen[1], "[::1]:11435");
    ck_assert_uint_eq(c->n_http_keys, 2);
    ck_assert_str_eq(c->http_keys[0].key_file, "/k/speaker.key");
    ck_assert_str_eq(c->http_keys[0].app, "speaker");
    ck_assert_ptr_nonnull(strstr(c->http_keys[1].key_file, "/k2")); /* resolved to a path */
    ck_assert_uint_eq(c->n_http_cors, 1);
    ck_assert_uint_eq(c->http_max_body_bytes, 64u << 10);
    cfg_destroy(&c);
}
END_TEST

/* A CURVE public key as `corral keygen` writes one. */
#define TEST_KEY "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"

START_TEST(test_auth_keys) {
    const char *text = "auth: {owner: false, server_key_file: keys/corral.key, default_app: "
                       "plain.app_2-x}\n"
                       "apps:\n"
                       "  - name: speaker\n"
                       "    uids: [1001, 1002]\n"
                       "    gids: 100\n"
                       "    curve_keys: ['" TEST_KEY "']\n"
                       "    admin: true\n"
                       "    max_concurrent: 4\n"
                       "    requests_per_minute: 120\n"
                       "    max_tokens: 512\n"
                       "  - name: plain.app_2-x\n";
    corral_error err;
    cfg *c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert(!c->auth_owner);
    ck_assert_str_eq(c->default_app, "plain.app_2-x");
    /* Relative to the config's folder (here the current directory). */
    ck_assert_ptr_nonnull(strstr(c->server_key_file, "/keys/corral.key"));
    const cfg_app *a = cfg_find_app(c, "speaker");
    ck_assert_uint_eq(a->n_uids, 2);
    ck_assert_uint_eq(a->uids[0], 1001);
    ck_assert_uint_eq(a->uids[1], 1002);
    ck_assert_uint_eq(a->n_gids, 1);
    ck_assert_uint_eq(a->gids[0], 100);
    ck_assert_uint_eq(a->n_curve_keys, 1);
    ck_assert_str_eq(a->curve_keys[0], TEST_KEY);
    ck_assert(a->admin);
    ck_assert_int_eq(a->max_concurrent, 4);
    ck_assert_int_eq(a->requests_per_minute, 120);
    ck_assert_int_eq(a->max_tokens, 512);
    /* Defaults: nobody listed, no admin, no limits. */
    const cfg_app *b = cfg_find_app(c, "plain.app_2-x");
    ck_assert(b->n_uids == 0 && b->n_gids == 0 && b->n_curve_keys == 0 && !b->admin);
    ck_assert(b->max_concurrent == 0 && b->requests_per_minute == 0 && b->max_tokens == 0);
    ck_assert_int_eq(b->max_priority, CFG_PRIORITY_INTERACTIVE);
    cfg_destroy(&c);
    /* The owner is on by default; no server key. */
    c = cfg_new_defaults(&err);
    ck_assert(c->auth_owner);
    ck_assert_ptr_null(c->server_key_file);
    ck_assert_ptr_null(c->default_app);
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_http_errors) {
    expect_error("http: {listen: [\"0.0.0.0:11435\"]}\n",
                 "'0.0.0.0:11435' is not a loopback address; serving beyond this machine needs "
                 "http.keys");
    expect_error("http: {listen: [\"localhost\"]}\n", "http.listen: 'localhost': expected");
    expect_error("http: {listen: [\"127.0.0.1:0\"]}\n", "bad port");
    expect_error("http: {keys: [{app: a}]}\n", "lacks the required key 'key_file'");
    expect_error("http: {keys: [{key_file: k}]}\n", "lacks the required key 'app'");
    expect_error("http: {max_body_bytes: 10}\n", "http.max_body_bytes");
    expect_error("http: {port: 80}\n", "unknown key 'http.port'");
}
END_TEST

START_TEST(test_auth_key_errors) {
    expect_error("apps:\n  - name: s\n    uids: [-1]\n", "expected a numeric id");
    expect_error("apps:\n  - name: s\n    uids: [alice]\n", "t.yaml:3:12: uids: expected a numeric "
                                                            "id (`id -u NAME`), got 'alice'");
    expect_error("apps:\n  - name: s\n    gids: [4294967295]\n", "expected a numeric id");
    expect_error("apps:\n  - name: s\n    gids: {a: 1}\n", "gids: expected a numeric id or a list");
    expect_error("apps:\n  - name: s\n    curve_keys: [short]\n",
                 "app 's': curve_keys entry 1 is not a CURVE public key");
    /* 40 characters, but a group whose value is 2^32 or more. */
    expect_error("apps:\n  - name: s\n    curve_keys: ['####################################"
                 "####']\n",
                 "curve_keys entry 1");
    expect_error("apps:\n  - name: 'two words'\n", "app 'two words': a name is 1 to 63");
    expect_error("apps:\n  - name: '(owner)'\n", "a name is 1 to 63");
    expect_error("apps:\n  - name: "
                 "a234567890123456789012345678901234567890123456789012345678901234\n",
                 "a name is 1 to 63");
    expect_error("apps:\n  - name: s\n    admin: yes\n", "admin: expected true or false");
    expect_error("apps:\n  - name: s\n    max_tokens: -1\n", "max_tokens: -1 is out of range");
    expect_error("apps:\n  - name: s\n    requests_per_minute: 9999999999\n", "out of range");
    expect_error("auth: {owner: maybe}\n", "auth.owner: expected true or false");
    expect_error("auth: {server_key: x}\n", "unknown key 'auth.server_key'");
    expect_error("auth: {default_app: ghost}\n",
                 "auth.default_app names app 'ghost', which is not in `apps`");
}
END_TEST

/* Issue 20, finding 3: one run names every problem of a file (not only the first), each with
 * its line and column, unknown names with the closest known one. */
START_TEST(test_every_problem_is_reported) {
    const char *text = "limits:\n"
                       "  max_mesage_bytes: 1MiB\n" /* 2:3 a typo */
                       "  queue_per_model: 0\n"     /* 3:20 out of range */
                       "models:\n"
                       "  - name: a\n"
                       "    path: /nonexistent/a.gguf\n" /* 6:11 no file */
                       "    sanitizer: stict\n"          /* 5:5 no such profile */
                       "    context_overflow: wrap\n"    /* 8:23 not a choice */
                       "  - name: b\n"
                       "    path: /etc/hostname\n"
                       "    colur: red\n" /* 11:5 unknown key */
                       "sanitizers:\n"
                       "  - name: strict\n";
    cfg_report rep = {0};
    corral_error err;
    cfg *c = cfg_load_string_report(text, strlen(text), "t.yaml", &rep, NULL, &err);
    ck_assert_ptr_null(c);
    ck_assert_uint_eq(rep.n, 6);
    const char *want[] = {
        "t.yaml:2:3: unknown key 'limits.max_mesage_bytes' (did you mean "
        "'limits.max_message_bytes'?)",
        "t.yaml:3:20: limits.queue_per_model: 0 is out of range",
        "t.yaml:8:23: context_overflow: expected truncate_oldest or error, got 'wrap'",
        "t.yaml:11:5: unknown key 'colur'",
        "t.yaml:6:11: model 'a': file /nonexistent/a.gguf: No such file or directory",
        "t.yaml:5:5: model 'a' names sanitizer profile 'stict', which is not in `sanitizers` (did "
        "you mean 'strict'?)",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        bool found = false;
        for (size_t k = 0; k < rep.n && !found; k++) found = strstr(rep.problems[k], want[i]);
        ck_assert_msg(found, "no problem like '%s' (first: %s)", want[i], rep.problems[0]);
    }
    /* err: the first, and how many more. */
    ck_assert_msg(strstr(err.message, "max_mesage_bytes") &&
                      strstr(err.message, "and 5 more problems"),
                  "%s", err.message);
    cfg_report_free(&rep);
    ck_assert_uint_eq(rep.n, 0);
}
END_TEST

/* Entries that lack their name are reported, and the checks that look names up (an app's
 * models, a model's profile, the default app) still run over them without touching the missing
 * name. Found by fuzz_config: an app naming a model beside a model without a name, and an adapter
 * without its path. */
START_TEST(test_entries_without_names_are_reported_and_skipped) {
    char text[8192];
    snprintf(text, sizeof text,
             "models:\n"
             "  - {n, ame: s, path: /etc/hostname, sanitizer: p}\n"
             "  - {name: t, path: %s, adapters: [{scale: 1}, [x]]}\n"
             "sanitizers:\n"
             "  - {steps: []}\n"
             "apps:\n"
             "  - {models: [s]}\n"
             "  - {name: a, models: [s], sanitizer: p}\n"
             "auth:\n"
             "  default_app: a\n",
             test_shared_path("models/stories260K.gguf"));
    cfg_report rep = {0};
    corral_error err;
    /* With the model files' checks too (corrald --check-config, startup, reloads). */
    cfg *c = cfg_load_string_report(text, strlen(text), "t.yaml", &rep, cfg_check_models, &err);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    const char *want[] = {
        "models: entry 1 lacks the required key 'name'",
        "adapters: entry 1 lacks the required key 'path'",
        "adapters: each entry must be a mapping, got a list",
        "sanitizers: entry 1 lacks the required key 'name'",
        "apps: entry 1 lacks the required key 'name'",
        "app 'a' names model 's', which is not configured",
        "app 'a' names sanitizer profile 'p', which is not in `sanitizers`",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        bool found = false;
        for (size_t k = 0; k < rep.n && !found; k++) found = strstr(rep.problems[k], want[i]);
        ck_assert_msg(found, "no problem like '%s' (first: %s)", want[i], rep.problems[0]);
    }
    cfg_report_free(&rep);
}
END_TEST

/* Issue 20, finding 3: the model files' headers, templates and contexts are checked without
 * loading weights, every problem with the place of its key and a did-you-mean for names. */
START_TEST(test_model_checks_read_headers) {
    /* (test_shared_path's buffer is static: one copy per path.) */
    char a[4096], b[4096], q8[4096];
    snprintf(a, sizeof a, "%s", test_shared_path("models/stories260K.gguf"));
    snprintf(b, sizeof b, "%s", test_shared_path("models/legacy-v1.gguf"));
    snprintf(q8, sizeof q8, "%s", test_shared_path("models/stories260K-q8_0.gguf"));
    char readme[512];
    snprintf(readme, sizeof readme, "%s", write_file("README.md", "# corral\n\nnot a model\n"));
    char text[16384];
    snprintf(text, sizeof text,
             "models:\n"
             "  - name: a\n"
             "    path: %s\n"
             "    template: chatm\n"
             "    context: 99999\n"
             "  - name: b\n"
             "    path: %s\n"
             "  - name: c\n"
             "    path: %s\n"
             "  - name: ok\n"
             "    path: %s\n"
             "    template: llama3\n"
             "    context: 2048\n",
             a, b, readme, q8);
    cfg_report rep = {0};
    corral_error err;
    cfg *c = cfg_load_string_report(text, strlen(text), "t.yaml", &rep, cfg_check_models, &err);
    ck_assert_ptr_null(c);
    ck_assert_uint_eq(rep.n, 4);
    ck_assert_msg(strstr(rep.problems[0], "t.yaml:4:15: model 'a': unknown chat template 'chatm' "
                                          "(did you mean 'chatml'?)"),
                  "%s", rep.problems[0]);
    ck_assert_msg(strstr(rep.problems[1], "t.yaml:5:14: model 'a': context 99999 is more than "
                                          "the 2048 positions"),
                  "%s", rep.problems[1]);
    ck_assert_msg(strstr(rep.problems[2], "t.yaml:7:11: model 'b': ") &&
                      strstr(rep.problems[2], "GGUF version 1"),
                  "%s", rep.problems[2]);
    ck_assert_msg(strstr(rep.problems[3], "t.yaml:9:11: model 'c': ") &&
                      strstr(rep.problems[3], "README.md: header: not a GGUF file: bad magic"),
                  "%s", rep.problems[3]);
    ck_assert_msg(strstr(err.message, "chatm") && strstr(err.message, "and 3 more"), "%s",
                  err.message);
    cfg_report_free(&rep);
    /* A good file passes the same checks. */
    snprintf(text, sizeof text, "models:\n  - name: ok\n    path: %s\n    context: 512\n", a);
    c = cfg_load_string_report(text, strlen(text), "t.yaml", &rep, cfg_check_models, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_uint_eq(rep.n, 0);
    ck_assert_int_eq(c->models[0].context_overflow, CFG_OVERFLOW_TRUNCATE_OLDEST);
    ck_assert_str_eq(cfg_overflow_name(c->models[0].context_overflow), "truncate_oldest");
    cfg_destroy(&c);
}
END_TEST

START_TEST(test_context_overflow) {
    corral_error err;
    const char *text = "models:\n  - name: x\n    path: /etc/hostname\n"
                       "    context_overflow: error\n";
    cfg *c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    ck_assert_int_eq(c->models[0].context_overflow, CFG_OVERFLOW_ERROR);
    cfg_destroy(&c);
    ck_assert_ptr_null(cfg_overflow_name((cfg_overflow)7));
}
END_TEST

static Suite *config_suite(void) {
    Suite *s = suite_create("config");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, setup, teardown);
    tcase_add_test(core, test_defaults);
    tcase_add_test(core, test_per_user_dirs);
    tcase_add_test(core, test_relative_paths_without_detours);
    tcase_add_test(core, test_file_found_and_loaded);
    tcase_add_test(core, test_file_not_found);
    tcase_add_test(core, test_default_file_search);
    tcase_add_test(core, test_models_and_apps);
    tcase_add_test(core, test_memory_share_of_ram);
    tcase_add_test(core, test_http_section);
    tcase_add_test(core, test_auth_keys);
    tcase_add_test(core, test_context_overflow);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_empty_and_comment_only_files);
    tcase_add_test(limits, test_byte_size_bounds);
    tcase_add_test(limits, test_nesting_bounded);
    tcase_add_test(limits, test_aliases_refused);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, setup, teardown);
    tcase_add_test(errors, test_unknown_key_has_position);
    tcase_add_test(errors, test_special_files_are_refused_without_blocking);
    tcase_add_test(errors, test_wrong_types);
    tcase_add_test(errors, test_syntax_and_duplicates);
    tcase_add_test(errors, test_model_entry_errors);
    tcase_add_test(errors, test_http_errors);
    tcase_add_test(errors, test_auth_key_errors);
    tcase_add_test(errors, test_every_problem_is_reported);
    tcase_add_test(errors, test_entries_without_names_are_reported_and_skipped);
    tcase_add_test(errors, test_model_checks_read_headers);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(config_suite)
