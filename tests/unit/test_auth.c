/*
 * test_auth.c — Check suite for auth tables (daemon/auth.h): who may connect, which app a request
 * runs as, the ZAP request's peer and the User-Id that names it.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "testutil.h"

/* Two CURVE public keys (RFC 26's examples). */
#define KEY_A "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
#define KEY_B "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"

static cfg *load(const char *text) {
    corral_error err;
    cfg *c = cfg_load_string(text, strlen(text), "t.yaml", &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    return c;
}

static auth_table *table_of(const char *text) {
    cfg *c = load(text);
    corral_error err;
    auth_table *t = auth_table_new(c, &err);
    ck_assert_msg(t != NULL, "%s", err.message);
    cfg_destroy(&c); /* the table keeps what it needs */
    return t;
}

static auth_peer ipc_peer(uint32_t uid, uint32_t gid) {
    return (auth_peer){.via = AUTH_VIA_IPC, .uid = uid, .gid = gid, .pid = 42};
}

static auth_peer curve_peer(const char *key) {
    auth_peer p = {.via = AUTH_VIA_CURVE};
    snprintf(p.key, sizeof p.key, "%s", key);
    return p;
}

static const char apps_text[] = "apps:\n"
                                "  - name: speaker\n"
                                "    uids: [5001]\n"
                                "    curve_keys: ['" KEY_A "']\n"
                                "  - name: editor\n"
                                "    uids: [5001, 5002]\n"
                                "    gids: [6000]\n"
                                "  - name: nobody\n";

/* The app a peer's request runs as when it names `requested`, or "" with err when refused. */
static corral_status select_app(const auth_table *t, auth_peer p, const char *requested,
                                auth_grant *g, corral_error *err) {
    return auth_select(t, &p, requested, g, err);
}

START_TEST(test_uids_gids_and_keys_map_to_apps) {
    auth_table *t = table_of(apps_text);
    corral_error err;
    auth_grant g;
    const auth_peer a = ipc_peer(5001, 77);
    ck_assert_int_eq(auth_admit(t, &a, &err), CORRAL_OK);
    /* Its default is the first app that lists it; it may name the others that do. */
    ck_assert_int_eq(select_app(t, a, "", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "speaker");
    ck_assert(!g.owner);
    ck_assert_int_eq(select_app(t, a, "editor", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "editor");
    /* By group only. */
    ck_assert_int_eq(select_app(t, ipc_peer(7777, 6000), "", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "editor");
    /* By key. */
    const auth_peer k = curve_peer(KEY_A);
    ck_assert_int_eq(auth_admit(t, &k, &err), CORRAL_OK);
    ck_assert_int_eq(select_app(t, k, "", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "speaker");
    auth_table *again = auth_table_ref(t);
    ck_assert_ptr_eq(again, t);
    auth_table_release(&again);
    ck_assert_ptr_null(again);
    auth_table_release(&t);
    auth_table_release(&t); /* NULL-safe */
}
END_TEST

START_TEST(test_the_owner) {
    const uint32_t me = (uint32_t)geteuid();
    auth_table *t = table_of(apps_text);
    corral_error err;
    auth_grant g;
    const auth_peer owner = ipc_peer(me, 12345);
    ck_assert_int_eq(auth_admit(t, &owner, &err), CORRAL_OK);
    ck_assert_int_eq(select_app(t, owner, "", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, AUTH_OWNER_APP);
    ck_assert(g.owner);
    /* The owner may act as any app, listed or not. */
    ck_assert_int_eq(select_app(t, owner, "speaker", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "speaker");
    ck_assert_int_eq(select_app(t, owner, "someone-else", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "someone-else");
    auth_table_release(&t);

    /* An app that lists corrald's own uid takes it: it is that app, not the owner. */
    char text[256];
    snprintf(text, sizeof text, "apps:\n  - name: mine\n    uids: [%u]\n", (unsigned)me);
    t = table_of(text);
    ck_assert_int_eq(select_app(t, owner, "", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "mine");
    ck_assert(!g.owner);
    ck_assert_int_eq(select_app(t, owner, "other", &g, &err), CORRAL_PERMISSION_DENIED);
    auth_table_release(&t);

    /* A CURVE client is never the owner. */
    t = table_of("apps: []\n");
    const auth_peer k = curve_peer(KEY_A);
    ck_assert_int_eq(auth_admit(t, &k, &err), CORRAL_PERMISSION_DENIED);
    auth_table_release(&t);
}
END_TEST

START_TEST(test_user_id_round_trip) {
    const auth_peer peers[] = {ipc_peer(0, 0), ipc_peer(4294967294u, 7), curve_peer(KEY_B)};
    for (size_t i = 0; i < sizeof peers / sizeof peers[0]; i++) {
        char text[96];
        ck_assert_uint_gt(auth_peer_format(&peers[i], text, sizeof text), 0);
        auth_peer back;
        ck_assert_int_eq(auth_peer_parse(text, &back), CORRAL_OK);
        ck_assert_int_eq(back.via, peers[i].via);
        ck_assert_uint_eq(back.uid, peers[i].uid);
        ck_assert_uint_eq(back.gid, peers[i].gid);
        ck_assert_uint_eq(back.pid, peers[i].pid);
        ck_assert_str_eq(back.key, peers[i].key);
    }
    char who[128];
    const auth_peer p = ipc_peer(5, 6);
    auth_peer_describe(&p, who, sizeof who);
    ck_assert_str_eq(who, "uid 5 gid 6 pid 42");
}
END_TEST

START_TEST(test_zap_requests) {
    corral_error err;
    auth_peer p;
    /* libzmq's address of an ipc peer: its name, then ":uid:gid:pid" (SO_PEERCRED). */
    const char address[] = "localhost:1000:100:4242";
    ck_assert_int_eq(
        auth_peer_from_zap(AUTH_VIA_IPC, "NULL", 4, address, strlen(address), NULL, 0, &p, &err),
        CORRAL_OK);
    ck_assert_int_eq(p.via, AUTH_VIA_IPC);
    ck_assert_uint_eq(p.uid, 1000);
    ck_assert_uint_eq(p.gid, 100);
    ck_assert_uint_eq(p.pid, 4242);
    ck_assert_int_eq(auth_peer_from_zap(AUTH_VIA_IPC, "NULL", 4, ":1:2:3", 6, NULL, 0, &p, &err),
                     CORRAL_OK);
    ck_assert_uint_eq(p.uid, 1);
    unsigned char raw[CURVE_KEY_BYTES];
    ck_assert_int_eq(curve_key_decode(KEY_A, raw), CORRAL_OK);
    ck_assert_int_eq(
        auth_peer_from_zap(AUTH_VIA_CURVE, "CURVE", 5, "127.0.0.1", 9, raw, sizeof raw, &p, &err),
        CORRAL_OK);
    ck_assert_str_eq(p.key, KEY_A);
}
END_TEST

START_TEST(test_limits) {
    auth_table *t = table_of(apps_text);
    corral_error err;
    auth_grant g;
    char name[AUTH_APP_MAX + 1];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    ck_assert_int_eq(select_app(t, ipc_peer(5001, 1), name, &g, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "longer than 63"));
    name[AUTH_APP_MAX - 1] = '\0'; /* 63 bytes: fits, and names no app of this peer */
    ck_assert_int_eq(select_app(t, ipc_peer(5001, 1), name, &g, &err), CORRAL_PERMISSION_DENIED);
    /* Ids at the top of the range parse; beyond it they do not. */
    auth_peer p;
    ck_assert_int_eq(auth_peer_parse("ipc:4294967295:0:0", &p), CORRAL_OK);
    ck_assert_int_eq(auth_peer_parse("ipc:4294967296:0:0", &p), CORRAL_PERMISSION_DENIED);
    ck_assert_int_eq(auth_peer_parse("ipc:12345678901:0:0", &p), CORRAL_PERMISSION_DENIED);
    /* Many apps: each key finds its own. */
    char text[1 << 14];
    size_t len = (size_t)snprintf(text, sizeof text, "apps:\n");
    for (int i = 0; i < 100; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "  - name: app%d\n    uids: [%d]\n",
                                i, 20000 + i);
    auth_table_release(&t);
    t = table_of(text);
    ck_assert_int_eq(select_app(t, ipc_peer(20099, 0), "", &g, &err), CORRAL_OK);
    ck_assert_str_eq(g.app, "app99");
    auth_table_release(&t);
}
END_TEST

START_TEST(test_refusals_name_the_rule) {
    auth_table *t = table_of(apps_text);
    corral_error err;
    auth_grant g;
    const auth_peer stranger = ipc_peer(9999, 9999);
    ck_assert_int_eq(auth_admit(t, &stranger, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "no app lists uid 9999 in its uids or gid 9999"));
    ck_assert_int_eq(select_app(t, stranger, "", &g, &err), CORRAL_PERMISSION_DENIED);
    const auth_peer unknown_key = curve_peer(KEY_B);
    ck_assert_int_eq(auth_admit(t, &unknown_key, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "is not in any app's curve_keys"));
    /* Request.app naming an app the peer is not listed by: refused, naming what it may be. */
    ck_assert_int_eq(select_app(t, ipc_peer(5002, 1), "speaker", &g, &err),
                     CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "Request.app 'speaker' is not an app this"));
    ck_assert_ptr_nonnull(strstr(err.message, "may act as: editor"));
    /* An app nobody may act as exists, but naming it gets the same answer as a made-up name. */
    corral_error err2;
    select_app(t, ipc_peer(5002, 1), "nobody", &g, &err);
    select_app(t, ipc_peer(5002, 1), "ghost", &g, &err2);
    ck_assert_ptr_nonnull(strstr(err.message, "'nobody' is not an app this"));
    ck_assert_ptr_nonnull(strstr(err2.message, "'ghost' is not an app this"));
    auth_table_release(&t);

    /* The owner switched off: corrald's own user is refused too, and told why. */
    t = table_of("auth: {owner: false}\n");
    const auth_peer me = ipc_peer((uint32_t)geteuid(), 0);
    ck_assert_int_eq(auth_admit(t, &me, &err), CORRAL_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(err.message, "auth.owner is false"));
    auth_table_release(&t);
}
END_TEST

START_TEST(test_bad_zap_requests_and_user_ids) {
    corral_error err;
    auth_peer p;
    /* The mechanism must match the listener's transport. */
    ck_assert_int_eq(auth_peer_from_zap(AUTH_VIA_IPC, "PLAIN", 5, ":1:2:3", 6, NULL, 0, &p, &err),
                     CORRAL_PERMISSION_DENIED);
    ck_assert_int_eq(auth_peer_from_zap(AUTH_VIA_CURVE, "NULL", 4, ":1:2:3", 6, NULL, 0, &p, &err),
                     CORRAL_PERMISSION_DENIED);
    /* No credentials, or ones that do not parse. */
    static const char *const addresses[] = {
        "", "localhost", "1:2", ":a:2:3", ":1:2:", "::1", ":1:2:99999999999"};
    for (size_t i = 0; i < sizeof addresses / sizeof addresses[0]; i++)
        ck_assert_msg(auth_peer_from_zap(AUTH_VIA_IPC, "NULL", 4, addresses[i],
                                         strlen(addresses[i]), NULL, 0, &p,
                                         &err) == CORRAL_PERMISSION_DENIED,
                      "accepted '%s'", addresses[i]);
    /* A CURVE request without a 32-byte key. */
    const unsigned char short_key[5] = {1, 2, 3, 4, 5};
    ck_assert_int_eq(auth_peer_from_zap(AUTH_VIA_CURVE, "CURVE", 5, "x", 1, short_key,
                                        sizeof short_key, &p, &err),
                     CORRAL_PERMISSION_DENIED);
    /* User-Ids that corrald's handler did not write. */
    static const char *const ids[] = {
        "", "ipc:1:2", "ipc:1:2:3:4", "ipc:a:b:c", "curve:short", "uid:0", "ipc:1:2:3 "};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        ck_assert_msg(auth_peer_parse(ids[i], &p) == CORRAL_PERMISSION_DENIED, "parsed '%s'",
                      ids[i]);
    ck_assert_int_eq(auth_peer_parse(NULL, &p), CORRAL_PERMISSION_DENIED);
}
END_TEST

static Suite *auth_suite(void) {
    Suite *s = suite_create("auth");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_uids_gids_and_keys_map_to_apps);
    tcase_add_test(core, test_the_owner);
    tcase_add_test(core, test_user_id_round_trip);
    tcase_add_test(core, test_zap_requests);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_refusals_name_the_rule);
    tcase_add_test(errors, test_bad_zap_requests_and_user_ids);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(auth_suite)
