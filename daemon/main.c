/*
 * main.c — corrald: command line, configuration, logging, signals; then the core (core.h) and
 * its front ends: the ZeroMQ one (front_zmq.h), whose loop runs on this thread, and the HTTP one
 * (front_http.h), which runs on a thread of its own when http.listen names addresses.
 *
 * Precedence for every setting: command-line flag > environment (CORRAL_LOG_LEVEL) > config file >
 * built-in default. SIGINT and SIGTERM stop the daemon cleanly (exit 0), SIGHUP reloads the
 * configuration; all three are received through a signalfd that the server polls with its
 * sockets, so no work happens in a signal handler.
 */
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config.h"
#include "corral/cpu.h"
#include "corral/endpoint.h"
#include "corral/log.h"
#include "corral/version.h"
#include "core.h"
#include "front_http.h"
#include "front_zmq.h"
#include "mem.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: corrald [options]\n"
            "\n"
            "corrald is corral's model supervisor daemon. It runs in the foreground until it\n"
            "receives SIGINT (Ctrl-C) or SIGTERM, then exits 0. SIGHUP reloads the config file:\n"
            "new models appear, removed ones finish their requests and go.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE      read configuration from FILE. Without it: $CORRAL_CONFIG,\n"
            "                         else $XDG_CONFIG_HOME/corral/corral.yaml (~/.config/...),\n"
            "                         else PREFIX/etc/corral/corral.yaml (the prefix this\n"
            "                         corrald is installed in), else /etc/corral/corral.yaml,\n"
            "                         else built-in defaults\n"
            "  -l, --listen ENDPOINT  bind ENDPOINT instead of the config's `listen` list;\n"
            "                         repeat for several (ipc://PATH or tcp://127.0.0.1:PORT)\n"
            "                         (the OpenAI/Ollama HTTP API listens on the config's\n"
            "                         http.listen, e.g. 127.0.0.1:11435)\n"
            "      --log-level LEVEL  error, warn, info, debug or trace (overrides\n"
            "                         $CORRAL_LOG_LEVEL and the config's log_level)\n"
            "      --check-config     load and check the configuration (every problem, each\n"
            "                         model file's header, templates, contexts), print the\n"
            "                         result, exit\n"
            "      --help-config      list every configuration key with its default, exit\n"
            "  -V, --version          print versions (corral, jemalloc) and CPU features, exit\n"
            "  -h, --help             print this help, exit\n"
            "\n"
            "environment: CORRAL_CONFIG (config file), CORRAL_LOG_LEVEL (log level),\n"
            "             XDG_RUNTIME_DIR (where the default ipc socket lives),\n"
            "             XDG_STATE_HOME, XDG_CACHE_HOME (the default memory.swap_dir,\n"
            "             $XDG_STATE_HOME/corral/swap, and cache.dir, $XDG_CACHE_HOME/corral;\n"
            "             else ~/.local/state and ~/.cache)\n");
}

static void print_version(void) {
    const char *jemalloc = mem_allocator_version();
    char features[256];
    cpu_format_features(cpu_detect_features(), features, sizeof features);
    printf("corrald %s\n", CORRAL_VERSION);
    printf("jemalloc %s%s\n", jemalloc ? jemalloc : "(not linked)",
           mem_allocator_is_jemalloc() ? "" : " (not the active allocator in this build)");
    printf("cpu features: %s\n", features);
    printf("physical cores: %d\n", cpu_count_physical_cores());
}

int main(int argc, char **argv) {
    enum { OPT_LOG_LEVEL = 256, OPT_CHECK_CONFIG, OPT_HELP_CONFIG };
    static const struct option long_options[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
        {"help-config", no_argument, NULL, OPT_HELP_CONFIG},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL;
    const char *log_level_flag = NULL;
    char *listen_flags[64];
    size_t n_listen_flags = 0;
    int check_only = 0;

    int opt;
    while ((opt = getopt_long(argc, argv, "c:l:Vh", long_options, NULL)) != -1) {
        switch (opt) {
            case 'c':
                config_path = optarg;
                break;
            case 'l':
                if (n_listen_flags == sizeof listen_flags / sizeof listen_flags[0]) {
                    fprintf(stderr, "corrald: too many --listen flags\n");
                    return 2;
                }
                listen_flags[n_listen_flags++] = optarg;
                break;
            case OPT_LOG_LEVEL:
                log_level_flag = optarg;
                break;
            case OPT_CHECK_CONFIG:
                check_only = 1;
                break;
            case OPT_HELP_CONFIG:
                printf("corrald configuration keys (YAML):\n");
                cfg_print_reference(stdout);
                return 0;
            case 'V':
                print_version();
                return 0;
            case 'h':
                print_usage(stdout);
                return 0;
            default:
                print_usage(stderr);
                return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "corrald: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }

    /* Configuration: every problem of the file is printed, then those of the models it names
     * (their files' headers, templates, contexts), before anything starts. */
    corral_error err = {0};
    char found[PATH_MAX];
    if (!config_path && cfg_find_default_file(found, sizeof found)) config_path = found;
    cfg_report problems = {0};
    cfg *config = config_path ? cfg_load_file_report(config_path, &problems, cfg_check_models, &err)
                              : cfg_new_defaults(&err);
    if (!config) {
        if (problems.n == 0) fprintf(stderr, "corrald: %s\n", err.message);
        for (size_t i = 0; i < problems.n; i++)
            fprintf(stderr, "corrald: %s\n", problems.problems[i]);
        if (problems.n > 1)
            fprintf(stderr, "corrald: %zu problems in %s\n", problems.n,
                    config_path ? config_path : "the configuration");
        cfg_report_free(&problems);
        return 1;
    }
    cfg_report_free(&problems);
    if (n_listen_flags > 0) {
        for (size_t i = 0; i < config->n_listen; i++) free(config->listen[i]);
        free(config->listen);
        config->listen = calloc(n_listen_flags, sizeof *config->listen);
        config->n_listen = 0;
        for (size_t i = 0; config->listen && i < n_listen_flags; i++) {
            if (endpoint_validate(listen_flags[i], &err) != CORRAL_OK) {
                fprintf(stderr, "corrald: --listen: %s\n", err.message);
                cfg_destroy(&config);
                return 2;
            }
            config->listen[config->n_listen] = strdup(listen_flags[i]);
            if (!config->listen[config->n_listen]) break;
            config->n_listen++;
        }
        if (config->n_listen != n_listen_flags) {
            fprintf(stderr, "corrald: out of memory\n");
            cfg_destroy(&config);
            return 1;
        }
    }

    /* Logging: config, then environment, then flag. */
    log_set_level(config->log_level);
    if (log_level_from_env() != 0) {
        fprintf(stderr,
                "corrald: CORRAL_LOG_LEVEL='%s' is not one of error, warn, info, debug, "
                "trace\n",
                getenv("CORRAL_LOG_LEVEL"));
        cfg_destroy(&config);
        return 2;
    }
    if (log_level_flag) {
        log_level level;
        if (log_level_parse(log_level_flag, &level) != 0) {
            fprintf(stderr,
                    "corrald: --log-level '%s' is not one of error, warn, info, debug, "
                    "trace\n",
                    log_level_flag);
            cfg_destroy(&config);
            return 2;
        }
        log_set_level(level);
    }

    if (check_only) {
        corral_error perr;
        if (core_check_config(config, &perr) != CORRAL_OK ||
            front_zmq_check(config, &perr) != CORRAL_OK ||
            front_http_check(config, &perr) != CORRAL_OK) {
            fprintf(stderr, "corrald: %s\n", perr.message);
            cfg_destroy(&config);
            return 1;
        }
        printf("%s: ok\n", config_path ? config_path : "(built-in defaults)");
        cfg_destroy(&config);
        return 0;
    }

    /* Signals are blocked before any thread exists (ZeroMQ starts its I/O threads in
     * server_new), so every thread inherits the mask and only the signalfd sees them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    int signal_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC);
    if (signal_fd < 0) {
        perror("corrald: signalfd");
        cfg_destroy(&config);
        return 1;
    }

    const char *jemalloc = mem_allocator_version();
    char features[256];
    cpu_format_features(cpu_detect_features(), features, sizeof features);
    log_info("corrald starting", LOG_STR("version", CORRAL_VERSION),
             LOG_STR("config", config_path ? config_path : "(built-in defaults)"),
             LOG_STR("jemalloc", jemalloc ? jemalloc : "none"),
             LOG_INT("jemalloc_active", mem_allocator_is_jemalloc()), LOG_STR("cpu", features),
             LOG_INT("pid", getpid()));

    /* The endpoints first: a daemon that cannot listen (another one is there) must stop before
     * its core touches any state. Then the core, which owns the configuration from here on; the
     * front end keeps reading its limits. */
    char *reload_path = config->source_path ? strdup(config->source_path) : NULL;
    front_zmq *front = front_zmq_new(config, &err);
    front_http *http = front ? front_http_new(config, &err) : NULL;
    core *k = NULL;
    if (front && http) {
        k = core_new(config, &err);
    } else {
        cfg_destroy(&config);
    }
    config = NULL;
    if (k && front_http_start(http, k, &err) != CORRAL_OK) core_destroy(&k);
    if (!k) {
        log_error("cannot start", LOG_STR("error", err.message));
        front_http_destroy(&http);
        front_zmq_destroy(&front);
        free(reload_path);
        close(signal_fd);
        return 1;
    }
    for (size_t i = 0; i < front_zmq_endpoint_count(front); i++)
        log_info("listening", LOG_STR("endpoint", front_zmq_endpoint(front, i)));
    for (size_t i = 0; i < front_http_address_count(http); i++)
        log_info("listening (HTTP: OpenAI and Ollama APIs)",
                 LOG_STR("address", front_http_address(http, i)));

    corral_status st = front_zmq_run(front, k, signal_fd, reload_path, &err);
    if (st != CORRAL_OK) log_error("front end failed", LOG_STR("error", err.message));
    /* The core has been told to shut down: the HTTP front end delivers what it answers, then
     * stops. The core next: it may still hold jobs of the front ends until its threads stop. */
    front_http_stop(http);
    core_destroy(&k);
    front_http_destroy(&http);
    front_zmq_destroy(&front);
    free(reload_path);
    close(signal_fd);
    log_info("corrald stopped");
    return st == CORRAL_OK ? 0 : 1;
}
