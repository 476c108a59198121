/*
 * model_repack.c — putting a loaded model's matrices into panel layout (kernels.h), the layout of
 * the fast matrix-product kernels, and keeping that layout between loads.
 *
 * Which weights: every matrix the forward pass multiplies by (the layers' projections and the
 * output, also when the output is the tied token embedding, whose rows forward_get_row then takes
 * out of the panels) of a type whose panel kernel the process's kernel path has, with at least
 * one whole panel of rows. Reference mode keeps the file's layout (it dequantizes rows).
 *
 * Where the panels live. With a cache directory (model_params.cache_dir), in a corral image
 * (image.h) of kind "repacked-model" named repack-<file name>-<fingerprint>.gguf, holding just the
 * repacked tensors under their own names, types and shapes. The fingerprint covers the model
 * file's identity at load (path, size, modification time, inode, edges), the layout version and the
 * list of tensors repacked, so an edited model or another choice of tensors never meets a stale
 * image. The first load writes the image (packing one tensor at a time straight from the file
 * mapping, atomically renamed into place); every later load maps it, checks the tensors' names,
 * types and shapes against the model file, and binds the weights to it: loading then costs no
 * packing, and the process never touches the model file's copy of those weights, so memory holds
 * one copy. The image's tensor bytes are not hashed at every load (that would read the whole file):
 * like a model file's own weights, wrong bytes there could give wrong numbers but never an access
 * out of bounds, and image_open still checks the whole structure.
 *
 * Without a cache directory, or when the image cannot be written (a read-only or full disk: logged
 * as a warning), the panels go into memory of the model's own, filled at load; the file's pages
 * of each repacked tensor are then given back (MADV_DONTNEED) so that the process still holds one
 * copy of each weight.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/image.h"
#include "corral/log.h"
#include "corral/paths.h"
#include "model_impl.h"

/* The kind of image, and the version of the panel layout: a change of layout makes every older
 * image stale (the fingerprint covers it). */
#define REPACK_IMAGE_KIND      "repacked-model"
#define REPACK_LAYOUT          "panel16-v2" /* v2: Q6_K codes rearranged (kernels_panel.c) */
#define REPACK_KEY_LAYOUT      "corral.repack.layout"
#define REPACK_IMAGE_ALIGNMENT 64u

struct model_packed {
    void *mem; /* in-memory panels, or NULL */
    size_t bytes;
    image *img; /* the mapped image, or NULL */
    char *path; /* the image's path, or NULL */
};

typedef struct repack_plan repack_plan;

/* A distinct tensor to repack (the tied output and token_embd are one; so are the views of a
 * fused tensor). */
typedef struct repack_item {
    repack_plan *plan;    /* the plan it belongs to (progress) */
    const gguf_tensor *t; /* in the model file */
    const void *src;
    uint32_t type;
    int64_t n_in, n_out;
    size_t bytes, offset;
    const void *dst; /* where its panels are, once made */
} repack_item;

struct repack_plan {
    repack_item *items;
    size_t n_items, total;
    corral_progress progress; /* model_params.repack_progress */
    size_t n_packed;          /* items packed so far, for it */
};

/* Whether slot i's weight goes into panels on this kernel path. A view of a fused tensor's rows
 * (arch.h) is packed as part of the whole tensor, which gives it panels of its own only when it
 * starts on a panel boundary and ends on one or at the tensor's end (its leftover rows are then
 * the tensor's). */
static int repack_wanted(const struct model *m, const kernel_ops *ops, size_t i,
                         const model_weight *w) {
    if (!w->data || w->n_out < KERNEL_PANEL_ROWS) return 0;
    /* The untied embedding is only ever read by rows. */
    if (i == ARCH_ROLE_TOKEN_EMBD && !m->hp.tied_output) return 0;
    if (w->row0 % KERNEL_PANEL_ROWS != 0 ||
        (w->n_out % KERNEL_PANEL_ROWS != 0 && w->row0 + w->n_out != w->tensor->ne[1]))
        return 0;
    return kernels_panel_layout_known((tensor_type)w->type) && ops->type[w->type].panel_dot;
}

static corral_status repack_make_plan(struct model *m, const kernel_ops *ops, repack_plan *plan,
                                      corral_error *err) {
    const size_t n_slots = model_n_slots(m);
    plan->items = calloc(n_slots, sizeof *plan->items);
    if (!plan->items) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n_slots; i++) {
        const model_weight *w = model_slot(m, i);
        if (!repack_wanted(m, ops, i, w)) continue;
        int seen = 0;
        for (size_t k = 0; k < plan->n_items && !seen; k++) seen = plan->items[k].t == w->tensor;
        if (seen) continue;
        /* The whole file tensor, of which the weight may be a view. */
        const int64_t n_out = w->tensor->ne[1];
        const size_t bytes = (size_t)n_out * w->row_bytes;
        plan->items[plan->n_items++] = (repack_item){.plan = plan,
                                                     .t = w->tensor,
                                                     .src = w->tensor->data,
                                                     .type = w->type,
                                                     .n_in = w->n_in,
                                                     .n_out = n_out,
                                                     .bytes = bytes,
                                                     .offset = plan->total};
        /* In memory, each tensor on a cache line of its own. */
        plan->total += (bytes + 63) / 64 * 64;
    }
    return CORRAL_OK;
}

void model__populate(const void *p, size_t n) {
#if defined(MADV_POPULATE_READ)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)p & ~(page - 1);
    /* EINVAL on kernels before 5.14: the pages then come in by faults, as without the call. */
    if (n > 0) madvise((void *)a, (uintptr_t)p + n - a, MADV_POPULATE_READ);
#else
    (void)p;
    (void)n;
#endif
}

/* Drop the pages wholly inside [p, p + n) from this process's mapping of the file. */
static void release_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    const uintptr_t b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

static void repack_item_pack(const repack_item *it, void *dst) {
    kernels_panel_pack((tensor_type)it->type, it->src, it->n_in, it->n_out, 0,
                       it->n_out / KERNEL_PANEL_ROWS, dst);
    release_pages(it->src, it->bytes);
    repack_plan *plan = it->plan;
    corral_progress_report(&plan->progress, ++plan->n_packed, plan->n_items);
}

/* ---- in memory ------------------------------------------------------------------------------- */

/* The in-memory panels start on a 2 MiB boundary and are advised MADV_HUGEPAGE before they are
 * written, so that the kernel backs them with 2 MiB pages where it can: the matrix products stream
 * them like the image's (gguf.c, map_file). */
#define REPACK_MEMORY_ALIGNMENT ((size_t)2 << 20)

static corral_status repack_in_memory(struct model_packed *pk, repack_plan *plan,
                                      corral_error *err) {
    void *mem = NULL;
    if (posix_memalign(&mem, REPACK_MEMORY_ALIGNMENT, plan->total) != 0)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY,
                                "cannot allocate %zu bytes for the repacked weights", plan->total);
#if defined(MADV_HUGEPAGE)
    madvise(mem, plan->total / REPACK_MEMORY_ALIGNMENT * REPACK_MEMORY_ALIGNMENT, MADV_HUGEPAGE);
#endif
    pk->mem = mem;
    pk->bytes = plan->total;
    plan->n_packed = 0; /* (after an image that could not be written: packed anew) */
    for (size_t k = 0; k < plan->n_items; k++) {
        repack_item *it = &plan->items[k];
        repack_item_pack(it, (char *)mem + it->offset);
        it->dst = (char *)mem + it->offset;
    }
    return CORRAL_OK;
}

/* ---- the image ------------------------------------------------------------------------------- */

static corral_status repack_fill(void *user, const char *name, void *dst, uint64_t size,
                                 corral_error *err) {
    const repack_item *it = user;
    if (size != it->bytes)
        return corral_error_set(err, CORRAL_INTERNAL, "tensor %s: %llu bytes to fill, not %zu",
                                name, (unsigned long long)size, it->bytes);
    repack_item_pack(it, dst);
    return CORRAL_OK;
}

/* The image's path for this model file and plan: <dir>/repack-<file name>-<fingerprint>.gguf. */
static corral_status repack_image_path(const struct model *m, const char *dir,
                                       const repack_plan *plan, char *fp_hex, char *path,
                                       size_t size, corral_error *err) {
    image_fingerprint fp;
    image_fingerprint_init(&fp, "corral-repack-1");
    image_fingerprint_add_str(&fp, REPACK_LAYOUT);
    /* The file as it was when the model was loaded (and as it still is, if it is mapped again:
     * model_weights_restore checks its stamp first). */
    if (!m->file_fingerprint[0])
        return corral_error_set(err, CORRAL_IO, "%s could not be read for its fingerprint",
                                gguf_path(m->file));
    image_fingerprint_add_str(&fp, m->file_fingerprint);
    for (size_t k = 0; k < plan->n_items; k++) {
        image_fingerprint_add_bytes(&fp, plan->items[k].t->name.data, plan->items[k].t->name.len);
        image_fingerprint_add_u64(&fp, plan->items[k].type);
    }
    image_fingerprint_hex(&fp, fp_hex);
    const char *file = strrchr(gguf_path(m->file), '/');
    file = file ? file + 1 : gguf_path(m->file);
    const size_t stem = strlen(file) > 5 && strcmp(file + strlen(file) - 5, ".gguf") == 0
                            ? strlen(file) - 5
                            : strlen(file);
    const int n = snprintf(path, size, "%s/" MODEL_REPACK_FILE_PREFIX "%.*s-%s.gguf", dir,
                           (int)stem, file, fp_hex);
    if (n < 0 || (size_t)n >= size)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "cache path too long in %s", dir);
    return CORRAL_OK;
}

/* Map the image at path and bind the plan's items to its tensors; NULL when it is missing, stale
 * or does not hold exactly the tensors planned (the caller then writes it anew). */
static image *repack_open_image(const char *path, const char *fp_hex, repack_plan *plan) {
    image_problem problem;
    corral_error err;
    image *img = image_open(path, REPACK_IMAGE_KIND, fp_hex, IMAGE_VERIFY_METADATA, &problem, &err);
    if (!img) {
        if (problem != IMAGE_PROBLEM_MISSING)
            log_warn("repacked weights image unusable, writing it again",
                     LOG_STR("reason", err.message));
        return NULL;
    }
    const gguf_file *f = image_gguf(img);
    for (size_t k = 0; k < plan->n_items; k++) {
        repack_item *it = &plan->items[k];
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)it->t->name.len, it->t->name.data);
        const gguf_tensor *t = gguf_find_tensor(f, name);
        if (!t || t->type != it->type || t->ne[0] != it->n_in || t->ne[1] != it->n_out ||
            t->size != it->bytes) {
            log_warn("repacked weights image does not match the model, writing it again",
                     LOG_STR("image", path), LOG_STR("tensor", name));
            image_destroy(&img);
            return NULL;
        }
        it->dst = t->data;
    }
    return img;
}

static corral_status repack_write_image(const char *path, const char *fp_hex, repack_plan *plan,
                                        corral_error *err) {
    image_writer *w = image_writer_new(REPACK_IMAGE_KIND, fp_hex, err);
    if (!w) return err ? err->status : CORRAL_OUT_OF_MEMORY;
    gguf_builder *b = image_writer_builder(w);
    image_writer_set_pace(w, &plan->progress);
    corral_status st = gguf_builder_set_str(b, REPACK_KEY_LAYOUT, REPACK_LAYOUT);
    if (st == CORRAL_OK) st = gguf_builder_set_u32(b, "general.alignment", REPACK_IMAGE_ALIGNMENT);
    if (st != CORRAL_OK) corral_error_set(err, st, "%s: out of memory", path);
    for (size_t k = 0; st == CORRAL_OK && k < plan->n_items; k++) {
        repack_item *it = &plan->items[k];
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)it->t->name.len, it->t->name.data);
        const int64_t ne[2] = {it->n_in, it->n_out};
        st = image_writer_add_tensor_fill(w, name, it->type, 2, ne, repack_fill, it, err);
    }
    if (st == CORRAL_OK) st = image_writer_write(w, path, err);
    image_writer_destroy(&w);
    return st;
}

/* Bind the plan to an image in dir, writing it first when needed. CORRAL_OK with pk->img set, or
 * an error (the caller falls back to memory). */
static corral_status repack_with_image(const struct model *m, const char *dir,
                                       struct model_packed *pk, repack_plan *plan,
                                       corral_error *err) {
    char fp_hex[IMAGE_FINGERPRINT_CHARS + 1], path[4096];
    corral_status st = repack_image_path(m, dir, plan, fp_hex, path, sizeof path, err);
    if (st != CORRAL_OK) return st;
    st = paths_make_dir(dir, err); /* the cache folder and its missing parents, mode 0700 */
    if (st != CORRAL_OK) return st;
    pk->img = repack_open_image(path, fp_hex, plan);
    if (!pk->img) {
        st = repack_write_image(path, fp_hex, plan, err);
        if (st != CORRAL_OK) return st;
        pk->img = repack_open_image(path, fp_hex, plan);
        if (!pk->img)
            return corral_error_set(err, CORRAL_IO, "%s: written but not readable back", path);
        log_info("repacked weights written", LOG_STR("image", path));
    } else {
        /* For the least-recently-used trimming of the directory (image_dir_trim). */
        image_touch(path, NULL);
    }
    pk->path = strdup(path);
    /* The first token reads every weight: map the image's pages now, in one system call, rather
     * than in a thousand faults during that token (measured: 3 ms here, 10-15 ms saved there,
     * for a 600 MB image). */
    const gguf_file *f = image_gguf(pk->img);
    gguf_advise_pages(f, gguf_file_data(f), gguf_file_size(f), GGUF_PAGES_STREAMED);
    model__populate(gguf_file_data(f), gguf_file_size(f));
    return CORRAL_OK;
}

/* ---- model__repack --------------------------------------------------------------------------- */

corral_status model__repack(struct model *m, corral_error *err) {
    if (m->params.compute == MODEL_COMPUTE_REFERENCE || m->params.keep_file_layout)
        return CORRAL_OK;
    const kernel_ops *ops = kernels_get(err);
    if (!ops) return err ? err->status : CORRAL_UNSUPPORTED;
    repack_plan plan = {.progress = m->params.repack_progress};
    corral_status st = repack_make_plan(m, ops, &plan, err);
    if (st != CORRAL_OK || plan.n_items == 0) {
        free(plan.items);
        return st;
    }
    struct model_packed *pk = calloc(1, sizeof *pk);
    if (!pk) {
        free(plan.items);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    st = CORRAL_INTERNAL;
    if (m->params.cache_dir) {
        corral_error ierr = {0};
        st = repack_with_image(m, m->params.cache_dir, pk, &plan, &ierr);
        if (st != CORRAL_OK) {
            log_warn("cannot keep repacked weights in the cache directory; repacking in memory",
                     LOG_STR("cache_dir", m->params.cache_dir), LOG_STR("reason", ierr.message));
            image_destroy(&pk->img);
        }
    }
    if (st != CORRAL_OK) st = repack_in_memory(pk, &plan, err);
    if (st != CORRAL_OK) {
        model__packed_destroy(&pk);
        free(plan.items);
        return st;
    }
    for (size_t i = 0; i < model_n_slots(m); i++) {
        model_weight *w = model_slot(m, i);
        if (!repack_wanted(m, ops, i, w)) continue;
        for (size_t k = 0; k < plan.n_items; k++) {
            if (plan.items[k].t != w->tensor) continue;
            /* A panel holds as many bytes as its 16 rows: a view's panels start at its row. */
            w->data = (const char *)plan.items[k].dst + w->row0 * (int64_t)w->row_bytes;
            w->panels = 1;
            break;
        }
    }
    log_debug("weights in panel layout", LOG_UINT("tensors", plan.n_items),
              LOG_STR("image", pk->path ? pk->path : "(memory)"));
    m->packed = pk;
    free(plan.items);
    return CORRAL_OK;
}

void model__unpack(struct model *m) {
    if (!m->packed) return;
    for (size_t i = 0; i < model_n_slots(m); i++) {
        model_weight *w = model_slot(m, i);
        w->data = w->file_data;
        w->panels = 0;
    }
    model__packed_destroy(&m->packed);
}

void model__packed_destroy(struct model_packed **p) {
    if (!p || !*p) return;
    free((*p)->mem);
    image_destroy(&(*p)->img);
    free((*p)->path);
    free(*p);
    *p = NULL;
}

const gguf_file *model__packed_gguf(const struct model *m) {
    return m->packed && m->packed->img ? image_gguf(m->packed->img) : NULL;
}

const char *model_repack_path(const model *m) {
    return m->packed ? m->packed->path : NULL;
}
