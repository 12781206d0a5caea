/* The live dashboards of jobs (docs/dashboard.md): one HTTP server on HOST:PORT serving
 * each job added to it at a path of its own (`pliant run`: "/"; the operator:
 * "/jobs/NAMESPACE/NAME/"): GET PATH, the page (its HTML, CSS and JavaScript in one
 * response, nothing fetched from elsewhere), and PATH"feed", a read-only WebSocket
 * (subprotocol "pliant-dashboard") of the job's events, JSON objects whose format
 * docs/dashboard.md describes. A page that connects gets the history (one message
 * {"type": "history", "events": [...]}, every event published so far), then each new
 * event as it is published. Whatever a page sends is ignored; anything else is 404.
 *
 * Threads: the server runs on a thread of its own (libwebsockets, plain HTTP). The
 * front end's thread (the coordinator's) adds and removes jobs and publishes their
 * events: each call copies under one mutex and wakes the server, never waits for a
 * page, and a page that reads slowly only delays itself. A job's log keeps every event
 * but steps: past its max_events it drops every other step event of its older half
 * (the loss chart keeps its shape at half the resolution there).
 *
 * Ownership: the server owns the jobs and their copies of the events. A removed job
 * lives on until its last page's connection closed; pl_dashboard_stop closes the pages,
 * joins the thread and frees everything, the jobs still added included. */
#ifndef PLIANT_DASHBOARD_H
#define PLIANT_DASHBOARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PL_DASHBOARD_SUBPROTOCOL "pliant-dashboard"
#define PL_DASHBOARD_MAX_EVENTS 200000 /* `pliant run`'s job */
#define PL_DASHBOARD_MAX_PATH 600

typedef struct pl_dashboard pl_dashboard;         /* the server */
typedef struct pl_dashboard_job pl_dashboard_job; /* one job's page and event log */

/* Listens on addr ("HOST:PORT", "[V6]:PORT" or ":PORT" for 127.0.0.1; port 0: a free
 * one) and starts the server's thread. NULL and err (naming flag, the option that
 * gave addr) on failure. */
pl_dashboard *pl_dashboard_start(const char *flag, const char *addr, char *err, size_t errlen);
/* Closes the pages, stops the thread and frees all. NULL is fine. */
void pl_dashboard_stop(pl_dashboard *d);
/* While why is set (copied), every request is answered 503 with it (an operator
 * replica that does not lead); NULL serves again. Thread-safe. */
void pl_dashboard_set_unavailable(pl_dashboard *d, const char *why);

/* A job's page at path ("/..../", at most PL_DASHBOARD_MAX_PATH bytes, not served yet),
 * its log bounded as above. NULL when out of memory or the path is bad or taken. */
pl_dashboard_job *pl_dashboard_add(pl_dashboard *d, const char *path, size_t max_events);
/* The page is gone (404) and its open feeds are closed. NULL is fine. */
void pl_dashboard_remove(pl_dashboard_job *j);

/* Appends one event (a JSON object's text, copied) and wakes the server. Thread-safe;
 * never blocks on a page. step: 1 for a step event (may be thinned), else 0. NULL j:
 * nothing. */
void pl_dashboard_publish(pl_dashboard_job *j, const char *json, int step);

/* The address bound, for "http://HOST:PORT/". */
const char *pl_dashboard_host(const pl_dashboard *d);
int pl_dashboard_port(const pl_dashboard *d);
/* The job's pages connected to its feed now, and since it was added. */
int pl_dashboard_pages(const pl_dashboard_job *j, int *total);

/* One run of a static page with several (`pliant simulate --report`: one per strategy):
 * its name, for the page's selector, and its events in the feed's format. */
typedef struct {
    const char *name;
    const char *const *events;
    int n;
} pl_dashboard_run;
/* The page with runs[0..n) built in (no feed), the first shown, the others a choice away.
 * 0, or -1 on a write error. */
int pl_dashboard_write_runs(FILE *f, const pl_dashboard_run *runs, int n);

#endif
