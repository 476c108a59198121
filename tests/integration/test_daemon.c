/*
 * test_daemon.c — black-box tests of corrald as a process: start, answer pings over real ZeroMQ,
 * log its endpoint, survive garbage, refuse a second daemon on its endpoint, stop cleanly on
 * SIGINT/SIGTERM, report versions, reject bad configs and flags.
 */
#include <check.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "corral.h"
#include "corral.pb-c.h"
#include "daemon_harness.h"
#include "testutil.h"

START_TEST(test_ping_and_clean_stop_on_sigterm) {
    harness_daemon d;
    ck_assert_int_eq(harness_start(&d, "", NULL, 5000), 0);
    corral_error err;
    corral_client *c = corral_client_new(d.endpoint, &err);
    ck_assert_ptr_nonnull(c);
    corral_pong pong;
    ck_assert_int_eq(corral_client_ping(c, 2000, &pong, &err), CORRAL_OK);
    ck_assert_str_eq(pong.version, "0.1.0");
    ck_assert_uint_eq(pong.protocol_version, 1);
    corral_client_destroy(&c);

    char log[8192];
    harness_read_log(&d, log, sizeof log);
    char want[400];
    snprintf(want, sizeof want, "msg=listening endpoint=%s", d.endpoint);
    ck_assert_msg(strstr(log, want) != NULL, "log lacks '%s':\n%s", want, log);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 2000), 0);
}
END_TEST

START_TEST(test_clean_stop_on_sigint) {
    harness_daemon d;
    ck_assert_int_eq(harness_start(&d, "", NULL, 5000), 0);
    ck_assert_int_eq(harness_stop(&d, SIGINT, 2000), 0);
}
END_TEST

START_TEST(test_version_reports_jemalloc_and_cpu) {
    const char *args[] = {"--version", NULL};
    char out[2048];
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 0);
    ck_assert_msg(strstr(out, "corrald 0.1.0") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "jemalloc 5.") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "cpu features: ") != NULL, "%s", out);
#ifndef CORRAL_SANITIZE
    /* Outside sanitizer builds, jemalloc must really serve malloc(). */
    ck_assert_msg(strstr(out, "not the active allocator") == NULL, "%s", out);
#endif
}
END_TEST

START_TEST(test_help_lists_every_flag) {
    const char *args[] = {"--help", NULL};
    char out[4096];
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 0);
    const char *flags[] = {"--config",      "--listen",  "--log-level", "--check-config",
                           "--help-config", "--version", "--help"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        ck_assert_msg(strstr(out, flags[i]) != NULL, "--help lacks %s", flags[i]);
}
END_TEST

START_TEST(test_garbage_gets_protocol_error_and_daemon_keeps_serving) {
    harness_daemon d;
    ck_assert_int_eq(harness_start(&d, "", NULL, 5000), 0);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, timeout = 2000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    ck_assert_int_eq(zmq_connect(sock, d.endpoint), 0);
    const unsigned char garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02};
    ck_assert_int_ge(zmq_send(sock, garbage, sizeof garbage, 0), 0);
    unsigned char buf[1024];
    int n = zmq_recv(sock, buf, sizeof buf, 0);
    ck_assert_int_gt(n, 0);
    Corral__V1__Response *resp = corral__v1__response__unpack(NULL, (size_t)n, buf);
    ck_assert_ptr_nonnull(resp);
    ck_assert_int_eq(resp->body_case, CORRAL__V1__RESPONSE__BODY_ERROR);
    ck_assert_int_eq(resp->error->code, CORRAL__V1__ERROR_CODE__PROTOCOL);
    corral__v1__response__free_unpacked(resp, NULL);

    /* An empty (body-less) request is valid protobuf but names nothing to do. */
    ck_assert_int_ge(zmq_send(sock, "", 0, 0), 0);
    n = zmq_recv(sock, buf, sizeof buf, 0);
    ck_assert_int_gt(n, 0);
    resp = corral__v1__response__unpack(NULL, (size_t)n, buf);
    ck_assert_ptr_nonnull(resp);
    ck_assert_int_eq(resp->error->code, CORRAL__V1__ERROR_CODE__UNSUPPORTED);
    corral__v1__response__free_unpacked(resp, NULL);
    zmq_close(sock);
    zmq_ctx_term(ctx);

    corral_error err;
    corral_client *c = corral_client_new(d.endpoint, &err);
    ck_assert_int_eq(corral_client_ping(c, 2000, NULL, &err), CORRAL_OK);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 2000), 0);
}
END_TEST

START_TEST(test_second_daemon_on_same_endpoint_refused) {
    harness_daemon d;
    ck_assert_int_eq(harness_start(&d, "", NULL, 5000), 0);
    /* What a write of the running daemon left in its swap directory: a second daemon that starts
     * its core before finding the endpoint taken would clean it up under the first one. */
    char leftover[400];
    snprintf(leftover, sizeof leftover, "%s/swap/session-0123456789abcdef.gguf.tmp.1", d.dir);
    FILE *fp = fopen(leftover, "w");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    char listen[300];
    snprintf(listen, sizeof listen, "--listen=%s", d.endpoint);
    const char *args[] = {"-c", d.config_path, listen, NULL};
    char out[4096];
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 1);
    ck_assert_msg(strstr(out, "another corrald is listening") != NULL, "%s", out);
    ck_assert_msg(access(leftover, F_OK) == 0, "the second daemon cleaned the first one's swap");
    /* On an endpoint of its own but the same directories: refused, naming the holder. */
    char dir[128];
    snprintf(dir, sizeof dir, "%s/other", d.dir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(listen, sizeof listen, "--listen=ipc://%s/corral.sock", dir);
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 1);
    char pid[64];
    snprintf(pid, sizeof pid, "in use by another corrald (pid %d)", (int)d.pid);
    ck_assert_msg(strstr(out, "swap directory") && strstr(out, pid), "%s", out);
    ck_assert_msg(access(leftover, F_OK) == 0, "the second daemon cleaned the first one's swap");
    /* The first one is untouched. */
    corral_error err;
    corral_client *c = corral_client_new(d.endpoint, &err);
    ck_assert_int_eq(corral_client_ping(c, 2000, NULL, &err), CORRAL_OK);
    corral_client_destroy(&c);
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 2000), 0);
}
END_TEST

/* Write a CURVE key pair into dir as NAME.key (mode 600) and NAME.pub; the public key into pub. */
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

START_TEST(test_tcp_endpoints_on_both_loopbacks) {
    /* tcp://localhost: ZeroMQ reads a bind's host as an interface name; tcp://[::1]: needs IPv6
     * turned on for the socket. Both passed --check-config and then failed to bind. tcp is served
     * with CURVE only: the client holds a key its app lists. */
    const int port = 20000 + (int)(getpid() % 20000);
    char keys[] = "/tmp/corral-it-keys-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(keys));
    char server_pub[41], client_pub[41], client_key[128];
    write_keypair(keys, "server", server_pub);
    write_keypair(keys, "client", client_pub);
    snprintf(client_key, sizeof client_key, "%s/client.key", keys);
    char body[1024];
    snprintf(body, sizeof body,
             "listen: [\"$IPC\", \"tcp://localhost:%d\", \"tcp://[::1]:%d\"]\n"
             "auth: {server_key_file: %s/server.key}\n"
             "apps:\n  - name: remote\n    curve_keys: ['%s']\n",
             port, port + 1, keys, client_pub);
    harness_daemon d;
    ck_assert_int_eq(harness_start(&d, body, NULL, 10000), 0);
    const char *check[] = {"-c", d.config_path, "--check-config", NULL};
    char out[4096];
    /* The endpoints are taken now (by d): a check binds them, so it reports them in use. */
    ck_assert_int_eq(harness_run_corrald(check, out, sizeof out, 5000), 1);
    for (int i = 0; i < 2; i++) {
        char endpoint[64];
        snprintf(endpoint, sizeof endpoint, i ? "tcp://[::1]:%d" : "tcp://127.0.0.1:%d", port + i);
        corral_error err;
        const corral_connect_options o = {
            .endpoint = endpoint, .server_key = server_pub, .client_key_file = client_key};
        corral_client *c = corral_client_new_with(&o, &err);
        ck_assert_msg(c != NULL, "%s", err.message);
        ck_assert_msg(corral_client_ping(c, 5000, NULL, &err) == CORRAL_OK, "%s: %s", endpoint,
                      err.message);
        corral_client_destroy(&c);
    }
    ck_assert_int_eq(harness_stop(&d, SIGTERM, 5000), 0);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", keys);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_tcp_without_curve_is_refused_at_start) {
    /* A tcp endpoint and no server key: refused by --check-config and at start, saying how to fix
     * it, before anything is bound or touched. */
    char dir[] = "/tmp/corral-it-tcp-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128], text[256];
    snprintf(path, sizeof path, "%s/corral.yaml", dir);
    snprintf(text, sizeof text, "listen: [\"tcp://127.0.0.1:%d\"]\nmemory: {swap_dir: %s/swap}\n",
             20000 + (int)(getpid() % 20000), dir);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
    const char *check[] = {"-c", path, "--check-config", NULL};
    const char *start[] = {"-c", path, NULL};
    char out[4096];
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(harness_run_corrald(i ? start : check, out, sizeof out, 5000), 1);
        ck_assert_msg(strstr(out, "tcp endpoints need CURVE") &&
                          strstr(out, "auth.server_key_file") && strstr(out, "corral keygen"),
                      "%s", out);
    }
    char swap[160];
    snprintf(swap, sizeof swap, "%s/swap", dir);
    ck_assert_msg(access(swap, F_OK) != 0, "the refused daemon made its swap directory");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_check_config_binds_what_startup_binds) {
    /* A socket directory others may write in passes the syntax check but not the bind:
     * --check-config must say so, as startup would. */
    char dir[] = "/tmp/corral-it-open-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0775), 0);
    char path[128], text[256];
    snprintf(path, sizeof path, "%s/corral.yaml", dir);
    snprintf(text, sizeof text, "listen: [\"ipc://%s/sock\"]\nmemory: {swap_dir: %s/swap}\n", dir,
             dir);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
    const char *check[] = {"-c", path, "--check-config", NULL};
    char out[4096];
    ck_assert_int_eq(harness_run_corrald(check, out, sizeof out, 5000), 1);
    ck_assert_msg(strstr(out, "group or others could replace the socket"), "%s", out);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    ck_assert_int_eq(harness_run_corrald(check, out, sizeof out, 5000), 0);
    ck_assert_msg(strstr(out, ": ok"), "%s", out);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_bad_config_and_flags_exit_nonzero) {
    char path[] = "/tmp/corral-it-cfg-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *text = "log_level: info\nlimits:\n  bogus: 1\n";
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    const char *args[] = {"-c", path, NULL};
    char out[4096];
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 1);
    char want[128];
    snprintf(want, sizeof want, "%s:3:3: unknown key 'limits.bogus'", path);
    ck_assert_msg(strstr(out, want) != NULL, "%s", out);

    /* A value of the wrong type, and a model whose file does not exist. */
    fd = open(path, O_WRONLY | O_TRUNC);
    text = "threads: many\n";
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 1);
    snprintf(want, sizeof want, "%s:1:10: threads: expected an integer, got 'many'", path);
    ck_assert_msg(strstr(out, want) != NULL, "%s", out);
    fd = open(path, O_WRONLY | O_TRUNC);
    text = "models:\n  - name: m\n    path: /nonexistent/model.gguf\n";
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(harness_run_corrald(args, out, sizeof out, 5000), 1);
    snprintf(want, sizeof want, "%s:3:11: model 'm': file /nonexistent/model.gguf", path);
    ck_assert_msg(strstr(out, want) != NULL, "%s", out);

    const char *missing[] = {"-c", "/nonexistent/corral.yaml", NULL};
    ck_assert_int_eq(harness_run_corrald(missing, out, sizeof out, 5000), 1);
    ck_assert_msg(strstr(out, "/nonexistent/corral.yaml") != NULL, "%s", out);
    unlink(path);

    const char *flag[] = {"--no-such-flag", NULL};
    ck_assert_int_eq(harness_run_corrald(flag, out, sizeof out, 5000), 2);
    const char *level[] = {"--log-level", "chatty", NULL};
    ck_assert_int_eq(harness_run_corrald(level, out, sizeof out, 5000), 2);
    ck_assert_msg(strstr(out, "chatty") != NULL, "%s", out);
}
END_TEST

static Suite *daemon_suite(void) {
    Suite *s = suite_create("daemon");
    TCase *core = tcase_create("core");
    tcase_set_timeout(core, 30);
    tcase_add_test(core, test_ping_and_clean_stop_on_sigterm);
    tcase_add_test(core, test_clean_stop_on_sigint);
    tcase_add_test(core, test_version_reports_jemalloc_and_cpu);
    tcase_add_test(core, test_help_lists_every_flag);
    tcase_add_test(core, test_tcp_endpoints_on_both_loopbacks);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_set_timeout(errors, 30);
    tcase_add_test(errors, test_garbage_gets_protocol_error_and_daemon_keeps_serving);
    tcase_add_test(errors, test_second_daemon_on_same_endpoint_refused);
    tcase_add_test(errors, test_bad_config_and_flags_exit_nonzero);
    tcase_add_test(errors, test_check_config_binds_what_startup_binds);
    tcase_add_test(errors, test_tcp_without_curve_is_refused_at_start);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(daemon_suite)
