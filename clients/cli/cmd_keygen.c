/*
 * cmd_keygen.c — `corral keygen DIR [--name NAME]`: a CURVE key pair for corrald's tcp endpoints
 * (SECURITY.md), as two files in DIR: NAME.key, the secret key (mode 600: corrald and the clients
 * refuse a secret key file other users may read), and NAME.pub, the public key to hand out (the
 * daemon's goes to its clients as CORRAL_SERVER_KEY; a client's goes into its app's curve_keys).
 * Each file holds one line of z85 text after a comment saying what it is.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "cli.h"

/* Write text to path, created with mode; an existing file is left alone (EEXIST). */
static int write_new_file(const char *path, mode_t mode, const char *text) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    const size_t len = strlen(text);
    const bool ok = write(fd, text, len) == (ssize_t)len && fchmod(fd, mode) == 0;
    const int saved = errno;
    if (close(fd) != 0 || !ok) {
        unlink(path);
        errno = ok ? errno : saved;
        return -1;
    }
    return 0;
}

int cmd_keygen(int argc, char **argv) {
    static const struct option options[] = {
        {"name", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const char usage[] =
        "usage: corral keygen DIR [--name NAME]\n\n"
        "Make a CURVE key pair for corrald's tcp endpoints: DIR/NAME.key, the secret key\n"
        "(mode 600, never to be shared), and DIR/NAME.pub, the public key. NAME is corral\n"
        "by default. Existing files are never overwritten. DIR is created (mode 700) if\n"
        "missing.\n\n"
        "For corrald: auth.server_key_file: DIR/NAME.key; give NAME.pub's key to the\n"
        "clients (CORRAL_SERVER_KEY). For a client: put NAME.pub's key in its app's\n"
        "curve_keys, and run it with CORRAL_CLIENT_KEY_FILE=DIR/NAME.key.\n";
    const char *name = "corral";
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "n:h", options, NULL)) != -1) {
        switch (opt) {
            case 'n':
                name = optarg;
                break;
            case 'h':
                fputs(usage, stdout);
                return 0;
            default:
                fputs(usage, stderr);
                return 2;
        }
    }
    if (optind != argc - 1) {
        fputs(usage, stderr);
        return 2;
    }
    const char *dir = argv[optind];
    if (!*name || strchr(name, '/')) return cli_fail("keygen", "--name: a file name, not a path");
    if (!zmq_has("curve"))
        return cli_fail("keygen", "this libzmq has no CURVE support (it must be built with "
                                  "libsodium)");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return cli_fail("keygen", "cannot create %s: %s", dir, strerror(errno));
    char public_key[41], secret_key[41];
    if (zmq_curve_keypair(public_key, secret_key) != 0)
        return cli_fail("keygen", "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    char key_path[4096], pub_path[4096], text[256];
    snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name);
    snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name);
    if (access(key_path, F_OK) == 0 || access(pub_path, F_OK) == 0)
        return cli_fail("keygen", "%s or %s exists already: not overwritten", key_path, pub_path);
    snprintf(text, sizeof text,
             "# corral CURVE secret key: keep it private (corrald and clients refuse it if other "
             "users may read it)\n%s\n",
             secret_key);
    memset(secret_key, 0, sizeof secret_key);
    if (write_new_file(key_path, 0600, text) != 0) {
        memset(text, 0, sizeof text);
        return cli_fail("keygen", "cannot write %s: %s", key_path, strerror(errno));
    }
    memset(text, 0, sizeof text);
    snprintf(text, sizeof text, "# corral CURVE public key\n%s\n", public_key);
    if (write_new_file(pub_path, 0644, text) != 0) {
        const int e = errno;
        unlink(key_path);
        return cli_fail("keygen", "cannot write %s: %s", pub_path, strerror(e));
    }
    printf("%s\n", public_key);
    fprintf(stderr, "corral keygen: wrote %s (secret) and %s (public key, printed above)\n",
            key_path, pub_path);
    return 0;
}
