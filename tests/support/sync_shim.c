/*
 * An LD_PRELOAD shim that models a disk's write-back for one file, so that
 * tests can show what a power loss or a failed fsync leaves without special
 * hardware.
 *
 * SYNC_SHIM_FILE names the file. For every fsync/fdatasync of it:
 *  - the call passes through; when it works, the file's length is written
 *    to "<file>.synced": what a power loss right now would leave;
 *  - while "<file>.fail-sync" exists, the call fails with EIO instead, and
 *    the file is cut back to its length at the last sync that worked (the
 *    kernel dropped the unsynced pages' write-back), appending the bytes
 *    cut to "<file>.lost", one line per failure.
 * Every other file's syncs pass through untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int is_target(int fd, const char *path) {
    struct stat a, b;
    if (fstat(fd, &a) != 0 || stat(path, &b) != 0)
        return 0;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static void put(const char *path, const char *suffix, long long value, int append) {
    char name[4096];
    snprintf(name, sizeof name, "%s%s", path, suffix);
    int fd = open(name, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd < 0)
        return;
    char text[32];
    int n = snprintf(text, sizeof text, "%lld\n", value);
    if (write(fd, text, (size_t)n) < 0) {
        /* Nothing to do: the test sees the missing record. */
    }
    close(fd);
}

static long long synced_length(const char *path) {
    char name[4096];
    snprintf(name, sizeof name, "%s.synced", path);
    FILE *f = fopen(name, "r");
    if (!f)
        return 0;
    long long value = 0;
    if (fscanf(f, "%lld", &value) != 1)
        value = 0;
    fclose(f);
    return value;
}

static int sync_through(int fd, int (*real)(int)) {
    const char *path = getenv("SYNC_SHIM_FILE");
    if (!path || !is_target(fd, path))
        return real(fd);
    pthread_mutex_lock(&lock);
    char fail[4096];
    snprintf(fail, sizeof fail, "%s.fail-sync", path);
    int result;
    struct stat st;
    if (access(fail, F_OK) == 0) {
        long long keep = synced_length(path);
        long long cut = 0;
        if (fstat(fd, &st) == 0 && st.st_size > keep) {
            cut = st.st_size - keep;
            int w = open(path, O_WRONLY);
            if (w >= 0) {
                if (ftruncate(w, keep) != 0)
                    cut = 0;
                close(w);
            }
        }
        put(path, ".lost", cut, 1);
        errno = EIO;
        result = -1;
    } else {
        result = real(fd);
        if (result == 0 && fstat(fd, &st) == 0)
            put(path, ".synced", (long long)st.st_size, 0);
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return sync_through(fd, real);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return sync_through(fd, real);
}
