/*
 * fuzz_gguf.c — the GGUF reader (engine/include/corral/gguf.h) on arbitrary bytes, then what a
 * loader does with a file that parses: read every metadata value the ways `corral inspect` and the
 * typed getters do, look at every tensor's bytes, and build the tokenizer from the metadata
 * (tok_new_from_gguf), which is where most of a model file's untrusted structure is interpreted.
 *
 * Invariants checked beyond "no crash, no leak": a failure always says why; every key and tensor
 * the reader hands out lies inside the buffer and is found again by name; formatted values are
 * NUL-terminated within their buffer; a tokenizer that was built gives ids inside its vocabulary
 * and decodes them within tok_max_piece_len per piece.
 */
#include "corral/chat.h"
#include "corral/gguf.h"
#include "corral/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static int inside(const uint8_t *data, size_t size, const void *p, uint64_t len) {
    const uint8_t *q = p;
    return len == 0 || (q >= data && q <= data + size && len <= (uint64_t)(data + size - q));
}

/* The typed getters on key, each of which either succeeds or fails with a message. */
static void read_typed(const gguf_file *f, const char *key) {
    corral_error err = {0};
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    int b;
    gguf_str s;
    corral_status st[] = {
        gguf_get_u32(f, key, &u32, &err), gguf_get_i32(f, key, &i32, &err),
        gguf_get_u64(f, key, &u64, &err), gguf_get_f32(f, key, &f32, &err),
        gguf_get_bool(f, key, &b, &err),  gguf_get_str(f, key, &s, &err),
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        FUZZ_CHECK(st[i] == CORRAL_OK || st[i] == CORRAL_FORMAT || st[i] == CORRAL_NOT_FOUND,
                   "getter %zu on '%s' returned %d", i, key, (int)st[i]);
}

static void walk_metadata(const gguf_file *f, const uint8_t *data, size_t size) {
    const uint64_t n_kv = gguf_kv_count(f);
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_str key = gguf_kv_key(f, i);
        FUZZ_CHECK(inside(data, size, key.data, key.len), "key %llu outside the buffer",
                   (unsigned long long)i);
        gguf_type type = gguf_kv_type(f, i);
        FUZZ_CHECK(type < GGUF_TYPE_COUNT, "key %llu has type %d", (unsigned long long)i,
                   (int)type);
        FUZZ_CHECK(strcmp(gguf_type_name(type), "?") != 0, "type %d has no name", (int)type);

        char text[160];
        size_t n = gguf_format_value(f, i, text, sizeof text);
        FUZZ_CHECK(n < sizeof text && strlen(text) == n, "formatted value %llu: %zu bytes",
                   (unsigned long long)i, n);
        char tiny[4];
        n = gguf_format_value(f, i, tiny, sizeof tiny);
        FUZZ_CHECK(n < sizeof tiny, "formatted into 4 bytes: %zu", n);

        /* Keys with a NUL inside cannot be asked for by C string; every other one is found. */
        char *k = fuzz_strdup((const uint8_t *)key.data, (size_t)key.len);
        if (strlen(k) == key.len) {
            FUZZ_CHECK(gguf_find_key(f, k) == (int64_t)i, "key '%s' not found at %llu", k,
                       (unsigned long long)i);
            read_typed(f, k);
            corral_error err = {0};
            gguf_type elem;
            uint64_t count;
            if (gguf_get_array(f, k, &elem, &count, &err) == CORRAL_OK) {
                FUZZ_CHECK(type == GGUF_TYPE_ARRAY, "'%s' is an array of type %d", k, (int)type);
                if (elem == GGUF_TYPE_STRING) {
                    /* The first and last few strings, and one past the end. */
                    for (uint64_t j = 0; j < count; j = j == 7 && count > 16 ? count - 8 : j + 1) {
                        gguf_str e = gguf_array_str(f, i, j);
                        FUZZ_CHECK(inside(data, size, e.data, e.len), "'%s'[%llu] outside", k,
                                   (unsigned long long)j);
                    }
                    FUZZ_CHECK(gguf_array_str(f, i, count).data == NULL, "'%s'[count]", k);
                } else if (count <= 4096) {
                    float *fv = malloc((count ? count : 1) * sizeof *fv);
                    int32_t *iv = malloc((count ? count : 1) * sizeof *iv);
                    FUZZ_CHECK(fv && iv, "out of memory");
                    (void)gguf_array_copy_f32(f, k, fv, count, &err);
                    (void)gguf_array_copy_i32(f, k, iv, count, &err);
                    free(fv);
                    free(iv);
                }
            }
        }
        free(k);
    }
}

static void walk_tensors(const gguf_file *f, const uint8_t *data, size_t size) {
    const uint64_t n = gguf_tensor_count(f);
    for (uint64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        FUZZ_CHECK(t != NULL, "tensor %llu missing", (unsigned long long)i);
        FUZZ_CHECK(inside(data, size, t->name.data, t->name.len), "tensor %llu name outside",
                   (unsigned long long)i);
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS, "tensor %llu has %u dims",
                   (unsigned long long)i, t->n_dims);
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            FUZZ_CHECK(t->ne[d] >= 0 && (d < t->n_dims || t->ne[d] == 1), "tensor %llu ne[%u]",
                       (unsigned long long)i, d);
        FUZZ_CHECK(inside(data, size, t->data, t->size), "tensor %llu data outside",
                   (unsigned long long)i);
        if (t->size) {
            /* Touch both ends: ASan reports a read past libFuzzer's exact-size buffer. */
            volatile uint8_t first = ((const uint8_t *)t->data)[0];
            volatile uint8_t last = ((const uint8_t *)t->data)[t->size - 1];
            (void)first;
            (void)last;
        }
        char *name = fuzz_strdup((const uint8_t *)t->name.data, (size_t)t->name.len);
        if (strlen(name) == t->name.len)
            FUZZ_CHECK(gguf_find_tensor(f, name) == t, "tensor '%s' not found by name", name);
        free(name);
    }
    FUZZ_CHECK(gguf_tensor_at(f, n) == NULL, "tensor past the count");
}

/* What the model loader and corrald do with a vocabulary: build it, ask for its special ids,
 * encode a little text (and a little of the input) and decode it back. */
static void use_tokenizer(const gguf_file *f, const uint8_t *data, size_t size) {
    corral_error err = {0};
    tokenizer *t = tok_new_from_gguf(f, &err);
    if (!t) {
        FUZZ_CHECK(err.status < 0 && err.message[0], "tokenizer failed without a message");
        return;
    }
    const int32_t n_vocab = tok_vocab_size(t);
    FUZZ_CHECK(n_vocab > 0, "empty vocabulary accepted");
    for (int r = 0; r < TOK_SPECIAL_COUNT; r++) {
        int32_t id = tok_special_id(t, (tok_special)r);
        FUZZ_CHECK(id == TOK_NONE || (id >= 0 && id < n_vocab), "special %d is %d", r, id);
    }
    const size_t max_piece = tok_max_piece_len(t);
    for (int32_t id = 0; id < n_vocab && id < 64; id++) {
        size_t len;
        const char *text = tok_token_text(t, id, &len);
        FUZZ_CHECK(text != NULL || len == 0, "token %d has no text", id);
        FUZZ_CHECK(inside(data, size, text, len) && len <= max_piece, "token %d text", id);
        (void)tok_token_type(t, id);
        (void)tok_is_eog(t, id);
        (void)tok_token_score(t, id);
    }

    static const char sample[] = "Hello world, \xc3\xbcnic\xc3\xb6"
                                 "de 123\n\t<s>";
    const size_t n_in = size < 64 ? size : 64;
    char *text = malloc(sizeof sample + n_in);
    FUZZ_CHECK(text != NULL, "out of memory");
    memcpy(text, sample, sizeof sample - 1);
    if (n_in) memcpy(text + sizeof sample - 1, data + size - n_in, n_in);
    const size_t text_len = sizeof sample - 1 + n_in;

    const uint32_t flags[] = {0, TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL};
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
        size_t n_ids = 0;
        corral_status st = tok_encode(t, text, text_len, flags[k], NULL, 0, &n_ids, &err);
        if (st != CORRAL_OK && st != CORRAL_RESOURCE_EXHAUSTED) continue;
        int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
        FUZZ_CHECK(ids != NULL, "out of memory");
        size_t again = 0;
        st = tok_encode(t, text, text_len, flags[k], ids, n_ids, &again, &err);
        FUZZ_CHECK(st == CORRAL_OK && again == n_ids, "second encode: %d, %zu of %zu", (int)st,
                   again, n_ids);
        char *piece = malloc(max_piece + 1);
        FUZZ_CHECK(piece != NULL, "out of memory");
        for (size_t j = 0; j < n_ids; j++) {
            FUZZ_CHECK(ids[j] >= 0 && ids[j] < n_vocab, "id %d outside a vocabulary of %d", ids[j],
                       n_vocab);
            size_t n_bytes = 0;
            st = tok_decode_piece(t, ids[j], TOK_DECODE_SPECIAL, piece, max_piece + 1, &n_bytes,
                                  &err);
            FUZZ_CHECK(st == CORRAL_OK && n_bytes <= max_piece, "piece of %d: %d, %zu > %zu",
                       ids[j], (int)st, n_bytes, max_piece);
        }
        free(piece);
        size_t n_bytes = 0;
        st = tok_decode(t, ids, n_ids, TOK_DECODE_STRIP_SPACE, NULL, 0, &n_bytes, &err);
        FUZZ_CHECK(st == CORRAL_OK || st == CORRAL_RESOURCE_EXHAUSTED, "decode: %d", (int)st);
        free(ids);
    }
    free(text);
    tok_destroy(&t);
    FUZZ_CHECK(t == NULL, "tok_destroy left the pointer");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    corral_error err = {0};
    gguf_file *f = gguf_open_buffer(data, size, "fuzz.gguf", &err);
    if (!f) {
        FUZZ_CHECK(err.status < 0 && err.message[0], "open failed without a message");
        return 0;
    }
    FUZZ_CHECK(gguf_version(f) == 2 || gguf_version(f) == 3, "version %u", gguf_version(f));
    uint32_t align = gguf_alignment(f);
    FUZZ_CHECK(align && (align & (align - 1)) == 0, "alignment %u", align);
    FUZZ_CHECK(gguf_data_offset(f) <= size && gguf_file_size(f) == size, "data offset");
    walk_metadata(f, data, size);
    walk_tensors(f, data, size);

    gguf_str tmpl;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl, &err) == CORRAL_OK) {
        char *src = fuzz_strdup((const uint8_t *)tmpl.data, (size_t)tmpl.len);
        (void)chat_template_detect(src);
        free(src);
    }
    use_tokenizer(f, data, size);
    gguf_destroy(&f);
    FUZZ_CHECK(f == NULL, "gguf_destroy left the pointer");
    return 0;
}
