/*
 * front_zmq_proto.h — the ZeroMQ front end's translation: protobuf Requests (proto/corral.proto)
 * into core requests, and the core's events and replies into packed protobuf Responses.
 *
 * This file and front_zmq.c are the only parts of corrald that know the wire format; the core
 * (core.h, job.h, request.h) speaks corral's own types.
 */
#ifndef CORRAL_DAEMON_FRONT_ZMQ_PROTO_H
#define CORRAL_DAEMON_FRONT_ZMQ_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "corral.pb-c.h"
#include "corral/status.h"
#include "job.h"
#include "request.h"

/* A packing buffer, reused message after message; it grows to the largest message packed. */
typedef struct zproto_buf {
    uint8_t *data;
    size_t cap;
} zproto_buf;

void zproto_buf_free(zproto_buf *b);

/* Check the string fields of a serialized Request before it is decoded: each must be valid UTF-8
 * without NUL bytes (the decoder would cut a string at its first NUL without a word).
 * CORRAL_INVALID_ARGUMENT naming the field ("generate.prompt contains a NUL byte"); CORRAL_OK
 * otherwise, also for bytes that are not a valid message (the decoder refuses those). */
corral_status zproto_check_strings(const uint8_t *data, size_t len, corral_error *err);

/* Translate a decoded Request that needs the core into *out. Strings point into req, which must
 * outlive out; arrays the core request needs beyond req go into *extra (one allocation, freed
 * with free(); NULL when none). Returns CORRAL_OK, or CORRAL_INVALID_ARGUMENT / CORRAL_UNSUPPORTED
 * with err naming the problem (a priority or body this daemon does not know), or
 * CORRAL_OUT_OF_MEMORY. */
corral_status zproto_to_core(const Corral__V1__Request *req, core_request *out, void **extra,
                             corral_error *err);

/* Pack one Response for request `id` into b. Each returns the packed length, or 0 when memory
 * runs out (the message is then lost; the caller logs it). */
size_t zproto_pack_error(zproto_buf *b, uint64_t id, corral_status code, const char *message);
size_t zproto_pack_ack(zproto_buf *b, uint64_t id, const char *message);
size_t zproto_pack_pong(zproto_buf *b, uint64_t id, uint64_t uptime_ms, const char *config_path);
size_t zproto_pack_progress(zproto_buf *b, uint64_t id, const job_progress *p, const char *model);
size_t zproto_pack_chunk(zproto_buf *b, uint64_t id, const job_text *t, uint32_t index);
size_t zproto_pack_done(zproto_buf *b, uint64_t id, const core_done *d);
size_t zproto_pack_reply(zproto_buf *b, uint64_t id, const core_reply *r);

#endif /* CORRAL_DAEMON_FRONT_ZMQ_PROTO_H */
