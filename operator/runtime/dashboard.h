/* The live dashboard of one job (docs/dashboard.md): an HTTP server on HOST:PORT that
 * serves the page (GET /: its HTML, CSS and JavaScript in one response, nothing fetched
 * from elsewhere) and a read-only WebSocket feed (path /feed, subprotocol
 * "pliant-dashboard") of the job's events, JSON objects whose format docs/dashboard.md
 * describes. A page that connects gets the history (one message {"type": "history",
 * "events": [...]}, every event published so far), then each new event as it is
 * published. Whatever a page sends is ignored.
 *
 * Threads: the server runs on a thread of its own (libwebsockets, plain HTTP). The
 * front end's thread (the coordinator's) only calls pl_dashboard_publish, which copies
 * the event into a bounded log under a mutex and wakes the server: it never waits for a
 * page, and a page that reads slowly only delays itself. The log keeps every event but
 * steps: past PL_DASHBOARD_MAX_EVENTS it drops every other step event of its older half
 * (the loss chart keeps its shape at half the resolution there).
 *
 * Ownership: the dashboard owns its copies of the events; pl_dashboard_stop closes the
 * pages, joins the thread and frees everything. */
#ifndef PLIANT_DASHBOARD_H
#define PLIANT_DASHBOARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PL_DASHBOARD_SUBPROTOCOL "pliant-dashboard"
#define PL_DASHBOARD_MAX_EVENTS 200000

typedef struct pl_dashboard pl_dashboard;

/* Listens on addr ("HOST:PORT", "[V6]:PORT" or ":PORT" for 127.0.0.1; port 0: a free
 * one) and starts the server's thread. NULL and err (naming addr) on failure. */
pl_dashboard *pl_dashboard_start(const char *addr, char *err, size_t errlen);
/* Closes the pages, stops the thread and frees all. NULL is fine. */
void pl_dashboard_stop(pl_dashboard *d);

/* Appends one event (a JSON object's text, copied) and wakes the server. Thread-safe;
 * never blocks on a page. step: 1 for a step event (may be thinned), else 0. */
void pl_dashboard_publish(pl_dashboard *d, const char *json, int step);

/* The address bound, for "http://HOST:PORT/". */
const char *pl_dashboard_host(const pl_dashboard *d);
int pl_dashboard_port(const pl_dashboard *d);
/* Pages connected to the feed now, and since the start. */
int pl_dashboard_pages(const pl_dashboard *d, int *total);

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
