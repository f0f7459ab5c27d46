// Small file-system helpers with crash-safe semantics: mkdir -p, atomic file replacement (write a temp file
// in the same directory, fsync it, rename it over the target, fsync the directory), whole-file reads, and
// recursive removal. All fail with a one-line kiln_error naming the path.
#ifndef KILN_IO_FSUTIL_H
#define KILN_IO_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"
#include "util/sha256.h"

// Creates path and any missing parents (mode 0777 & ~umask). An existing directory is fine.
int kiln_mkdir_p(const char *path, struct kiln_error *err);

// fsyncs a directory, making renames and creations inside it durable.
int kiln_fsync_dir(const char *path, struct kiln_error *err);

// Writes path atomically: readers see either the old file or the complete new one, also after a crash.
int kiln_write_file_atomic(const char *path, const void *data, size_t n, struct kiln_error *err);

// The streaming form of kiln_write_file_atomic, for large files:
//   kiln_afile_open -> kiln_afile_write ... -> kiln_afile_commit (or kiln_afile_abort on any failure).
// The bytes written are hashed on the way (sha256), so callers get a checksum without reading back.
struct kiln_afile {
    int fd;
    char path[1024]; // the target
    char tmp[1100];  // PATH.tmp-<pid>-<nonce> in the same directory
    uint64_t bytes;  // written so far
    struct kiln_sha256 sha;
};
int kiln_afile_open(struct kiln_afile *f, const char *path, struct kiln_error *err);
int kiln_afile_write(struct kiln_afile *f, const void *data, size_t n, struct kiln_error *err);
// fsync + rename + fsync dir. sha256_hex (may be NULL) gets the hash of everything written.
int kiln_afile_commit(struct kiln_afile *f, char sha256_hex[65], struct kiln_error *err);
void kiln_afile_abort(struct kiln_afile *f); // closes and removes the temp file; safe after a failed call

// Reads a whole file into a malloc'd buffer (NUL-terminated for convenience; *n excludes the NUL).
int kiln_read_file(const char *path, char **data, size_t *n, struct kiln_error *err);

// rm -rf path (does not follow symlinks). A missing path is fine.
int kiln_remove_tree(const char *path, struct kiln_error *err);

// 1 if path is an existing directory, 0 otherwise.
int kiln_is_dir(const char *path);

// snprintf into out, failing (instead of truncating) when the result does not fit.
int kiln_path_join(char *out, size_t cap, const char *dir, const char *name, struct kiln_error *err);

// One writer per directory: an advisory lock (flock) on DIR/.lock, held until kiln_dir_unlock or the
// process's death (the kernel releases it, so a crash never leaves a stale lock). The file names the holder
// ("pid PID host HOST"); a second taker gets a usage error naming them. *fd_out gets the lock's descriptor.
int kiln_dir_lock(const char *dir, const char *what, int *fd_out, struct kiln_error *err);
void kiln_dir_unlock(int fd); // -1 is fine

// A fresh 64-bit value for temp names (time, pid and a counter mixed); not cryptographic.
uint64_t kiln_nonce(void);

#endif
