/* Local workers (local_workers.h): child processes, each watched through a pidfd
 * so that `pliant run`'s loop can wait on them with a timeout. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "local_workers.h"
#include "util.h"

extern char **environ;

typedef struct {
    char name[PL_WORKER_NAME_MAX];
    pid_t pid;
    int pidfd;
} child;

struct pl_local_workers {
    child *kids;
    int n, cap;
};

static child *find(pl_local_workers *lw, const char *name)
{
    for (int i = 0; i < lw->n; i++)
        if (!strcmp(lw->kids[i].name, name)) return &lw->kids[i];
    return NULL;
}

/* environ plus the spec's entries (which win): built before fork, used by the child. */
static char **merged_env(char *const *extra)
{
    int n = 0, m = 0;
    while (environ[n]) n++;
    while (extra && extra[m]) m++;
    char **env = calloc((size_t)(n + m + 1), sizeof *env);
    if (!env) return NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t klen = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
        int overridden = 0;
        for (int j = 0; j < m && !overridden; j++) overridden = !strncmp(extra[j], environ[i], klen);
        if (!overridden) env[k++] = environ[i];
    }
    for (int j = 0; j < m; j++) env[k++] = extra[j];
    return env;
}

int pl_local_workers_start(pl_local_workers *lw, const pl_worker_spec *w, char *err,
                           size_t errlen)
{
    if (!w->name[0] || find(lw, w->name))
        return pl_errf(err, errlen, "worker \"%s\": %s", w->name,
                       w->name[0] ? "a worker of that name is already running" : "empty name");
    if (!w->argv || !w->argv[0]) return pl_errf(err, errlen, "worker \"%s\": no command", w->name);
    if (lw->n == lw->cap) {
        int cap = lw->cap ? 2 * lw->cap : 16;
        child *grown = realloc(lw->kids, (size_t)cap * sizeof *grown);
        if (!grown) return pl_errf(err, errlen, "worker \"%s\": out of memory", w->name);
        lw->kids = grown;
        lw->cap = cap;
    }
    char **env = merged_env(w->env);
    int logfd = w->log_path ? open(w->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    /* a pipe closed by exec tells the parent whether exec worked */
    int pipefd[2] = {-1, -1};
    if (!env || (w->log_path && logfd < 0) || pipe2(pipefd, O_CLOEXEC)) {
        int e = errno;
        free(env);
        if (logfd >= 0) close(logfd);
        return pl_errf(err, errlen, "worker \"%s\": %s", w->name,
                       w->log_path && logfd < 0 ? "cannot open its log" : strerror(e));
    }
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        if (logfd >= 0) {
            dup2(logfd, STDOUT_FILENO);
            dup2(logfd, STDERR_FILENO);
        }
        setpgid(0, 0); /* its own group: a signal to us is not a signal to it */
        /* ...but our end is its end: no worker outlives `pliant run` (even SIGKILLed) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        execve(w->argv[0], w->argv, env);
        int e = errno;
        if (write(pipefd[1], &e, sizeof e) < 0) _exit(127);
        _exit(127);
    }
    int e = errno;
    free(env);
    if (logfd >= 0) close(logfd);
    close(pipefd[1]);
    if (pid < 0) {
        close(pipefd[0]);
        return pl_errf(err, errlen, "worker \"%s\": fork: %s", w->name, strerror(e));
    }
    int exec_errno = 0;
    ssize_t got = read(pipefd[0], &exec_errno, sizeof exec_errno);
    close(pipefd[0]);
    if (got == (ssize_t)sizeof exec_errno) {
        waitpid(pid, NULL, 0);
        return pl_errf(err, errlen, "worker \"%s\": cannot run %s: %s", w->name, w->argv[0],
                       strerror(exec_errno));
    }
    int pidfd = pidfd_open(pid, 0);
    if (pidfd < 0) {
        e = errno;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return pl_errf(err, errlen, "worker \"%s\": pidfd_open: %s", w->name, strerror(e));
    }
    child *c = &lw->kids[lw->n++];
    snprintf(c->name, sizeof c->name, "%s", w->name);
    c->pid = pid;
    c->pidfd = pidfd;
    return 0;
}

/* Signals go to the worker's whole process group (everything on a "node"
 * dies with it); the group id stays valid until we reap the leader. */
int pl_local_workers_signal(pl_local_workers *lw, const char *name, int sig, char *err,
                            size_t errlen)
{
    child *c = find(lw, name);
    if (!c) return pl_errf(err, errlen, "worker \"%s\": not running", name);
    if (kill(-c->pid, sig) && pidfd_send_signal(c->pidfd, sig, NULL, 0))
        return pl_errf(err, errlen, "worker \"%s\": signal %d: %s", name, sig, strerror(errno));
    return 0;
}

/* Reaps child i (its pidfd is readable) into ev and drops it from the table. */
static void reap(pl_local_workers *lw, int i, pl_worker_event *ev)
{
    child c = lw->kids[i];
    int status = 0;
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(c.pidfd);
    lw->kids[i] = lw->kids[--lw->n];
    memset(ev, 0, sizeof *ev);
    snprintf(ev->name, sizeof ev->name, "%s", c.name);
    if (WIFSIGNALED(status)) {
        ev->end = PL_WORKER_KILLED;
        ev->signal = WTERMSIG(status);
    } else {
        ev->end = PL_WORKER_EXITED;
        ev->status = WEXITSTATUS(status);
    }
}

int pl_local_workers_wait(pl_local_workers *lw, pl_worker_event *ev, int timeout_ms)
{
    if (lw->n == 0) {
        if (timeout_ms > 0) poll(NULL, 0, timeout_ms);
        return 0;
    }
    struct pollfd *fds = calloc((size_t)lw->n, sizeof *fds);
    if (!fds) return -1;
    for (int i = 0; i < lw->n; i++) fds[i] = (struct pollfd){.fd = lw->kids[i].pidfd, .events = POLLIN};
    int r;
    while ((r = poll(fds, (nfds_t)lw->n, timeout_ms)) < 0 && errno == EINTR) {
    }
    int found = -1;
    for (int i = 0; r > 0 && i < lw->n && found < 0; i++)
        if (fds[i].revents) found = i;
    free(fds);
    if (r < 0) return -1;
    if (found < 0) return 0;
    reap(lw, found, ev);
    return 1;
}

int pl_local_workers_count(const pl_local_workers *lw)
{
    return lw->n;
}

void pl_local_workers_free(pl_local_workers *lw)
{
    if (!lw) return;
    for (int i = 0; i < lw->n; i++)
        if (kill(-lw->kids[i].pid, SIGKILL)) pidfd_send_signal(lw->kids[i].pidfd, SIGKILL, NULL, 0);
    pl_worker_event ev;
    while (lw->n) reap(lw, lw->n - 1, &ev);
    free(lw->kids);
    free(lw);
}

pl_local_workers *pl_local_workers_new(char *err, size_t errlen)
{
    pl_local_workers *lw = calloc(1, sizeof *lw);
    if (!lw) pl_errf(err, errlen, "local workers: out of memory");
    return lw;
}
