/*
 * generate.c — libcorral's generations: building a Generate request from corral_generate_params,
 * the per-generation queue that the client's read loop fills (bounded by the client's queue
 * limit; an overflowing generation is cancelled rather than buffered without end), polling it,
 * cancelling it, and the blocking calls (corral_generate, corral_generate_text, corral_chat) that
 * are a poll loop over the same handle.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

/* ---- building the request ---------------------------------------------------------------- */

/* Storage for the wrapper messages and chat messages of one Generate while it is packed. */
typedef struct generate_wire {
    Corral__V1__Generate gen;
    Corral__V1__UInt32Value max_tokens;
    Corral__V1__FloatValue temperature, top_p, min_p, repeat_penalty, presence_penalty,
        frequency_penalty;
    Corral__V1__Int32Value top_k, penalty_last_n;
    Corral__V1__UInt64Value seed;
    Corral__V1__ChatMessage *messages;  /* n_messages entries */
    Corral__V1__ChatMessage **pointers; /* what protobuf-c wants */
} generate_wire;

static corral_status generate_wire_build(generate_wire *w, const corral_generate_params *p,
                                         const corral_message *messages, size_t n_messages,
                                         bool stream, corral_error *err) {
    memset(w, 0, sizeof *w);
    Corral__V1__Generate init = CORRAL__V1__GENERATE__INIT;
    w->gen = init;
    Corral__V1__Generate *g = &w->gen;
    g->model = client__str(p->model);
    g->prompt = client__str(p->prompt);
    if (n_messages > 0 && !messages)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "n_messages is %zu but messages is NULL", n_messages);
    if (p->n_stop > 0 && !p->stop)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "n_stop is %zu but stop is NULL",
                                p->n_stop);
    if (n_messages > 0) {
        w->messages = calloc(n_messages, sizeof *w->messages);
        w->pointers = calloc(n_messages, sizeof *w->pointers);
        if (!w->messages || !w->pointers)
            return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for %zu messages",
                                    n_messages);
        for (size_t i = 0; i < n_messages; i++) {
            Corral__V1__ChatMessage m = CORRAL__V1__CHAT_MESSAGE__INIT;
            m.role = client__str(messages[i].role);
            m.content = client__str(messages[i].content);
            w->messages[i] = m;
            w->pointers[i] = &w->messages[i];
        }
        g->n_messages = n_messages;
        g->messages = w->pointers;
    }
#define WRAP_(field, type, INIT)   \
    if (p->has_##field) {          \
        type v_ = INIT;            \
        w->field = v_;             \
        w->field.value = p->field; \
        g->field = &w->field;      \
    }
    WRAP_(max_tokens, Corral__V1__UInt32Value, CORRAL__V1__UINT32_VALUE__INIT)
    WRAP_(temperature, Corral__V1__FloatValue, CORRAL__V1__FLOAT_VALUE__INIT)
    WRAP_(top_k, Corral__V1__Int32Value, CORRAL__V1__INT32_VALUE__INIT)
    WRAP_(top_p, Corral__V1__FloatValue, CORRAL__V1__FLOAT_VALUE__INIT)
    WRAP_(min_p, Corral__V1__FloatValue, CORRAL__V1__FLOAT_VALUE__INIT)
    WRAP_(repeat_penalty, Corral__V1__FloatValue, CORRAL__V1__FLOAT_VALUE__INIT)
    WRAP_(presence_penalty, Corral__V1__FloatValue, CORRAL__V1__FLOAT_VALUE__INIT)
    WRAP_(frequency_penalty, Corral__V1__FloatValue, CORRAL__V1__FLOAT_VALUE__INIT)
    WRAP_(penalty_last_n, Corral__V1__Int32Value, CORRAL__V1__INT32_VALUE__INIT)
    WRAP_(seed, Corral__V1__UInt64Value, CORRAL__V1__UINT64_VALUE__INIT)
#undef WRAP_
    g->n_stop = p->n_stop;
    g->stop = (char **)p->stop;
    for (size_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i])
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "stop string %zu is NULL", i);
    g->stream = stream;
    g->priority = (Corral__V1__Priority)p->priority;
    g->session = client__str(p->session);
    g->deadline_ms = p->deadline_ms;
    g->constraint = client__str(p->constraint);
    g->json_schema = client__str(p->json_schema);
    g->sanitizer = client__str(p->sanitizer);
    g->template_ = client__str(p->chat_template);
    return CORRAL_OK;
}

static void generate_wire_release(generate_wire *w) {
    free(w->messages);
    free(w->pointers);
}

/* ---- the generation handle --------------------------------------------------------------- */

static corral_status generation_start(corral_client *c, const corral_generate_params *p,
                                      const corral_message *messages, size_t n_messages,
                                      bool stream, corral_generation **out, corral_error *err) {
    *out = NULL;
    if (!c || !p)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s is NULL",
                                c ? "params" : "client");
    if (c->awaited_id)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "the client is waiting for a reply (it is used by one thread at a "
                                "time, and not from its callbacks)");
    corral_generation *g = calloc(1, sizeof *g);
    if (!g) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    generate_wire w;
    corral_status st = generate_wire_build(&w, p, messages, n_messages, stream, err);
    if (st == CORRAL_OK) {
        Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
        req.body_case = CORRAL__V1__REQUEST__BODY_GENERATE;
        req.generate = &w.gen;
        st = client__send(c, &req, err);
        g->id = req.id;
    }
    generate_wire_release(&w);
    if (st != CORRAL_OK) {
        free(g);
        return st;
    }
    g->client = c;
    g->next = c->generations;
    if (c->generations) c->generations->prev = g;
    c->generations = g;
    *out = g;
    return CORRAL_OK;
}

corral_generation *corral_generate_start(corral_client *c, const corral_generate_params *p,
                                         corral_error *err) {
    bool stream = !p || p->stream != CORRAL_STREAM_OFF;
    corral_generation *g;
    generation_start(c, p, p ? p->messages : NULL, p ? p->n_messages : 0, stream, &g, err);
    return g;
}

void generation__fail(corral_generation *g, corral_status status, const char *message) {
    if (g->finished) return;
    g->finished = true;
    g->final_status = status;
    corral_error_set(&g->error, status, "%s", message);
    if (g->client && !g->cancel_sent) {
        g->cancel_sent = true;
        client__send_cancel(g->client, g->id, NULL);
    }
}

static void generation_take_done(corral_generation *g, const Corral__V1__Done *d) {
    corral_done *out = &g->done;
    memset(out, 0, sizeof *out);
    out->stop_reason = (corral_stop_reason)d->stop_reason;
    out->prompt_tokens = d->prompt_tokens;
    out->prefilled_tokens = d->prefilled_tokens;
    out->generated_tokens = d->generated_tokens;
    if (d->timings) {
        out->timings.queue_us = d->timings->queue_us;
        out->timings.load_us = d->timings->load_us;
        out->timings.prefill_us = d->timings->prefill_us;
        out->timings.decode_us = d->timings->decode_us;
        out->timings.total_us = d->timings->total_us;
    }
    snprintf(out->model, sizeof out->model, "%s", d->model ? d->model : "");
    out->queue_steps = d->queue_steps;
    out->dropped_messages = d->dropped_messages;
    snprintf(out->sanitizer_report, sizeof out->sanitizer_report, "%s",
             d->sanitizer_report ? d->sanitizer_report : "");
}

void generation__accept(corral_generation *g, Corral__V1__Response *resp, size_t wire_size) {
    char why[256];
    g->heard = true;
    switch (resp->body_case) {
        case CORRAL__V1__RESPONSE__BODY_CHUNK: {
            if (g->overflowed) break;
            if (resp->chunk->index != g->expected_index) {
                snprintf(why, sizeof why,
                         "corrald sent chunk %u of generation %llu where chunk %u was due",
                         resp->chunk->index, (unsigned long long)g->id, g->expected_index);
                generation__fail(g, CORRAL_PROTOCOL, why);
                break;
            }
            g->expected_index++;
            size_t cost = wire_size + CLIENT_QUEUE_OVERHEAD;
            /* An empty queue always takes one chunk, so a generation that is polled makes progress
             * whatever the limit. */
            if (g->head && g->queued_bytes + cost > g->client->queue_limit) {
                g->overflowed = true;
                if (!g->cancel_sent) {
                    g->cancel_sent = true;
                    client__send_cancel(g->client, g->id, NULL);
                }
                break;
            }
            client__queued *q = malloc(sizeof *q);
            if (!q) {
                generation__fail(g, CORRAL_OUT_OF_MEMORY, "out of memory for a chunk");
                break;
            }
            q->resp = resp;
            q->cost = cost;
            q->next = NULL;
            if (g->tail)
                g->tail->next = q;
            else
                g->head = q;
            g->tail = q;
            g->queued_bytes += cost;
            return; /* the queue owns resp now */
        }
        case CORRAL__V1__RESPONSE__BODY_PROGRESS:
            client__progress_from(resp->progress, &g->progress);
            if (g->progress.phase == CORRAL_PHASE_PREFILL) {
                g->prefilled = (uint32_t)g->progress.done;
                g->prefill_total = (uint32_t)g->progress.total;
            }
            break;
        case CORRAL__V1__RESPONSE__BODY_DONE:
            g->finished = true;
            if (g->overflowed) {
                g->final_status = CORRAL_RESOURCE_EXHAUSTED;
                corral_error_set(
                    &g->error, CORRAL_RESOURCE_EXHAUSTED,
                    "generation %llu was cancelled: more than %zu bytes of its output "
                    "queued up while the caller waited on other requests (poll it more "
                    "often, or raise the client's queue limit)",
                    (unsigned long long)g->id, g->client->queue_limit);
            } else {
                g->final_status = CORRAL_OK;
                generation_take_done(g, resp->done);
            }
            break;
        case CORRAL__V1__RESPONSE__BODY_ERROR:
            g->finished = true;
            g->final_status = client__error_from(resp->error, &g->error);
            if (g->overflowed && g->final_status == CORRAL_CANCELLED) {
                g->final_status = CORRAL_RESOURCE_EXHAUSTED;
                corral_error_set(&g->error, CORRAL_RESOURCE_EXHAUSTED,
                                 "generation %llu was cancelled: its queue overflowed",
                                 (unsigned long long)g->id);
            }
            break;
        default:
            snprintf(why, sizeof why, "corrald answered generation %llu with %s",
                     (unsigned long long)g->id, client__body_name(resp->body_case));
            generation__fail(g, CORRAL_PROTOCOL, why);
            break;
    }
    corral__v1__response__free_unpacked(resp, NULL);
}

void generation__detach(corral_generation *g) {
    g->client = NULL;
    g->prev = g->next = NULL;
    if (!g->finished) {
        g->finished = true;
        g->final_status = CORRAL_UNAVAILABLE;
        corral_error_set(&g->error, CORRAL_UNAVAILABLE,
                         "the client of generation %llu was destroyed before it ended",
                         (unsigned long long)g->id);
    }
}

static void generation_drop_current(corral_generation *g) {
    if (g->current) corral__v1__response__free_unpacked(g->current, NULL);
    g->current = NULL;
}

int corral_generation_poll(corral_generation *g, int timeout_ms, corral_chunk *chunk,
                           corral_done *done, corral_error *err) {
    generation_drop_current(g);
    int64_t deadline = client__deadline(timeout_ms);
    for (;;) {
        if (g->head) {
            client__queued *q = g->head;
            g->head = q->next;
            if (!g->head) g->tail = NULL;
            g->queued_bytes -= q->cost;
            g->current = q->resp;
            free(q);
            const Corral__V1__Chunk *ch = g->current->chunk;
            if (chunk) {
                chunk->text = ch->text ? ch->text : "";
                chunk->text_len = strlen(chunk->text);
                chunk->token_ids = ch->token_ids;
                chunk->n_token_ids = ch->n_token_ids;
                chunk->index = ch->index;
            }
            return CORRAL_POLL_CHUNK;
        }
        if (g->finished) {
            if (g->final_status == CORRAL_OK) {
                if (done) *done = g->done;
                return CORRAL_POLL_DONE;
            }
            if (err) *err = g->error;
            return g->final_status;
        }
        corral_error perr;
        corral_status st = client__pump(g->client, deadline, &perr);
        if (st == CORRAL_DEADLINE_EXCEEDED) return CORRAL_POLL_NOTHING;
        if (st != CORRAL_OK) generation__fail(g, st, perr.message);
    }
}

corral_status corral_generation_cancel(corral_generation *g, corral_error *err) {
    if (g->finished || g->cancel_sent || !g->client) return CORRAL_OK;
    corral_status st = client__send_cancel(g->client, g->id, err);
    if (st == CORRAL_OK) g->cancel_sent = true;
    return st;
}

void corral_generation_progress(const corral_generation *g, uint32_t *prefilled, uint32_t *total) {
    if (prefilled) *prefilled = g->prefilled;
    if (total) *total = g->prefill_total;
}

void corral_generation_progress_info(const corral_generation *g, corral_progress_info *out) {
    *out = g->progress;
}

uint64_t corral_generation_id(const corral_generation *g) {
    return g->id;
}

void corral_generation_destroy(corral_generation **pg) {
    if (!pg || !*pg) return;
    corral_generation *g = *pg;
    corral_client *c = g->client;
    if (c) {
        if (!g->finished && !g->cancel_sent) client__send_cancel(c, g->id, NULL);
        if (g->prev)
            g->prev->next = g->next;
        else
            c->generations = g->next;
        if (g->next) g->next->prev = g->prev;
    }
    generation_drop_current(g);
    while (g->head) {
        client__queued *q = g->head;
        g->head = q->next;
        corral__v1__response__free_unpacked(q->resp, NULL);
        free(q);
    }
    free(g);
    *pg = NULL;
}

/* ---- blocking calls ---------------------------------------------------------------------- */

static corral_status generate_blocking(corral_client *c, const corral_generate_params *p,
                                       const corral_message *messages, size_t n_messages,
                                       bool stream, corral_chunk_fn on_chunk, void *user,
                                       corral_done *done, int timeout_ms, corral_error *err) {
    int64_t deadline = client__deadline(timeout_ms);
    corral_generation *g;
    corral_status st = generation_start(c, p, messages, n_messages, stream, &g, err);
    if (st != CORRAL_OK) return st;
    bool cancelled = false;
    for (;;) {
        int left = -1;
        if (deadline >= 0) {
            int64_t ms = deadline - client__now_ms();
            left = ms > 0 ? (int)ms : 0;
        }
        corral_chunk chunk;
        corral_done d;
        int r = corral_generation_poll(g, left, &chunk, &d, err);
        if (r == CORRAL_POLL_CHUNK) {
            if (!cancelled && on_chunk && on_chunk(&chunk, user) != 0) {
                cancelled = true;
                st = corral_generation_cancel(g, err);
                if (st != CORRAL_OK) break;
            }
        } else if (r == CORRAL_POLL_DONE) {
            if (done) *done = d;
            st = CORRAL_OK;
            break;
        } else if (r == CORRAL_POLL_NOTHING) {
            /* Say which it was: the daemon never took it up (queued, or waiting for its model
             * without reporting), or it ran and did not finish. */
            if (g->heard)
                st = corral_error_set(err, CORRAL_DEADLINE_EXCEEDED,
                                      "the generation on corrald at %s did not end within %d ms "
                                      "(it was cancelled)",
                                      c->endpoint, timeout_ms);
            else
                st = corral_error_set(err, CORRAL_DEADLINE_EXCEEDED,
                                      "corrald at %s sent nothing for the generation within %d "
                                      "ms: it did not start (it was cancelled)",
                                      c->endpoint, timeout_ms);
            break;
        } else {
            st = (corral_status)r;
            break;
        }
    }
    corral_generation_destroy(&g);
    return st;
}

corral_status corral_generate(corral_client *c, const corral_generate_params *p,
                              corral_chunk_fn on_chunk, void *user, corral_done *done,
                              int timeout_ms, corral_error *err) {
    if (!p) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "params are NULL");
    bool stream =
        p->stream == CORRAL_STREAM_AUTO ? on_chunk != NULL : p->stream == CORRAL_STREAM_ON;
    return generate_blocking(c, p, p->messages, p->n_messages, stream, on_chunk, user, done,
                             timeout_ms, err);
}

corral_status corral_chat(corral_client *c, const corral_generate_params *p,
                          const corral_message *messages, size_t n_messages,
                          corral_chunk_fn on_chunk, void *user, corral_done *done, int timeout_ms,
                          corral_error *err) {
    if (!p) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "params are NULL");
    if (p->prompt || p->messages || p->n_messages)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "corral_chat takes the messages as arguments: params must not "
                                "set prompt or messages");
    bool stream =
        p->stream == CORRAL_STREAM_AUTO ? on_chunk != NULL : p->stream == CORRAL_STREAM_ON;
    return generate_blocking(c, p, messages, n_messages, stream, on_chunk, user, done, timeout_ms,
                             err);
}

/* A growing text buffer for corral_generate_text. */
typedef struct text_sink {
    char *data;
    size_t len, cap;
    bool oom;
} text_sink;

static int text_sink_append(const corral_chunk *chunk, void *user) {
    text_sink *s = user;
    if (s->len + chunk->text_len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + chunk->text_len + 1) cap *= 2;
        char *data = realloc(s->data, cap);
        if (!data) {
            s->oom = true;
            return 1; /* cancel: the text could not be kept */
        }
        s->data = data;
        s->cap = cap;
    }
    memcpy(s->data + s->len, chunk->text, chunk->text_len);
    s->len += chunk->text_len;
    s->data[s->len] = '\0';
    return 0;
}

corral_status corral_generate_text(corral_client *c, const corral_generate_params *p, char **text,
                                   size_t *text_len, corral_done *done, int timeout_ms,
                                   corral_error *err) {
    *text = NULL;
    if (text_len) *text_len = 0;
    if (!p) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "params are NULL");
    text_sink sink = {0};
    bool stream = p->stream == CORRAL_STREAM_ON;
    corral_status st = generate_blocking(c, p, p->messages, p->n_messages, stream, text_sink_append,
                                         &sink, done, timeout_ms, err);
    if (st == CORRAL_OK && sink.oom)
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for %zu bytes of text",
                              sink.len);
    if (st == CORRAL_OK && !sink.data) {
        sink.data = calloc(1, 1);
        if (!sink.data) st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    if (st != CORRAL_OK) {
        free(sink.data);
        return st;
    }
    *text = sink.data;
    if (text_len) *text_len = sink.len;
    return CORRAL_OK;
}

/* ---- names ------------------------------------------------------------------------------- */

static const char *const stop_reason_names[] = {
    [CORRAL_STOP_UNSPECIFIED] = "unspecified",   [CORRAL_STOP_EOG] = "eog",
    [CORRAL_STOP_MAX_TOKENS] = "max_tokens",     [CORRAL_STOP_STOP_STRING] = "stop_string",
    [CORRAL_STOP_CONTEXT_FULL] = "context_full", [CORRAL_STOP_CONSTRAINT] = "constraint",
    [CORRAL_STOP_CANCELLED] = "cancelled",
};

static const char *const priority_names[] = {
    [CORRAL_PRIORITY_DEFAULT] = "default",
    [CORRAL_PRIORITY_BACKGROUND] = "background",
    [CORRAL_PRIORITY_INTERACTIVE] = "interactive",
    [CORRAL_PRIORITY_REALTIME] = "realtime",
};

const char *corral_stop_reason_name(corral_stop_reason reason) {
    size_t i = (size_t)reason;
    return i < sizeof stop_reason_names / sizeof *stop_reason_names ? stop_reason_names[i]
                                                                    : "unknown";
}

const char *corral_priority_name(corral_priority priority) {
    size_t i = (size_t)priority;
    return i < sizeof priority_names / sizeof *priority_names ? priority_names[i] : "unknown";
}

int corral_priority_from_name(const char *name, corral_priority *out) {
    for (size_t i = 0; name && i < sizeof priority_names / sizeof *priority_names; i++) {
        if (strcmp(name, priority_names[i]) == 0) {
            *out = (corral_priority)i;
            return 0;
        }
    }
    return -1;
}
