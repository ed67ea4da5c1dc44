/* File I/O for qmalloc's own output and start-up reads (messages, statistics, heap profiles,
 * /proc/self/environ and maps), made as raw system calls. glibc's open, read, write and close are
 * cancellation points: a thread cancelled in one while it held a qmalloc lock unwound with the
 * lock held, and every thread that wanted it later waited for ever (a heap-profile dump to a pipe
 * nobody read, cancelled in its write under the profiler's lock: every later sample hung:
 * api-prof_cancel). qmalloc calls no cancellation point; a cancel waiting on the thread acts at the
 * program's next one. Each returns what the system call does, with errno set as glibc's would
 * (-1 and errno on failure); they are async-signal-safe (the profiler's dump signal). */
#ifndef QM_OS_FILE_H
#define QM_OS_FILE_H

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static inline int os_file_open(const char *path, int flags, mode_t mode) {
  return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

static inline ssize_t os_file_read(int fd, void *buf, size_t n) { return (ssize_t)syscall(SYS_read, fd, buf, n); }

static inline ssize_t os_file_write(int fd, const void *buf, size_t n) { return (ssize_t)syscall(SYS_write, fd, buf, n); }

static inline int os_file_close(int fd) { return (int)syscall(SYS_close, fd); }

#endif
