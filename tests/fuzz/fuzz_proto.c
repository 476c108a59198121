/*
 * fuzz_proto.c — a ZeroMQ message as corrald's front end receives it: corral__v1__request__unpack
 * (protobuf-c, from the generated proto/corral.pb-c.c) on the bytes, then, as front_zmq.c does,
 * the check of every string field on the wire (zproto_check_strings), Ping and Cancel read in
 * place and everything else translated by zproto_to_core (daemon/front_zmq_proto.h) into a
 * core_request, and all of it freed.
 *
 * Invariants: a request whose strings the check refuses is refused as INVALID_ARGUMENT with a
 * message that is valid UTF-8 (it names the field); one it lets through has only valid UTF-8
 * without NULs in the strings the decoder gives (the app, the model, the prompt, the messages);
 * a translation succeeds exactly for the bodies the core serves, with a known priority;
 * the core request's kind matches the body; every string it carries is non-NULL and its length is
 * the C string's; a failure leaves no extra allocation behind and names the problem. Then the
 * answers the front end would send — an Error carrying the translation's message, an Ack echoing
 * the app name — are packed and decoded back unchanged.
 */
#include "corral.pb-c.h"
#include "corral/utf8.h"
#include "front_zmq_proto.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static void check_text(const char *s, size_t len, const char *what) {
    FUZZ_CHECK(s != NULL, "%s is NULL", what);
    FUZZ_CHECK(strlen(s) == len, "%s: length %zu, strlen %zu", what, len, strlen(s));
}

static void check_generate(const Corral__V1__Generate *g, const core_generate *c) {
    FUZZ_CHECK(c->model && c->session && c->sanitizer && c->template_name, "NULL string");
    if (c->prompt) {
        check_text(c->prompt, c->prompt_len, "prompt");
        FUZZ_CHECK(c->prompt_len > 0, "empty prompt not NULL");
    }
    FUZZ_CHECK(c->n_messages == g->n_messages, "%zu messages of %zu", c->n_messages, g->n_messages);
    for (size_t i = 0; i < c->n_messages; i++) {
        FUZZ_CHECK(c->messages[i].role != NULL, "message %zu has no role", i);
        check_text(c->messages[i].content, c->messages[i].content_len, "message content");
    }
    check_text(c->constraint, c->constraint_len, "constraint");
    check_text(c->json_schema, c->json_schema_len, "json_schema");
    FUZZ_CHECK(c->n_stop == g->n_stop, "stop strings");
    for (size_t i = 0; i < c->n_stop; i++) FUZZ_CHECK(c->stop[i] != NULL, "stop %zu NULL", i);
    FUZZ_CHECK(c->priority >= 0 && c->priority <= CFG_PRIORITY_REALTIME, "priority %d",
               c->priority);
    FUZZ_CHECK(c->sampling.has_max_tokens == (g->max_tokens != NULL), "max_tokens wrapper");
    FUZZ_CHECK(c->sampling.has_seed == (g->seed != NULL), "seed wrapper");
}

static void translate(const Corral__V1__Request *req) {
    static const core_kind kinds[] = {
        [CORRAL__V1__REQUEST__BODY_GENERATE] = CORE_GENERATE,
        [CORRAL__V1__REQUEST__BODY_TOKENIZE] = CORE_TOKENIZE,
        [CORRAL__V1__REQUEST__BODY_LIST_MODELS] = CORE_LIST_MODELS,
        [CORRAL__V1__REQUEST__BODY_STATUS] = CORE_STATUS,
        [CORRAL__V1__REQUEST__BODY_LOAD] = CORE_LOAD,
        [CORRAL__V1__REQUEST__BODY_UNLOAD] = CORE_UNLOAD,
        [CORRAL__V1__REQUEST__BODY_PIN] = CORE_PIN,
        [CORRAL__V1__REQUEST__BODY_UNPIN] = CORE_UNPIN,
    };
    const size_t body = (size_t)req->body_case;
    const int served = body < sizeof kinds / sizeof kinds[0] && kinds[body] != 0;

    core_request out;
    void *extra = (void *)&out; /* must be reset by the call */
    corral_error err = {0};
    corral_status st = zproto_to_core(req, &out, &extra, &err);
    if (st != CORRAL_OK) {
        FUZZ_CHECK(st == CORRAL_INVALID_ARGUMENT || st == CORRAL_UNSUPPORTED, "status %d", (int)st);
        FUZZ_CHECK(extra == NULL, "failed translation left extra");
        FUZZ_CHECK(err.message[0] != '\0', "failed without a message");
        FUZZ_CHECK(st == CORRAL_INVALID_ARGUMENT || !served, "body %zu refused", body);
        FUZZ_CHECK(st == CORRAL_UNSUPPORTED || body == CORRAL__V1__REQUEST__BODY_GENERATE,
                   "body %zu invalid", body);

        zproto_buf buf = {0};
        size_t n = zproto_pack_error(&buf, req->id, st, err.message);
        FUZZ_CHECK(n > 0, "packing an error failed");
        Corral__V1__Response *r = corral__v1__response__unpack(NULL, n, buf.data);
        FUZZ_CHECK(r && r->id == req->id && r->body_case == CORRAL__V1__RESPONSE__BODY_ERROR &&
                       strcmp(r->error->message, err.message) == 0 &&
                       r->error->code == (Corral__V1__ErrorCode)(-st),
                   "error response does not read back");
        corral__v1__response__free_unpacked(r, NULL);
        zproto_buf_free(&buf);
        return;
    }
    FUZZ_CHECK(served && out.kind == kinds[body], "body %zu became kind %d", body, (int)out.kind);
    switch (out.kind) {
        case CORE_GENERATE:
            check_generate(req->generate, &out.generate);
            FUZZ_CHECK((extra != NULL) == (req->generate->n_messages > 0), "extra and messages");
            break;
        case CORE_TOKENIZE:
            FUZZ_CHECK(out.tokenize.model != NULL, "tokenize model NULL");
            check_text(out.tokenize.text, out.tokenize.text_len, "tokenize text");
            FUZZ_CHECK(extra == NULL, "extra for tokenize");
            break;
        default:
            FUZZ_CHECK(out.kind == CORE_LIST_MODELS || out.target.model != NULL, "model NULL");
            FUZZ_CHECK(extra == NULL, "extra for kind %d", (int)out.kind);
            break;
    }
    free(extra);
}

/* A string the decoder gave, of a request whose wire strings passed the check: valid UTF-8 (with
 * no NUL the decoder could have cut it at, the C string is all of it). */
static void check_clean(const char *s, const char *what) {
    if (!s) return;
    const size_t n = strlen(s);
    FUZZ_CHECK(utf8_validate((const uint8_t *)s, n) == n, "%s is not valid UTF-8", what);
}

static void check_strings_passed(const Corral__V1__Request *req) {
    check_clean(req->app, "app");
    if (req->body_case != CORRAL__V1__REQUEST__BODY_GENERATE || !req->generate) return;
    const Corral__V1__Generate *g = req->generate;
    check_clean(g->model, "generate.model");
    check_clean(g->prompt, "generate.prompt");
    check_clean(g->session, "generate.session");
    check_clean(g->constraint, "generate.constraint");
    for (size_t i = 0; i < g->n_messages; i++) {
        check_clean(g->messages[i]->role, "message role");
        check_clean(g->messages[i]->content, "message content");
    }
    for (size_t i = 0; i < g->n_stop; i++) check_clean(g->stop[i], "stop string");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Corral__V1__Request *req = corral__v1__request__unpack(NULL, size, data);
    if (!req) return 0;
    FUZZ_CHECK(req->app != NULL, "app NULL");
    corral_error err = {0};
    const corral_status strings = zproto_check_strings(data, size, &err);
    if (strings != CORRAL_OK) {
        FUZZ_CHECK(strings == CORRAL_INVALID_ARGUMENT, "string check status %d", (int)strings);
        const size_t n = strlen(err.message);
        FUZZ_CHECK(n > 0 && utf8_validate((const uint8_t *)err.message, n) == n,
                   "the string check's message is empty or not UTF-8");
        corral__v1__request__free_unpacked(req, NULL);
        return 0; /* refused before anything reads the request, as the front end does */
    }
    check_strings_passed(req);
    switch (req->body_case) {
        case CORRAL__V1__REQUEST__BODY_PING:
            FUZZ_CHECK(req->ping != NULL, "ping body NULL");
            break;
        case CORRAL__V1__REQUEST__BODY_CANCEL:
            FUZZ_CHECK(req->cancel != NULL, "cancel body NULL");
            (void)req->cancel->request_id;
            break;
        default:
            translate(req);
            break;
    }
    /* An Ack echoing the client's app name reads back as it was sent. */
    zproto_buf buf = {0};
    size_t n = zproto_pack_ack(&buf, req->id, req->app);
    FUZZ_CHECK(n > 0, "packing an ack failed");
    Corral__V1__Response *r = corral__v1__response__unpack(NULL, n, buf.data);
    FUZZ_CHECK(r && r->body_case == CORRAL__V1__RESPONSE__BODY_ACK &&
                   strcmp(r->ack->message, req->app) == 0,
               "ack does not read back");
    corral__v1__response__free_unpacked(r, NULL);
    zproto_buf_free(&buf);
    corral__v1__request__free_unpacked(req, NULL);
    return 0;
}
