/* The local backend: workers are child processes, each watched through a
 * pidfd so that the controller's loop can wait on them with a timeout. */
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

#include "backend.h"
#include "util.h"

extern char **environ;

typedef struct {
    char name[PL_WORKER_NAME_MAX];
    pid_t pid;
    int pidfd;
} child;

typedef struct {
    pl_backend base;
    child *kids;
    int n, cap;
} local_backend;

static child *find(local_backend *lb, const char *name)
{
    for (int i = 0; i < lb->n; i++)
        if (!strcmp(lb->kids[i].name, name)) return &lb->kids[i];
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

static int local_create(pl_backend *b, const pl_worker_spec *w, char *err, size_t errlen)
{
    local_backend *lb = (local_backend *)b;
    if (!w->name[0] || find(lb, w->name))
        return pl_errf(err, errlen, "worker \"%s\": %s", w->name,
                       w->name[0] ? "a worker of that name is already running" : "empty name");
    if (!w->argv || !w->argv[0]) return pl_errf(err, errlen, "worker \"%s\": no command", w->name);
    if (lb->n == lb->cap) {
        int cap = lb->cap ? 2 * lb->cap : 16;
        child *grown = realloc(lb->kids, (size_t)cap * sizeof *grown);
        if (!grown) return pl_errf(err, errlen, "worker \"%s\": out of memory", w->name);
        lb->kids = grown;
        lb->cap = cap;
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
    child *c = &lb->kids[lb->n++];
    snprintf(c->name, sizeof c->name, "%s", w->name);
    c->pid = pid;
    c->pidfd = pidfd;
    return 0;
}

/* Signals go to the worker's whole process group (everything on a "node"
 * dies with it); the group id stays valid until we reap the leader. */
static int local_signal(pl_backend *b, const char *name, int sig, char *err, size_t errlen)
{
    child *c = find((local_backend *)b, name);
    if (!c) return pl_errf(err, errlen, "worker \"%s\": not running", name);
    if (kill(-c->pid, sig) && pidfd_send_signal(c->pidfd, sig, NULL, 0))
        return pl_errf(err, errlen, "worker \"%s\": signal %d: %s", name, sig, strerror(errno));
    return 0;
}

/* Reaps child i (its pidfd is readable) into ev and drops it from the table. */
static void reap(local_backend *lb, int i, pl_worker_event *ev)
{
    child c = lb->kids[i];
    int status = 0;
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(c.pidfd);
    lb->kids[i] = lb->kids[--lb->n];
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

static int local_watch(pl_backend *b, pl_worker_event *ev, int timeout_ms)
{
    local_backend *lb = (local_backend *)b;
    if (lb->n == 0) {
        if (timeout_ms > 0) poll(NULL, 0, timeout_ms);
        return 0;
    }
    struct pollfd *fds = calloc((size_t)lb->n, sizeof *fds);
    if (!fds) return -1;
    for (int i = 0; i < lb->n; i++) fds[i] = (struct pollfd){.fd = lb->kids[i].pidfd, .events = POLLIN};
    int r;
    while ((r = poll(fds, (nfds_t)lb->n, timeout_ms)) < 0 && errno == EINTR) {
    }
    int found = -1;
    for (int i = 0; r > 0 && i < lb->n && found < 0; i++)
        if (fds[i].revents) found = i;
    free(fds);
    if (r < 0) return -1;
    if (found < 0) return 0;
    reap(lb, found, ev);
    return 1;
}

static int local_count(const pl_backend *b)
{
    return ((const local_backend *)b)->n;
}

static void local_destroy(pl_backend *b)
{
    local_backend *lb = (local_backend *)b;
    for (int i = 0; i < lb->n; i++)
        if (kill(-lb->kids[i].pid, SIGKILL)) pidfd_send_signal(lb->kids[i].pidfd, SIGKILL, NULL, 0);
    pl_worker_event ev;
    while (lb->n) reap(lb, lb->n - 1, &ev);
    free(lb->kids);
    free(lb);
}

static const pl_backend_ops LOCAL_OPS = {local_create, local_signal, local_watch, local_count,
                                         local_destroy};

pl_backend *pl_backend_local_new(char *err, size_t errlen)
{
    local_backend *lb = calloc(1, sizeof *lb);
    if (!lb) {
        pl_errf(err, errlen, "backend: out of memory");
        return NULL;
    }
    lb->base.ops = &LOCAL_OPS;
    return &lb->base;
}
