/* A killed worker's connections close before its memory is released (docs/runtime.md
 * "Noticing a killed worker"). When a process dies, the kernel first unmaps its memory,
 * then closes its descriptors (the newest first), and only the last memory file's close
 * frees its pages: a CPU worker holding a few GB of engine and copy reserve kept its
 * sockets open 0.4–2.5 s after a SIGKILL, and its peers and coordinator learned of the
 * loss that much later. pl_idle_teardown_arm starts a sibling process that shares the
 * worker's address space (clone CLONE_VM, no descriptors of its own but a pidfd of the
 * worker) at SCHED_IDLE, which ends once every thread of the worker has: the worker's exit
 * then only closes descriptors (its peers read EOF at once), and the address space, with its
 * pages, is released by the sibling, when a core is otherwise idle.
 *
 * Call it once per process. */
#ifndef PLIANT_IDLE_TEARDOWN_H
#define PLIANT_IDLE_TEARDOWN_H

#include <stddef.h>
#include <sys/types.h>

/* 0 when the sibling runs (*sibling: its pid, where not NULL), or -1 and err (the process
 * then exits as any other). */
int pl_idle_teardown_arm(pid_t *sibling, char *err, size_t errlen);

#endif
