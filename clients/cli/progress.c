/*
 * progress.c — the `corral` command's progress line: while long work runs (a model loading in
 * the daemon, a long prompt, a merge, a synthetic model being written, benchmark runs) a person
 * at a terminal sees one line on stderr, redrawn in place:
 *
 *     stories: repacking [##########..........]  52%  80/155
 *
 * and nothing at all when stderr is not a terminal (a pipe, a file, a test), so that scripts and
 * logs get only the commands' own output. The line is erased before anything else is printed
 * (cli_progress_clear), and redrawn at most every CLI_PROGRESS_INTERVAL_MS unless the phase
 * changes, so that fast work costs no terminal traffic.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CLI_PROGRESS_INTERVAL_MS 100
#define CLI_PROGRESS_BAR         24

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cli_progress_init(cli_progress *p, const char *label) {
    memset(p, 0, sizeof *p);
    const char *term = getenv("TERM");
    p->tty = isatty(STDERR_FILENO) && !(term && strcmp(term, "dumb") == 0);
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
}

void cli_progress_show(cli_progress *p, const char *what, uint64_t done, uint64_t total) {
    if (!p->tty) return;
    const int64_t now = now_ms();
    const bool same_phase = p->shown && strcmp(p->what, what) == 0;
    const bool finished = total && done >= total;
    if (same_phase && !finished && now - p->drawn_ms < CLI_PROGRESS_INTERVAL_MS) return;
    snprintf(p->what, sizeof p->what, "%s", what);
    p->drawn_ms = now;
    p->shown = true;
    char line[256];
    int n = snprintf(line, sizeof line, "\r%s%s%s", p->label, p->label[0] ? ": " : "", what);
    if (total) {
        const uint64_t d = done > total ? total : done;
        const int fill = (int)(d * CLI_PROGRESS_BAR / total);
        char bar[CLI_PROGRESS_BAR + 1];
        for (int i = 0; i < CLI_PROGRESS_BAR; i++) bar[i] = i < fill ? '#' : '.';
        bar[CLI_PROGRESS_BAR] = '\0';
        n += snprintf(line + n, sizeof line - (size_t)n, " [%s] %3d%%  %llu/%llu", bar,
                      (int)(d * 100 / total), (unsigned long long)d, (unsigned long long)total);
    } else {
        n += snprintf(line + n, sizeof line - (size_t)n, "...");
    }
    /* Erase what a longer line left after this one. */
    if (n > 0 && (size_t)n < sizeof line) snprintf(line + n, sizeof line - (size_t)n, "\x1b[K");
    fputs(line, stderr);
    fflush(stderr);
}

void cli_progress_clear(cli_progress *p) {
    if (!p->tty || !p->shown) return;
    fputs("\r\x1b[K", stderr);
    fflush(stderr);
    p->shown = false;
    p->what[0] = '\0';
}

void cli_progress_engine(void *user, uint64_t done, uint64_t total) {
    cli_progress *p = user;
    cli_progress_show(p, p->engine_what, done, total);
}
