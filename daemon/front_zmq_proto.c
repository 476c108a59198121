/*
 * front_zmq_proto.c — protobuf to core requests, core answers to protobuf (see the header).
 *
 * Packing builds each Response on the stack and packs it into the caller's reused buffer, so a
 * streamed token costs no allocation here. The enums of the two sides are mapped by tables, not
 * by casts, so that either side can grow without the other silently changing meaning.
 */
#include "front_zmq_proto.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corral/utf8.h"
#include "corral/version.h"

void zproto_buf_free(zproto_buf *b) {
    free(b->data);
    *b = (zproto_buf){0};
}

/* ---- requests -------------------------------------------------------------------------------- */

/* Read a varint at *p (before end); false when it is cut short or longer than 10 bytes. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        const uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

enum { ZPROTO_MAX_DEPTH = 16 };

/* Walk the wire bytes of a message of descriptor d and check every string field: valid UTF-8
 * and no NUL byte. protobuf-c promises neither (it copies a string's bytes and ends them with a
 * NUL, so whatever follows an embedded NUL would silently vanish). Malformed wire data is left to
 * the decoder to refuse. `field` is the path so far, for the message. */
static corral_status check_strings(const uint8_t *p, const uint8_t *end,
                                   const ProtobufCMessageDescriptor *d, const char *field,
                                   int depth, corral_error *err) {
    if (depth > ZPROTO_MAX_DEPTH)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "messages nested deeper than %d",
                                ZPROTO_MAX_DEPTH);
    while (p < end) {
        uint64_t key, len;
        if (!read_varint(&p, end, &key)) return CORRAL_OK;
        switch (key & 7) {
            case 0: /* varint */
                if (!read_varint(&p, end, &len)) return CORRAL_OK;
                continue;
            case 1: /* 64-bit */
                p += end - p < 8 ? end - p : 8;
                continue;
            case 5: /* 32-bit */
                p += end - p < 4 ? end - p : 4;
                continue;
            case 2: /* length-delimited */
                break;
            default:
                return CORRAL_OK;
        }
        if (!read_varint(&p, end, &len) || len > (uint64_t)(end - p)) return CORRAL_OK;
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                : NULL;
        char path[128];
        if (f) snprintf(path, sizeof path, "%s%s%s", field, field[0] ? "." : "", f->name);
        if (f && f->type == PROTOBUF_C_TYPE_STRING) {
            const size_t bad = utf8_validate(p, (size_t)len);
            if (bad < len)
                return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                        "field %s is not valid UTF-8 (byte %zu)", path, bad);
            if (memchr(p, '\0', (size_t)len))
                return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                        "field %s contains a NUL byte", path);
        } else if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            const corral_status st = check_strings(p, p + len, f->descriptor, path, depth + 1, err);
            if (st != CORRAL_OK) return st;
        }
        p += len;
    }
    return CORRAL_OK;
}

corral_status zproto_check_strings(const uint8_t *data, size_t len, corral_error *err) {
    return check_strings(data, data + len, &corral__v1__request__descriptor, "", 0, err);
}

static corral_status generate_to_core(const Corral__V1__Generate *g, core_generate *out,
                                      void **extra, corral_error *err) {
    *out = (core_generate){0};
    out->model = g->model;
    out->prompt = g->prompt[0] ? g->prompt : NULL;
    out->prompt_len = out->prompt ? strlen(out->prompt) : 0;
    if (g->n_messages) {
        core_message *msgs = calloc(g->n_messages, sizeof *msgs);
        if (!msgs) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < g->n_messages; i++)
            msgs[i] = (core_message){.role = g->messages[i]->role,
                                     .content = g->messages[i]->content,
                                     .content_len = strlen(g->messages[i]->content)};
        *extra = msgs;
        out->messages = msgs;
        out->n_messages = g->n_messages;
    }
    core_sampling *sp = &out->sampling;
#define WRAPPED(field)                   \
    do {                                 \
        if (g->field) {                  \
            sp->has_##field = true;      \
            sp->field = g->field->value; \
        }                                \
    } while (0)
    WRAPPED(max_tokens);
    WRAPPED(temperature);
    WRAPPED(top_k);
    WRAPPED(top_p);
    WRAPPED(min_p);
    WRAPPED(repeat_penalty);
    WRAPPED(presence_penalty);
    WRAPPED(frequency_penalty);
    WRAPPED(penalty_last_n);
    WRAPPED(seed);
#undef WRAPPED
    out->stop = (const char *const *)g->stop;
    out->n_stop = g->n_stop;
    out->stream = g->stream;
    switch (g->priority) {
        case CORRAL__V1__PRIORITY__PRIORITY_UNSPECIFIED:
            out->priority = 0;
            break;
        case CORRAL__V1__PRIORITY__PRIORITY_BACKGROUND:
            out->priority = CFG_PRIORITY_BACKGROUND;
            break;
        case CORRAL__V1__PRIORITY__PRIORITY_INTERACTIVE:
            out->priority = CFG_PRIORITY_INTERACTIVE;
            break;
        case CORRAL__V1__PRIORITY__PRIORITY_REALTIME:
            out->priority = CFG_PRIORITY_REALTIME;
            break;
        default:
            free(*extra);
            *extra = NULL;
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "unknown priority %d",
                                    (int)g->priority);
    }
    out->session = g->session;
    out->deadline_ms = g->deadline_ms;
    out->constraint = g->constraint;
    out->constraint_len = strlen(g->constraint);
    out->json_schema = g->json_schema;
    out->json_schema_len = strlen(g->json_schema);
    out->sanitizer = g->sanitizer;
    out->template_name = g->template_;
    return CORRAL_OK;
}

corral_status zproto_to_core(const Corral__V1__Request *req, core_request *out, void **extra,
                             corral_error *err) {
    *out = (core_request){0};
    *extra = NULL;
    switch (req->body_case) {
        case CORRAL__V1__REQUEST__BODY_GENERATE:
            out->kind = CORE_GENERATE;
            return generate_to_core(req->generate, &out->generate, extra, err);
        case CORRAL__V1__REQUEST__BODY_TOKENIZE:
            out->kind = CORE_TOKENIZE;
            out->tokenize.model = req->tokenize->model;
            out->tokenize.text = req->tokenize->text;
            out->tokenize.text_len = strlen(req->tokenize->text);
            out->tokenize.add_special = req->tokenize->add_special;
            return CORRAL_OK;
        case CORRAL__V1__REQUEST__BODY_LIST_MODELS:
            out->kind = CORE_LIST_MODELS;
            return CORRAL_OK;
        case CORRAL__V1__REQUEST__BODY_STATUS:
            out->kind = CORE_STATUS;
            out->target.model = req->status->model;
            return CORRAL_OK;
        case CORRAL__V1__REQUEST__BODY_LOAD:
            out->kind = CORE_LOAD;
            out->target.model = req->load->model;
            out->target.progress = req->load->progress;
            return CORRAL_OK;
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
            out->kind = CORE_UNLOAD;
            out->target.model = req->unload->model;
            out->target.force = req->unload->force;
            return CORRAL_OK;
        case CORRAL__V1__REQUEST__BODY_PIN:
            out->kind = CORE_PIN;
            out->target.model = req->pin->model;
            out->target.progress = req->pin->progress;
            return CORRAL_OK;
        case CORRAL__V1__REQUEST__BODY_UNPIN:
            out->kind = CORE_UNPIN;
            out->target.model = req->unpin->model;
            return CORRAL_OK;
        default:
            return corral_error_set(err, CORRAL_UNSUPPORTED,
                                    "request has no body this daemon understands (protocol "
                                    "version 1)");
    }
}

/* ---- responses ------------------------------------------------------------------------------- */

/* Pack r (its id set) into b, growing it as needed. */
static size_t pack(zproto_buf *b, Corral__V1__Response *r) {
    const size_t len = corral__v1__response__get_packed_size(r);
    if (len > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < len) cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        if (!grown) return 0;
        b->data = grown;
        b->cap = cap;
    }
    corral__v1__response__pack(r, b->data);
    return len;
}

size_t zproto_pack_error(zproto_buf *b, uint64_t id, corral_status code, const char *message) {
    Corral__V1__Error e = CORRAL__V1__ERROR__INIT;
    e.code = (Corral__V1__ErrorCode)(-code); /* the two tables agree row for row (test_status) */
    e.message = (char *)message;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = CORRAL__V1__RESPONSE__BODY_ERROR;
    r.error = &e;
    return pack(b, &r);
}

size_t zproto_pack_ack(zproto_buf *b, uint64_t id, const char *message) {
    Corral__V1__Ack a = CORRAL__V1__ACK__INIT;
    a.message = (char *)message;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = CORRAL__V1__RESPONSE__BODY_ACK;
    r.ack = &a;
    return pack(b, &r);
}

size_t zproto_pack_pong(zproto_buf *b, uint64_t id, uint64_t uptime_ms, const char *config_path) {
    Corral__V1__Pong p = CORRAL__V1__PONG__INIT;
    p.version = CORRAL_VERSION;
    p.protocol_version = CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    p.uptime_ms = uptime_ms;
    p.pid = (uint32_t)getpid();
    p.config_path = (char *)(config_path ? config_path : "");
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = CORRAL__V1__RESPONSE__BODY_PONG;
    r.pong = &p;
    return pack(b, &r);
}

/* The core's phases as the protocol's, by table (append-only on both sides). */
static const Corral__V1__ProgressPhase phase_to_proto[] = {
    [JOB_PHASE_PREFILL] = CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_PREFILL,
    [JOB_PHASE_LOADING] = CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_LOADING,
    [JOB_PHASE_MERGING] = CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_MERGING,
    [JOB_PHASE_REPACKING] = CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_REPACKING,
    [JOB_PHASE_QUANTIZING] = CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_QUANTIZING,
};

size_t zproto_pack_progress(zproto_buf *b, uint64_t id, const job_progress *jp, const char *model) {
    Corral__V1__Progress p = CORRAL__V1__PROGRESS__INIT;
    const size_t phase = (size_t)jp->phase;
    p.phase = phase < sizeof phase_to_proto / sizeof phase_to_proto[0]
                  ? phase_to_proto[phase]
                  : CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_UNSPECIFIED;
    p.done = jp->done;
    p.total = jp->total;
    /* The fields of clients from before phases: prefill only. */
    if (jp->phase == JOB_PHASE_PREFILL) {
        p.prefilled_tokens = (uint32_t)jp->done;
        p.total_tokens = (uint32_t)jp->total;
    }
    p.model = (char *)(model ? model : "");
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = CORRAL__V1__RESPONSE__BODY_PROGRESS;
    r.progress = &p;
    return pack(b, &r);
}

size_t zproto_pack_chunk(zproto_buf *b, uint64_t id, const job_text *t, uint32_t index) {
    Corral__V1__Chunk c = CORRAL__V1__CHUNK__INIT;
    char empty = '\0';
    c.text = t->len ? t->text : &empty;
    c.n_token_ids = t->n_ids;
    c.token_ids = t->ids;
    c.index = index;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = CORRAL__V1__RESPONSE__BODY_CHUNK;
    r.chunk = &c;
    return pack(b, &r);
}

static Corral__V1__StopReason stop_to_proto(core_stop s) {
    switch (s) {
        case CORE_STOP_EOG:
            return CORRAL__V1__STOP_REASON__STOP_REASON_EOG;
        case CORE_STOP_MAX_TOKENS:
            return CORRAL__V1__STOP_REASON__STOP_REASON_MAX_TOKENS;
        case CORE_STOP_STRING:
            return CORRAL__V1__STOP_REASON__STOP_REASON_STOP_STRING;
        case CORE_STOP_CONTEXT:
            return CORRAL__V1__STOP_REASON__STOP_REASON_CONTEXT_FULL;
        case CORE_STOP_CONSTRAINT:
            return CORRAL__V1__STOP_REASON__STOP_REASON_CONSTRAINT;
        case CORE_STOP_CANCELLED:
            return CORRAL__V1__STOP_REASON__STOP_REASON_CANCELLED;
    }
    return CORRAL__V1__STOP_REASON__STOP_REASON_UNSPECIFIED;
}

size_t zproto_pack_done(zproto_buf *b, uint64_t id, const core_done *d) {
    Corral__V1__Timings t = CORRAL__V1__TIMINGS__INIT;
    t.queue_us = (uint64_t)d->queue_us;
    t.load_us = (uint64_t)d->load_us;
    t.prefill_us = (uint64_t)d->prefill_us;
    t.decode_us = (uint64_t)d->decode_us;
    t.total_us = (uint64_t)d->total_us;
    Corral__V1__Done done = CORRAL__V1__DONE__INIT;
    done.stop_reason = stop_to_proto(d->stop);
    done.prompt_tokens = d->prompt_tokens;
    done.prefilled_tokens = d->prefilled_tokens;
    done.generated_tokens = d->generated_tokens;
    done.timings = &t;
    done.model = (char *)d->model;
    done.queue_steps = d->queue_steps;
    done.dropped_messages = d->dropped_messages;
    if (d->sanitizer_report) done.sanitizer_report = d->sanitizer_report;
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = CORRAL__V1__RESPONSE__BODY_DONE;
    r.done = &done;
    return pack(b, &r);
}

static Corral__V1__ModelState state_to_proto(core_model_state s) {
    switch (s) {
        case CORE_MODEL_UNLOADED:
            return CORRAL__V1__MODEL_STATE__MODEL_STATE_UNLOADED;
        case CORE_MODEL_LOADING:
            return CORRAL__V1__MODEL_STATE__MODEL_STATE_LOADING;
        case CORE_MODEL_RESIDENT:
            return CORRAL__V1__MODEL_STATE__MODEL_STATE_RESIDENT;
        case CORE_MODEL_SWAPPED:
            return CORRAL__V1__MODEL_STATE__MODEL_STATE_SWAPPED;
        case CORE_MODEL_BROKEN:
            return CORRAL__V1__MODEL_STATE__MODEL_STATE_BROKEN;
    }
    return CORRAL__V1__MODEL_STATE__MODEL_STATE_UNSPECIFIED;
}

/* A model's adapters as messages, in one allocation (pointers, then the messages); NULL when it
 * has none or memory runs out (the answer then lists none). */
static Corral__V1__AdapterInfo **adapters_to_proto(const core_model_info *m, size_t *n) {
    *n = 0;
    if (!m->n_adapters) return NULL;
    Corral__V1__AdapterInfo **ptrs =
        malloc(m->n_adapters * (sizeof *ptrs + sizeof(Corral__V1__AdapterInfo)));
    if (!ptrs) return NULL;
    Corral__V1__AdapterInfo *items = (Corral__V1__AdapterInfo *)(ptrs + m->n_adapters);
    for (size_t i = 0; i < m->n_adapters; i++) {
        corral__v1__adapter_info__init(&items[i]);
        items[i].path = m->adapters[i].path;
        items[i].scale = m->adapters[i].scale;
        ptrs[i] = &items[i];
    }
    *n = m->n_adapters;
    return ptrs;
}

static size_t pack_tokenize(zproto_buf *b, Corral__V1__Response *r, const core_reply *reply) {
    Corral__V1__TokenizeReply t = CORRAL__V1__TOKENIZE_REPLY__INIT;
    t.n_ids = reply->n_ids;
    t.ids = reply->ids;
    t.n_pieces = reply->n_ids;
    t.pieces = reply->pieces;
    r->body_case = CORRAL__V1__RESPONSE__BODY_TOKENIZE;
    r->tokenize = &t;
    return pack(b, r);
}

static size_t pack_models(zproto_buf *b, Corral__V1__Response *r, const core_reply *reply) {
    const size_t n = reply->n_models;
    Corral__V1__ModelInfo *items = calloc(n ? n : 1, sizeof *items);
    Corral__V1__ModelInfo **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    size_t len = 0;
    if (items && ptrs) {
        for (size_t i = 0; i < n; i++) {
            const core_model_info *m = &reply->models[i];
            Corral__V1__ModelInfo *mi = &items[i];
            corral__v1__model_info__init(mi);
            mi->name = m->name;
            mi->path = m->path;
            mi->arch = m->arch;
            mi->context = m->context;
            mi->chat_template = m->chat_template;
            mi->state = state_to_proto(m->state);
            mi->pinned = m->pinned;
            mi->adapters = adapters_to_proto(m, &mi->n_adapters);
            mi->context_overflow = (char *)(m->context_overflow ? m->context_overflow : "");
            ptrs[i] = mi;
        }
        Corral__V1__ModelList list = CORRAL__V1__MODEL_LIST__INIT;
        list.n_models = n;
        list.models = ptrs;
        r->body_case = CORRAL__V1__RESPONSE__BODY_MODELS;
        r->models = &list;
        len = pack(b, r);
        for (size_t i = 0; i < n; i++) free(items[i].adapters);
    }
    free(items);
    free(ptrs);
    return len;
}

static size_t pack_status(zproto_buf *b, Corral__V1__Response *r, const core_reply *reply) {
    const size_t n = reply->n_models;
    Corral__V1__ModelStatus *items = calloc(n ? n : 1, sizeof *items);
    Corral__V1__ModelStatus **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    size_t len = 0;
    if (items && ptrs) {
        for (size_t i = 0; i < n; i++) {
            const core_model_info *m = &reply->models[i];
            Corral__V1__ModelStatus *ms = &items[i];
            corral__v1__model_status__init(ms);
            ms->name = m->name;
            ms->state = state_to_proto(m->state);
            ms->bytes = m->bytes;
            ms->preload = m->preload;
            ms->ttl_ms = m->ttl_ms;
            ms->last_used_ms = m->last_used_ms;
            ms->queue_depth = m->queue_depth;
            ms->active = m->active;
            ms->requests_served = m->requests_served;
            ms->pinned = m->pinned;
            ms->sessions = m->sessions;
            ms->swap_ins = m->swap_ins;
            ms->swap_outs = m->swap_outs;
            ms->merges = m->merges;
            ms->last_load_ms = m->last_load_ms;
            ms->loads = m->loads;
            ms->steps = m->steps;
            ms->step_sequences = m->step_sequences;
            if (m->n_adapters) ms->base_path = m->path;
            if (m->error) ms->error = m->error;
            ms->adapters = adapters_to_proto(m, &ms->n_adapters);
            ptrs[i] = ms;
        }
        const core_daemon_info *di = &reply->daemon;
        Corral__V1__DaemonStatus d = CORRAL__V1__DAEMON_STATUS__INIT;
        d.version = CORRAL_VERSION;
        d.uptime_ms = di->uptime_ms;
        d.total_bytes = di->total_bytes;
        d.limit_bytes = di->limit_bytes;
        d.active = di->active;
        d.queued = di->queued;
        d.requests_served = di->requests_served;
        d.sessions = di->sessions;
        d.threads = di->threads;
        d.allocated_bytes = di->allocated_bytes;
        d.front_allocated_bytes = di->front_allocated_bytes;
        d.heap_bytes = di->heap_bytes;
        Corral__V1__StatusReply sr = CORRAL__V1__STATUS_REPLY__INIT;
        sr.n_models = n;
        sr.models = ptrs;
        sr.daemon = &d;
        r->body_case = CORRAL__V1__RESPONSE__BODY_STATUS;
        r->status = &sr;
        len = pack(b, r);
        for (size_t i = 0; i < n; i++) free(items[i].adapters);
    }
    free(items);
    free(ptrs);
    return len;
}

size_t zproto_pack_reply(zproto_buf *b, uint64_t id, const core_reply *reply) {
    Corral__V1__Response r = CORRAL__V1__RESPONSE__INIT;
    r.id = id;
    switch (reply->kind) {
        case CORE_TOKENIZE:
            return pack_tokenize(b, &r, reply);
        case CORE_LIST_MODELS:
            return pack_models(b, &r, reply);
        case CORE_STATUS:
            return pack_status(b, &r, reply);
        case CORE_LOAD:
        case CORE_UNLOAD:
        case CORE_PIN:
        case CORE_UNPIN:
        case CORE_GENERATE:
            break;
    }
    return zproto_pack_ack(b, id, reply->message);
}
