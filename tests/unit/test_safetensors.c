/*
 * test_safetensors.c — Check suite for the adapters' readers: strict JSON on jansson
 * (adapter_json.h) and the safetensors reader (safetensors.h). The shared PEFT adapter is read and
 * compared with the same adapter in llama.cpp's GGUF form; crafted files exercise every validation:
 * header length, JSON, dtypes, shapes against byte sizes, offsets past the end, overlaps and holes.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/gguf.h"
#include "corral/tensor.h"
#include "adapter_json.h"
#include "safetensors.h"
#include "testutil.h"

/* ---- JSON ---------------------------------------------------------------------------------- */

static json_t *parse(const char *text, corral_error *err) {
    return adapter_json_parse(text, strlen(text), "t.json", err);
}

START_TEST(test_json_values) {
    const char *text = "{\n  \"r\": 8, \"alpha\": -1.5e2, \"big\": 9223372036854775807,\n"
                       "  \"neg\": -9223372036854775808, \"list\": [true, false, null, \"x\"],\n"
                       "  \"s\": \"a\\\"b\\\\c\\/\\n\\u00e9\\ud83d\\ude00\\u0000z\", \"o\": {}, "
                       "\"e\": []\n}";
    corral_error err;
    json_t *root = parse(text, &err);
    ck_assert_msg(root != NULL, "%s", err.message);
    ck_assert(json_is_object(root));
    ck_assert_uint_eq(json_object_size(root), 8);
    const char *first = json_object_iter_key(json_object_iter(root)); /* document order */
    ck_assert_str_eq(first, "r");
    uint64_t u;
    double f;
    ck_assert_int_eq(adapter_json_u64(json_object_get(root, "r"), &u), 0);
    ck_assert_uint_eq(u, 8);
    ck_assert_int_eq(adapter_json_u64(json_object_get(root, "big"), &u), 0);
    ck_assert(u == INT64_MAX);
    ck_assert_int_eq(adapter_json_u64(json_object_get(root, "neg"), &u), -1); /* negative */
    ck_assert(json_integer_value(json_object_get(root, "neg")) == INT64_MIN);
    ck_assert_int_eq(adapter_json_f64(json_object_get(root, "alpha"), &f), 0);
    ck_assert(f == -150.0);
    ck_assert_int_eq(adapter_json_u64(json_object_get(root, "alpha"), &u), -1); /* a real */
    ck_assert_int_eq(adapter_json_f64(json_object_get(root, "s"), &f), -1);
    ck_assert_int_eq(adapter_json_u64(NULL, &u), -1);
    const json_t *list = json_object_get(root, "list");
    ck_assert_uint_eq(json_array_size(list), 4);
    ck_assert_str_eq(adapter_json_kind(json_array_get(list, 0)), "true");
    ck_assert_str_eq(adapter_json_kind(json_array_get(list, 1)), "false");
    ck_assert_str_eq(adapter_json_kind(json_array_get(list, 2)), "null");
    ck_assert_str_eq(json_string_value(json_array_get(list, 3)), "x");
    ck_assert_ptr_null(json_array_get(list, 4));
    const json_t *str = json_object_get(root, "s");
    static const char want[] = "a\"b\\c/\n\xc3\xa9\xf0\x9f\x98\x80\0z";
    ck_assert_uint_eq(json_string_length(str), sizeof want - 1); /* \u0000 kept */
    ck_assert(memcmp(json_string_value(str), want, sizeof want - 1) == 0);
    ck_assert_uint_eq(json_object_size(json_object_get(root, "o")), 0);
    ck_assert_str_eq(adapter_json_kind(json_object_get(root, "e")), "array");
    ck_assert_str_eq(adapter_json_kind(json_object_get(root, "missing")), "absent");
    json_decref(root);
    /* A scalar at the top level, surrounded by whitespace. */
    root = parse(" \t\r\n42 \n", &err);
    ck_assert_ptr_nonnull(root);
    ck_assert_int_eq(adapter_json_u64(root, &u), 0);
    ck_assert_uint_eq(u, 42);
    json_decref(root);
}
END_TEST

START_TEST(test_json_many_keys_lookup) {
    /* 5000 keys: lookups by hash, duplicates found among them. */
    size_t cap = 5000 * 24 + 16;
    char *text = malloc(cap);
    size_t n = 0;
    n += (size_t)snprintf(text + n, cap - n, "{");
    for (int i = 0; i < 5000; i++) {
        n +=
            (size_t)snprintf(text + n, cap - n, "%s\"k%d\":%d", i ? "," : "", (i * 7919) % 5000, i);
    }
    n += (size_t)snprintf(text + n, cap - n, "}");
    corral_error err;
    json_t *d = adapter_json_parse(text, n, "many.json", &err);
    ck_assert_msg(d != NULL, "%s", err.message);
    uint64_t u;
    ck_assert_int_eq(adapter_json_u64(json_object_get(d, "k7919"), &u), -1); /* absent */
    ck_assert_int_eq(adapter_json_u64(json_object_get(d, "k1"), &u), 0);
    ck_assert_uint_eq((u * 7919) % 5000, 1);
    json_decref(d);
    /* The same with one key repeated far apart. */
    memcpy(text + n - 1, ",\"k0\":1}", 9);
    d = adapter_json_parse(text, n + 7, "many.json", &err);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(err.message, "duplicate object key near '\"k0\"'"), "%s", err.message);
    free(text);
}
END_TEST

START_TEST(test_json_errors_name_line_and_column) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"a\": 1,}", "t.json:1:9: string or '}' expected"},
        {"{\"a\": 01}", "t.json:1:7: invalid token near '0'"},
        {"[1.]", "invalid token near '1.'"},
        {"[1e]", "invalid token near '1e'"},
        {"[-]", "invalid token near '-'"},
        {"[+1]", "invalid token near '+'"},
        {"[NaN]", "invalid token near 'NaN'"},
        {"{\"a\" 1}", "':' expected"},
        {"[1 2]", "']' expected"},
        {"\"a\nb\"", "unexpected newline"},
        {"\"\\x\"", "invalid escape"},
        {"\"\\u12\"", "invalid escape"},
        {"\"\\ud800\"", "invalid Unicode '\\uD800'"},
        {"\"\\udc00\"", "invalid Unicode '\\uDC00'"},
        {"\"\xc0\xaf\"", "unable to decode byte 0xc0"},
        {"\"\xed\xa0\x80\"", "unable to decode byte 0xed"}, /* an encoded surrogate */
        {"\"abc", "premature end of input"},
        {"", "unexpected token near end of file"},
        {"{} {}", "end of file expected"},
        {"{\"a\":1,\"a\":2}", "duplicate object key"},
        {"tru", "invalid token"},
        {"\n\n  [x]", "t.json:3:4: invalid token near 'x'"},
        {"[18446744073709551616]", "too big integer"},
        {"[1e999]", "real number overflow"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        corral_error err;
        json_t *d = parse(cases[i].text, &err);
        ck_assert_msg(d == NULL, "case %zu parsed", i);
        ck_assert_int_eq(err.status, CORRAL_FORMAT);
        ck_assert_msg(strstr(err.message, cases[i].want), "case %zu: '%s' lacks '%s'", i,
                      err.message, cases[i].want);
    }
    /* Nesting: 64 levels are fine, 65 are not. */
    char deep[200];
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = '\0';
    corral_error err;
    ck_assert_ptr_null(parse(deep, &err));
    ck_assert_str_eq(err.message, "t.json: nesting deeper than 64 levels");
    json_t *d = adapter_json_parse(deep + 1, 128, "t.json", &err);
    ck_assert_msg(d != NULL, "%s", err.message);
    json_decref(d);
    /* Far deeper: refused the same way (jansson's own limit is 2048). */
    char *very = malloc(4001);
    memset(very, '[', 2000);
    memset(very + 2000, ']', 2000);
    very[4000] = '\0';
    ck_assert_ptr_null(parse(very, &err));
    ck_assert_int_eq(err.status, CORRAL_FORMAT);
    free(very);
}
END_TEST

/* ---- safetensors: crafted files -------------------------------------------------------------- */

/* A safetensors image: the 8-byte length, the header text, `data_len` data bytes (0, 1, 2, ...).
 * Caller frees. */
static uint8_t *make_st(const char *header, size_t data_len, size_t *size) {
    size_t n = strlen(header);
    *size = 8 + n + data_len;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, header, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (uint8_t)i;
    return b;
}

static safetensors_file *open_st(const char *header, size_t data_len, corral_error *err) {
    size_t size;
    static uint8_t *keep; /* the handle borrows the buffer */
    free(keep);
    keep = make_st(header, data_len, &size);
    return safetensors_open_buffer(keep, size, "x.safetensors", err);
}

START_TEST(test_st_valid_crafted) {
    corral_error err;
    safetensors_file *f =
        open_st("{\"__metadata__\":{\"format\":\"pt\"},"
                "\"b\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[20,22]},"
                "\"z\":{\"dtype\":\"I8\",\"shape\":[0,4],\"data_offsets\":[22,22]}}"
                "    ",
                22, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(safetensors_tensor_count(f), 4);
    ck_assert_str_eq(safetensors_metadata(f, "format"), "pt");
    ck_assert_ptr_null(safetensors_metadata(f, "nope"));
    const safetensors_tensor *b = safetensors_find_tensor(f, "b");
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(b->dtype, SAFETENSORS_F16);
    ck_assert_uint_eq(b->n_dims, 2);
    ck_assert_int_eq(b->shape[0], 2);
    ck_assert_int_eq(b->shape[1], 3);
    ck_assert_uint_eq(b->offset, 8);
    ck_assert_uint_eq(b->size, 12);
    ck_assert_uint_eq(safetensors_tensor_elements(b), 6);
    const safetensors_tensor *s = safetensors_find_tensor(f, "s");
    ck_assert_uint_eq(s->n_dims, 0);
    ck_assert_uint_eq(safetensors_tensor_elements(s), 1);
    ck_assert_ptr_null(safetensors_find_tensor(f, "c"));
    /* Data bytes are 0, 1, 2, ...: tensor b starts at byte 8 of the buffer. */
    ck_assert_uint_eq(((const uint8_t *)b->data)[0], 8);
    float h[6];
    ck_assert_int_eq(safetensors_tensor_to_f32(b, 0, 6, h, &err), CORRAL_OK);
    ck_assert(h[0] == tensor_fp16_to_f32((uint16_t)(8 | 9 << 8)));
    ck_assert_int_eq(safetensors_tensor_to_f32(b, 4, 3, h, &err), CORRAL_INVALID_ARGUMENT);
    const safetensors_tensor *z = safetensors_find_tensor(f, "z");
    ck_assert_int_eq(safetensors_tensor_to_f32(z, 0, 0, h, &err), CORRAL_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "I8"));
    safetensors_destroy(&f);
    ck_assert_ptr_null(f);
}
END_TEST

START_TEST(test_st_corrupt_headers) {
    static const struct {
        const char *header;
        size_t data;
        const char *want;
    } cases[] = {
        /* offsets past the end of the data buffer */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
         "run past the end of the 12-byte data buffer"},
        /* overlapping tensors */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
         24, "tensors 'a' (bytes 0..16) and 'b' (bytes 8..24) overlap"},
        /* bad dtype */
        {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': bad dtype 'Q7'"},
        /* shape inconsistent with the byte size */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16,
         "tensor 'a': shape [3] of F32 needs a different number of bytes but data_offsets give 16"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,16]}}",
         16, "needs more than 2^64 bytes"},
        /* a hole, and trailing bytes that belong to no tensor */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16,
         "bytes 0..8 of the data buffer belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
         "trailing bytes belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
         "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
         "shape[0] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
         "\"data_offsets\" is not [begin, end]"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "no \"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
         "unknown field 'x'"},
        {"{\"a\":[1]}", 0, "is not an object (found array)"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value 'k' is not a string"},
        {"[1, 2]", 0, "the header is not a JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",", 4, "bad safetensors header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        corral_error err;
        safetensors_file *f = open_st(cases[i].header, cases[i].data, &err);
        ck_assert_msg(f == NULL, "case %zu opened", i);
        ck_assert_int_eq(err.status, CORRAL_FORMAT);
        ck_assert_msg(strstr(err.message, cases[i].want) && strstr(err.message, "x.safetensors"),
                      "case %zu: '%s' lacks '%s'", i, err.message, cases[i].want);
    }
}
END_TEST

START_TEST(test_st_header_length_absurd) {
    corral_error err;
    uint8_t b[64] = {0};
    /* Longer than the file. */
    b[0] = 200;
    memcpy(b + 8, "{}", 2);
    ck_assert_ptr_null(safetensors_open_buffer(b, sizeof b, "x.safetensors", &err));
    ck_assert_msg(strstr(err.message, "header length 200 is absurd: larger than the rest"), "%s",
                  err.message);
    /* 2^63: absurd, and no overflow on the way. */
    memset(b, 0, 8);
    b[7] = 0x80;
    ck_assert_ptr_null(safetensors_open_buffer(b, sizeof b, "x.safetensors", &err));
    ck_assert_ptr_nonnull(strstr(err.message, "absurd"));
    /* Over the 100 MB limit even though the file would hold it: checked without reading it. */
    size_t big = 8 + SAFETENSORS_HEADER_MAX + 1;
    uint8_t *huge = calloc(1, big);
    uint64_t n = SAFETENSORS_HEADER_MAX + 1;
    for (int i = 0; i < 8; i++) huge[i] = (uint8_t)(n >> (8 * i));
    ck_assert_ptr_null(safetensors_open_buffer(huge, big, "x.safetensors", &err));
    ck_assert_ptr_nonnull(strstr(err.message, "over the 100 MB limit"));
    free(huge);
    /* Too short for the length itself; an empty header. */
    ck_assert_ptr_null(safetensors_open_buffer(b, 5, "x.safetensors", &err));
    ck_assert_ptr_nonnull(strstr(err.message, "file truncated"));
    memset(b, 0, 8);
    ck_assert_ptr_null(safetensors_open_buffer(b, 8, "x.safetensors", &err));
    ck_assert_ptr_nonnull(strstr(err.message, "not a JSON object"));
    ck_assert_ptr_null(safetensors_open("/nonexistent/x.safetensors", &err));
    ck_assert_int_eq(err.status, CORRAL_NOT_FOUND);
}
END_TEST

/* ---- safetensors: the shared PEFT adapter ---------------------------------------------------- */

START_TEST(test_st_shared_peft_file_matches_gguf_adapter) {
    corral_error err;
    safetensors_file *f = safetensors_open(
        test_shared_path("lora/stories260K-lora-r8-peft/adapter_model.safetensors"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    ck_assert_uint_eq(safetensors_tensor_count(f), 70);
    ck_assert_str_eq(safetensors_metadata(f, "format"), "pt");
    gguf_file *g = gguf_open(test_shared_path("lora/stories260K-lora-r8.gguf"), &err);
    ck_assert_ptr_nonnull(g);
    /* v_proj and down_proj are not permuted: their factors equal the GGUF adapter's exactly. */
    const char *pairs[][2] = {
        {"base_model.model.model.layers.2.self_attn.v_proj.lora_A.weight",
         "blk.2.attn_v.weight.lora_a"},
        {"base_model.model.model.layers.2.self_attn.v_proj.lora_B.weight",
         "blk.2.attn_v.weight.lora_b"},
        {"base_model.model.model.layers.4.mlp.down_proj.lora_A.weight",
         "blk.4.ffn_down.weight.lora_a"},
        {"base_model.model.model.layers.4.mlp.down_proj.lora_B.weight",
         "blk.4.ffn_down.weight.lora_b"},
    };
    for (size_t i = 0; i < 4; i++) {
        const safetensors_tensor *t = safetensors_find_tensor(f, pairs[i][0]);
        const gguf_tensor *q = gguf_find_tensor(g, pairs[i][1]);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_nonnull(q);
        ck_assert_int_eq(t->dtype, SAFETENSORS_F32);
        /* safetensors shape [rows, cols] is GGUF ne [cols, rows]. */
        ck_assert_int_eq(t->shape[0], q->ne[1]);
        ck_assert_int_eq(t->shape[1], q->ne[0]);
        uint64_t n = safetensors_tensor_elements(t);
        float *x = malloc(n * sizeof *x);
        ck_assert_int_eq(safetensors_tensor_to_f32(t, 0, n, x, &err), CORRAL_OK);
        ck_assert(memcmp(x, q->data, n * sizeof *x) == 0);
        free(x);
    }
    gguf_destroy(&g);
    safetensors_destroy(&f);
}
END_TEST

/* ---- fuzz-style passes ------------------------------------------------------------------------
 */

static uint8_t *read_whole(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return b;
}

static uint64_t fuzz_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The shared PEFT file truncated and corrupted (mostly in its length and JSON header) 1200
 * times, each opened from an exactly-sized heap copy: nothing may read outside it (the
 * sanitizer build checks), and whatever is accepted must be safe to read in full. */
START_TEST(test_fuzz_shared_safetensors) {
    size_t size;
    uint8_t *orig = read_whole(
        test_shared_path("lora/stories260K-lora-r8-peft/adapter_model.safetensors"), &size);
    uint64_t header = 0;
    for (int i = 0; i < 8; i++) header |= (uint64_t)orig[i] << (8 * i);
    uint64_t s = 0x1234567;
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 1200; iter++) {
        size_t n = size;
        if (iter % 3 == 0) n = (size_t)(fuzz_next(&s) % (size + 1));
        uint8_t *buf = malloc(n ? n : 1);
        memcpy(buf, orig, n);
        int flips = 1 + (int)(fuzz_next(&s) % 4);
        for (int k = 0; k < flips && n > 0; k++) {
            size_t at = (size_t)(fuzz_next(&s) % (8 + header < n ? 8 + header : n));
            buf[at] = (uint8_t)fuzz_next(&s);
        }
        corral_error err;
        safetensors_file *f = safetensors_open_buffer(buf, n, "fuzz", &err);
        if (f) {
            accepted++;
            float tmp[1024];
            for (uint64_t i = 0; i < safetensors_tensor_count(f); i++) {
                const safetensors_tensor *t = safetensors_tensor_at(f, i);
                uint64_t total = safetensors_tensor_elements(t);
                for (uint64_t at = 0; at < total; at += 1024) {
                    uint64_t chunk = total - at < 1024 ? total - at : 1024;
                    (void)safetensors_tensor_to_f32(t, at, chunk, tmp, &err);
                }
                ck_assert_ptr_eq(safetensors_find_tensor(f, t->name), t);
            }
            safetensors_destroy(&f);
        } else {
            rejected++;
            ck_assert(err.status == CORRAL_FORMAT || err.status == CORRAL_OUT_OF_MEMORY);
        }
        free(buf);
    }
    printf("  fuzz: %d accepted, %d rejected\n", accepted, rejected);
    ck_assert_int_gt(rejected, 400);
    free(orig);
}
END_TEST

/* The same for the JSON reader on the shared adapter_config.json. */
START_TEST(test_fuzz_json_config) {
    size_t size;
    uint8_t *orig =
        read_whole(test_shared_path("lora/stories260K-lora-r8-peft/adapter_config.json"), &size);
    uint64_t s = 0xfeedbeef;
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = iter % 2 ? size : (size_t)(fuzz_next(&s) % (size + 1));
        char *buf = malloc(n ? n : 1);
        memcpy(buf, orig, n);
        for (int k = 0; k < 3 && n > 0; k++) buf[fuzz_next(&s) % n] = (char)fuzz_next(&s);
        corral_error err;
        json_t *d = adapter_json_parse(buf, n, "fuzz.json", &err);
        if (d) {
            const char *key;
            json_t *v;
            json_object_foreach(d, key, v)(void) json_string_value(v);
            json_decref(d);
        } else {
            ck_assert_int_eq(err.status, CORRAL_FORMAT);
        }
        free(buf);
    }
    free(orig);
}
END_TEST

static Suite *safetensors_suite(void) {
    Suite *s = suite_create("safetensors");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_json_values);
    tcase_add_test(core, test_st_valid_crafted);
    tcase_add_test(core, test_st_shared_peft_file_matches_gguf_adapter);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_json_many_keys_lookup);
    tcase_add_test(limits, test_st_header_length_absurd);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_json_errors_name_line_and_column);
    tcase_add_test(errors, test_st_corrupt_headers);
    tcase_add_test(errors, test_fuzz_shared_safetensors);
    tcase_add_test(errors, test_fuzz_json_config);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(safetensors_suite)
