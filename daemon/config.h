/*
 * config.h — corrald's configuration: the YAML file, its defaults and its checks.
 *
 * Every key is a row of one declarative table in config.c (dotted path, type, bounds, default,
 * documentation), in the manner of redis's config.c: parsing, defaults and range checks all come
 * from the table, so a key cannot be parsed one way and defaulted another. Defaults are written as
 * YAML text and go through the same parser as the file. Any problem in a file (unknown key, wrong
 * type, value out of range, duplicate key, YAML syntax) is reported as `file:line:column: message`.
 */
#ifndef CORRAL_DAEMON_CONFIG_H
#define CORRAL_DAEMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "corral/log.h"
#include "corral/status.h"

typedef struct cfg {
    char *source_path; /* the file this came from; NULL when built from defaults only */
    char **listen;     /* endpoints to bind; n_listen == 0 means the default endpoint */
    size_t n_listen;
    log_level log_level;        /* log_level */
    uint64_t max_message_bytes; /* limits.max_message_bytes: largest request accepted */
} cfg;

/* A configuration holding every default. Caller owns the result (cfg_destroy). NULL only when
 * memory runs out, with err set. */
cfg *cfg_new_defaults(corral_error *err);

/* Load and check a YAML file; keys it leaves out keep their defaults. Caller owns the result.
 * Returns NULL with err set: CORRAL_NOT_FOUND when the file does not exist, CORRAL_IO when it
 * cannot be read, CORRAL_INVALID_ARGUMENT with "path:line:column: message" for bad content. */
cfg *cfg_load_file(const char *path, corral_error *err);

/* Parse YAML text (for tests and for files already in memory); `name` is used in messages. */
cfg *cfg_load_string(const char *text, size_t len, const char *name, corral_error *err);

/* Free a configuration. NULL-safe; sets *c to NULL. */
void cfg_destroy(cfg **c);

/* Which file corrald reads when no -c is given: $CORRAL_CONFIG if set, else the first that exists
 * of $XDG_CONFIG_HOME/corral/corral.yaml (~/.config when unset) and /etc/corral/corral.yaml.
 * Returns 1 and writes the path into buf, or 0 when none exists (run on defaults). */
int cfg_find_default_file(char *buf, size_t size);

/* Print every key with its type, default and documentation (corrald --help-config). */
void cfg_print_reference(FILE *out);

#endif /* CORRAL_DAEMON_CONFIG_H */
