/*
 * test_status.c — Check suite for the status table (base/include/corral/status.h): names,
 * descriptions and the wire enum in proto/corral.proto must agree row for row.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "corral.pb-c.h"
#include "corral/status.h"
#include "corral/utf8.h"
#include "testutil.h"

START_TEST(test_round_trip_every_row) {
    for (int i = 0; i < CORRAL_STATUS_COUNT; i++) {
        int status = -i;
        const char *name = corral_status_name(status);
        ck_assert_msg(name != NULL, "status %d has no name: the table is not dense", status);
        corral_status back;
        ck_assert_int_eq(corral_status_from_name(name, &back), 0);
        ck_assert_int_eq(back, status);
        ck_assert_str_ne(corral_strerror(status), "unknown status");
    }
}
END_TEST

START_TEST(test_known_values) {
    ck_assert_int_eq(CORRAL_OK, 0);
    ck_assert_str_eq(corral_status_name(CORRAL_OK), "OK");
    ck_assert_str_eq(corral_status_name(CORRAL_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
    ck_assert_str_eq(corral_strerror(CORRAL_NOT_FOUND), "not found");
}
END_TEST

START_TEST(test_proto_enum_matches_table) {
    const ProtobufCEnumDescriptor *d = &corral__v1__error_code__descriptor;
    ck_assert_uint_eq(d->n_values, CORRAL_STATUS_COUNT);
    for (unsigned i = 0; i < d->n_values; i++) {
        int status = -d->values[i].value;
        ck_assert_msg(corral_status_name(status) != NULL, "wire code %d has no status",
                      d->values[i].value);
        ck_assert_str_eq(d->values[i].name, corral_status_name(status));
    }
}
END_TEST

START_TEST(test_out_of_range_values) {
    ck_assert_ptr_null(corral_status_name(1));
    ck_assert_ptr_null(corral_status_name(-CORRAL_STATUS_COUNT));
    ck_assert_str_eq(corral_strerror(12345), "unknown status");
    ck_assert_str_eq(corral_strerror(-CORRAL_STATUS_COUNT), "unknown status");
}
END_TEST

START_TEST(test_error_message_truncated_not_overflowed) {
    char big[4 * CORRAL_ERROR_MESSAGE_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    corral_error err;
    ck_assert_int_eq(corral_error_set(&err, CORRAL_FORMAT, "%s", big), CORRAL_FORMAT);
    ck_assert_uint_eq(strlen(err.message), CORRAL_ERROR_MESSAGE_MAX - 1);
    corral_error_prefix(&err, "file %s", "a.gguf");
    ck_assert_uint_eq(strlen(err.message), CORRAL_ERROR_MESSAGE_MAX - 1);
    ck_assert(strncmp(err.message, "file a.gguf: xxx", 16) == 0);
}
END_TEST

/* Messages leave the daemon as protobuf strings, which must be UTF-8: a character the limit would
 * split is dropped whole, for each sequence length and each place the limit can fall in it. */
START_TEST(test_error_message_cut_between_characters) {
    static const char *const chars[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    for (size_t c = 0; c < sizeof chars / sizeof chars[0]; c++) {
        const size_t clen = strlen(chars[c]);
        for (size_t shift = 0; shift < clen; shift++) {
            /* the character starts `shift` bytes before the last byte the record keeps */
            const size_t pad = CORRAL_ERROR_MESSAGE_MAX - 2 - shift;
            char text[2 * CORRAL_ERROR_MESSAGE_MAX];
            memset(text, 'x', pad);
            snprintf(text + pad, sizeof text - pad, "%s tail", chars[c]);
            corral_error err;
            corral_error_set(&err, CORRAL_FORMAT, "%s", text);
            const size_t want = pad + (shift + 1 == clen ? clen : 0);
            ck_assert_msg(strlen(err.message) == want, "length %zu, shift %zu: kept %zu, want %zu",
                          clen, shift, strlen(err.message), want);
            ck_assert_uint_eq(utf8_validate((const uint8_t *)err.message, strlen(err.message)),
                              strlen(err.message));
            /* the same through corral_error_prefix, which moves the character one byte on */
            corral_error_set(&err, CORRAL_FORMAT, "%s", text + 2);
            corral_error_prefix(&err, "p");
            ck_assert_uint_eq(utf8_validate((const uint8_t *)err.message, strlen(err.message)),
                              strlen(err.message));
            ck_assert_uint_ge(strlen(err.message), CORRAL_ERROR_MESSAGE_MAX - 1 - 3);
        }
    }
}
END_TEST

START_TEST(test_unknown_name_rejected) {
    corral_status st = CORRAL_OK;
    ck_assert_int_eq(corral_status_from_name("NO_SUCH_STATUS", &st), -1);
    ck_assert_int_eq(corral_status_from_name("ok", &st), -1); /* names are case-sensitive */
    ck_assert_int_eq(corral_status_from_name(NULL, &st), -1);
    ck_assert_int_eq(st, CORRAL_OK);
}
END_TEST

START_TEST(test_null_error_record_is_safe) {
    ck_assert_int_eq(corral_error_set(NULL, CORRAL_IO, "x"), CORRAL_IO);
    ck_assert_int_eq(corral_error_prefix(NULL, "y"), CORRAL_OK);
    corral_error_clear(NULL);
    corral_error err;
    corral_error_set(&err, CORRAL_IO, "disk on fire");
    corral_error_prefix(&err, "model %s", "m");
    ck_assert_str_eq(err.message, "model m: disk on fire");
    ck_assert_int_eq(err.status, CORRAL_IO);
    corral_error_clear(&err);
    ck_assert_int_eq(err.status, CORRAL_OK);
    ck_assert_str_eq(err.message, "");
}
END_TEST

static Suite *status_suite(void) {
    Suite *s = suite_create("status");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_round_trip_every_row);
    tcase_add_test(core, test_known_values);
    tcase_add_test(core, test_proto_enum_matches_table);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_out_of_range_values);
    tcase_add_test(limits, test_error_message_truncated_not_overflowed);
    tcase_add_test(limits, test_error_message_cut_between_characters);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_unknown_name_rejected);
    tcase_add_test(errors, test_null_error_record_is_safe);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(status_suite)
