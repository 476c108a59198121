/*
 * dirlock.h — one corrald per directory: an exclusive lock on the swap and cache directories.
 *
 * Two daemons sharing a swap directory would clean each other's session images at start and
 * overwrite each other's files; two sharing a cache directory would trim each other's images.
 * Each directory corrald writes holds a lock file (.corrald.lock) on which the running daemon
 * holds an flock(2) for its whole life, with its pid written in it, so a second daemon refuses to
 * start and names the one that holds it. The kernel drops the lock when the process ends, however
 * it ends, so a crash leaves nothing stale behind.
 */
#ifndef CORRAL_DAEMON_DIRLOCK_H
#define CORRAL_DAEMON_DIRLOCK_H

#include "corral/status.h"

typedef struct dirlock dirlock;

/* Lock directory `dir` (created with its missing parents, mode 0700) for this process. `what` names
 * it in messages ("swap directory"). Returns the lock, or NULL with err: CORRAL_UNAVAILABLE naming
 * the holder's pid when another process holds it. A directory that cannot be created or written
 * is not locked: NULL with CORRAL_OK in err->status (the caller goes on without it; what it
 * writes there fails on its own, with its own message). Caller owns the result. */
dirlock *dirlock_take(const char *dir, const char *what, corral_error *err);

/* Release the lock. NULL-safe; sets *l to NULL. */
void dirlock_release(dirlock **l);

#endif /* CORRAL_DAEMON_DIRLOCK_H */
