/*
 * config.c — the config table and the YAML walker that applies a file to it.
 *
 * How a file is read: libyaml loads the whole document as a node tree (so every node keeps its
 * line and column). The walker visits the root mapping; each key is joined to its parent's path
 * with '.' ("limits" + "max_message_bytes"). A path that names a table row is parsed by that row's
 * type; a path that is a prefix of some rows is a section and must be a mapping; anything else is
 * an unknown key. The first problem stops the load and is reported with its position.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "corral/endpoint.h"

typedef enum cfg_type {
    CFG_TYPE_BYTES,     /* unsigned byte count, with optional K/M/G/T suffix (KiB = 1024) */
    CFG_TYPE_LOG_LEVEL, /* error | warn | info | debug | trace */
    CFG_TYPE_ENDPOINTS, /* a sequence of endpoint strings (or one string) */
} cfg_type;

typedef struct cfg_option {
    const char *path; /* dotted key path */
    cfg_type type;
    size_t offset;             /* field in struct cfg */
    uint64_t min, max;         /* inclusive bounds for numeric types */
    const char *default_value; /* YAML text, parsed like a value from a file */
    const char *doc;
} cfg_option;

static const cfg_option cfg_options[] = {
    {.path = "listen",
     .type = CFG_TYPE_ENDPOINTS,
     .offset = offsetof(cfg, listen),
     .default_value = "[]",
     .doc = "endpoints to bind: ipc://ABSOLUTE/PATH or tcp://127.0.0.1:PORT; empty means "
            "ipc://$XDG_RUNTIME_DIR/corral/corral.sock (or /tmp/corral-$UID/corral.sock)"},
    {.path = "log_level",
     .type = CFG_TYPE_LOG_LEVEL,
     .offset = offsetof(cfg, log_level),
     .default_value = "info",
     .doc = "error, warn, info, debug or trace; CORRAL_LOG_LEVEL and --log-level override it"},
    {.path = "limits.max_message_bytes",
     .type = CFG_TYPE_BYTES,
     .offset = offsetof(cfg, max_message_bytes),
     .min = 1024,
     .max = 256ull << 20,
     .default_value = "1MiB",
     .doc = "largest request message accepted (ZMQ_MAXMSGSIZE); larger ones drop the connection"},
};

enum { CFG_N_OPTIONS = sizeof cfg_options / sizeof cfg_options[0] };

/* ---- value parsers: each returns NULL on success or a static description of what was wanted */

static const char *parse_bytes(const char *text, uint64_t *out) {
    const char *want = "a byte size such as 1048576, 512KiB, 1MiB or 4GiB";
    if (!text[0] || text[0] == '-') return want;
    errno = 0;
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text || errno == ERANGE) return want;
    while (*end == ' ') end++;
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0},     {"B", 0},   {"K", 10},   {"KB", 10}, {"KiB", 10},
                 {"M", 20},   {"MB", 20}, {"MiB", 20}, {"G", 30},  {"GB", 30},
                 {"GiB", 30}, {"T", 40},  {"TB", 40},  {"TiB", 40}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) != 0) continue;
        if (units[i].shift && value > (UINT64_MAX >> units[i].shift)) return want;
        *out = (uint64_t)value << units[i].shift;
        return NULL;
    }
    return want;
}

/* ---- the loader ---------------------------------------------------------------------------- */

typedef struct cfg_loader {
    cfg *c;
    yaml_document_t *doc;
    const char *name;
    corral_error *err;
} cfg_loader;

static corral_status cfg_fail(cfg_loader *ld, const yaml_node_t *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static corral_status cfg_fail(cfg_loader *ld, const yaml_node_t *node, const char *fmt, ...) {
    char what[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return corral_error_set(ld->err, CORRAL_INVALID_ARGUMENT, "%s:%zu:%zu: %s", ld->name,
                            node->start_mark.line + 1, node->start_mark.column + 1, what);
}

static const cfg_option *cfg_find_option(const char *path) {
    for (size_t i = 0; i < CFG_N_OPTIONS; i++)
        if (strcmp(cfg_options[i].path, path) == 0) return &cfg_options[i];
    return NULL;
}

static int cfg_is_section(const char *path) {
    size_t len = strlen(path);
    for (size_t i = 0; i < CFG_N_OPTIONS; i++)
        if (strncmp(cfg_options[i].path, path, len) == 0 && cfg_options[i].path[len] == '.')
            return 1;
    return 0;
}

static const char *node_kind(const yaml_node_t *node) {
    switch (node->type) {
        case YAML_SCALAR_NODE:
            return node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? "a plain value"
                                                                      : "a quoted string";
        case YAML_SEQUENCE_NODE:
            return "a list";
        case YAML_MAPPING_NODE:
            return "a mapping";
        default:
            return "nothing";
    }
}

static const char *scalar_text(const yaml_node_t *node) {
    return (const char *)node->data.scalar.value;
}

static corral_status cfg_set_endpoints(cfg_loader *ld, const cfg_option *opt, yaml_node_t *node) {
    size_t n = 0;
    yaml_node_t *items[64];
    if (node->type == YAML_SCALAR_NODE) {
        items[n++] = node;
    } else if (node->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = node->data.sequence.items.start;
             it < node->data.sequence.items.top; it++) {
            if (n == sizeof items / sizeof items[0])
                return cfg_fail(ld, node, "%s: at most %zu endpoints", opt->path,
                                sizeof items / sizeof items[0]);
            items[n++] = yaml_document_get_node(ld->doc, *it);
        }
    } else {
        return cfg_fail(ld, node, "%s: expected an endpoint or a list of endpoints, got %s",
                        opt->path, node_kind(node));
    }

    char **list = calloc(n ? n : 1, sizeof *list);
    if (!list) return corral_error_set(ld->err, CORRAL_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (items[i]->type != YAML_SCALAR_NODE) {
            for (size_t j = 0; j < i; j++) free(list[j]);
            free(list);
            return cfg_fail(ld, items[i], "%s: expected an endpoint string, got %s", opt->path,
                            node_kind(items[i]));
        }
        corral_error why;
        if (endpoint_validate(scalar_text(items[i]), &why) != CORRAL_OK) {
            for (size_t j = 0; j < i; j++) free(list[j]);
            free(list);
            return cfg_fail(ld, items[i], "%s: %s", opt->path, why.message);
        }
        list[i] = strdup(scalar_text(items[i]));
        if (!list[i]) {
            for (size_t j = 0; j < i; j++) free(list[j]);
            free(list);
            return corral_error_set(ld->err, CORRAL_OUT_OF_MEMORY, "out of memory");
        }
    }
    cfg *c = ld->c;
    for (size_t i = 0; i < c->n_listen; i++) free(c->listen[i]);
    free(c->listen);
    c->listen = list;
    c->n_listen = n;
    return CORRAL_OK;
}

static corral_status cfg_set_option(cfg_loader *ld, const cfg_option *opt, yaml_node_t *node) {
    void *field = (char *)ld->c + opt->offset;
    if (opt->type == CFG_TYPE_ENDPOINTS) return cfg_set_endpoints(ld, opt, node);

    if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return cfg_fail(ld, node, "%s: expected a plain value, got %s", opt->path, node_kind(node));
    const char *text = scalar_text(node);
    switch (opt->type) {
        case CFG_TYPE_BYTES: {
            uint64_t value;
            const char *want = parse_bytes(text, &value);
            if (want) return cfg_fail(ld, node, "%s: expected %s, got '%s'", opt->path, want, text);
            if (value < opt->min || value > opt->max)
                return cfg_fail(ld, node, "%s: %s is out of range [%llu, %llu] bytes", opt->path,
                                text, (unsigned long long)opt->min, (unsigned long long)opt->max);
            *(uint64_t *)field = value;
            return CORRAL_OK;
        }
        case CFG_TYPE_LOG_LEVEL: {
            log_level level;
            if (log_level_parse(text, &level) != 0)
                return cfg_fail(ld, node,
                                "%s: expected one of error, warn, info, debug, trace, got '%s'",
                                opt->path, text);
            *(log_level *)field = level;
            return CORRAL_OK;
        }
        case CFG_TYPE_ENDPOINTS:
            break;
    }
    return cfg_fail(ld, node, "%s: internal error: unhandled option type", opt->path);
}

static corral_status cfg_walk_mapping(cfg_loader *ld, yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
         pair++) {
        yaml_node_t *key = yaml_document_get_node(ld->doc, pair->key);
        yaml_node_t *value = yaml_document_get_node(ld->doc, pair->value);
        if (key->type != YAML_SCALAR_NODE)
            return cfg_fail(ld, key, "keys must be plain names, got %s", node_kind(key));

        /* Duplicate keys are almost always a mistake; refuse them rather than pick one. */
        for (yaml_node_pair_t *prev = map->data.mapping.pairs.start; prev < pair; prev++) {
            yaml_node_t *prev_key = yaml_document_get_node(ld->doc, prev->key);
            if (prev_key->type == YAML_SCALAR_NODE &&
                strcmp(scalar_text(prev_key), scalar_text(key)) == 0)
                return cfg_fail(ld, key, "duplicate key '%s' (first at line %zu)", scalar_text(key),
                                prev_key->start_mark.line + 1);
        }

        char path[256];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", scalar_text(key));
        if (n < 0 || (size_t)n >= sizeof path) return cfg_fail(ld, key, "key path too long");

        const cfg_option *opt = cfg_find_option(path);
        corral_status st;
        if (opt) {
            st = cfg_set_option(ld, opt, value);
        } else if (cfg_is_section(path)) {
            if (value->type != YAML_MAPPING_NODE)
                return cfg_fail(ld, value, "%s: expected a mapping (a section), got %s", path,
                                node_kind(value));
            st = cfg_walk_mapping(ld, value, path);
        } else {
            return cfg_fail(ld, key, "unknown key '%s'", path);
        }
        if (st != CORRAL_OK) return st;
    }
    return CORRAL_OK;
}

/* Parse `text` as a YAML document and apply it to c. An empty document changes nothing. */
static corral_status cfg_apply_yaml(cfg *c, const char *text, size_t len, const char *name,
                                    corral_error *err) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "cannot initialise the YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yaml_document_t doc;
    if (!yaml_parser_load(&parser, &doc)) {
        corral_status st =
            corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s:%zu:%zu: YAML syntax error: %s",
                             name, parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                             parser.problem ? parser.problem : "unknown problem");
        yaml_parser_delete(&parser);
        return st;
    }
    corral_status st = CORRAL_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        cfg_loader ld = {.c = c, .doc = &doc, .name = name, .err = err};
        if (root->type == YAML_MAPPING_NODE)
            st = cfg_walk_mapping(&ld, root, "");
        else if (!(root->type == YAML_SCALAR_NODE && scalar_text(root)[0] == '\0'))
            st = cfg_fail(&ld, root, "the top level must be a mapping of keys, got %s",
                          node_kind(root));
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

cfg *cfg_new_defaults(corral_error *err) {
    cfg *c = calloc(1, sizeof *c);
    if (!c) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    /* Defaults go through the same parser as files: build a document from the table. */
    for (size_t i = 0; i < CFG_N_OPTIONS; i++) {
        const cfg_option *opt = &cfg_options[i];
        char text[512];
        char *p = text;
        size_t left = sizeof text;
        /* "a.b.c" becomes "a: {b: {c: VALUE}}" */
        const char *seg = opt->path;
        int depth = 0;
        for (const char *dot; (dot = strchr(seg, '.')); seg = dot + 1, depth++) {
            int n = snprintf(p, left, "%.*s: {", (int)(dot - seg), seg);
            p += n;
            left -= (size_t)n;
        }
        int n = snprintf(p, left, "%s: %s", seg, opt->default_value);
        p += n;
        left -= (size_t)n;
        for (int d = 0; d < depth; d++, p++, left--) snprintf(p, left, "}");
        corral_error why;
        if (cfg_apply_yaml(c, text, strlen(text), "(built-in defaults)", &why) != CORRAL_OK) {
            corral_error_set(err, CORRAL_INTERNAL, "default of %s is invalid: %s", opt->path,
                             why.message);
            cfg_destroy(&c);
            return NULL;
        }
    }
    return c;
}

cfg *cfg_load_string(const char *text, size_t len, const char *name, corral_error *err) {
    cfg *c = cfg_new_defaults(err);
    if (!c) return NULL;
    if (cfg_apply_yaml(c, text, len, name, err) != CORRAL_OK) {
        cfg_destroy(&c);
        return NULL;
    }
    return c;
}

cfg *cfg_load_file(const char *path, corral_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        corral_error_set(err, errno == ENOENT ? CORRAL_NOT_FOUND : CORRAL_IO, "config file %s: %s",
                         path, strerror(errno));
        return NULL;
    }
    enum { CFG_FILE_MAX = 4 << 20 };
    char *text = malloc(CFG_FILE_MAX + 1);
    size_t len = text ? fread(text, 1, CFG_FILE_MAX + 1, fp) : 0;
    int read_error = ferror(fp);
    fclose(fp);
    if (!text) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory reading %s", path);
        return NULL;
    }
    if (read_error || len > CFG_FILE_MAX) {
        corral_error_set(
            err, read_error ? CORRAL_IO : CORRAL_INVALID_ARGUMENT,
            read_error ? "config file %s: read error" : "config file %s: larger than 4 MiB", path);
        free(text);
        return NULL;
    }
    cfg *c = cfg_load_string(text, len, path, err);
    free(text);
    if (c) {
        c->source_path = strdup(path);
        if (!c->source_path) {
            corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
            cfg_destroy(&c);
        }
    }
    return c;
}

void cfg_destroy(cfg **pc) {
    if (!pc || !*pc) return;
    cfg *c = *pc;
    for (size_t i = 0; i < c->n_listen; i++) free(c->listen[i]);
    free(c->listen);
    free(c->source_path);
    free(c);
    *pc = NULL;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int cfg_find_default_file(char *buf, size_t size) {
    const char *env = getenv("CORRAL_CONFIG");
    if (env && *env) {
        snprintf(buf, size, "%s", env);
        return 1;
    }
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    char candidate[PATH_MAX];
    if (xdg && xdg[0] == '/') {
        snprintf(candidate, sizeof candidate, "%s/corral/corral.yaml", xdg);
        if (file_exists(candidate)) return snprintf(buf, size, "%s", candidate), 1;
    } else if (home && home[0] == '/') {
        snprintf(candidate, sizeof candidate, "%s/.config/corral/corral.yaml", home);
        if (file_exists(candidate)) return snprintf(buf, size, "%s", candidate), 1;
    }
    if (file_exists("/etc/corral/corral.yaml")) {
        snprintf(buf, size, "%s", "/etc/corral/corral.yaml");
        return 1;
    }
    return 0;
}

void cfg_print_reference(FILE *out) {
    static const char *const type_names[] = {
        [CFG_TYPE_BYTES] = "bytes",
        [CFG_TYPE_LOG_LEVEL] = "level",
        [CFG_TYPE_ENDPOINTS] = "endpoints",
    };
    for (size_t i = 0; i < CFG_N_OPTIONS; i++) {
        const cfg_option *opt = &cfg_options[i];
        fprintf(out, "  %-28s %-10s default %s\n      %s\n", opt->path, type_names[opt->type],
                opt->default_value, opt->doc);
    }
}
