/*
 * fault.c — the SIGBUS handler and the per-thread stacks of guards behind fault.h.
 *
 * Each thread has a stack of guards, a thread-local pointer to the innermost one linked to the
 * ones outside it. The handler runs on the thread that faulted: it pops that thread's innermost
 * guard, fills in what failed and siglongjmps to it. The thread-local pointer uses the
 * initial-exec TLS model, so reading it in the handler is a plain load (no lazy allocation that
 * a signal could interrupt). Faults that are not ours — no guard armed, a fatal region, or a
 * SIGBUS that kill() sent (si_code <= 0) — go on to whatever handled SIGBUS before us.
 */
#include "corral/fault.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static __thread fault_guard *fault_top __attribute__((tls_model("initial-exec")));

/* The disposition of SIGBUS before fault_init: where faults that are not ours go. */
static struct sigaction fault_previous;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static int fault_installed;

/* The catching guard a fault on this thread goes to, or NULL. */
static fault_guard *catching_guard(void) {
    fault_guard *g = fault_top;
    return g && !g->fatal ? g : NULL;
}

/* A SIGBUS that no guard takes: what would have happened without us. The default action ends
 * the process with SIGBUS; an ignored SIGBUS cannot be ignored for a fault (returning would run
 * the faulting read again, forever), so it ends the process too. */
static void pass_on(int sig, siginfo_t *si, void *ctx) {
    if ((fault_previous.sa_flags & SA_SIGINFO) && fault_previous.sa_sigaction) {
        fault_previous.sa_sigaction(sig, si, ctx);
        return;
    }
    if (!(fault_previous.sa_flags & SA_SIGINFO) && fault_previous.sa_handler != SIG_DFL &&
        fault_previous.sa_handler != SIG_IGN) {
        fault_previous.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    /* SIGBUS is not blocked here (SA_NODEFER): it is delivered, with the default action, before
     * raise returns. */
    raise(SIGBUS);
}

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
    fault_guard *g = catching_guard();
    if (!g || si->si_code <= 0) {
        pass_on(sig, si, ctx);
        return;
    }
    fault_top = g->outer;
    g->info.code = si->si_code;
    g->info.addr = (uintptr_t)si->si_addr;
    siglongjmp(g->env, 1);
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    /* SA_NODEFER: the jump out of the handler leaves the thread's mask as it was (sigsetjmp does
     * not save it), so the next fault is caught too. */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    fault_installed = sigaction(SIGBUS, &sa, &fault_previous) == 0;
}

corral_status fault_init(corral_error *err) {
    pthread_once(&fault_once, install);
    if (!fault_installed)
        return corral_error_set(err, CORRAL_INTERNAL, "cannot install the SIGBUS handler");
    return CORRAL_OK;
}

void fault_guard_enter(fault_guard *g) {
    g->fatal = 0;
    g->info = (fault_info){0};
    g->outer = fault_top;
    fault_top = g;
}

void fault_guard_enter_fatal(fault_guard *g) {
    g->fatal = 1;
    g->info = (fault_info){0};
    g->outer = fault_top;
    fault_top = g;
}

void fault_guard_leave(fault_guard *g) {
    /* Leaving any guard but the innermost would corrupt the stack: a programming error. */
    if (fault_top != g) abort();
    fault_top = g->outer;
}

int fault_guarded(void) {
    return catching_guard() != NULL;
}

void fault_deliver(const fault_info *info) {
    fault_guard *g = catching_guard();
    if (g) {
        fault_top = g->outer;
        g->info = *info;
        siglongjmp(g->env, 1);
    }
    /* Nobody catches it: end the way the fault itself would have ended the process. */
    raise(SIGBUS);
    abort();
}

const char *fault_code_text(int code) {
    switch (code) {
        case BUS_ADRERR:
            return "no file page behind the address (the file is shorter than its mapping)";
        case BUS_OBJERR:
            return "the file's page could not be read (I/O error)";
#ifdef BUS_MCEERR_AR
        case BUS_MCEERR_AR:
            return "a memory error";
#endif
        default:
            return "a bus error";
    }
}
