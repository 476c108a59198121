/*
 * fault.h — surviving SIGBUS from memory-mapped files: a guarded region turns the fault into an
 * error its caller handles, instead of the signal ending the process.
 *
 * corral maps its weights (model files, repacked and merged images) read-only and reads them in
 * place. When such a file is truncated or rewritten while mapped, a read of a page that is no
 * longer backed by the file raises SIGBUS (si_code BUS_ADRERR; an unreadable disk block gives
 * the same). The kernel sends it to the thread that read, synchronously, at the instruction that
 * read: nothing can be checked in advance (the file may shrink between any check and the read).
 *
 * A guard is a sigsetjmp point on the stack of one thread. fault_init installs one process-wide
 * SIGBUS handler; when a thread faults inside a guarded region, the handler records what failed
 * (fault_info) and siglongjmps to that thread's innermost guard, whose sigsetjmp then returns
 * nonzero. Guards nest (each thread keeps a stack of them, in thread-local storage). A fault with
 * no guard armed on its thread, or a SIGBUS sent by kill(), goes to whatever handled SIGBUS
 * before fault_init (the default action ends the process, as it did before; a sanitizer's
 * handler reports it): only faults that corral is ready for are caught.
 *
 * Usage, the only pattern that is correct (setjmp's rules):
 *
 *     fault_guard g;
 *     if (sigsetjmp(g.env, 0) == 0) {
 *         fault_guard_enter(&g);
 *         ... reads of mapped memory ...
 *         fault_guard_leave(&g);
 *     } else {
 *         ... g.info says what failed; the guard is already left ...
 *     }
 *
 * sigsetjmp is called with savemask 0 (no system call), and the handler is installed with
 * SA_NODEFER, so the thread's signal mask is the same after the jump as before the fault. Local
 * variables of the function that calls sigsetjmp and that change inside the guarded region must be
 * volatile to be read after a jump (C11 7.13.2.1). What a jump skips is never run: whatever the
 * region held (locks, allocations, half-written buffers) is the caller's to reason about —
 * corral guards only code that takes no locks and whose allocations belong to an owner that is
 * destroyed as a whole (see docs/robustness.md).
 *
 * Threads. A fault is delivered to the thread that read, so every thread that reads mappings
 * guards its own reads; a thread must leave SIGBUS unblocked (a blocked SIGBUS caused by a fault
 * ends the process whatever the handler). threadpool.c guards each slice of a run on the thread
 * that runs it and hands a fault on to the caller of the run (fault_deliver).
 */
#ifndef CORRAL_FAULT_H
#define CORRAL_FAULT_H

#include <setjmp.h>
#include <stdint.h>

#include "corral/status.h"

/* What a caught fault was. */
typedef struct fault_info {
    int code;       /* si_code: BUS_ADRERR (no file page behind it), BUS_OBJERR, ... */
    uintptr_t addr; /* the address whose read failed */
} fault_info;

/* One guarded region (on the stack of the thread that runs it). */
typedef struct fault_guard {
    sigjmp_buf env;            /* where a fault jumps to: the caller's sigsetjmp */
    fault_info info;           /* filled before the jump */
    struct fault_guard *outer; /* the guard this one is nested in (fault.c's) */
    int fatal;                 /* 1: a fault here is not caught (fault_guard_enter_fatal) */
} fault_guard;

/* Install the SIGBUS handler (once per process; later calls do nothing). Thread-safe. Errors:
 * CORRAL_INTERNAL when sigaction fails. Nothing is caught before it is called: libraries that
 * guard (threadpool_new, model_load) call it themselves. */
corral_status fault_init(corral_error *err);

/* Arm g, which the caller has just passed to sigsetjmp: a fault on this thread until
 * fault_guard_leave(g) jumps there. Guards nest; g must be left before an outer one is. */
void fault_guard_enter(fault_guard *g);

/* Arm g as a region where faults are NOT caught, even if an outer guard is armed: for code
 * that a jump must never leave half-done (a thread-pool run whose threads meet at barriers). No
 * sigsetjmp is needed. Leave it with fault_guard_leave. */
void fault_guard_enter_fatal(fault_guard *g);

/* Disarm g (the innermost guard of this thread) after its region ended without a fault. */
void fault_guard_leave(fault_guard *g);

/* 1 when a guard that catches faults is armed on this thread. */
int fault_guarded(void);

/* Deliver a fault to this thread's innermost guard as if the thread had just faulted with *info
 * (the thread pool hands a worker's fault to the thread that ran the pool). Does not return. With
 * no catching guard armed, raises SIGBUS the way the fault would have (the process ends). */
void fault_deliver(const fault_info *info) __attribute__((noreturn));

/* A short description of info->code ("address not backed by the file", ...). Static. */
const char *fault_code_text(int code);

#endif /* CORRAL_FAULT_H */
