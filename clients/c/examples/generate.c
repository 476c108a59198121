/*
 * examples/generate.c — the smallest complete libcorral program: stream a generation to stdout.
 *
 *   corral_example_generate MODEL "PROMPT" [MAX_TOKENS]
 *
 * It connects to the default endpoint ($CORRAL_ENDPOINT, else corrald's default), prints each
 * chunk as it arrives, then the stop reason and token counts to stderr. Build it outside the tree
 * with: cc generate.c $(pkg-config --cflags --libs corral)
 */
#include <stdio.h>
#include <stdlib.h>

#include "corral.h"

/* Print each piece of text as soon as it comes. */
static int print_chunk(const corral_chunk *chunk, void *user) {
    (void)user;
    fwrite(chunk->text, 1, chunk->text_len, stdout);
    fflush(stdout);
    return 0; /* nonzero would cancel the generation */
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s MODEL \"PROMPT\" [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    corral_error err;
    corral_client *client = corral_client_new(NULL, &err);
    if (!client) {
        fprintf(stderr, "%s: %s\n", corral_status_name(err.status), err.message);
        return 1;
    }
    corral_generate_params params = {.model = argv[1], .prompt = argv[2]};
    if (argc == 4) {
        params.has_max_tokens = true;
        params.max_tokens = (uint32_t)strtoul(argv[3], NULL, 10);
    }
    corral_done done;
    corral_status st = corral_generate(client, &params, print_chunk, NULL, &done, -1, &err);
    if (st == CORRAL_OK) {
        printf("\n");
        fprintf(stderr, "[%s: %u prompt tokens, %u generated, %s]\n", done.model,
                done.prompt_tokens, done.generated_tokens,
                corral_stop_reason_name(done.stop_reason));
    } else {
        fprintf(stderr, "%s: %s\n", corral_status_name(st), err.message);
    }
    corral_client_destroy(&client);
    return st == CORRAL_OK ? 0 : 1;
}
