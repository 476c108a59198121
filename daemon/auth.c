/*
 * auth.c — auth tables: peers to apps (see auth.h).
 *
 * A table copies, from each configured app, its name and the three lists that say who may act as
 * it: uids, gids and CURVE public keys (kept as z85 text, which is unique per key, so a peer's key
 * is compared as text). Lookups walk the apps in config order; configs hold a handful of apps, and
 * the walk is a few comparisons per request.
 */
#include "auth.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct auth_app {
    char name[AUTH_APP_MAX];
    uint32_t *uids;
    size_t n_uids;
    uint32_t *gids;
    size_t n_gids;
    char (*keys)[CURVE_KEY_TEXT];
    size_t n_keys;
} auth_app;

struct auth_table {
    atomic_uint refs;
    bool owner_enabled; /* auth.owner */
    uint32_t owner_uid; /* corrald's effective uid */
    auth_app *apps;
    size_t n_apps;
};

static void table_free(auth_table *t) {
    for (size_t i = 0; i < t->n_apps; i++) {
        free(t->apps[i].uids);
        free(t->apps[i].gids);
        free(t->apps[i].keys);
    }
    free(t->apps);
    free(t);
}

/* A copy of n ids (NULL for none). */
static bool copy_ids(const uint32_t *ids, size_t n, uint32_t **out) {
    *out = NULL;
    if (!n) return true;
    *out = malloc(n * sizeof **out);
    if (!*out) return false;
    memcpy(*out, ids, n * sizeof **out);
    return true;
}

auth_table *auth_table_new(const cfg *c, corral_error *err) {
    auth_table *t = calloc(1, sizeof *t);
    if (!t || (c->n_apps && !(t->apps = calloc(c->n_apps, sizeof *t->apps)))) {
        free(t);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    atomic_init(&t->refs, 1);
    t->owner_enabled = c->auth_owner;
    t->owner_uid = (uint32_t)geteuid();
    for (size_t i = 0; i < c->n_apps; i++) {
        const cfg_app *ca = &c->apps[i];
        auth_app *a = &t->apps[i];
        t->n_apps++;
        /* Names were checked by the config loader (at most 63 bytes). */
        snprintf(a->name, sizeof a->name, "%s", ca->name);
        if (!copy_ids(ca->uids, ca->n_uids, &a->uids) ||
            !copy_ids(ca->gids, ca->n_gids, &a->gids) ||
            (ca->n_curve_keys && !(a->keys = calloc(ca->n_curve_keys, sizeof *a->keys)))) {
            corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            table_free(t);
            return NULL;
        }
        a->n_uids = ca->n_uids;
        a->n_gids = ca->n_gids;
        for (size_t k = 0; k < ca->n_curve_keys; k++) {
            if (!curve_key_valid(ca->curve_keys[k])) {
                corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                 "app '%s': curve_keys entry %zu is not a CURVE public key",
                                 ca->name, k + 1);
                table_free(t);
                return NULL;
            }
            memcpy(a->keys[k], ca->curve_keys[k], CURVE_KEY_TEXT);
        }
        a->n_keys = ca->n_curve_keys;
    }
    return t;
}

auth_table *auth_table_ref(auth_table *t) {
    if (t) atomic_fetch_add(&t->refs, 1);
    return t;
}

void auth_table_release(auth_table **pt) {
    if (!pt || !*pt) return;
    if (atomic_fetch_sub(&(*pt)->refs, 1) == 1) table_free(*pt);
    *pt = NULL;
}

static bool has_id(const uint32_t *ids, size_t n, uint32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* Whether peer may act as app a. */
static bool app_lists(const auth_app *a, const auth_peer *p) {
    if (p->via == AUTH_VIA_IPC)
        return has_id(a->uids, a->n_uids, p->uid) || has_id(a->gids, a->n_gids, p->gid);
    for (size_t k = 0; k < a->n_keys; k++)
        if (strcmp(a->keys[k], p->key) == 0) return true;
    return false;
}

/* The owner: corrald's own user over ipc, when auth.owner allows it and no app claims the uid. */
static bool is_owner(const auth_table *t, const auth_peer *p) {
    if (p->via != AUTH_VIA_IPC || !t->owner_enabled || p->uid != t->owner_uid) return false;
    for (size_t i = 0; i < t->n_apps; i++)
        if (has_id(t->apps[i].uids, t->apps[i].n_uids, p->uid)) return false;
    return true;
}

/* Why nothing lists peer, for the refusal. */
static corral_status refuse_unlisted(const auth_table *t, const auth_peer *p, corral_error *err) {
    char who[128];
    auth_peer_describe(p, who, sizeof who);
    if (p->via == AUTH_VIA_CURVE)
        return corral_error_set(err, CORRAL_PERMISSION_DENIED, "%s is not in any app's curve_keys",
                                who);
    if (p->uid == t->owner_uid && !t->owner_enabled)
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "%s: corrald's own user, but auth.owner is false and no app lists "
                                "uid %u or gid %u",
                                who, (unsigned)p->uid, (unsigned)p->gid);
    return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                            "%s: no app lists uid %u in its uids or gid %u in its gids", who,
                            (unsigned)p->uid, (unsigned)p->gid);
}

corral_status auth_admit(const auth_table *t, const auth_peer *p, corral_error *err) {
    if (is_owner(t, p)) return CORRAL_OK;
    for (size_t i = 0; i < t->n_apps; i++)
        if (app_lists(&t->apps[i], p)) return CORRAL_OK;
    return refuse_unlisted(t, p, err);
}

corral_status auth_select(const auth_table *t, const auth_peer *p, const char *requested,
                          auth_grant *out, corral_error *err) {
    memset(out, 0, sizeof *out);
    if (!requested) requested = "";
    if (strlen(requested) >= sizeof out->app)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "Request.app is longer than %d bytes",
                                AUTH_APP_MAX - 1);
    if (is_owner(t, p)) {
        /* The owner is trusted with everything: it acts as itself, or as any app it names. */
        out->owner = true;
        snprintf(out->app, sizeof out->app, "%s", requested[0] ? requested : AUTH_OWNER_APP);
        return CORRAL_OK;
    }
    const auth_app *first = NULL;
    for (size_t i = 0; i < t->n_apps; i++) {
        const auth_app *a = &t->apps[i];
        if (!app_lists(a, p)) continue;
        if (!first) first = a;
        if (!requested[0] || strcmp(a->name, requested) == 0) {
            snprintf(out->app, sizeof out->app, "%s", a->name);
            return CORRAL_OK;
        }
    }
    if (!first) return refuse_unlisted(t, p, err);
    char who[128];
    auth_peer_describe(p, who, sizeof who);
    /* Whether the named app exists is not said: the client learns what it is entitled to. */
    char mine[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < t->n_apps && len < sizeof mine; i++)
        if (app_lists(&t->apps[i], p))
            len += (size_t)snprintf(mine + len, sizeof mine - len, "%s%s", len ? ", " : "",
                                    t->apps[i].name);
    return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                            "Request.app '%s' is not an app this connection may act as (%s may "
                            "act as: %s)",
                            requested, who, mine);
}

/* Parse a decimal uint32 of n bytes at s. */
static bool parse_u32(const char *s, size_t n, uint32_t *out) {
    if (n == 0 || n > 10) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

corral_status auth_peer_from_zap(auth_via via, const char *mechanism, size_t mechanism_len,
                                 const char *address, size_t address_len,
                                 const unsigned char *credentials, size_t credentials_len,
                                 auth_peer *out, corral_error *err) {
    memset(out, 0, sizeof *out);
    out->via = via;
    const char *want = via == AUTH_VIA_IPC ? "NULL" : "CURVE";
    if (mechanism_len != strlen(want) || memcmp(mechanism, want, mechanism_len) != 0)
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "a %s connection must use the %s mechanism, not %.*s",
                                via == AUTH_VIA_IPC ? "ipc" : "tcp", want,
                                (int)(mechanism_len < 16 ? mechanism_len : 16), mechanism);
    if (via == AUTH_VIA_CURVE) {
        if (credentials_len != CURVE_KEY_BYTES)
            return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                    "a CURVE connection without a 32-byte client key");
        curve_key_encode(credentials, out->key);
        return CORRAL_OK;
    }
    /* "...:UID:GID:PID": the last three fields. */
    size_t end = address_len, fields[3][2];
    for (int f = 2; f >= 0; f--) {
        size_t start = end;
        while (start > 0 && address[start - 1] != ':') start--;
        if (start == 0)
            return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                    "an ipc connection whose peer credentials are unknown (libzmq "
                                    "without SO_PEERCRED?)");
        fields[f][0] = start;
        fields[f][1] = end - start;
        end = start - 1;
    }
    if (!parse_u32(address + fields[0][0], fields[0][1], &out->uid) ||
        !parse_u32(address + fields[1][0], fields[1][1], &out->gid) ||
        !parse_u32(address + fields[2][0], fields[2][1], &out->pid))
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "an ipc connection whose peer credentials do not parse");
    return CORRAL_OK;
}

size_t auth_peer_format(const auth_peer *p, char *buf, size_t size) {
    const int n = p->via == AUTH_VIA_IPC ? snprintf(buf, size, "ipc:%u:%u:%u", (unsigned)p->uid,
                                                    (unsigned)p->gid, (unsigned)p->pid)
                                         : snprintf(buf, size, "curve:%s", p->key);
    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

corral_status auth_peer_parse(const char *text, auth_peer *out) {
    memset(out, 0, sizeof *out);
    if (!text) return CORRAL_PERMISSION_DENIED;
    if (strncmp(text, "curve:", 6) == 0) {
        if (!curve_key_valid(text + 6)) return CORRAL_PERMISSION_DENIED;
        out->via = AUTH_VIA_CURVE;
        memcpy(out->key, text + 6, CURVE_KEY_TEXT);
        return CORRAL_OK;
    }
    if (strncmp(text, "ipc:", 4) != 0) return CORRAL_PERMISSION_DENIED;
    const char *s = text + 4;
    uint32_t *dst[3] = {&out->uid, &out->gid, &out->pid};
    for (int f = 0; f < 3; f++) {
        const size_t n = strcspn(s, ":");
        if (!parse_u32(s, n, dst[f]) || (f < 2 ? s[n] != ':' : s[n] != '\0'))
            return CORRAL_PERMISSION_DENIED;
        s += n + (f < 2);
    }
    out->via = AUTH_VIA_IPC;
    return CORRAL_OK;
}

void auth_peer_describe(const auth_peer *p, char *buf, size_t size) {
    if (p->via == AUTH_VIA_IPC)
        snprintf(buf, size, "uid %u gid %u pid %u", (unsigned)p->uid, (unsigned)p->gid,
                 (unsigned)p->pid);
    else
        snprintf(buf, size, "CURVE key %s", p->key);
}
