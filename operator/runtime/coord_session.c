/* A coordinator behind its control server: worker connections, registrations and
 * messages in and out (coord_session.h). */
#include "coord_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct worker {
    pl_proto_name name;
    pl_proto_name zone;   /* "" unknown */
    pl_ctl_conn *conn;    /* NULL: not connected (yet, or any more) */
    struct worker *next;
} worker;

struct pl_coord_session {
    pl_coord_session_config cfg;
    pl_ctl_server *srv;
    worker *workers;
    int64_t disrupted_ms; /* -1: no loss since the last take */
};

static worker *find_worker(pl_coord_session *s, const char *name)
{
    for (worker *w = s->workers; w; w = w->next)
        if (!strcmp(w->name, name)) return w;
    return NULL;
}

static worker *get_worker(pl_coord_session *s, const char *name)
{
    worker *w = find_worker(s, name);
    if (w || !(w = calloc(1, sizeof *w))) return w;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->next = s->workers;
    s->workers = w;
    return w;
}

int pl_coord_session_lost(pl_coord_session *s, const char *name, const char *cause)
{
    pl_coord_phase_t ph = pl_coord_phase(s->cfg.coord);
    if (ph == PL_COORD_DONE || ph == PL_COORD_FAILED || !find_worker(s, name)) return 0;
    if (pl_coord_worker_lost(s->cfg.coord, name, cause) != PL_COORD_OK) return 0;
    if (s->disrupted_ms < 0) s->disrupted_ms = pl_now_ms();
    return 1;
}

static void on_register(pl_ctl_server *srv, pl_ctl_conn *c, const pl_msg *m, void *user)
{
    pl_coord_session *s = user;
    const pl_msg_register *r = &m->u.reg;
    const char *why = NULL;
    worker *w = find_worker(s, r->name);
    if (s->cfg.job && strcmp(r->job, s->cfg.job))
        why = "this coordinator runs another job";
    else if (s->cfg.admit && (why = s->cfg.admit(s->cfg.user, r->name)))
        ;
    else if (w && w->conn)
        why = "a worker of that name is connected";
    else if (pl_coord_worker_joined(s->cfg.coord, &(pl_coord_worker_info){
                 .name = r->name, .node = r->node, .host = r->host, .port = r->port,
                 .zone = w && w->zone[0] ? w->zone : r->zone, .device = r->device,
                 .nccl = r->nccl, .has_checkpoint = r->has_checkpoint,
                 .checkpoint_step = r->checkpoint_step,
                 .checkpoint_error = r->checkpoint_error}, pl_now_ms()) == PL_COORD_ERR)
        why = pl_coord_error(s->cfg.coord);
    else if (!w && !(w = get_worker(s, r->name)))
        why = "out of memory";
    if (why) {
        pl_ctl_server_refuse(srv, c, pl_coord_generation(s->cfg.coord), why);
        return;
    }
    w->conn = c;
}

static void on_message(pl_ctl_server *srv, pl_ctl_conn *c, const pl_msg *m, void *user)
{
    pl_coord_session *s = user;
    (void)srv;
    pl_coord_on_msg(s->cfg.coord, pl_ctl_conn_name(c), m, pl_now_ms());
}

static void on_close(pl_ctl_server *srv, pl_ctl_conn *c, const char *reason, void *user)
{
    pl_coord_session *s = user;
    (void)srv;
    worker *w = find_worker(s, pl_ctl_conn_name(c));
    if (!w || w->conn != c) return;
    w->conn = NULL;
    char cause[256];
    snprintf(cause, sizeof cause, "connection closed: %s", reason ? reason : "");
    pl_coord_session_lost(s, w->name, cause);
}

pl_coord_session *pl_coord_session_new(const pl_coord_session_config *cfg, char *err,
                                       size_t errlen)
{
    pl_coord_session *s = calloc(1, sizeof *s);
    if (!s) {
        pl_errf(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->disrupted_ms = -1;
    pl_ctl_server_config sc = cfg->server;
    sc.cb = (pl_ctl_server_callbacks){on_register, on_message, on_close, s};
    int tries = sc.port > 0 && cfg->ports > 1 ? cfg->ports : 1;
    for (int k = 0; k < tries && !s->srv; k++) {
        sc.port = cfg->server.port > 0 ? cfg->server.port + k : 0;
        if (tries > 1 && cfg->port_taken && cfg->port_taken(cfg->port_ctx, sc.port)) {
            pl_errf(err, errlen, "control server: ports %d to %d are all taken",
                    cfg->server.port, cfg->server.port + tries - 1);
            continue;
        }
        s->srv = pl_ctl_server_create(&sc, err, errlen);
    }
    if (!s->srv) {
        free(s);
        return NULL;
    }
    return s;
}

void pl_coord_session_free(pl_coord_session *s)
{
    if (!s) return;
    pl_ctl_server_destroy(s->srv); /* on_close for each: the coordinator still exists */
    while (s->workers) {
        worker *w = s->workers;
        s->workers = w->next;
        free(w);
    }
    free(s);
}

int pl_coord_session_poll(pl_coord_session *s, int timeout_ms)
{
    if (pl_ctl_server_service(s->srv, timeout_ms) < 0) return -1;
    char to[PL_PROTO_NAME_MAX + 1];
    pl_msg m;
    while (pl_coord_next(s->cfg.coord, to, sizeof to, &m)) {
        worker *w = find_worker(s, to);
        if (w && w->conn) pl_ctl_server_send(s->srv, w->conn, &m);
        pl_msg_free(&m);
    }
    pl_coord_tick(s->cfg.coord, pl_now_ms());
    return 0;
}

void pl_coord_session_set_zone(pl_coord_session *s, const char *name, const char *zone)
{
    worker *w = get_worker(s, name);
    if (!w || !strcmp(w->zone, zone)) return;
    snprintf(w->zone, sizeof w->zone, "%s", zone);
    if (w->conn) pl_coord_set_zone(s->cfg.coord, name, zone);
}

int64_t pl_coord_session_take_disruption(pl_coord_session *s)
{
    int64_t t = s->disrupted_ms;
    s->disrupted_ms = -1;
    return t;
}

int pl_coord_session_connected(const pl_coord_session *s)
{
    int n = 0;
    for (const worker *w = s->workers; w; w = w->next) n += w->conn != NULL;
    return n;
}

pl_ctl_server *pl_coord_session_server(pl_coord_session *s) { return s->srv; }
