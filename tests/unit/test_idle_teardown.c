/* The idle-priority sibling that releases a dead worker's memory (worker/agent/idle_teardown.h):
 * it runs at SCHED_IDLE in a process group of its own, holding no descriptor but a pidfd of
 * the worker; a SIGKILL of
 * the worker's group closes the worker's connections (its peer reads EOF) while the sibling
 * lives on, and the sibling ends after the worker, killed or exiting normally. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "idle_teardown.h"

#define MEMORY (64u << 20)

/* The "worker": its own process group, 64 MiB of populated memory file, the sibling
 * armed; it writes the sibling's pid (0: arming failed) to `report`, then sleeps, or exits
 * at once with `exit_now`. */
static void worker(int report, int exit_now)
{
    setpgid(0, 0);
    pid_t sib = 0;
    char err[256];
    int fd = memfd_create("test-idle-teardown", 0);
    char *p = fd < 0 || ftruncate(fd, MEMORY) ? MAP_FAILED
                                              : mmap(NULL, MEMORY, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) memset(p, 1, MEMORY);
    if (p == MAP_FAILED || pl_idle_teardown_arm(&sib, err, sizeof err)) sib = 0;
    if (write(report, &sib, sizeof sib) != sizeof sib || exit_now) _exit(0);
    for (;;) pause();
}

/* Forks the worker; its pid and the sibling's, and the other end of a socket it holds. */
static int start_worker(int exit_now, pid_t *pid, pid_t *sib, int *peer)
{
    int report[2], sv[2];
    if (pipe(report) || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return -1;
    *pid = fork();
    if (*pid == 0) {
        close(report[0]);
        close(sv[0]);
        worker(report[1], exit_now);
    }
    close(report[1]);
    close(sv[1]);
    *peer = sv[0];
    ssize_t n = read(report[0], sib, sizeof *sib);
    close(report[0]);
    return *pid > 0 && n == sizeof *sib && *sib > 0 ? 0 : -1;
}

/* Whether pid has ended (gone, or a zombie its new parent has not reaped). */
static int ended(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *s = strrchr(buf, ')');
    return !s || s[2] == 'Z' || s[2] == 'X';
}

static int wait_ended(pid_t pid, int ms)
{
    for (int t = 0; t < ms; t += 10) {
        if (ended(pid)) return 1;
        usleep(10000);
    }
    return ended(pid);
}

/* Whether pid's only descriptor is a pidfd (of the worker it waits for). */
static int holds_only_a_pidfd(pid_t pid)
{
    char dir[64], path[320], link[128] = "";
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        link[k > 0 ? k : 0] = 0;
        n++;
    }
    closedir(d);
    return n == 1 && strstr(link, "pidfd") != NULL;
}

static void test_sibling_is_idle_alone_and_holds_nothing(void)
{
    pid_t pid, sib;
    int peer;
    CHECK(start_worker(0, &pid, &sib, &peer) == 0);
    CHECK_EQ_INT(sched_getscheduler(sib), SCHED_IDLE);
    CHECK_EQ_INT(getpgid(sib), sib);
    CHECK(holds_only_a_pidfd(sib));
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(peer);
    CHECK(wait_ended(sib, 10000));
}

/* The worker's group killed as `pliant run` kills it: the peer reads EOF, the worker is
 * reaped, and the sibling, spared by the group kill, ends by its parent-death signal. */
static void test_group_kill_closes_the_connection_first(void)
{
    pid_t pid, sib;
    int peer;
    CHECK(start_worker(0, &pid, &sib, &peer) == 0);
    CHECK_EQ_INT(kill(-pid, SIGKILL), 0);
    struct pollfd pf = {.fd = peer, .events = POLLIN};
    int ready = poll(&pf, 1, 10000);
    char c;
    ssize_t n = ready == 1 ? read(peer, &c, 1) : -1;
    close(peer);
    int status = 0;
    CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
    CHECK_EQ_INT(n, 0); /* EOF */
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK(wait_ended(sib, 10000));
}

static void test_normal_exit_ends_the_sibling(void)
{
    pid_t pid, sib;
    int peer;
    CHECK(start_worker(1, &pid, &sib, &peer) == 0);
    int status = 0;
    CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
    close(peer);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(wait_ended(sib, 10000));
}

static void *linger(void *arg)
{
    (void)arg;
    usleep(400 * 1000);
    _exit(0);
}

/* The worker's first thread ends while another goes on (as after a SIGKILL, where each
 * thread ends on its own): the sibling waits for the last, not for the first (which is
 * when the kernel's parent-death signal would come). */
static void test_the_sibling_outlives_every_thread(void)
{
    int report[2];
    CHECK(pipe(report) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        pid_t sib = 0;
        char err[256];
        pthread_t th;
        if (pl_idle_teardown_arm(&sib, err, sizeof err)) sib = 0;
        if (write(report[1], &sib, sizeof sib) != sizeof sib ||
            pthread_create(&th, NULL, linger, NULL))
            _exit(1);
        pthread_exit(NULL); /* the first thread ends; `linger` ends the process */
    }
    close(report[1]);
    pid_t sib = 0;
    CHECK(read(report[0], &sib, sizeof sib) == sizeof sib && sib > 0);
    close(report[0]);
    usleep(150 * 1000); /* the first thread has ended, the other lingers */
    CHECK(!ended(sib));
    int status = 0;
    CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(wait_ended(sib, 10000));
}

TEST_MAIN_BEGIN
RUN(test_sibling_is_idle_alone_and_holds_nothing);
RUN(test_group_kill_closes_the_connection_first);
RUN(test_normal_exit_ends_the_sibling);
RUN(test_the_sibling_outlives_every_thread);
TEST_MAIN_END
