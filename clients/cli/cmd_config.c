/*
 * cmd_config.c — `corral add`, `corral rm` and `corral show`: managing the models of corrald's
 * configuration from the command line, and describing one.
 *
 * Which file. --config FILE; else the file the running corrald reads (its Pong says which);
 * else the one corrald would read at start ($CORRAL_CONFIG, else $XDG_CONFIG_HOME/corral/
 * corral.yaml or ~/.config/corral/corral.yaml, else /etc/corral/corral.yaml: daemon/config.c's
 * cfg_find_default_file); when none exists, add creates the user's.
 *
 * Editing keeps the file as its author wrote it. libyaml composes the document (so that every
 * node knows where its text starts and ends), and the edit is done on the text itself: `add`
 * inserts the new entry's lines after the last line of the last entry of `models` (with the
 * entries' own indentation), or writes a `models:` section when there is none; `rm` deletes the
 * lines of one entry, from its dash to the end of its last line. Everything else — comments, blank
 * lines, the order of keys and entries, quoting — is untouched. (Re-emitting the events would
 * have lost the comments: libyaml's emitter has no comment events.) A node's end mark in a block
 * collection lies after the comments that follow it, so the end of an entry is taken from the
 * last scalar or flow collection inside it, whose end marks are exact. The edited text is parsed
 * again before it replaces the file (atomically: a temporary file in the same folder, then
 * rename), and must hold exactly the entries expected.
 *
 * Then corrald reloads: the CLI sends SIGHUP to the pid its Pong names — only when that daemon
 * reads the edited file — and waits until ListModels shows the change (a reload corrald refuses
 * is in its log; the CLI says so).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "cli.h"
#include "corral.h"
#include "corral/chat.h"
#include "corral/gguf.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/suggest.h"
#include "daemon_cli.h"

#define CONFIG_FILE_MAX  (4 << 20) /* as corrald's reader */
#define CONFIG_ADAPTERS  64
#define RELOAD_WAIT_MS   10000
#define RELOAD_POLL_MS   100
#define PROBE_TIMEOUT_MS 2000

/* ---- the running daemon ------------------------------------------------------------------ */

/* A quiet look for a running corrald: a client whose ping was answered (with its pid and config
 * file in *pong), or NULL when none answers (nothing is printed). */
static corral_client *daemon_probe(corral_pong *pong) {
    corral_error err;
    const corral_connect_options options = {.endpoint = cli_endpoint,
                                            .server_key = cli_server_key,
                                            .server_key_file = cli_server_key_file,
                                            .client_key_file = cli_client_key_file};
    corral_client *c = corral_client_new_with(&options, &err);
    if (!c) return NULL;
    corral_client_set_app(c, cli_app);
    const char *endpoint = corral_client_endpoint(c);
    struct stat sb;
    if ((strncmp(endpoint, "ipc://", 6) == 0 && stat(endpoint + 6, &sb) != 0) ||
        corral_client_ping(c, PROBE_TIMEOUT_MS, pong, &err) != CORRAL_OK)
        corral_client_destroy(&c);
    return c;
}

/* ---- which file ---------------------------------------------------------------------------- */

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The configuration file to edit (see the file comment) into out; *exists says whether it does. */
static int config_locate(const char *flag, const corral_pong *pong, char *out, size_t size,
                         bool *exists) {
    const char *env = getenv("CORRAL_CONFIG");
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    char user[PATH_MAX] = "";
    if (xdg && xdg[0] == '/')
        snprintf(user, sizeof user, "%s/corral/corral.yaml", xdg);
    else if (home && home[0] == '/')
        snprintf(user, sizeof user, "%s/.config/corral/corral.yaml", home);
    if (flag)
        snprintf(out, size, "%s", flag);
    else if (pong && pong->config_path[0])
        snprintf(out, size, "%s", pong->config_path);
    else if (env && *env)
        snprintf(out, size, "%s", env);
    else if (user[0] && file_exists(user))
        snprintf(out, size, "%s", user);
    else if (file_exists("/etc/corral/corral.yaml"))
        snprintf(out, size, "%s", "/etc/corral/corral.yaml");
    else if (user[0])
        snprintf(out, size, "%s", user);
    else
        return -1;
    *exists = file_exists(out);
    return 0;
}

/* ---- text and YAML ----------------------------------------------------------------------- */

typedef struct text {
    char *data;
    size_t len, cap;
} text;

static int text_reserve(text *t, size_t more) {
    if (t->len + more + 1 <= t->cap) return 0;
    size_t cap = t->cap ? t->cap : 1024;
    while (cap < t->len + more + 1) cap *= 2;
    char *d = realloc(t->data, cap);
    if (!d) return -1;
    t->data = d;
    t->cap = cap;
    return 0;
}

static int text_addf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int text_addf(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || text_reserve(t, (size_t)n) != 0) return -1;
    va_start(ap, fmt);
    vsnprintf(t->data + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
    return 0;
}

/* Replace t's bytes [at, at + del) with ins (n bytes). */
static int text_splice(text *t, size_t at, size_t del, const char *ins, size_t n) {
    if (n > del && text_reserve(t, n - del) != 0) return -1;
    memmove(t->data + at + n, t->data + at + del, t->len - at - del + 1);
    memcpy(t->data + at, ins, n);
    t->len = t->len - del + n;
    return 0;
}

static int text_read(const char *path, text *t) {
    memset(t, 0, sizeof *t);
    FILE *fp = fopen(path, "rb");
    if (!fp) return errno == ENOENT ? (text_reserve(t, 0) == 0 ? (t->data[0] = '\0', 0) : -1) : -1;
    char buf[8192];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, fp)) > 0) {
        if (t->len + n > CONFIG_FILE_MAX || text_reserve(t, n) != 0) {
            errno = EFBIG;
            rc = -1;
            break;
        }
        memcpy(t->data + t->len, buf, n);
        t->len += n;
        t->data[t->len] = '\0';
    }
    if (ferror(fp)) rc = -1;
    fclose(fp);
    if (rc == 0 && text_reserve(t, 0) == 0) t->data[t->len] = '\0';
    return rc;
}

/* A composed document of t; false (with the syntax error printed) when it does not parse. */
static bool yaml_compose(const char *cmd, const char *path, const text *t, yaml_document_t *doc) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return cli_fail(cmd, "out of memory"), false;
    yaml_parser_set_input_string(&parser, (const unsigned char *)t->data, t->len);
    const bool ok = yaml_parser_load(&parser, doc) != 0;
    if (!ok)
        cli_fail(cmd, "%s:%zu:%zu: YAML syntax error: %s (fix the file first)", path,
                 parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                 parser.problem ? parser.problem : "unknown problem");
    yaml_parser_delete(&parser);
    return ok;
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The value of key in mapping map, or NULL (and the key node in *key_out when found). */
static yaml_node_t *mapping_get(yaml_document_t *doc, const yaml_node_t *map, const char *key,
                                yaml_node_t **key_out) {
    if (!map || map->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        const char *s = scalar(k);
        if (s && strcmp(s, key) == 0) {
            if (key_out) *key_out = k;
            return yaml_document_get_node(doc, p->value);
        }
    }
    return NULL;
}

static bool is_block(const yaml_node_t *n) {
    return (n->type == YAML_SEQUENCE_NODE && n->data.sequence.style != YAML_FLOW_SEQUENCE_STYLE) ||
           (n->type == YAML_MAPPING_NODE && n->data.mapping.style != YAML_FLOW_MAPPING_STYLE);
}

/* Where the text of node really ends: a block collection's end mark lies after the comments and
 * blank lines that follow it, so its last item's is taken instead (scalars' and flow
 * collections' end marks are exact). */
static size_t content_end(yaml_document_t *doc, const yaml_node_t *n) {
    if (!is_block(n)) return n->end_mark.index;
    size_t end = n->start_mark.index;
    if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
             it++) {
            const size_t e = content_end(doc, yaml_document_get_node(doc, *it));
            if (e > end) end = e;
        }
    } else {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
             p++) {
            size_t e = content_end(doc, yaml_document_get_node(doc, p->key));
            const size_t v = content_end(doc, yaml_document_get_node(doc, p->value));
            if (v > e) e = v;
            if (e > end) end = e;
        }
    }
    return end;
}

/* The start of the line holding index i, and the index after the newline ending it. */
static size_t line_start(const text *t, size_t i) {
    while (i > 0 && t->data[i - 1] != '\n') i--;
    return i;
}

static size_t line_after(const text *t, size_t i) {
    while (i < t->len && t->data[i] != '\n') i++;
    return i < t->len ? i + 1 : i;
}

/* The entry of `models` named name: its index and node; -1 when there is none. */
static long find_entry(yaml_document_t *doc, const yaml_node_t *models, const char *name,
                       yaml_node_t **entry) {
    if (!models || models->type != YAML_SEQUENCE_NODE) return -1;
    long i = 0;
    for (yaml_node_item_t *it = models->data.sequence.items.start;
         it < models->data.sequence.items.top; it++, i++) {
        yaml_node_t *e = yaml_document_get_node(doc, *it);
        const char *n = scalar(mapping_get(doc, e, "name", NULL));
        if (n && strcmp(n, name) == 0) {
            *entry = e;
            return i;
        }
    }
    return -1;
}

/* The entries' names, comma-separated, and the closest to `name` (did you mean). */
static void entry_names(yaml_document_t *doc, const yaml_node_t *models, const char *name,
                        char *list, size_t size, char *hint, size_t hint_size) {
    list[0] = hint[0] = '\0';
    const char *names[256];
    size_t n = 0, len = 0;
    if (models && models->type == YAML_SEQUENCE_NODE)
        for (yaml_node_item_t *it = models->data.sequence.items.start;
             it < models->data.sequence.items.top && n < 256; it++) {
            const char *s =
                scalar(mapping_get(doc, yaml_document_get_node(doc, *it), "name", NULL));
            if (!s) continue;
            names[n++] = s;
            if (len < size)
                len += (size_t)snprintf(list + len, size - len, "%s%s", len ? ", " : "", s);
        }
    const char *close = suggest_closest(name, names, n);
    if (close) snprintf(hint, hint_size, " (did you mean '%s'?)", close);
}

/* A YAML double-quoted scalar of s. */
static int text_quoted(text *t, const char *s) {
    if (text_addf(t, "\"") != 0) return -1;
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            if (text_addf(t, "\\%c", c) != 0) return -1;
        } else if (c < 0x20) {
            if (text_addf(t, "\\x%02x", c) != 0) return -1;
        } else if (text_addf(t, "%c", c) != 0) {
            return -1;
        }
    }
    return text_addf(t, "\"");
}

/* Write text to path atomically (a temporary file beside it, fsync, rename), keeping the mode of
 * the file it replaces (0644 for a new one, whose folder is made with mode 0700). */
static int write_atomic(const char *cmd, const char *path, const text *t) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        for (char *p = dir + 1;; p++) { /* mkdir -p */
            const char c = *p;
            if (c != '/' && c != '\0') continue;
            *p = '\0';
            if (mkdir(dir, 0700) != 0 && errno != EEXIST)
                return cli_fail(cmd, "cannot create %s: %s", dir, strerror(errno));
            *p = c;
            if (c == '\0') break;
        }
    }
    struct stat st;
    const mode_t mode = stat(path, &st) == 0 ? st.st_mode & 07777 : 0644;
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return cli_fail(cmd, "cannot write %s: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < t->len) {
        const ssize_t n = write(fd, t->data + done, t->len - done);
        if (n <= 0) {
            const int e = errno;
            close(fd);
            unlink(tmp);
            return cli_fail(cmd, "writing %s: %s", tmp, strerror(e));
        }
        done += (size_t)n;
    }
    if (fchmod(fd, mode) != 0 || fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return cli_fail(cmd, "replacing %s: %s", path, strerror(e));
    }
    return 0;
}

/* ---- reloading the daemon ---------------------------------------------------------------- */

/* Whether ListModels has the model (want_present) or not. -1 when it cannot be asked. */
static int daemon_lists(corral_client *c, const char *name) {
    corral_error err;
    corral_model_list *l = NULL;
    if (corral_list_models(c, DAEMON_CALL_TIMEOUT_MS, &l, &err) != CORRAL_OK) return -1;
    int found = 0;
    for (size_t i = 0; i < l->n_models; i++) found |= strcmp(l->models[i].name, name) == 0;
    corral_model_list_destroy(&l);
    return found;
}

/* Make the running corrald read `path` again and wait until it lists (or no longer lists) the
 * model. Prints what happened; returns 0, or 1 when a daemon reading this file did not take the
 * change (the file is edited all the same). */
static int daemon_reload(const char *cmd, corral_client *c, const corral_pong *pong,
                         const char *path, const char *model, bool present) {
    char real[PATH_MAX];
    if (!c) {
        fprintf(stderr, "corral %s: corrald is not running; it reads %s when it starts\n", cmd,
                path);
        return 0;
    }
    if (!realpath(path, real) || strcmp(real, pong->config_path) != 0) {
        fprintf(stderr,
                "corral %s: the corrald at %s reads %s, not this file: it was not reloaded\n", cmd,
                corral_client_endpoint(c),
                pong->config_path[0] ? pong->config_path : "its built-in defaults");
        return 0;
    }
    if (!pong->pid || kill((pid_t)pong->pid, SIGHUP) != 0)
        return cli_fail(cmd,
                        "cannot tell corrald (pid %" PRIu32
                        ") to reload: %s; run `kill -HUP %" PRIu32 "` as its user",
                        pong->pid, pong->pid ? strerror(errno) : "it did not say its pid",
                        pong->pid);
    for (int waited = 0; waited < RELOAD_WAIT_MS; waited += RELOAD_POLL_MS) {
        if (daemon_lists(c, model) == (present ? 1 : 0)) {
            fprintf(stderr, "corral %s: corrald (pid %" PRIu32 ") reloaded %s\n", cmd, pong->pid,
                    path);
            return 0;
        }
        nanosleep(&(struct timespec){0, RELOAD_POLL_MS * 1000000L}, NULL);
    }
    return cli_fail(cmd,
                    "corrald (pid %" PRIu32 ") did not take the change within %d s: its log says "
                    "why (a reload with a problem is refused and the running configuration kept)",
                    pong->pid, RELOAD_WAIT_MS / 1000);
}

/* ---- add --------------------------------------------------------------------------------- */

typedef struct add_args {
    const char *name, *file;
    char path[PATH_MAX]; /* the model file, absolute */
    struct {
        char path[PATH_MAX];
        double scale;
    } adapters[CONFIG_ADAPTERS];
    size_t n_adapters;
    long context;
    const char *template_name;
    bool pin, preload;
} add_args;

static void add_usage(FILE *out) {
    fprintf(out,
            "usage: corral add NAME FILE.gguf [--adapter A[:SCALE]]... [--context N]\n"
            "                  [--template NAME] [--pin] [--preload] [--config FILE]\n"
            "                  [--no-reload]\n\n"
            "Add a model to corrald's configuration and make the running corrald load the file\n"
            "again. The file edited is --config, else the one the running corrald reads, else\n"
            "the one it would read at start (~/.config/corral/corral.yaml; created when there is\n"
            "none). Its comments, blank lines and order stay as they are: the new entry is\n"
            "written after the last one. FILE.gguf is checked first (header, architecture,\n"
            "tensors: what a load checks, without reading the weights) and written as an\n"
            "absolute path; so is each adapter (a GGUF LoRA file or a PEFT folder).\n\n"
            "options:\n"
            "  -a, --adapter A[:SCALE]  merge this LoRA adapter (repeatable; SCALE 1 by default)\n"
            "  -c, --context N          tokens per conversation (0 or absent: the model's own)\n"
            "      --template NAME      chat template instead of the file's (chatml, llama3, ...)\n"
            "      --pin                keep it loaded (loaded at start, never unloaded)\n"
            "      --preload            load it at start\n"
            "      --config FILE        the configuration file to edit\n"
            "      --no-reload          edit the file only\n%s",
            cli_daemon_help);
}

/* Check the model file (and the adapters against it) as a load would, without its weights; the
 * template name against the known ones. 0, or 1 after printing the problem. */
static int add_check(add_args *a) {
    if (!realpath(a->file, a->path)) return cli_fail("add", "%s: %s", a->file, strerror(errno));
    const model_params mp = {.compute = MODEL_COMPUTE_REFERENCE};
    corral_error err;
    model *m = model_load(a->path, &mp, &err);
    if (!m) return cli_fail("add", "%s", err.message);
    const model_hparams *hp = model_get_hparams(m);
    int rc = 0;
    if (a->context > 0 && (uint64_t)a->context > hp->n_ctx_train)
        rc = cli_fail("add", "--context %ld is more than the %u positions %s was trained for",
                      a->context, hp->n_ctx_train, a->file);
    model_destroy(&m);
    for (size_t i = 0; rc == 0 && i < a->n_adapters; i++) {
        char real[PATH_MAX];
        if (!realpath(a->adapters[i].path, real))
            return cli_fail("add", "adapter %s: %s", a->adapters[i].path, strerror(errno));
        snprintf(a->adapters[i].path, sizeof a->adapters[i].path, "%s", real);
    }
    if (rc == 0 && a->template_name &&
        chat_template_from_name(a->template_name, NULL) == CHAT_TEMPLATE_UNKNOWN) {
        const char *names[CHAT_TEMPLATE_COUNT + 1];
        size_t n = 0;
        for (int t = 0; t < CHAT_TEMPLATE_COUNT; t++)
            if (chat_template_name((chat_template)t))
                names[n++] = chat_template_name((chat_template)t);
        names[n++] = "mistral-instruct";
        char hint[128] = "";
        suggest_append(hint, sizeof hint, a->template_name, names, n);
        rc = cli_fail("add", "unknown chat template '%s'%s", a->template_name, hint);
    }
    return rc;
}

/* The new entry's lines, each starting with `dash` spaces then "- " (the first) or `keys`
 * spaces. */
static int add_entry_text(const add_args *a, int dash, int keys, text *out) {
    int rc = text_addf(out, "%*s- name: ", dash, "");
    rc |= text_quoted(out, a->name);
    rc |= text_addf(out, "\n%*spath: ", keys, "");
    rc |= text_quoted(out, a->path);
    rc |= text_addf(out, "\n");
    if (a->context > 0) rc |= text_addf(out, "%*scontext: %ld\n", keys, "", a->context);
    if (a->template_name) {
        rc |= text_addf(out, "%*stemplate: ", keys, "");
        rc |= text_quoted(out, a->template_name);
        rc |= text_addf(out, "\n");
    }
    if (a->pin) rc |= text_addf(out, "%*spin: true\n", keys, "");
    if (a->preload) rc |= text_addf(out, "%*spreload: true\n", keys, "");
    if (a->n_adapters) rc |= text_addf(out, "%*sadapters:\n", keys, "");
    for (size_t i = 0; i < a->n_adapters; i++) {
        rc |= text_addf(out, "%*s  - { path: ", keys, "");
        rc |= text_quoted(out, a->adapters[i].path);
        rc |= text_addf(out, ", scale: %g }\n", a->adapters[i].scale);
    }
    return rc;
}

/* Insert the entry into t (composed as doc). 0, or 1 after printing why it cannot. */
static int add_insert(const char *path, text *t, yaml_document_t *doc, const add_args *a,
                      size_t *line_out) {
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (root &&
        !(root->type == YAML_MAPPING_NODE || (root->type == YAML_SCALAR_NODE && !scalar(root)[0])))
        return cli_fail("add", "%s: the top level is not a mapping of keys", path);
    if (root && root->type == YAML_MAPPING_NODE && !is_block(root))
        return cli_fail("add",
                        "%s: the top level is written in flow style ({...}); add the model "
                        "by hand",
                        path);
    yaml_node_t *key = NULL;
    yaml_node_t *models = root ? mapping_get(doc, root, "models", &key) : NULL;
    text entry = {0};
    int rc = 0;
    if (!models) {
        /* No section yet: one at the end of the file. */
        if (t->len && t->data[t->len - 1] != '\n') rc |= text_splice(t, t->len, 0, "\n", 1);
        *line_out = 1;
        for (size_t i = 0; i < t->len; i++) *line_out += t->data[i] == '\n';
        rc |= text_addf(&entry, "%smodels:\n", t->len ? "\n" : "");
        *line_out += t->len ? 2 : 1;
        rc |= add_entry_text(a, 2, 4, &entry);
        rc |= text_splice(t, t->len, 0, entry.data, entry.len);
    } else if (models->type == YAML_SCALAR_NODE ||
               (models->type == YAML_SEQUENCE_NODE &&
                models->data.sequence.items.start == models->data.sequence.items.top)) {
        /* "models:", "models: []" or "models: ~": the value goes, the entry follows the key. */
        if (models->type == YAML_SCALAR_NODE && scalar(models)[0] &&
            strcmp(scalar(models), "~") != 0 && strcmp(scalar(models), "null") != 0)
            return cli_fail("add", "%s:%zu:%zu: models is '%s', not a list", path,
                            models->start_mark.line + 1, models->start_mark.column + 1,
                            scalar(models));
        const size_t from = models->start_mark.index, to = models->end_mark.index;
        const int indent = (int)key->start_mark.column;
        rc |= text_splice(t, from, to - from, "", 0);
        const size_t at = line_after(t, from);
        *line_out = key->start_mark.line + 2;
        if (at == t->len && t->len && t->data[t->len - 1] != '\n') rc |= text_addf(&entry, "\n");
        rc |= add_entry_text(a, indent + 2, indent + 4, &entry);
        rc |= text_splice(t, at, 0, entry.data, entry.len);
    } else if (models->type == YAML_SEQUENCE_NODE && !is_block(models)) {
        /* models: [{...}, {...}]: one more item before the bracket. */
        size_t close = models->end_mark.index;
        while (close > models->start_mark.index && t->data[close - 1] != ']') close--;
        if (close == models->start_mark.index)
            return cli_fail("add", "%s: cannot find the end of `models`", path);
        rc |= text_addf(&entry, ", {name: ");
        rc |= text_quoted(&entry, a->name);
        rc |= text_addf(&entry, ", path: ");
        rc |= text_quoted(&entry, a->path);
        if (a->context > 0) rc |= text_addf(&entry, ", context: %ld", a->context);
        if (a->template_name) {
            rc |= text_addf(&entry, ", template: ");
            rc |= text_quoted(&entry, a->template_name);
        }
        if (a->pin) rc |= text_addf(&entry, ", pin: true");
        if (a->preload) rc |= text_addf(&entry, ", preload: true");
        if (a->n_adapters) rc |= text_addf(&entry, ", adapters: [");
        for (size_t i = 0; i < a->n_adapters; i++) {
            rc |= text_addf(&entry, "%s{path: ", i ? ", " : "");
            rc |= text_quoted(&entry, a->adapters[i].path);
            rc |= text_addf(&entry, ", scale: %g}", a->adapters[i].scale);
        }
        if (a->n_adapters) rc |= text_addf(&entry, "]");
        rc |= text_addf(&entry, "}");
        rc |= text_splice(t, close - 1, 0, entry.data, entry.len);
        *line_out = models->end_mark.line + 1;
    } else if (models->type == YAML_SEQUENCE_NODE) {
        /* A block list: after the last line of its last entry, indented as its first entry. */
        const yaml_node_t *first = yaml_document_get_node(doc, *models->data.sequence.items.start);
        size_t dash = first->start_mark.index;
        while (dash > 0 && t->data[dash - 1] != '-') dash--;
        const int dash_col = dash ? (int)(dash - 1 - line_start(t, dash - 1)) : 0;
        const size_t at = line_after(t, content_end(doc, models));
        *line_out = 1;
        for (size_t i = 0; i < at; i++) *line_out += t->data[i] == '\n';
        if (at == t->len && t->len && t->data[t->len - 1] != '\n') rc |= text_addf(&entry, "\n");
        rc |= add_entry_text(a, dash_col, (int)first->start_mark.column, &entry);
        rc |= text_splice(t, at, 0, entry.data, entry.len);
    } else {
        free(entry.data);
        return cli_fail("add", "%s:%zu:%zu: models is not a list", path,
                        models->start_mark.line + 1, models->start_mark.column + 1);
    }
    free(entry.data);
    return rc ? cli_fail("add", "out of memory") : 0;
}

int cmd_add(int argc, char **argv) {
    enum { OPT_TEMPLATE = 3000, OPT_PIN, OPT_PRELOAD, OPT_CONFIG, OPT_NO_RELOAD };
    static const struct option options[] = {
        {"adapter", required_argument, NULL, 'a'},
        {"context", required_argument, NULL, 'c'},
        {"template", required_argument, NULL, OPT_TEMPLATE},
        {"pin", no_argument, NULL, OPT_PIN},
        {"preload", no_argument, NULL, OPT_PRELOAD},
        {"config", required_argument, NULL, OPT_CONFIG},
        {"no-reload", no_argument, NULL, OPT_NO_RELOAD},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    static add_args a;
    memset(&a, 0, sizeof a);
    const char *config_flag = NULL;
    bool reload = true;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "a:c:h", options, NULL)) != -1) {
        if (cli_daemon_option(opt)) continue;
        switch (opt) {
            case 'a': {
                if (a.n_adapters == CONFIG_ADAPTERS)
                    return cli_fail("add", "at most %d adapters", CONFIG_ADAPTERS), 2;
                /* "path:scale" when what follows the last ':' is a number. */
                char *colon = strrchr(optarg, ':');
                double scale = 1.0;
                if (colon && colon != optarg && cli_parse_double(colon + 1, -100, 100, &scale) == 0)
                    *colon = '\0';
                else
                    scale = 1.0;
                snprintf(a.adapters[a.n_adapters].path, sizeof a.adapters[0].path, "%s", optarg);
                a.adapters[a.n_adapters++].scale = scale;
                break;
            }
            case 'c':
                if (cli_parse_long(optarg, 0, 1 << 20, &a.context))
                    return cli_fail("add", "--context: '%s' is not a number of tokens", optarg), 2;
                break;
            case OPT_TEMPLATE:
                a.template_name = optarg;
                break;
            case OPT_PIN:
                a.pin = true;
                break;
            case OPT_PRELOAD:
                a.preload = true;
                break;
            case OPT_CONFIG:
                config_flag = optarg;
                break;
            case OPT_NO_RELOAD:
                reload = false;
                break;
            case 'h':
                add_usage(stdout);
                return 0;
            default:
                add_usage(stderr);
                return 2;
        }
    }
    if (argc - optind != 2) {
        add_usage(stderr);
        return 2;
    }
    a.name = argv[optind];
    a.file = argv[optind + 1];
    if (!a.name[0] || strlen(a.name) > 127)
        return cli_fail("add", "a model name is 1 to 127 bytes"), 2;
    if (add_check(&a) != 0) return 1;

    corral_pong pong;
    corral_client *c = reload || !config_flag ? daemon_probe(&pong) : NULL;
    char path[PATH_MAX];
    bool exists;
    if (config_locate(config_flag, c ? &pong : NULL, path, sizeof path, &exists) != 0) {
        corral_client_destroy(&c);
        return cli_fail("add", "no configuration file: give --config FILE (HOME is not set)");
    }
    text t;
    if (text_read(path, &t) != 0) {
        corral_client_destroy(&c);
        return cli_fail("add", "%s: %s", path, strerror(errno));
    }
    yaml_document_t doc;
    int rc = yaml_compose("add", path, &t, &doc) ? 0 : 1;
    if (rc == 0) {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        yaml_node_t *models = root ? mapping_get(&doc, root, "models", NULL) : NULL;
        yaml_node_t *entry;
        if (find_entry(&doc, models, a.name, &entry) >= 0)
            rc = cli_fail("add",
                          "%s:%zu: a model '%s' is already configured (`corral rm %s` "
                          "first)",
                          path, entry->start_mark.line + 1, a.name, a.name);
        size_t line = 0;
        if (rc == 0) rc = add_insert(path, &t, &doc, &a, &line);
        yaml_document_delete(&doc);
        /* The edited text must parse, with the entry where it belongs. */
        if (rc == 0 && yaml_compose("add", path, &t, &doc)) {
            root = yaml_document_get_root_node(&doc);
            models = root ? mapping_get(&doc, root, "models", NULL) : NULL;
            if (find_entry(&doc, models, a.name, &entry) < 0)
                rc = cli_fail("add",
                              "internal error: the edited %s lacks the entry; nothing "
                              "was written",
                              path);
            yaml_document_delete(&doc);
            if (rc == 0) rc = write_atomic("add", path, &t);
            if (rc == 0) {
                fprintf(stderr, "corral add: model '%s' (%s) added to %s:%zu\n", a.name, a.path,
                        path, line);
                if (reload) rc = daemon_reload("add", c, &pong, path, a.name, true);
            }
        } else if (rc == 0) {
            rc = 1;
        }
    }
    free(t.data);
    corral_client_destroy(&c);
    return rc;
}

/* ---- rm ---------------------------------------------------------------------------------- */

int cmd_rm(int argc, char **argv) {
    enum { OPT_CONFIG = 3000, OPT_NO_RELOAD };
    static const struct option options[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"no-reload", no_argument, NULL, OPT_NO_RELOAD},
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    const char *config_flag = NULL;
    bool reload = true;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (cli_daemon_option(opt)) continue;
        if (opt == OPT_CONFIG) {
            config_flag = optarg;
        } else if (opt == OPT_NO_RELOAD) {
            reload = false;
        } else if (opt == 'h') {
            printf("usage: corral rm NAME [--config FILE] [--no-reload]\n\n"
                   "Remove a model from corrald's configuration (the file as `corral add`\n"
                   "chooses it; the entry's lines go, the rest of the file stays as it is) and\n"
                   "make the running corrald reload it: the model finishes its requests and is\n"
                   "unloaded.\n\noptions:\n"
                   "      --config FILE       the configuration file to edit\n"
                   "      --no-reload         edit the file only\n%s",
                   cli_daemon_help);
            return 0;
        } else {
            return 2;
        }
    }
    if (argc - optind != 1) return cli_fail("rm", "give one model NAME (see corral rm --help)"), 2;
    const char *name = argv[optind];
    corral_pong pong;
    corral_client *c = reload || !config_flag ? daemon_probe(&pong) : NULL;
    char path[PATH_MAX];
    bool exists;
    if (config_locate(config_flag, c ? &pong : NULL, path, sizeof path, &exists) != 0 || !exists) {
        corral_client_destroy(&c);
        return cli_fail("rm", "no configuration file%s%s", exists ? "" : " at ",
                        exists ? "" : path);
    }
    text t;
    if (text_read(path, &t) != 0) {
        corral_client_destroy(&c);
        return cli_fail("rm", "%s: %s", path, strerror(errno));
    }
    yaml_document_t doc;
    int rc = yaml_compose("rm", path, &t, &doc) ? 0 : 1;
    if (rc == 0) {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        yaml_node_t *models = root ? mapping_get(&doc, root, "models", NULL) : NULL;
        yaml_node_t *entry = NULL;
        const long index = find_entry(&doc, models, name, &entry);
        if (index < 0) {
            char list[512], hint[160];
            entry_names(&doc, models, name, list, sizeof list, hint, sizeof hint);
            rc = cli_fail("rm", "%s configures no model '%s'%s (it has: %s)", path, name, hint,
                          list[0] ? list : "none");
        } else if (!is_block(models)) {
            /* A flow list: the item and the comma beside it. */
            size_t from = entry->start_mark.index, to = entry->end_mark.index;
            size_t after = to;
            while (after < t.len && (t.data[after] == ' ' || t.data[after] == '\t')) after++;
            if (after < t.len && t.data[after] == ',') {
                to = after + 1;
                while (to < t.len && t.data[to] == ' ') to++;
            } else {
                size_t before = from;
                while (before > 0 && (t.data[before - 1] == ' ' || t.data[before - 1] == '\t'))
                    before--;
                if (before > 0 && t.data[before - 1] == ',') from = before - 1;
            }
            rc = text_splice(&t, from, to - from, "", 0) ? cli_fail("rm", "out of memory") : 0;
        } else {
            /* A block list: from the line of the entry's dash to the end of its last line. */
            size_t dash = entry->start_mark.index;
            while (dash > 0 && t.data[dash - 1] != '-') dash--;
            const size_t from = line_start(&t, dash ? dash - 1 : 0);
            const size_t to = line_after(&t, content_end(&doc, entry));
            rc = text_splice(&t, from, to - from, "", 0) ? cli_fail("rm", "out of memory") : 0;
        }
        const size_t line = entry ? entry->start_mark.line + 1 : 0;
        yaml_document_delete(&doc);
        if (rc == 0 && yaml_compose("rm", path, &t, &doc)) {
            root = yaml_document_get_root_node(&doc);
            models = root ? mapping_get(&doc, root, "models", NULL) : NULL;
            if (find_entry(&doc, models, name, &entry) >= 0)
                rc = cli_fail("rm",
                              "internal error: the edited %s still has the entry; nothing "
                              "was written",
                              path);
            yaml_document_delete(&doc);
            if (rc == 0) rc = write_atomic("rm", path, &t);
            if (rc == 0) {
                fprintf(stderr, "corral rm: model '%s' removed from %s (it was at line %zu)\n",
                        name, path, line);
                if (reload) rc = daemon_reload("rm", c, &pong, path, name, false);
            }
        } else if (rc == 0) {
            rc = 1;
        }
    }
    free(t.data);
    corral_client_destroy(&c);
    return rc;
}

/* ---- show -------------------------------------------------------------------------------- */

/* The file's own facts, read as a load would read them (no weights). */
static void show_file(const char *path) {
    const model_params mp = {.compute = MODEL_COMPUTE_REFERENCE};
    corral_error err;
    model *m = model_load(path, &mp, &err);
    if (!m) {
        printf("  file:       %s (cannot be read here: %s)\n", path, err.message);
        return;
    }
    const model_hparams *hp = model_get_hparams(m);
    const gguf_file *f = model_get_gguf(m);
    char size[32], weights[32];
    cli_format_bytes(gguf_file_size(f), size, sizeof size);
    cli_format_bytes(model_weight_bytes(m), weights, sizeof weights);
    printf("  file:       %s (%s, GGUF v%u, %llu tensors)\n", path, size, gguf_version(f),
           (unsigned long long)gguf_tensor_count(f));
    printf("  model:      %s%s%s%s, %u layers, dim %u, %u heads (%u KV) of %u, FFN %u, vocab %u\n",
           hp->arch, hp->name[0] ? " \"" : "", hp->name, hp->name[0] ? "\"" : "", hp->n_layer,
           hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab);
    printf("  trained:    context %u, RoPE base %g%s%s\n", hp->n_ctx_train,
           (double)hp->rope_freq_base, strcmp(hp->rope_scaling, "none") ? ", scaling " : "",
           strcmp(hp->rope_scaling, "none") ? hp->rope_scaling : "");
    printf("  weights:    %s\n", weights);
    const chat_template own = prompt_file_chat_template(f);
    printf("  file's template: %s\n", chat_template_name(own) ? chat_template_name(own) : "?");
    model_destroy(&m);
}

int cmd_show(int argc, char **argv) {
    static const struct option options[] = {
        DAEMON_COMMON_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (cli_daemon_option(opt)) continue;
        if (opt == 'h') {
            printf("usage: corral show NAME\n\n"
                   "A model of the running corrald: its file's metadata (architecture, shape,\n"
                   "trained context, weights; read from the file's header, as a load checks\n"
                   "it), the context and chat template it serves with, its adapters, and its\n"
                   "state (residency, memory, pin, use).\n\noptions:\n%s",
                   cli_daemon_help);
            return 0;
        }
        return 2;
    }
    if (argc - optind != 1)
        return cli_fail("show", "give one model NAME (see corral show --help)"), 2;
    const char *name = argv[optind];
    corral_client *c = cli_daemon_connect("show");
    if (!c) return 1;
    corral_error err;
    corral_model_list *l = NULL;
    corral_status st = corral_list_models(c, DAEMON_CALL_TIMEOUT_MS, &l, &err);
    if (st != CORRAL_OK) {
        corral_client_destroy(&c);
        return cli_daemon_error("show", st, &err);
    }
    const corral_model_info *m = NULL;
    const char **names = calloc(l->n_models ? l->n_models : 1, sizeof *names);
    for (size_t i = 0; i < l->n_models; i++) {
        if (strcmp(l->models[i].name, name) == 0) m = &l->models[i];
        if (names) names[i] = l->models[i].name;
    }
    if (!m) {
        const char *close = names ? suggest_closest(name, names, l->n_models) : NULL;
        cli_fail("show", "NOT_FOUND: model '%s' is not configured%s%s%s", name,
                 close ? " (did you mean '" : "", close ? close : "", close ? "'?)" : "");
        free(names);
        corral_model_list_destroy(&l);
        corral_client_destroy(&c);
        return 1;
    }
    free(names);
    corral_status_report *r = NULL;
    st = corral_client_status(c, name, DAEMON_CALL_TIMEOUT_MS, &r, &err);
    corral_client_destroy(&c);
    printf("%s\n", m->name);
    show_file(m->path);
    printf("  serves:     context %" PRIu32 "%s, template %s, context_overflow %s\n", m->context,
           m->arch[0] ? "" : " (configured; the model's own until loaded)",
           m->chat_template[0] ? m->chat_template : "the file's",
           m->context_overflow[0] ? m->context_overflow : "?");
    if (m->n_adapters == 0) printf("  adapters:   none\n");
    for (size_t i = 0; i < m->n_adapters; i++)
        printf("  adapter:    %s (scale %g)\n", m->adapters[i].path, (double)m->adapters[i].scale);
    if (st == CORRAL_OK && r->n_models == 1) {
        const corral_model_status *ms = &r->models[0];
        char bytes[32], age[32];
        cli_format_bytes(ms->bytes, bytes, sizeof bytes);
        cli_format_age(ms->last_used_ms, age, sizeof age);
        printf("  state:      %s, %s%s; last used %s, %" PRIu64 " requests served, %" PRIu32
               " sessions, %" PRIu64 " loads\n",
               corral_model_state_name(ms->state), bytes, ms->pinned ? ", pinned" : "", age,
               ms->requests_served, ms->sessions, ms->loads);
        if (ms->error[0]) printf("  error:      %s\n", ms->error);
    } else if (st != CORRAL_OK) {
        printf("  state:      %s (%s)\n", corral_model_state_name(m->state), err.message);
    }
    corral_status_report_destroy(&r);
    corral_model_list_destroy(&l);
    return fflush(stdout) == 0 ? 0 : cli_fail("show", "writing to stdout: %s", strerror(errno));
}
