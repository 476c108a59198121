/*
 * cmd_inspect.c — `corral inspect MODEL.gguf`: metadata and tensors of any GGUF file.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "corral/gguf.h"
#include "corral/tensor.h"

int cmd_inspect(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: corral inspect MODEL.gguf\n\n"
                "Print the file's GGUF version, every metadata key with its type and value\n"
                "(long strings and arrays abbreviated), and every tensor with its type, shape,\n"
                "offset and size.\n");
        return argc == 2 ? 0 : 2;
    }
    corral_error err;
    gguf_file *f = gguf_open(argv[1], &err);
    if (!f) return cli_fail("inspect", "%s", err.message);

    printf("file: %s\nversion: %u\nalignment: %u\nsize: %llu bytes\n", argv[1], gguf_version(f),
           gguf_alignment(f), (unsigned long long)gguf_file_size(f));
    printf("\nmetadata (%llu keys):\n", (unsigned long long)gguf_kv_count(f));
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        gguf_str key = gguf_kv_key(f, i);
        char value[256];
        gguf_format_value(f, i, value, sizeof value);
        printf("  %-44.*s %-8s %s\n", (int)key.len, key.data, gguf_type_name(gguf_kv_type(f, i)),
               value);
    }
    uint64_t total = 0;
    printf("\ntensors (%llu):\n", (unsigned long long)gguf_tensor_count(f));
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[96] = "";
        size_t len = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", d ? " x " : "",
                                    (long long)t->ne[d]);
        printf("  %-40.*s %-8s %-22s offset %-12llu %llu bytes%s\n", (int)t->name.len, t->name.data,
               tensor_type_name(t->type), shape, (unsigned long long)t->offset,
               (unsigned long long)t->size,
               tensor_type_is_supported(t->type) ? "" : "  (unsupported)");
        total += t->size;
    }
    printf("\ntensor data: %llu bytes\n", (unsigned long long)total);
    gguf_destroy(&f);
    return 0;
}
