/*
 * fuzz_peft.c — PEFT's adapter_config.json as corral reads it (adapters/lora.c): the input is the
 * config of a real adapter directory whose adapter_model.safetensors is the shared stories260K
 * LoRA, opened with lora_adapter_open against the stories260K base. That runs the strict JSON
 * reader, the config's checks and refusals by name, rank_pattern / alpha_pattern keys through
 * their little regex matcher against every module, the base-config courtesy check (a
 * stories260K-hf/config.json sits beside the adapter), and every tensor against the base.
 *
 * The directory is made once, under $TMPDIR, and removed at exit; each input rewrites the config
 * file in it, nothing else.
 *
 * Invariants: a failure has a status lora.h documents and a message naming the adapter's path;
 * an adapter that opens has targets sorted by name, each found again by name, with a rank the
 * tensors have, a finite scaling, and factors that can be read.
 */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "fuzz.h"
#include "lora.h"

static char root[256], adapter[320], config[360], hf_dir[320], hf_config[360], weights[360];
static gguf_file *base;

static void cleanup(void) {
    unlink(config);
    unlink(weights);
    rmdir(adapter);
    unlink(hf_config);
    rmdir(hf_dir);
    rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    corral_error err = {0};
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/corral-fuzz-peft-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    FUZZ_CHECK(mkdtemp(root) != NULL, "cannot make %s", root);
    snprintf(adapter, sizeof adapter, "%s/adapter", root);
    snprintf(config, sizeof config, "%s/adapter_config.json", adapter);
    snprintf(weights, sizeof weights, "%s/adapter_model.safetensors", adapter);
    snprintf(hf_dir, sizeof hf_dir, "%s/stories260K-hf", root);
    snprintf(hf_config, sizeof hf_config, "%s/config.json", hf_dir);
    FUZZ_CHECK(mkdir(adapter, 0700) == 0 && mkdir(hf_dir, 0700) == 0, "cannot make %s", adapter);
    atexit(cleanup);
    char target[4096];
    snprintf(target, sizeof target, "%s",
             fuzz_shared_path("lora/stories260K-lora-r8-peft/adapter_model.safetensors"));
    FUZZ_CHECK(symlink(target, weights) == 0, "cannot link %s", target);
    snprintf(target, sizeof target, "%s", fuzz_shared_path("lora/stories260K-hf/config.json"));
    FUZZ_CHECK(symlink(target, hf_config) == 0, "cannot link %s", target);
    const char *path = fuzz_shared_path("models/stories260K.gguf");
    base = gguf_open(path, &err);
    if (!base) {
        fprintf(stderr, "fuzz_peft: %s: %s (set CORRAL_SHARED_DIR)\n", path, err.message);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *fp = fopen(config, "wb");
    FUZZ_CHECK(fp != NULL, "cannot write %s", config);
    FUZZ_CHECK(fwrite(data, 1, size, fp) == size && fclose(fp) == 0, "cannot write %s", config);

    corral_error err = {0};
    lora_adapter *a = lora_adapter_open(adapter, base, &err);
    if (!a) {
        FUZZ_CHECK(err.status == CORRAL_FORMAT || err.status == CORRAL_UNSUPPORTED ||
                       err.status == CORRAL_INVALID_ARGUMENT || err.status == CORRAL_OUT_OF_MEMORY,
                   "status %d: %s", (int)err.status, err.message);
        FUZZ_CHECK(strstr(err.message, "adapter") || strstr(err.message, root),
                   "message names no adapter: %s", err.message);
        return 0;
    }
    FUZZ_CHECK(lora_adapter_format(a) == LORA_FORMAT_PEFT, "format %d",
               (int)lora_adapter_format(a));
    const uint32_t n = lora_adapter_target_count(a);
    FUZZ_CHECK(n > 0, "an adapter with no target opened");
    const char *prev = NULL;
    for (uint32_t i = 0; i < n; i++) {
        lora_target_info t;
        FUZZ_CHECK(lora_adapter_target(a, i, &t) == CORRAL_OK, "target %u", i);
        FUZZ_CHECK(!prev || strcmp(prev, t.tensor) < 0, "targets not sorted at %s", t.tensor);
        prev = t.tensor;
        FUZZ_CHECK(lora_adapter_find_target(a, t.tensor) == (int32_t)i, "target %s not found",
                   t.tensor);
        FUZZ_CHECK(t.rank >= 1 && t.n_in > 0 && t.n_out > 0, "target %s: rank %u, %lld x %lld",
                   t.tensor, t.rank, (long long)t.n_out, (long long)t.n_in);
        FUZZ_CHECK(isfinite(t.scaling) && isfinite(t.alpha), "target %s: scaling %g", t.tensor,
                   t.scaling);
        if (i == 0) {
            float *left = malloc((size_t)t.n_out * t.rank * sizeof *left);
            float *right = malloc((size_t)t.rank * (size_t)t.n_in * sizeof *right);
            FUZZ_CHECK(left && right, "out of memory");
            FUZZ_CHECK(lora_adapter_factors(a, i, left, right, &err) == CORRAL_OK,
                       "factors of %s: %s", t.tensor, err.message);
            free(left);
            free(right);
        }
    }
    lora_target_info past;
    FUZZ_CHECK(lora_adapter_target(a, n, &past) == CORRAL_INVALID_ARGUMENT, "target past count");
    lora_adapter_destroy(&a);
    FUZZ_CHECK(a == NULL, "lora_adapter_destroy left the pointer");
    return 0;
}
