/*
 * admin.c — libcorral's plain requests besides ping: Tokenize, ListModels, Status, Load, Unload,
 * Pin, Unpin. Each is one request and one reply; each result is copied out of the protobuf
 * message into one malloc'd block (struct, arrays, then the strings), so the caller frees it
 * with one call and never sees protobuf-c types. Enum values this library does not know (a newer
 * daemon may append some) pass through; the _name functions call them "unknown".
 */
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

/* ---- one-block results ------------------------------------------------------------------- */

/* A bump allocator over one block whose size was computed beforehand. */
typedef struct block {
    char *base;
    size_t used, size;
} block;

/* Bytes a string takes in a block (never NULL: absent strings become ""). */
static size_t block_str_size(const char *s) {
    return (s ? strlen(s) : 0) + 1;
}

/* Bytes an array of n elements of `size` takes, with room to align it. */
static size_t block_array_size(size_t n, size_t size) {
    return n * size + alignof(max_align_t);
}

static corral_status block_open(block *b, size_t size, corral_error *err) {
    b->base = calloc(1, size);
    b->used = 0;
    b->size = size;
    if (!b->base)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for a %zu-byte reply",
                                size);
    return CORRAL_OK;
}

static void *block_take(block *b, size_t n, size_t size) {
    size_t align = alignof(max_align_t);
    size_t at = (b->used + align - 1) / align * align;
    b->used = at + n * size;
    return b->base + at;
}

static const char *block_str(block *b, const char *s) {
    size_t len = s ? strlen(s) : 0;
    char *out = b->base + b->used;
    if (len) memcpy(out, s, len);
    out[len] = '\0';
    b->used += len + 1;
    return out;
}

/* ---- tokenize ---------------------------------------------------------------------------- */

corral_status corral_tokenize(corral_client *c, const char *model, const char *text,
                              bool add_special, int timeout_ms, corral_tokens **out,
                              corral_error *err) {
    *out = NULL;
    Corral__V1__Tokenize tok = CORRAL__V1__TOKENIZE__INIT;
    tok.model = client__str(model);
    tok.text = client__str(text);
    tok.add_special = add_special;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = CORRAL__V1__REQUEST__BODY_TOKENIZE;
    req.tokenize = &tok;
    Corral__V1__Response *resp;
    corral_status st = client__call(c, &req, CORRAL__V1__RESPONSE__BODY_TOKENIZE, "Tokenize",
                                    timeout_ms, &resp, err);
    if (st != CORRAL_OK) return st;
    const Corral__V1__TokenizeReply *r = resp->tokenize;
    if (r->n_pieces != 0 && r->n_pieces != r->n_ids) {
        st = corral_error_set(err, CORRAL_PROTOCOL,
                              "corrald at %s sent %zu token ids but %zu pieces", c->endpoint,
                              r->n_ids, r->n_pieces);
        goto done;
    }
    size_t size = sizeof(corral_tokens) + block_array_size(r->n_ids, sizeof(int32_t)) +
                  block_array_size(r->n_pieces, sizeof(char *));
    for (size_t i = 0; i < r->n_pieces; i++) size += block_str_size(r->pieces[i]);
    block b;
    st = block_open(&b, size, err);
    if (st != CORRAL_OK) goto done;
    corral_tokens *t = block_take(&b, 1, sizeof *t);
    t->n = r->n_ids;
    t->ids = block_take(&b, r->n_ids, sizeof *t->ids);
    if (r->n_ids) memcpy(t->ids, r->ids, r->n_ids * sizeof *t->ids);
    if (r->n_pieces) {
        t->pieces = block_take(&b, r->n_pieces, sizeof *t->pieces);
        for (size_t i = 0; i < r->n_pieces; i++) t->pieces[i] = (char *)block_str(&b, r->pieces[i]);
    }
    *out = t;
done:
    corral__v1__response__free_unpacked(resp, NULL);
    return st;
}

void corral_tokens_destroy(corral_tokens **t) {
    if (!t || !*t) return;
    free(*t);
    *t = NULL;
}

/* ---- models ------------------------------------------------------------------------------ */

static size_t adapters_size(Corral__V1__AdapterInfo *const *a, size_t n) {
    size_t size = block_array_size(n, sizeof(corral_adapter));
    for (size_t i = 0; i < n; i++) size += block_str_size(a[i]->path);
    return size;
}

static const corral_adapter *adapters_copy(block *b, Corral__V1__AdapterInfo *const *a, size_t n) {
    corral_adapter *out = block_take(b, n, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        out[i].path = block_str(b, a[i]->path);
        out[i].scale = a[i]->scale;
    }
    return out;
}

corral_status corral_list_models(corral_client *c, int timeout_ms, corral_model_list **out,
                                 corral_error *err) {
    *out = NULL;
    Corral__V1__ListModels list = CORRAL__V1__LIST_MODELS__INIT;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = CORRAL__V1__REQUEST__BODY_LIST_MODELS;
    req.list_models = &list;
    Corral__V1__Response *resp;
    corral_status st = client__call(c, &req, CORRAL__V1__RESPONSE__BODY_MODELS, "ListModels",
                                    timeout_ms, &resp, err);
    if (st != CORRAL_OK) return st;
    const Corral__V1__ModelList *r = resp->models;
    size_t size =
        sizeof(corral_model_list) + block_array_size(r->n_models, sizeof(corral_model_info));
    for (size_t i = 0; i < r->n_models; i++) {
        const Corral__V1__ModelInfo *m = r->models[i];
        size += block_str_size(m->name) + block_str_size(m->path) + block_str_size(m->arch) +
                block_str_size(m->chat_template) + adapters_size(m->adapters, m->n_adapters) +
                block_str_size(m->context_overflow);
    }
    block b;
    st = block_open(&b, size, err);
    if (st != CORRAL_OK) goto done;
    corral_model_list *l = block_take(&b, 1, sizeof *l);
    l->n_models = r->n_models;
    l->models = block_take(&b, r->n_models, sizeof *l->models);
    for (size_t i = 0; i < r->n_models; i++) {
        const Corral__V1__ModelInfo *m = r->models[i];
        corral_model_info *info = &l->models[i];
        info->name = block_str(&b, m->name);
        info->path = block_str(&b, m->path);
        info->arch = block_str(&b, m->arch);
        info->context = m->context;
        info->chat_template = block_str(&b, m->chat_template);
        info->state = (corral_model_state)m->state;
        info->pinned = m->pinned;
        info->n_adapters = m->n_adapters;
        info->adapters = adapters_copy(&b, m->adapters, m->n_adapters);
        info->context_overflow = block_str(&b, m->context_overflow);
    }
    *out = l;
done:
    corral__v1__response__free_unpacked(resp, NULL);
    return st;
}

void corral_model_list_destroy(corral_model_list **list) {
    if (!list || !*list) return;
    free(*list);
    *list = NULL;
}

/* ---- status ------------------------------------------------------------------------------ */

corral_status corral_client_status(corral_client *c, const char *model, int timeout_ms,
                                   corral_status_report **out, corral_error *err) {
    *out = NULL;
    Corral__V1__Status status = CORRAL__V1__STATUS__INIT;
    status.model = client__str(model);
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = CORRAL__V1__REQUEST__BODY_STATUS;
    req.status = &status;
    Corral__V1__Response *resp;
    corral_status st =
        client__call(c, &req, CORRAL__V1__RESPONSE__BODY_STATUS, "Status", timeout_ms, &resp, err);
    if (st != CORRAL_OK) return st;
    const Corral__V1__StatusReply *r = resp->status;
    const Corral__V1__DaemonStatus *d = r->daemon;
    size_t size = sizeof(corral_status_report) +
                  block_array_size(r->n_models, sizeof(corral_model_status)) +
                  block_str_size(d ? d->version : NULL);
    for (size_t i = 0; i < r->n_models; i++) {
        const Corral__V1__ModelStatus *m = r->models[i];
        size += block_str_size(m->name) + block_str_size(m->base_path) + block_str_size(m->error) +
                adapters_size(m->adapters, m->n_adapters);
    }
    block b;
    st = block_open(&b, size, err);
    if (st != CORRAL_OK) goto done;
    corral_status_report *rep = block_take(&b, 1, sizeof *rep);
    rep->n_models = r->n_models;
    rep->models = block_take(&b, r->n_models, sizeof *rep->models);
    for (size_t i = 0; i < r->n_models; i++) {
        const Corral__V1__ModelStatus *m = r->models[i];
        corral_model_status *ms = &rep->models[i];
        ms->name = block_str(&b, m->name);
        ms->state = (corral_model_state)m->state;
        ms->bytes = m->bytes;
        ms->last_used_ms = m->last_used_ms;
        ms->queue_depth = m->queue_depth;
        ms->active = m->active;
        ms->requests_served = m->requests_served;
        ms->pinned = m->pinned;
        ms->sessions = m->sessions;
        ms->swap_ins = m->swap_ins;
        ms->swap_outs = m->swap_outs;
        ms->preload = m->preload;
        ms->ttl_ms = m->ttl_ms;
        ms->base_path = block_str(&b, m->base_path);
        ms->n_adapters = m->n_adapters;
        ms->adapters = adapters_copy(&b, m->adapters, m->n_adapters);
        ms->merges = m->merges;
        ms->last_load_ms = m->last_load_ms;
        ms->loads = m->loads;
        ms->steps = m->steps;
        ms->step_sequences = m->step_sequences;
        ms->error = block_str(&b, m->error);
    }
    corral_daemon_status *ds = &rep->daemon;
    ds->version = block_str(&b, d ? d->version : NULL);
    if (d) {
        ds->uptime_ms = d->uptime_ms;
        ds->total_bytes = d->total_bytes;
        ds->limit_bytes = d->limit_bytes;
        ds->active = d->active;
        ds->queued = d->queued;
        ds->requests_served = d->requests_served;
        ds->sessions = d->sessions;
        ds->threads = d->threads;
        ds->allocated_bytes = d->allocated_bytes;
        ds->front_allocated_bytes = d->front_allocated_bytes;
        ds->heap_bytes = d->heap_bytes;
    }
    *out = rep;
done:
    corral__v1__response__free_unpacked(resp, NULL);
    return st;
}

void corral_status_report_destroy(corral_status_report **report) {
    if (!report || !*report) return;
    free(*report);
    *report = NULL;
}

/* ---- load, unload, pin, unpin ------------------------------------------------------------ */

/* The four model commands share one shape: a message with just the model name, answered by Ack.
 * Their protobuf-c structs are distinct types, so each gets its own body on the stack. */
static corral_status model_command(corral_client *c, Corral__V1__Request__BodyCase body,
                                   const char *model, bool flag, corral_progress_cb on_progress,
                                   void *user, int timeout_ms, corral_error *err) {
    Corral__V1__Load load = CORRAL__V1__LOAD__INIT;
    Corral__V1__Unload unload = CORRAL__V1__UNLOAD__INIT;
    Corral__V1__Pin pin = CORRAL__V1__PIN__INIT;
    Corral__V1__Unpin unpin = CORRAL__V1__UNPIN__INIT;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = body;
    const char *what = "";
    switch (body) {
        case CORRAL__V1__REQUEST__BODY_LOAD:
            load.model = client__str(model);
            load.progress = on_progress != NULL;
            req.load = &load;
            what = "Load";
            break;
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
            unload.model = client__str(model);
            unload.force = flag;
            req.unload = &unload;
            what = "Unload";
            break;
        case CORRAL__V1__REQUEST__BODY_PIN:
            pin.model = client__str(model);
            pin.progress = on_progress != NULL;
            req.pin = &pin;
            what = "Pin";
            break;
        default:
            unpin.model = client__str(model);
            req.unpin = &unpin;
            what = "Unpin";
            break;
    }
    Corral__V1__Response *resp;
    c->awaited_progress = on_progress;
    c->awaited_progress_user = user;
    corral_status st =
        client__call(c, &req, CORRAL__V1__RESPONSE__BODY_ACK, what, timeout_ms, &resp, err);
    c->awaited_progress = NULL;
    c->awaited_progress_user = NULL;
    if (st != CORRAL_OK) return st;
    corral__v1__response__free_unpacked(resp, NULL);
    return CORRAL_OK;
}

corral_status corral_load(corral_client *c, const char *model, int timeout_ms, corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_LOAD, model, false, NULL, NULL, timeout_ms,
                         err);
}

corral_status corral_load_with_progress(corral_client *c, const char *model, int timeout_ms,
                                        corral_progress_cb on_progress, void *user,
                                        corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_LOAD, model, false, on_progress, user,
                         timeout_ms, err);
}

corral_status corral_unload(corral_client *c, const char *model, int timeout_ms,
                            corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_UNLOAD, model, false, NULL, NULL, timeout_ms,
                         err);
}

corral_status corral_unload_force(corral_client *c, const char *model, bool force, int timeout_ms,
                                  corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_UNLOAD, model, force, NULL, NULL, timeout_ms,
                         err);
}

corral_status corral_pin(corral_client *c, const char *model, int timeout_ms, corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_PIN, model, false, NULL, NULL, timeout_ms,
                         err);
}

corral_status corral_pin_with_progress(corral_client *c, const char *model, int timeout_ms,
                                       corral_progress_cb on_progress, void *user,
                                       corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_PIN, model, false, on_progress, user,
                         timeout_ms, err);
}

corral_status corral_unpin(corral_client *c, const char *model, int timeout_ms, corral_error *err) {
    return model_command(c, CORRAL__V1__REQUEST__BODY_UNPIN, model, false, NULL, NULL, timeout_ms,
                         err);
}

/* ---- names ------------------------------------------------------------------------------- */

static const char *const model_state_names[] = {
    [CORRAL_MODEL_UNSPECIFIED] = "unspecified", [CORRAL_MODEL_UNLOADED] = "unloaded",
    [CORRAL_MODEL_LOADING] = "loading",         [CORRAL_MODEL_RESIDENT] = "resident",
    [CORRAL_MODEL_SWAPPED] = "swapped",         [CORRAL_MODEL_BROKEN] = "broken",
};

static const char *const progress_phase_names[] = {
    [CORRAL_PHASE_UNSPECIFIED] = "unspecified", [CORRAL_PHASE_PREFILL] = "prefill",
    [CORRAL_PHASE_LOADING] = "loading",         [CORRAL_PHASE_MERGING] = "merging",
    [CORRAL_PHASE_REPACKING] = "repacking",     [CORRAL_PHASE_QUANTIZING] = "quantizing",
};

const char *corral_progress_phase_name(corral_progress_phase phase) {
    size_t i = (size_t)phase;
    return i < sizeof progress_phase_names / sizeof *progress_phase_names ? progress_phase_names[i]
                                                                          : "unknown";
}

const char *corral_model_state_name(corral_model_state state) {
    size_t i = (size_t)state;
    return i < sizeof model_state_names / sizeof *model_state_names ? model_state_names[i]
                                                                    : "unknown";
}
