#include "io/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int kiln_mkdir_p(const char *path, struct kiln_error *err) {
    char buf[1024];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf))
        return kiln_errorf(err, KILN_ERR_USAGE, "bad directory path (%s): empty or longer than %zu bytes",
                           path, sizeof(buf) - 1);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot create directory (%s): %s", buf,
                               strerror(errno));
        buf[i] = c;
    }
    if (!kiln_is_dir(path))
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot create directory (%s): a file of that name exists",
                           path);
    return 0;
}

int kiln_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int kiln_fsync_dir(const char *path, struct kiln_error *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open directory (%s): %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    // some file systems refuse fsync on directories (EINVAL); their renames are as durable as they get
    if (rc != 0 && e != EINVAL && e != EROFS)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot fsync directory (%s): %s", path, strerror(e));
    return 0;
}

int kiln_path_join(char *out, size_t cap, const char *dir, const char *name, struct kiln_error *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return kiln_errorf(err, KILN_ERR_USAGE, "path too long (%s/%s): longer than %zu bytes", dir, name,
                           cap - 1);
    return 0;
}

uint64_t kiln_nonce(void) {
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16) ^
                 (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ULL);
    // splitmix64 finalizer
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// The directory part of path ("." when there is none), for fsyncing after a rename.
static void dir_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(out, cap, ".");
    } else if (slash == path) {
        snprintf(out, cap, "/");
    } else {
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
    }
}

// ---- atomic files -----------------------------------------------------------------------------

int kiln_afile_open(struct kiln_afile *f, const char *path, struct kiln_error *err) {
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    if (strlen(path) >= sizeof(f->path))
        return kiln_errorf(err, KILN_ERR_USAGE, "path too long (%s): longer than %zu bytes", path,
                           sizeof(f->path) - 1);
    snprintf(f->path, sizeof(f->path), "%s", path);
    snprintf(f->tmp, sizeof(f->tmp), "%s.tmp-%ld-%016llx", path, (long)getpid(),
             (unsigned long long)kiln_nonce());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot create file (%s): %s", f->tmp, strerror(errno));
    kiln_sha256_init(&f->sha);
    return 0;
}

int kiln_afile_write(struct kiln_afile *f, const void *data, size_t n, struct kiln_error *err) {
    KILN_ASSERT(f->fd >= 0);
    const char *p = data;
    kiln_sha256_update(&f->sha, data, n);
    while (n) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write file (%s): %s", f->tmp,
                               w < 0 ? strerror(errno) : "wrote 0 bytes");
        p += w, n -= (size_t)w, f->bytes += (uint64_t)w;
    }
    return 0;
}

int kiln_afile_commit(struct kiln_afile *f, char sha256_hex[65], struct kiln_error *err) {
    KILN_ASSERT(f->fd >= 0);
    if (fsync(f->fd) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot fsync file (%s): %s", f->tmp, strerror(errno));
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot close file (%s): %s", f->tmp, strerror(errno));
    if (rename(f->tmp, f->path) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot rename file (%s -> %s): %s", f->tmp, f->path,
                           strerror(errno));
    f->tmp[0] = '\0'; // nothing left to clean up
    char dir[1024];
    dir_of(f->path, dir, sizeof(dir));
    if (kiln_fsync_dir(dir, err))
        return err ? err->code : KILN_ERR_RUNTIME;
    if (sha256_hex) {
        uint8_t d[32];
        kiln_sha256_final(&f->sha, d);
        kiln_sha256_hex(d, sha256_hex);
    }
    return 0;
}

void kiln_afile_abort(struct kiln_afile *f) {
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp[0])
        unlink(f->tmp);
    f->tmp[0] = '\0';
}

int kiln_write_file_atomic(const char *path, const void *data, size_t n, struct kiln_error *err) {
    struct kiln_afile f;
    int rc = kiln_afile_open(&f, path, err);
    if (!rc)
        rc = kiln_afile_write(&f, data, n, err);
    if (!rc)
        rc = kiln_afile_commit(&f, NULL, err);
    kiln_afile_abort(&f);
    return rc;
}

// ---- reading and removing ---------------------------------------------------------------------

int kiln_read_file(const char *path, char **data, size_t *n, struct kiln_error *err) {
    *data = NULL;
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open file (%s): %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read file (%s): not a regular file", path);
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = kiln_xmalloc(cap);
    for (;;) {
        if (len + 1 == cap) { // the file grew while we read it
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                close(fd);
                return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read file (%s): out of memory", path);
            }
            buf = nb;
        }
        ssize_t got = read(fd, buf + len, cap - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot read file (%s): %s", path, strerror(e));
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    *data = buf;
    *n = len;
    return 0;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)ftw;
    int rc = (type == FTW_DP) ? rmdir(path) : unlink(path);
    return (rc != 0 && errno != ENOENT) ? errno : 0;
}

int kiln_remove_tree(const char *path, struct kiln_error *err) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT
                   ? 0
                   : kiln_errorf(err, KILN_ERR_RUNTIME, "cannot remove (%s): %s", path, strerror(errno));
    int rc = nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    if (rc != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot remove (%s): %s", path,
                           rc > 0 ? strerror(rc) : strerror(errno));
    return 0;
}

int kiln_dir_lock(const char *dir, const char *what, int *fd_out, struct kiln_error *err) {
    char path[1100];
    *fd_out = -1;
    int rc = kiln_path_join(path, sizeof(path), dir, ".lock", err);
    if (rc)
        return rc;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot open %s (%s): %s", path, what, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[256] = "";
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        close(fd);
        if (e != EWOULDBLOCK)
            return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot lock %s (%s): %s", path, what, strerror(e));
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "%s (%s) is in use by another kiln job (%s, %s): one job writes a run directory at a "
                           "time; wait for it to end, or use another %s",
                           dir, what, holder[0] ? holder : "holder unknown", path, what);
    }
    char host[128] = "?", line[256];
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = 0;
    int len = snprintf(line, sizeof(line), "pid %ld host %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        int e = errno;
        close(fd);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write %s (%s): %s", path, what, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

void kiln_dir_unlock(int fd) {
    if (fd >= 0)
        close(fd); // releases the flock
}
