/*
 * swap.c — session images in the swap directory (see swap.h).
 */
#include "swap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/image.h"
#include "corral/log.h"
#include "corral/paths.h"
#include "corral/tensor.h"

#define SWAP_KIND   "kv-session"
#define SWAP_PREFIX "session-"

/* An image an earlier corrald left: whose session it holds. Sessions of this run are the core's
 * own records (session.c); these answer for the images no session has claimed yet. */
typedef struct swap_owner {
    char *app, *session;
} swap_owner;

struct swap_dir {
    char *path;
    bool writable;
    int64_t max_age_ms;
    swap_owner *owners; /* one per image kept by the scan */
    size_t n_owners;
};

static void session_path(const swap_dir *d, const swap_session_key *key, char *out, size_t size);

/* Remember whose session the image at path holds (its app and id, as written beside its cache).
 * An image whose name is not the hash of what it says it holds is not indexed: nothing of it is
 * trusted. */
static void owner_index(swap_dir *d, const char *path, const image *im) {
    const gguf_file *f = image_gguf(im);
    gguf_str app, session;
    corral_error err;
    if (gguf_get_str(f, "corral.session.app", &app, &err) != CORRAL_OK ||
        gguf_get_str(f, "corral.session.id", &session, &err) != CORRAL_OK)
        return;
    char *a = strndup(app.data, app.len), *s = strndup(session.data, session.len);
    swap_owner *grown = a && s ? realloc(d->owners, (d->n_owners + 1) * sizeof *grown) : NULL;
    char expected[PATH_MAX];
    if (grown) {
        d->owners = grown;
        session_path(d, &(swap_session_key){.app = a, .session = s}, expected, sizeof expected);
    }
    if (!grown || strlen(a) != app.len || strlen(s) != session.len || strcmp(expected, path) != 0) {
        free(a);
        free(s);
        return;
    }
    d->owners[d->n_owners++] = (swap_owner){.app = a, .session = s};
}

/* Remove leftovers, expired and bad images; count what is kept. */
static void swap_scan(swap_dir *d, int64_t max_age_ms, swap_scan_report *rep) {
    const time_t now = time(NULL);
    DIR *dir = opendir(d->path);
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, SWAP_PREFIX, strlen(SWAP_PREFIX)) != 0) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", d->path, e->d_name);
        if (strstr(e->d_name, ".part.") || strstr(e->d_name, ".tmp.")) {
            if (unlink(path) == 0) rep->temp_removed++;
            continue;
        }
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
        struct stat st;
        if (stat(path, &st) == 0 && (int64_t)(now - st.st_mtime) * 1000 > max_age_ms) {
            if (unlink(path) == 0) rep->images_removed++;
            continue;
        }
        image_problem problem;
        corral_error err;
        image *im = image_open(path, SWAP_KIND, NULL, IMAGE_VERIFY_FULL, &problem, &err);
        if (im) {
            rep->images_kept++;
            owner_index(d, path, im);
            image_destroy(&im);
        } else {
            log_warn("swap image discarded", LOG_STR("path", path),
                     LOG_STR("problem", image_problem_name(problem)));
            if (unlink(path) == 0) rep->images_removed++;
        }
    }
    closedir(dir);
}

swap_dir *swap_dir_open(const char *path, int64_t max_age_ms, swap_scan_report *report) {
    swap_scan_report local = {0};
    if (!report) report = &local;
    memset(report, 0, sizeof *report);
    swap_dir *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        return NULL;
    }
    d->max_age_ms = max_age_ms;
    corral_error why;
    if (paths_make_dir(path, &why) != CORRAL_OK) {
        log_warn("swap directory cannot be created: state will be dropped instead of swapped",
                 LOG_STR("path", path), LOG_STR("error", why.message));
        return d;
    }
    /* Writable? Try it: permissions alone do not tell (read-only mounts, full disks, root). */
    char probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/.corral-probe.%d", path, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        d->writable = true;
    } else {
        log_warn("swap directory is not writable: state will be dropped instead of swapped",
                 LOG_STR("path", path), LOG_STR("error", strerror(errno)));
    }
    swap_scan(d, max_age_ms, report);
    return d;
}

void swap_dir_destroy(swap_dir **pd) {
    if (!pd || !*pd) return;
    for (size_t i = 0; i < (*pd)->n_owners; i++) {
        free((*pd)->owners[i].app);
        free((*pd)->owners[i].session);
    }
    free((*pd)->owners);
    free((*pd)->path);
    free(*pd);
    *pd = NULL;
}

bool swap_dir_writable(const swap_dir *d) {
    return d && d->writable;
}

const char *swap_dir_path(const swap_dir *d) {
    return d->path;
}

static void session_path(const swap_dir *d, const swap_session_key *key, char *out, size_t size) {
    /* hash(app NUL session) names the file: ids are client strings, never paths. */
    size_t a = strlen(key->app), s = strlen(key->session);
    char *buf = malloc(a + s + 1);
    uint64_t h = 0;
    if (buf) {
        memcpy(buf, key->app, a);
        buf[a] = '\0';
        memcpy(buf + a + 1, key->session, s);
        h = image_hash64(buf, a + s + 1, 0x636f7272616cull);
        free(buf);
    }
    snprintf(out, size, "%s/" SWAP_PREFIX "%016llx.gguf", d->path, (unsigned long long)h);
}

static corral_status session_fingerprint(const swap_session_key *key, char out[17],
                                         corral_error *err) {
    image_fingerprint fp;
    /* "-3": the model file's identity as the model loaded it (images of "-2", which took the
     * file's identity when written, are stale; "-1" had one tensor per layer). */
    image_fingerprint_init(&fp, "kv-session-3");
    if (!key->model_fingerprint || !key->model_fingerprint[0])
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "model '%s' has no file fingerprint (its file could not be read "
                                "when it was loaded): its session caches are not kept",
                                key->model_name);
    image_fingerprint_add_str(&fp, key->model_fingerprint);
    image_fingerprint_add_u64(&fp, key->context);
    image_fingerprint_add_u64(&fp, (uint64_t)key->kv_f32);
    image_fingerprint_add_str(&fp, key->app);
    image_fingerprint_add_str(&fp, key->session);
    image_fingerprint_add_str(&fp, key->model_name);
    image_fingerprint_hex(&fp, out);
    return CORRAL_OK;
}

/* Whether the cache has a layer il (kv_cache_rows answers NULL past the last). */
static bool cache_has_layer(const kv_cache *kv, uint32_t il) {
    size_t row_bytes;
    return kv_cache_rows(kv, il, 0, 0, &row_bytes) != NULL;
}

corral_status swap_session_write(swap_dir *d, const swap_session_key *key, const kv_cache *kv,
                                 const int32_t *tokens, uint32_t n, corral_error *err) {
    if (!d->writable)
        return corral_error_set(err, CORRAL_IO, "swap directory %s is not writable", d->path);
    char fingerprint[17];
    corral_status st = session_fingerprint(key, fingerprint, err);
    if (st != CORRAL_OK) return st;
    image_writer *w = image_writer_new(SWAP_KIND, fingerprint, err);
    if (!w) return err->status;
    gguf_builder *b = image_writer_builder(w);
    gguf_builder_set_str(b, "corral.session.app", key->app);
    gguf_builder_set_str(b, "corral.session.id", key->session);
    gguf_builder_set_str(b, "corral.session.model", key->model_name);
    gguf_builder_set_u32(b, "corral.session.positions", n);
    const int64_t ne_tokens[1] = {n};
    st = image_writer_add_tensor(w, "tokens", TENSOR_TYPE_I32, 1, ne_tokens, tokens, err);
    const uint32_t type = kv_cache_type(kv) == KV_TYPE_F32 ? TENSOR_TYPE_F32 : TENSOR_TYPE_F16;
    const size_t elem = type == TENSOR_TYPE_F32 ? 4 : 2;
    /* One tensor per layer, KV head and K or V: "k.<layer>.<head>", head_dim x positions. */
    for (uint32_t il = 0; st == CORRAL_OK && cache_has_layer(kv, il); il++)
        for (uint32_t h = 0; st == CORRAL_OK; h++) {
            size_t row_bytes;
            const void *k = kv_cache_rows(kv, il, h, 0, &row_bytes);
            if (!k) break;
            const void *v = kv_cache_rows(kv, il, h, 1, &row_bytes);
            /* A sliding layer holds only its newest positions: those from its first on. */
            const uint32_t first = kv_cache_layer_first(kv, il);
            const int64_t ne[2] = {(int64_t)(row_bytes / elem), n - (first < n ? first : n)};
            char name[32];
            snprintf(name, sizeof name, "k.%u.%u", il, h);
            st = image_writer_add_tensor(w, name, type, 2, ne, k, err);
            snprintf(name, sizeof name, "v.%u.%u", il, h);
            if (st == CORRAL_OK) st = image_writer_add_tensor(w, name, type, 2, ne, v, err);
        }
    char path[PATH_MAX];
    session_path(d, key, path, sizeof path);
    if (st == CORRAL_OK) st = image_writer_write(w, path, err);
    image_writer_destroy(&w);
    return st;
}

bool swap_session_exists(const swap_dir *d, const swap_session_key *key) {
    char path[PATH_MAX];
    session_path(d, key, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0;
}

bool swap_session_held_elsewhere(swap_dir *d, const char *session, const char *app) {
    const time_t now = time(NULL);
    for (size_t i = 0; i < d->n_owners; i++) {
        const swap_owner *o = &d->owners[i];
        if (strcmp(o->session, session) != 0 || strcmp(o->app, app) == 0) continue;
        char path[PATH_MAX];
        session_path(d, &(swap_session_key){.app = o->app, .session = o->session}, path,
                     sizeof path);
        struct stat st;
        if (stat(path, &st) != 0) continue; /* read back, moved or discarded since */
        if ((int64_t)(now - st.st_mtime) * 1000 > d->max_age_ms) {
            /* Unclaimed past the session time-to-live: expired, as the scan would have found. */
            unlink(path);
            continue;
        }
        return true;
    }
    return false;
}

void swap_session_discard(swap_dir *d, const swap_session_key *key) {
    char path[PATH_MAX];
    session_path(d, key, path, sizeof path);
    unlink(path);
}

corral_status swap_session_read(swap_dir *d, const swap_session_key *key, kv_cache *kv,
                                int32_t **tokens, uint32_t *n, corral_error *err) {
    char path[PATH_MAX], fingerprint[17];
    session_path(d, key, path, sizeof path);
    *tokens = NULL;
    *n = 0;
    corral_status st = session_fingerprint(key, fingerprint, err);
    if (st != CORRAL_OK) return st;
    image_problem problem;
    image *im = image_open(path, SWAP_KIND, fingerprint, IMAGE_VERIFY_FULL, &problem, err);
    if (!im) {
        unlink(path);
        return err->status;
    }
    const gguf_file *f = image_gguf(im);
    const gguf_tensor *tt = gguf_find_tensor(f, "tokens");
    const uint32_t type = kv_cache_type(kv) == KV_TYPE_F32 ? TENSOR_TYPE_F32 : TENSOR_TYPE_F16;
    st = CORRAL_OK;
    if (!tt || tt->type != TENSOR_TYPE_I32 || tt->n_dims != 1 || tt->ne[0] < 0 ||
        (uint64_t)tt->ne[0] > kv_cache_n_ctx(kv))
        st = corral_error_set(err, CORRAL_FORMAT, "%s: tokens tensor missing or too long", path);
    const uint32_t positions = st == CORRAL_OK ? (uint32_t)tt->ne[0] : 0;
    for (uint32_t il = 0; st == CORRAL_OK && cache_has_layer(kv, il); il++)
        for (uint32_t h = 0; st == CORRAL_OK; h++) {
            size_t row_bytes;
            if (!kv_cache_rows(kv, il, h, 0, &row_bytes)) break;
            for (int values = 0; values < 2 && st == CORRAL_OK; values++) {
                char name[32];
                snprintf(name, sizeof name, "%c.%u.%u", values ? 'v' : 'k', il, h);
                const gguf_tensor *t = gguf_find_tensor(f, name);
                /* Rows of the last positions: all of them, or a sliding layer's newest. */
                if (!t || t->type != type || t->n_dims != 2 || t->ne[1] < 0 ||
                    t->ne[1] > positions || t->size != (uint64_t)t->ne[1] * row_bytes)
                    st = corral_error_set(err, CORRAL_FORMAT,
                                          "%s: tensor %s is missing or does not fit the cache",
                                          path, name);
                else
                    st = kv_cache_load_rows(kv, il, h, values, t->data,
                                            positions - (uint32_t)t->ne[1], positions, err);
            }
        }
    if (st == CORRAL_OK) {
        *tokens = malloc((positions ? positions : 1) * sizeof **tokens);
        if (!*tokens)
            st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        else
            memcpy(*tokens, tt->data, positions * sizeof **tokens);
    }
    image_destroy(&im);
    unlink(path);
    if (st != CORRAL_OK) {
        kv_cache_truncate(kv, 0);
        return st;
    }
    *n = positions;
    return CORRAL_OK;
}
