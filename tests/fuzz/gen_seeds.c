/*
 * gen_seeds.c — writes the binary seeds of tests/fuzz/corpus/: small GGUF files (the metadata of
 * the shared models with tiny tensors of several types, a byte-level BPE vocabulary in a few
 * hundred tokens, the first bytes of real files), safetensors images, and packed protobuf
 * Requests of every body. The text seeds (YAML, JSON, regexes, tokenizer and sanitizer inputs) are
 * committed as they are; these are regenerated with
 *
 *     build/tests/fuzz/fuzz_gen_seeds ../shared tests/fuzz/corpus
 *
 * Every file is kept well under 64 KiB, so that libFuzzer's mutations stay cheap. Not a test: the
 * output is committed, and running it again rewrites the same bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral.pb-c.h"
#include "corral/gguf.h"
#include "corral/tensor.h"
#include "corral/utf8.h"

#define SEED_MAX (60 * 1024)

static const char *shared_dir, *out_dir;

static void die(const char *what, const char *detail) {
    fprintf(stderr, "gen_seeds: %s: %s\n", what, detail);
    exit(1);
}

static void write_seed(const char *target, const char *name, const void *data, size_t size) {
    if (size > SEED_MAX) die(name, "seed over 60 KiB");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, size, fp) != size || fclose(fp) != 0) die(path, "cannot write");
    printf("%-60s %6zu bytes\n", path, size);
}

static void *read_whole(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) die(path, "cannot open");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = malloc((size_t)n);
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) die(path, "cannot read");
    fclose(fp);
    *size = (size_t)n;
    return buf;
}

/* ---- GGUF ------------------------------------------------------------------------------------ */

/* Write b to a temporary file and copy it into the corpus. */
static void write_gguf_seed(gguf_builder *b, const char *name) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/gguf/.%s.tmp", out_dir, name);
    corral_error err;
    if (gguf_builder_write(b, tmp, &err) != CORRAL_OK) die(name, err.message);
    size_t size;
    void *data = read_whole(tmp, &size);
    remove(tmp);
    write_seed("gguf", name, data, size);
    free(data);
    gguf_builder_destroy(&b);
}

/* Every key of the shared model `rel`, plus a few tiny tensors of the types given. */
static void seed_from_model(const char *rel, const char *name, const uint32_t *types, int n_types) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", shared_dir, rel);
    corral_error err;
    gguf_file *f = gguf_open(path, &err);
    if (!f) die(path, err.message);
    gguf_builder *b = gguf_builder_new();
    for (uint64_t i = 0; i < gguf_kv_count(f); i++)
        if (gguf_builder_copy_kv(b, f, i) != CORRAL_OK) die(path, "copy_kv");
    static const char *const names[] = {"token_embd.weight", "blk.0.attn_q.weight",
                                        "output_norm.weight", "blk.0.ffn_down.weight"};
    uint8_t zeros[1024] = {0};
    for (int t = 0; t < n_types && t < 4; t++) {
        const int64_t ne[2] = {tensor_type_get_traits(types[t])->block_size, 2};
        if (tensor_row_size(types[t], ne[0]) * 2 > sizeof zeros) die(name, "tensor too big");
        if (gguf_builder_add_tensor(b, names[t], types[t], 2, ne, zeros, &err) != CORRAL_OK)
            die(name, err.message);
    }
    gguf_destroy(&f);
    write_gguf_seed(b, name);
}

/* GPT-2's byte-to-code-point table: printable Latin-1 bytes stand for themselves, the others map
 * to U+0100 upwards in byte order. */
static size_t gpt2_byte_text(unsigned byte, char out[UTF8_SEQUENCE_MAX]) {
    unsigned next = 0x100, cp = 0;
    for (unsigned x = 0; x <= byte; x++) {
        const int printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        cp = printable ? x : next++;
    }
    return utf8_encode(cp, (uint8_t *)out);
}

/* A byte-level BPE vocabulary small enough for a seed: the 256 byte tokens, a few merges, a
 * control and a user-defined token, and a chat template. */
static void seed_bpe_vocab(const char *name, const char *pre) {
    static const char *const merged[] = {"\xc4\xa0t", "he", "\xc4\xa0the", "in",
                                         ("\xc4\xa0"
                                          "a")};
    static const char *const merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "\xc4\xa0 a"};
    enum { N_BYTES = 256, N_MERGED = 5, N = N_BYTES + N_MERGED + 2 };
    char texts[N_BYTES][UTF8_SEQUENCE_MAX + 1];
    const char *tokens[N];
    int32_t types[N];
    for (unsigned i = 0; i < N_BYTES; i++) {
        texts[i][gpt2_byte_text(i, texts[i])] = '\0';
        tokens[i] = texts[i];
        types[i] = 1;
    }
    for (int i = 0; i < N_MERGED; i++) {
        tokens[N_BYTES + i] = merged[i];
        types[N_BYTES + i] = 1;
    }
    tokens[N - 2] = "<|endoftext|>";
    types[N - 2] = 3;
    tokens[N - 1] = "<|user|>";
    types[N - 1] = 4;
    gguf_builder *b = gguf_builder_new();
    gguf_builder_set_str(b, "general.architecture", "gpt2");
    gguf_builder_set_str(b, "tokenizer.ggml.model", "gpt2");
    gguf_builder_set_str(b, "tokenizer.ggml.pre", pre);
    gguf_builder_set_str_array(b, "tokenizer.ggml.tokens", tokens, N);
    gguf_builder_set_array(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N);
    gguf_builder_set_str_array(b, "tokenizer.ggml.merges", merges, N_MERGED);
    gguf_builder_set_u32(b, "tokenizer.ggml.bos_token_id", N - 2);
    gguf_builder_set_u32(b, "tokenizer.ggml.eos_token_id", N - 2);
    gguf_builder_set_bool(b, "tokenizer.ggml.add_bos_token", 0);
    gguf_builder_set_str(b, "tokenizer.chat_template",
                         "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                         "<|im_end|>\n{% endfor %}");
    write_gguf_seed(b, name);
}

/* The first `n` bytes of a real file: a header whose tensors' data is missing. */
static void seed_cut(const char *rel, size_t n, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", shared_dir, rel);
    size_t size;
    uint8_t *data = read_whole(path, &size);
    write_seed("gguf", name, data, n < size ? n : size);
    free(data);
}

static void gguf_seeds(void) {
    const uint32_t f32[] = {TENSOR_TYPE_F32, TENSOR_TYPE_F16};
    const uint32_t quant[] = {TENSOR_TYPE_Q8_0, TENSOR_TYPE_Q4_K, TENSOR_TYPE_BF16,
                              TENSOR_TYPE_Q6_K};
    seed_from_model("models/stories260K.gguf", "stories260K-meta.gguf", f32, 2);
    seed_from_model("models/synth-qwen2-q8_0.gguf", "qwen2-meta.gguf", quant, 4);
    seed_from_model("models/synth-phi3-q4_k_m.gguf", "phi3-meta.gguf", quant, 2);
    seed_from_model("models/synth-gemma3-q8_0.gguf", "gemma3-meta.gguf", quant + 1, 2);
    seed_from_model("lora/stories260K-lora-r8.gguf", "lora-meta.gguf", f32, 1);
    seed_bpe_vocab("bpe-gpt2.gguf", "gpt-2");
    seed_bpe_vocab("bpe-llama3.gguf", "llama-bpe");
    seed_bpe_vocab("bpe-qwen2.gguf", "qwen2");
    seed_cut("models/stories260K.gguf", 16384, "stories260K-cut16k.gguf");
    seed_cut("models/legacy-v1.gguf", 2048, "legacy-v1-cut2k.gguf");
}

/* ---- safetensors ----------------------------------------------------------------------------- */

static void st_seed(const char *name, const char *header, size_t data_len) {
    const size_t n = strlen(header);
    uint8_t *b = calloc(1, 8 + n + data_len + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, header, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (uint8_t)(i * 37u + 11u);
    write_seed("safetensors", name, b, 8 + n + data_len);
    free(b);
}

static void safetensors_seeds(void) {
    st_seed("empty.safetensors", "{}", 0);
    st_seed("meta-only.safetensors", "{\"__metadata__\":{\"format\":\"pt\"}}", 0);
    st_seed("f32.safetensors",
            "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24);
    st_seed("lora-pair.safetensors",
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\":"
            "{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
            "\"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight\":"
            "{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[16,32]}}",
            32);
    st_seed("dtypes.safetensors",
            "{\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]},"
            "\"c\":{\"dtype\":\"BOOL\",\"shape\":[1,1],\"data_offsets\":[11,12]},"
            "\"d\":{\"dtype\":\"F8_E4M3\",\"shape\":[0],\"data_offsets\":[12,12]},"
            "\"e\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[12,20]}}   ",
            20);
    /* The real adapter's header, with data only for what fits: rejected, but every entry's shape
     * is a real one. */
    char path[4096];
    snprintf(path, sizeof path, "%s/lora/stories260K-lora-r8-peft/adapter_model.safetensors",
             shared_dir);
    size_t size;
    uint8_t *real = read_whole(path, &size);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)real[i] << (8 * i);
    write_seed("safetensors", "peft-header.safetensors", real,
               8 + n + 256 < size && 8 + n + 256 < SEED_MAX ? 8 + n + 256 : SEED_MAX);
    free(real);
}

/* ---- protobuf requests ----------------------------------------------------------------------- */

static void write_request(const char *name, Corral__V1__Request *r) {
    const size_t n = corral__v1__request__get_packed_size(r);
    uint8_t *buf = malloc(n ? n : 1);
    corral__v1__request__pack(r, buf);
    write_seed("proto", name, buf, n);
    free(buf);
}

static void proto_seeds(void) {
    Corral__V1__Request r = CORRAL__V1__REQUEST__INIT;
    r.id = 1;
    r.app = "editor";
    r.protocol_version = 1;

    Corral__V1__Ping ping = CORRAL__V1__PING__INIT;
    r.body_case = CORRAL__V1__REQUEST__BODY_PING;
    r.ping = &ping;
    write_request("ping.pb", &r);

    Corral__V1__ChatMessage m1 = CORRAL__V1__CHAT_MESSAGE__INIT, m2 = m1;
    m1.role = "system";
    m1.content = "You are brief.";
    m2.role = "user";
    m2.content = "Once upon a time";
    Corral__V1__ChatMessage *msgs[] = {&m1, &m2};
    Corral__V1__UInt32Value max_tokens = CORRAL__V1__UINT32_VALUE__INIT;
    max_tokens.value = 32;
    Corral__V1__FloatValue temp = CORRAL__V1__FLOAT_VALUE__INIT;
    temp.value = 0.7f;
    Corral__V1__Int32Value top_k = CORRAL__V1__INT32_VALUE__INIT;
    top_k.value = 40;
    Corral__V1__UInt64Value seed = CORRAL__V1__UINT64_VALUE__INIT;
    seed.value = 42;
    char *stops[] = {"\n\n", "The end"};
    Corral__V1__Generate g = CORRAL__V1__GENERATE__INIT;
    g.model = "stories";
    g.n_messages = 2;
    g.messages = msgs;
    g.max_tokens = &max_tokens;
    g.temperature = &temp;
    g.top_k = &top_k;
    g.seed = &seed;
    g.n_stop = 2;
    g.stop = stops;
    g.stream = 1;
    g.priority = CORRAL__V1__PRIORITY__PRIORITY_REALTIME;
    g.session = "s1";
    g.deadline_ms = 5000;
    g.constraint = "(yes|no)\\.";
    g.sanitizer = "chat-input";
    g.template_ = "chatml";
    r.id = 2;
    r.body_case = CORRAL__V1__REQUEST__BODY_GENERATE;
    r.generate = &g;
    write_request("generate-chat.pb", &r);

    Corral__V1__Generate p = CORRAL__V1__GENERATE__INIT;
    p.model = "stories";
    p.prompt = "Once upon a time";
    r.generate = &p;
    write_request("generate-prompt.pb", &r);
    p.priority = (Corral__V1__Priority)7; /* not a priority: refused by name */
    write_request("generate-bad-priority.pb", &r);

    Corral__V1__Tokenize tk = CORRAL__V1__TOKENIZE__INIT;
    tk.model = "stories";
    tk.text = "Hello <s> world";
    tk.add_special = 1;
    r.body_case = CORRAL__V1__REQUEST__BODY_TOKENIZE;
    r.tokenize = &tk;
    write_request("tokenize.pb", &r);

    Corral__V1__ListModels lm = CORRAL__V1__LIST_MODELS__INIT;
    r.body_case = CORRAL__V1__REQUEST__BODY_LIST_MODELS;
    r.list_models = &lm;
    write_request("list-models.pb", &r);

    Corral__V1__Status st = CORRAL__V1__STATUS__INIT;
    st.model = "";
    r.body_case = CORRAL__V1__REQUEST__BODY_STATUS;
    r.status = &st;
    write_request("status.pb", &r);

    Corral__V1__Load load = CORRAL__V1__LOAD__INIT;
    load.model = "stories";
    r.body_case = CORRAL__V1__REQUEST__BODY_LOAD;
    r.load = &load;
    write_request("load.pb", &r);
    Corral__V1__Unload unload = CORRAL__V1__UNLOAD__INIT;
    unload.model = "stories";
    r.body_case = CORRAL__V1__REQUEST__BODY_UNLOAD;
    r.unload = &unload;
    write_request("unload.pb", &r);
    Corral__V1__Pin pin = CORRAL__V1__PIN__INIT;
    pin.model = "stories";
    r.body_case = CORRAL__V1__REQUEST__BODY_PIN;
    r.pin = &pin;
    write_request("pin.pb", &r);
    Corral__V1__Unpin unpin = CORRAL__V1__UNPIN__INIT;
    unpin.model = "stories";
    r.body_case = CORRAL__V1__REQUEST__BODY_UNPIN;
    r.unpin = &unpin;
    write_request("unpin.pb", &r);

    Corral__V1__Cancel cancel = CORRAL__V1__CANCEL__INIT;
    cancel.request_id = 2;
    r.body_case = CORRAL__V1__REQUEST__BODY_CANCEL;
    r.cancel = &cancel;
    write_request("cancel.pb", &r);

    r.body_case = CORRAL__V1__REQUEST__BODY__NOT_SET;
    write_request("no-body.pb", &r);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SHARED_DIR CORPUS_DIR\n", argv[0]);
        return 2;
    }
    shared_dir = argv[1];
    out_dir = argv[2];
    gguf_seeds();
    safetensors_seeds();
    proto_seeds();
    return 0;
}
