/*
 * latencyfs: a read-only FUSE pass-through that adds a fixed delay to every open.
 *
 *     latencyfs BACKING_DIR MOUNTPOINT DELAY_US [FUSE options, e.g. -f]
 *
 * It emulates a source where each open costs about a millisecond more than
 * on a local disk (a parallel file system's metadata round trip) while reads
 * stay cheap, so that `python -m bench --workloads ingest` can compare an
 * ingest that reads many files at once with one that reads one at a time.
 * The delay is a sleep on the calling FUSE thread: opens in flight overlap,
 * as they do on a real parallel file system.  Written in C (libfuse3's
 * multithreaded loop) so the emulator's own cost per file stays small next
 * to the delay; bench/latency_fs.py builds and mounts it.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char backing[PATH_MAX];
static long delay_us;

static void full_path(char out[PATH_MAX], const char *path) {
    snprintf(out, PATH_MAX, "%s%s", backing, path);
}

static void *lfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->entry_timeout = 3600;
    cfg->attr_timeout = 3600;
    cfg->negative_timeout = 3600;
    cfg->kernel_cache = 0; /* every open reads through this process again */
    cfg->use_ino = 1;
    return NULL;
}

static int lfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    if (fi)
        return fstat((int)fi->fh, st) == -1 ? -errno : 0;
    full_path(p, path);
    return lstat(p, st) == -1 ? -errno : 0;
}

static int lfs_readlink(const char *path, char *buf, size_t size) {
    char p[PATH_MAX];
    full_path(p, path);
    ssize_t n = readlink(p, buf, size - 1);
    if (n == -1)
        return -errno;
    buf[n] = '\0';
    return 0;
}

static int lfs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset,
                       struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)offset; (void)fi; (void)flags;
    char p[PATH_MAX];
    full_path(p, path);
    DIR *dir = opendir(p);
    if (!dir)
        return -errno;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_ino = entry->d_ino;
        st.st_mode = (mode_t)entry->d_type << 12;
        if (fill(buf, entry->d_name, &st, 0, 0))
            break;
    }
    closedir(dir);
    return 0;
}

static int lfs_open(const char *path, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    if ((fi->flags & O_ACCMODE) != O_RDONLY)
        return -EROFS;
    if (delay_us > 0) {
        struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    full_path(p, path);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd == -1)
        return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int lfs_read(const char *path, char *buf, size_t size, off_t offset,
                    struct fuse_file_info *fi) {
    (void)path;
    ssize_t n = pread((int)fi->fh, buf, size, offset);
    return n == -1 ? -errno : (int)n;
}

static int lfs_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int lfs_flush(const char *path, struct fuse_file_info *fi) {
    (void)path; (void)fi;
    return 0;
}

static const struct fuse_operations ops = {
    .init = lfs_init,
    .getattr = lfs_getattr,
    .readlink = lfs_readlink,
    .readdir = lfs_readdir,
    .open = lfs_open,
    .read = lfs_read,
    .flush = lfs_flush,
    .release = lfs_release,
};

int main(int argc, char *argv[]) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s BACKING_DIR MOUNTPOINT DELAY_US [FUSE options]\n", argv[0]);
        return 2;
    }
    if (!realpath(argv[1], backing)) {
        perror(argv[1]);
        return 1;
    }
    delay_us = strtol(argv[3], NULL, 10);
    char *args[64];
    int n = 0;
    args[n++] = argv[0];
    args[n++] = argv[2];
    for (int i = 4; i < argc && n < 60; i++)
        args[n++] = argv[i];
    args[n++] = "-o";
    args[n++] = "ro,default_permissions,fsname=latencyfs";
    args[n] = NULL;
    return fuse_main(n, args, &ops, NULL);
}
