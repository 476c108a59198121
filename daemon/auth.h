/*
 * auth.h — who a client of corrald is, and which apps it may act as (SECURITY.md).
 *
 * The daemon establishes the app of every request; a client's word is never enough. A front end
 * learns who is at the other end of a connection from the transport: on ipc, the peer process's
 * credentials (uid, gid and pid, which libzmq reads with SO_PEERCRED and hands to corrald's ZAP
 * handler in the request's address); on tcp, the CURVE public key the client proved it holds in
 * the handshake. An auth table, made from a configuration, maps these to apps (apps[].uids,
 * gids, curve_keys) and recognises corrald's owner: an ipc peer running as corrald's own user
 * that no app lists (auth.owner), who may use every model and admin operation and act as any app.
 *
 * Two questions are asked of a table: at the handshake, whether a peer may connect at all
 * (auth_admit: the ZAP reply); for each request, which app it runs as (auth_select: the peer's
 * default app, or the one Request.app names if the peer is entitled to it). The second is asked
 * against the current table, so a reload that takes an app away from a uid takes it away from
 * connections already open too.
 *
 * A table is immutable once made and shared by reference counting: a front end's thread keeps
 * the one it holds while a reload installs the next.
 */
#ifndef CORRAL_DAEMON_AUTH_H
#define CORRAL_DAEMON_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "corral/curve.h"
#include "corral/status.h"

/* Longest app name with its NUL (job.h's app). */
#define AUTH_APP_MAX   64
/* The name the owner's requests run as when they name no app; no configured app can have it. */
#define AUTH_OWNER_APP "(owner)"

/* How a peer proved who it is. */
typedef enum auth_via {
    AUTH_VIA_IPC = 1,   /* a Unix socket: the kernel's word on its uid, gid and pid */
    AUTH_VIA_CURVE = 2, /* CURVE: it holds the secret half of `key` */
} auth_via;

typedef struct auth_peer {
    auth_via via;
    uint32_t uid, gid, pid;   /* AUTH_VIA_IPC */
    char key[CURVE_KEY_TEXT]; /* AUTH_VIA_CURVE: its public key, z85 */
} auth_peer;

/* What a request is allowed to run as. */
typedef struct auth_grant {
    char app[AUTH_APP_MAX]; /* "" for the owner acting as itself */
    bool owner;
} auth_grant;

typedef struct auth_table auth_table;

/* A table for configuration c (apps[].uids, gids, curve_keys; auth.owner), with the owner being
 * the calling process's effective uid. Copies what it needs: c may go first. Caller owns the result
 * (auth_table_release). NULL with err set when memory runs out or a curve key does not decode. */
auth_table *auth_table_new(const cfg *c, corral_error *err);

/* Another reference to t (NULL-safe). Thread-safe. */
auth_table *auth_table_ref(auth_table *t);

/* Drop a reference; the last frees the table. NULL-safe; sets *t to NULL. Thread-safe. */
void auth_table_release(auth_table **t);

/* The handshake's question: may peer connect? CORRAL_OK, or CORRAL_PERMISSION_DENIED with err
 * naming the rule ("uid 1001 (gid 1001) is not listed in any app's uids or gids"). Thread-safe. */
corral_status auth_admit(const auth_table *t, const auth_peer *peer, corral_error *err);

/* A request's question: which app does it run as? `requested` is Request.app: "" selects the
 * peer's default (the first app in the config that lists it; the owner acts as itself), another
 * name must be an app the peer is entitled to (the owner may name any). CORRAL_OK with *out
 * filled, or CORRAL_PERMISSION_DENIED with err naming the rule. Thread-safe. */
corral_status auth_select(const auth_table *t, const auth_peer *peer, const char *requested,
                          auth_grant *out, corral_error *err);

/* The ZAP domains corrald sets on its listeners: the handler knows each request's transport by
 * them, not by the shape of its address. */
#define AUTH_ZAP_DOMAIN_IPC "corral-ipc"
#define AUTH_ZAP_DOMAIN_TCP "corral-tcp"

/* The peer of a ZAP request (RFC 27) that came through a listener of transport `via`: its
 * mechanism (ipc listeners run "NULL", tcp ones "CURVE"), its address (for ipc peers libzmq
 * appends ":UID:GID:PID", the kernel's SO_PEERCRED) and its credentials (CURVE: the client's
 * 32-byte public key). Lengths are the frames' sizes; nothing needs a NUL. CORRAL_OK, or
 * CORRAL_PERMISSION_DENIED naming what is wrong (another mechanism, no credentials). Thread-safe.
 */
corral_status auth_peer_from_zap(auth_via via, const char *mechanism, size_t mechanism_len,
                                 const char *address, size_t address_len,
                                 const unsigned char *credentials, size_t credentials_len,
                                 auth_peer *out, corral_error *err);

/* The ZAP reply's User-Id for peer, which libzmq then attaches to every message of the connection
 * (zmq_msg_gets(msg, "User-Id")): "ipc:UID:GID:PID" or "curve:KEY". Returns the length written,
 * or 0 when it does not fit in size. Thread-safe. */
size_t auth_peer_format(const auth_peer *peer, char *buf, size_t size);

/* Parse a User-Id made by auth_peer_format. CORRAL_OK, or CORRAL_PERMISSION_DENIED when text is
 * NULL or not one (a connection that did not pass corrald's ZAP handler). Thread-safe. */
corral_status auth_peer_parse(const char *text, auth_peer *out);

/* A peer for logs and messages: "uid 1000 gid 1000 pid 42" or "CURVE key <z85>". */
void auth_peer_describe(const auth_peer *peer, char *buf, size_t size);

#endif /* CORRAL_DAEMON_AUTH_H */
