/*
 * front_http_access.c — who may call corrald's HTTP API: bearer keys mapped to apps, the default
 * app for loopback clients without a key, and the browser origins CORS lets in.
 *
 * Keys are read once at startup from their files (http.keys) and compared in constant time. The
 * app a key maps to is all the HTTP front end establishes: the app's rules (models, priority
 * ceiling, sanitizer, ...) are the core's to apply, exactly as for ZeroMQ clients.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "front_http_impl.h"

enum { HTTP_MAX_KEYS = 256, HTTP_KEY_MIN = 16, HTTP_KEY_MAX = 512 };

typedef struct hkey {
    char key[HTTP_KEY_MAX];
    size_t len;
    char app[64];
} hkey;

struct http_keys {
    hkey *keys;
    size_t n;
};

static corral_status read_key(const cfg_http_key *k, hkey *out, corral_error *err) {
    FILE *fp = fopen(k->key_file, "r");
    if (!fp)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "http.keys: key file %s: %s",
                                k->key_file, strerror(errno));
    char line[HTTP_KEY_MAX + 2];
    const bool got = fgets(line, sizeof line, fp) != NULL;
    fclose(fp);
    size_t len = got ? strcspn(line, "\r\n") : 0;
    line[len] = '\0';
    if (len < HTTP_KEY_MIN || len >= HTTP_KEY_MAX)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "http.keys: key file %s: the first line must hold a key of %d to "
                                "%d bytes",
                                k->key_file, HTTP_KEY_MIN, HTTP_KEY_MAX - 1);
    for (size_t i = 0; i < len; i++)
        if ((uint8_t)line[i] <= 0x20 || (uint8_t)line[i] >= 0x7F)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "http.keys: key file %s: the key must be printable ASCII "
                                    "without spaces",
                                    k->key_file);
    if (strlen(k->app) >= sizeof out->app)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "http.keys: app name '%s' is longer than 63 bytes", k->app);
    memcpy(out->key, line, len + 1);
    out->len = len;
    snprintf(out->app, sizeof out->app, "%s", k->app);
    return CORRAL_OK;
}

http_keys *http_keys_load(const cfg *c, corral_error *err) {
    if (c->n_http_keys > HTTP_MAX_KEYS) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "http.keys: more than %d keys",
                         HTTP_MAX_KEYS);
        return NULL;
    }
    http_keys *k = calloc(1, sizeof *k);
    if (k) k->keys = calloc(c->n_http_keys ? c->n_http_keys : 1, sizeof *k->keys);
    if (!k || !k->keys) {
        http_keys_destroy(&k);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < c->n_http_keys; i++) {
        if (read_key(&c->http_keys[i], &k->keys[i], err) != CORRAL_OK) {
            http_keys_destroy(&k);
            return NULL;
        }
        k->n++;
    }
    return k;
}

void http_keys_destroy(http_keys **pk) {
    if (!pk || !*pk) return;
    /* The keys are secrets: do not leave them in freed memory. */
    if ((*pk)->keys) explicit_bzero((*pk)->keys, (*pk)->n * sizeof *(*pk)->keys);
    free((*pk)->keys);
    free(*pk);
    *pk = NULL;
}

/* Compare without an early exit, so the time taken says nothing about where keys differ. */
static bool key_equal(const hkey *k, const char *given, size_t len) {
    uint8_t diff = (uint8_t)(k->len != len);
    for (size_t i = 0; i < k->len; i++) diff |= (uint8_t)(k->key[i] ^ (i < len ? given[i] : 0));
    return diff == 0;
}

static bool is_loopback_peer(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return false;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return false;
}

bool http_authenticate(const http_keys *keys, struct MHD_Connection *conn, char *app,
                       size_t app_size, http_problem *p) {
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    app[0] = '\0';
    if (!auth || !auth[0]) {
        if (!is_loopback_peer(conn))
            return http_fail(p, 401, NULL,
                             "an API key is required from beyond this machine (Authorization: "
                             "Bearer KEY)");
        return true;
    }
    if (strncasecmp(auth, "Bearer ", 7) != 0)
        return http_fail(p, 401, NULL, "the Authorization header must be 'Bearer KEY'");
    const char *key = auth + 7;
    while (*key == ' ') key++;
    const size_t len = strlen(key);
    for (size_t i = 0; i < keys->n; i++)
        if (key_equal(&keys->keys[i], key, len)) {
            snprintf(app, app_size, "%s", keys->keys[i].app);
            return true;
        }
    /* A loopback client without configured keys sends what its library always sends (the openai
     * client requires some key): serve it as the default app. */
    if (keys->n == 0 && is_loopback_peer(conn)) return true;
    return http_fail(p, 401, NULL, "incorrect API key");
}

void http_cors_origin(const cfg *c, struct MHD_Connection *conn, char *out, size_t size) {
    out[0] = '\0';
    const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
    if (!origin) return;
    for (size_t i = 0; i < c->n_http_cors; i++) {
        const bool any = strcmp(c->http_cors[i], "*") == 0;
        if (any || strcmp(c->http_cors[i], origin) == 0) {
            if (strlen(origin) < size || any) snprintf(out, size, "%s", any ? "*" : origin);
            return;
        }
    }
}

enum MHD_Result http_answer_preflight(hreq *r) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    if (r->origin[0]) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, X-Request-Id, OpenAI-Organization, "
                                "OpenAI-Project, X-Stainless-Lang, X-Stainless-Package-Version, "
                                "X-Stainless-OS, X-Stainless-Arch, X-Stainless-Runtime, "
                                "X-Stainless-Runtime-Version, X-Stainless-Retry-Count, "
                                "X-Stainless-Timeout");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    r->queued = true;
    const enum MHD_Result rc = MHD_queue_response(r->conn, r->origin[0] ? 204 : 403, resp);
    MHD_destroy_response(resp);
    return rc;
}
