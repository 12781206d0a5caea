/* The idle-priority sibling that releases a dead worker's memory (idle_teardown.h). */
#include "idle_teardown.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

#define SIBLING_STACK (64 * 1024)

typedef struct {
    pid_t parent;
    int ready_fd; /* write end of a pipe: one byte once set up */
} sibling_args;

/* Raw system calls only: the sibling shares the worker's thread-local storage (errno). */
static _Noreturn void sibling_exit(void)
{
    for (;;) syscall(SYS_exit, 1);
}

/* Until every thread of the worker has ended (a pidfd reads so once its thread group is
 * empty), then out: the exit releases the address space. Not the parent-death signal: it
 * comes when the worker's first thread ends, and a thread of the worker still ending after
 * the sibling would release the memory itself, before its descriptors close. */
static _Noreturn void wait_for_the_worker(int pidfd)
{
    struct pollfd pf = {.fd = pidfd, .events = POLLIN};
    for (;;)
        if (syscall(SYS_ppoll, &pf, 1, NULL, NULL, 0) == 1) sibling_exit();
}

/* Closes every descriptor but keep[0] and keep[1] (keep[0] < keep[1]). */
static int close_all_but(const int keep[2])
{
    return (keep[0] > 0 && syscall(SYS_close_range, 0, keep[0] - 1, 0)) ||
           (keep[1] > keep[0] + 1 && syscall(SYS_close_range, keep[0] + 1, keep[1] - 1, 0)) ||
           syscall(SYS_close_range, keep[1] + 1, ~0U, 0);
}

/* The sibling. It shares the worker's memory, thread-local storage included, so it makes
 * raw system calls only, and the worker waits for its one byte before going on: past
 * that point the sibling only waits (every signal blocked but SIGKILL). */
__attribute__((no_sanitize_address)) static int sibling_main(void *p)
{
    const sibling_args *a = p;
    static const struct sched_param idle = {0};
    const long pidfd = syscall(SYS_pidfd_open, a->parent, 0);
    if (pidfd < 0 || syscall(SYS_sched_setscheduler, 0, SCHED_IDLE, &idle) ||
        /* a group of its own: a kill of the worker's group (`pliant run`'s chaos, a
         * shell's) leaves it to end after the worker */
        syscall(SYS_setpgid, 0, 0))
        sibling_exit();
    const int fd = a->ready_fd;
    /* no descriptor but the pipe and the pidfd: the worker's sockets and pipes close with
     * the worker */
    const int keep[2] = {fd < pidfd ? fd : (int)pidfd, fd < pidfd ? (int)pidfd : fd};
    if (close_all_but(keep)) sibling_exit();
    char one = 1;
    if (syscall(SYS_write, fd, &one, 1) != 1) sibling_exit();
    syscall(SYS_close, fd);
    wait_for_the_worker((int)pidfd);
}

int pl_idle_teardown_arm(pid_t *sibling, char *err, size_t errlen)
{
    int ready[2];
    if (pipe2(ready, O_CLOEXEC))
        return pl_errf(err, errlen, "idle teardown: pipe: %s", strerror(errno));
    char *stack = mmap(NULL, SIBLING_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    sibling_args args = {.parent = getpid(), .ready_fd = ready[1]};
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* the sibling starts with them blocked */
    const pid_t pid =
        stack == MAP_FAILED ? -1 : clone(sibling_main, stack + SIBLING_STACK, CLONE_VM, &args);
    const int clone_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(ready[1]);
    char one = 0;
    ssize_t n = 0, eof = 0;
    while (pid >= 0 && (n = read(ready[0], &one, 1)) < 0 && errno == EINTR) {
    } /* until it is set up, or gone */
    while (n == 1 && (eof = read(ready[0], &one, 1)) < 0 && errno == EINTR) {
    } /* and has closed the pipe: from here on it holds the pidfd alone */
    close(ready[0]);
    if (pid < 0) {
        if (stack != MAP_FAILED) munmap(stack, SIBLING_STACK);
        return pl_errf(err, errlen, "idle teardown: clone: %s", strerror(clone_errno));
    }
    if (n != 1 || eof != 0) { /* it gave up: reap it (no exit signal, so __WCLONE) */
        waitpid(pid, NULL, __WCLONE);
        munmap(stack, SIBLING_STACK);
        return pl_errf(err, errlen, "idle teardown: the sibling could not set itself up");
    }
    if (sibling) *sibling = pid;
    return 0; /* the stack stays: the sibling sleeps on it */
}
