/*
 * paths.h — the directories corral writes and how it spells paths: one home for both.
 *
 * Per-user defaults. A corrald (or `corral bench`, `corral run-local`) that its configuration does
 * not point elsewhere keeps its state under the running user's own directories, as the XDG base
 * directory specification lays them out, so that two users (or a user and a system daemon) never
 * share one folder:
 *   swapped-out session state   $XDG_STATE_HOME/corral/swap   (else ~/.local/state/corral/swap)
 *   cached images               $XDG_CACHE_HOME/corral        (else ~/.cache/corral)
 * XDG_* values that are not absolute are ignored, as the specification says. Without a home
 * (HOME unset and no passwd entry) the defaults fall back to /tmp/corral-$UID/{state,cache}, as
 * the default endpoint falls back to /tmp/corral-$UID. A system-wide daemon names its folders in
 * its configuration (memory.swap_dir, cache.dir).
 *
 * Making directories. paths_make_dir is `mkdir -p` with mode 0700 for every component it
 * creates (a folder that exists keeps its mode), so state written there is private to its user.
 *
 * Spelling. paths_join resolves a relative path against a folder and removes the `.` and `dir/..`
 * components the join produced, so that what logs and `corral models` show is the file's plain
 * path (/home/u/shared/m.gguf, not /home/u/corral/config/../../shared/m.gguf). A `..` after a
 * symbolic link is kept, since the kernel resolves it from the link's target.
 *
 * Thread-safety: the functions read the environment and the file system only; reentrant.
 */
#ifndef CORRAL_PATHS_H
#define CORRAL_PATHS_H

#include <stddef.h>

#include "corral/status.h"

/* The per-user folder for corrald's swapped-out state: "$XDG_STATE_HOME/corral/swap", else
 * "$HOME/.local/state/corral/swap" (see the file comment). Written NUL-terminated into buf (not
 * created). CORRAL_INVALID_ARGUMENT when it does not fit in size bytes. */
corral_status paths_user_swap_dir(char *buf, size_t size, corral_error *err);

/* The per-user folder for cached images (merged variants, rearranged weights):
 * "$XDG_CACHE_HOME/corral", else "$HOME/.cache/corral". As paths_user_swap_dir. */
corral_status paths_user_cache_dir(char *buf, size_t size, corral_error *err);

/* `mkdir -p path`: every missing component is created with mode 0700. CORRAL_OK when path is (or
 * now is) a directory; CORRAL_IO naming the component that could not be made, or the path when
 * it exists but is not a directory; CORRAL_INVALID_ARGUMENT for an empty or overlong path. */
corral_status paths_make_dir(const char *path, corral_error *err);

/* `rel` resolved against `base` (rel itself when it is absolute or base is NULL), with the `.`
 * components and the `name/..` pairs removed where name is not a symbolic link, and repeated
 * slashes collapsed. Written into out (size bytes, NUL-terminated). CORRAL_INVALID_ARGUMENT when
 * it does not fit. */
corral_status paths_join(const char *base, const char *rel, char *out, size_t size,
                         corral_error *err);

#endif /* CORRAL_PATHS_H */
