/* The connections between the workers of a plan: dials, accepts and the stash of
 * connections that came early (mesh.h). */
#include "mesh.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_io.h"
#include "util.h"

struct pl_mesh {
    pl_mesh_config cfg;
    uint64_t generation;
    int32_t rank;
    pl_conn *stash[PL_MESH_STASH_MAX];
    int nstash;
    pl_conn *pending[PL_MESH_PENDING_MAX]; /* accepted, handshake running; oldest first */
    int npending;
    char last_refused[256]; /* for a timeout's message */
    int closed_early;       /* handshakes the dialer closed, this plan */
};

int pl_mesh_create(const pl_mesh_config *cfg, pl_mesh **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !cfg->token || !cfg->token_len || !cfg->name)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "mesh: a token and a name are required");
    pl_mesh *m = calloc(1, sizeof *m);
    if (!m) return pl_comm_errf(err, errlen, PL_COMM_ESYS, "mesh: out of memory");
    m->cfg = *cfg;
    if (m->cfg.handshake_ms <= 0) m->cfg.handshake_ms = PL_MESH_HANDSHAKE_MS;
    m->rank = PL_COMM_NO_RANK;
    *out = m;
    if (m->cfg.listener && m->cfg.log) {
        char line[160];
        const int p = m->cfg.protection ? (int)m->cfg.protection : PL_PROTECT_DEFAULT_MODE;
        snprintf(line, sizeof line, "listens for peer connections on port %d (frames: %s)",
                 pl_listener_port(m->cfg.listener), pl_frame_protection_name(p));
        m->cfg.log(m->cfg.ctx, line);
    }
    return 0;
}

void pl_mesh_drop_stash(pl_mesh *m)
{
    for (int i = 0; i < m->nstash; i++) pl_conn_close(m->stash[i]);
    m->nstash = 0;
}

/* Closes the handshakes in progress (they speak for the plan they began under). */
static void drop_pending(pl_mesh *m)
{
    for (int i = 0; i < m->npending; i++) pl_conn_close(m->pending[i]);
    m->npending = 0;
}

void pl_mesh_destroy(pl_mesh *m)
{
    if (!m) return;
    pl_mesh_drop_stash(m);
    drop_pending(m);
    free(m);
}

void pl_mesh_set_plan(pl_mesh *m, uint64_t generation, int32_t rank)
{
    pl_mesh_drop_stash(m);
    drop_pending(m);
    m->generation = generation;
    m->rank = rank;
    m->last_refused[0] = 0;
    m->closed_early = 0;
}

int pl_mesh_stashed(const pl_mesh *m) { return m->nstash; }

static int cancelled(const pl_mesh *m)
{
    return m->cfg.cancelled && m->cfg.cancelled(m->cfg.ctx);
}

static void refused(pl_mesh *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refused(pl_mesh *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->last_refused, sizeof m->last_refused, fmt, ap);
    va_end(ap);
    if (m->cfg.log) m->cfg.log(m->cfg.ctx, m->last_refused);
}

/* A handshake the dialer closed: mostly a peer whose dial slice ended while this worker
 * was busy (filling an engine), which dials again (mesh.h); its connections waited in the
 * listen backlog. Logged once a plan, then only kept for a timeout's message. */
static void closed_early(pl_mesh *m, const char *why)
{
    if (m->closed_early++ == 0) {
        refused(m, "refused a peer connection: %.200s (a dialer that gave up; more such closes "
                   "this plan are not logged)", why);
        return;
    }
    snprintf(m->last_refused, sizeof m->last_refused, "refused a peer connection: %.200s", why);
}

static pl_comm_ident ident(const pl_mesh *m, pl_conn_purpose purpose)
{
    return (pl_comm_ident){.token = m->cfg.token, .token_len = m->cfg.token_len,
                           .rank = m->rank, .name = m->cfg.name,
                           .generation = m->generation, .purpose = purpose,
                           .protection = m->cfg.protection, .cipher = m->cfg.cipher};
}

int pl_mesh_dial(pl_mesh *m, const char *host, int port, pl_conn_purpose purpose,
                 int32_t expect_rank, int timeout_ms, pl_conn **out, char *err, size_t errlen)
{
    *out = NULL;
    if (timeout_ms <= 0)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "dial %s:%d: timeout %d ms", host, port,
                            timeout_ms);
    const pl_comm_ident id = ident(m, purpose);
    const double deadline = pl_now_ms() + timeout_ms;
    const int slice = m->cfg.redial ? PL_MESH_DIAL_SLICE_MS : timeout_ms;
    for (;;) {
        if (cancelled(m))
            return pl_comm_errf(err, errlen, PL_COMM_ECANCELED, "dial %s:%d: cancelled", host,
                                port);
        const double left = deadline - pl_now_ms(); /* ≥ 1: a negative timeout never ends */
        const int try_ms = left < 1 ? 1 : left < slice ? (int)left : slice;
        int rc = pl_conn_connect(host, port, &id, expect_rank, try_ms, out, err, errlen);
        if (rc == 0) {
            if (errlen) err[0] = 0; /* forget the failed tries */
            return 0;
        }
        /* not ready yet: busy, at another generation, a handshake that closed */
        if (!m->cfg.redial ||
            (rc != PL_COMM_ETIMEOUT && rc != PL_COMM_ECLOSED && rc != PL_COMM_ESTALE))
            return rc;
        if (rc != PL_COMM_ETIMEOUT) usleep(20000);
        if (deadline - pl_now_ms() <= 0) return rc; /* err says why */
    }
}

static int take_stashed(pl_mesh *m, unsigned want, pl_conn **out)
{
    for (int i = 0; i < m->nstash; i++)
        if (want & PL_MESH_PURPOSE(pl_conn_purpose_of(m->stash[i]))) {
            *out = m->stash[i];
            memmove(&m->stash[i], &m->stash[i + 1], (size_t)(m->nstash - i - 1) * sizeof *m->stash);
            m->nstash--;
            return 1;
        }
    return 0;
}

/* Keeps c in the stash when its purpose is for later and there is room; else closes it. */
static void stash_or_close(pl_mesh *m, pl_conn *c, unsigned later)
{
    const pl_conn_purpose p = pl_conn_purpose_of(c);
    if ((later & PL_MESH_PURPOSE(p)) && m->nstash < PL_MESH_STASH_MAX) {
        m->stash[m->nstash++] = c;
        return;
    }
    refused(m, "closed a %s connection from %s (rank %d): %s", pl_conn_purpose_name(p),
            pl_conn_peer_name(c), (int)pl_conn_peer_rank(c),
            later & PL_MESH_PURPOSE(p) ? "the stash is full" : "not wanted now");
    pl_conn_close(c);
}

/* ---- accepting: every pending handshake at once ---- */

static void remove_pending(pl_mesh *m, int i)
{
    memmove(&m->pending[i], &m->pending[i + 1],
            (size_t)(m->npending - i - 1) * sizeof *m->pending);
    m->npending--;
}

/* Takes the connections waiting on the listener and starts their handshakes; over
 * PL_MESH_PENDING_MAX the oldest handshake is dropped. 0, or ESYS / EINVAL when the
 * listener fails. */
static int accept_waiting(pl_mesh *m, const pl_comm_ident *id, char *err, size_t errlen)
{
    for (int n = 0; n < PL_MESH_PENDING_MAX; n++) {
        char why[512] = "";
        pl_conn *c = NULL;
        int rc = pl_listener_accept_begin(m->cfg.listener, id, m->cfg.handshake_ms, &c, why,
                                          sizeof why);
        if (rc == PL_COMM_ESYS || rc == PL_COMM_EINVAL)
            return pl_comm_errf(err, errlen, rc, "%s", why);
        if (rc) {
            if (rc == PL_COMM_ECLOSED) closed_early(m, why);
            else refused(m, "refused a peer connection: %s", why);
            continue;
        }
        if (!c) return 0;
        if (m->npending == PL_MESH_PENDING_MAX) {
            refused(m, "dropped the connection from %s: %d handshakes pending, this the oldest",
                    pl_conn_peer_addr(m->pending[0]), PL_MESH_PENDING_MAX);
            pl_conn_close(m->pending[0]);
            remove_pending(m, 0);
        }
        m->pending[m->npending++] = c;
    }
    return 0;
}

/* Moves pending handshake i on. 1 with *out when it completed for a purpose in want;
 * else 0 (still running, or finished: refused and logged, stashed or closed). */
static int progress(pl_mesh *m, int i, unsigned want, unsigned later, pl_conn **out)
{
    pl_conn *c = m->pending[i];
    char why[512] = "";
    int rc = pl_conn_handshake_step(c, why, sizeof why);
    if (rc == 0) return 0;
    remove_pending(m, i);
    if (rc == PL_COMM_ETIMEOUT)
        refused(m, "dropped the connection from %s: no complete handshake within %d ms (%s)",
                pl_conn_peer_addr(c), m->cfg.handshake_ms, why);
    else if (rc == PL_COMM_ECLOSED)
        closed_early(m, why);
    else if (rc < 0)
        refused(m, "refused a peer connection: %s", why);
    if (rc < 0) {
        pl_conn_close(c);
        return 0;
    }
    if (want & PL_MESH_PURPOSE(pl_conn_purpose_of(c))) {
        *out = c;
        return 1;
    }
    stash_or_close(m, c, later);
    return 0;
}

/* Waits for the listener or a pending handshake (until deadline, at most
 * PL_MESH_POLL_MS: the cancel test), then moves each on. 1 with *out, 0, or an error. */
static int accept_round(pl_mesh *m, const pl_comm_ident *id, unsigned want, unsigned later,
                        double deadline, pl_conn **out, char *err, size_t errlen)
{
    struct pollfd pf[PL_MESH_PENDING_MAX + 1];
    const int np = m->npending;
    double now = pl_now_ms(), wake = deadline < now + PL_MESH_POLL_MS ? deadline
                                                                        : now + PL_MESH_POLL_MS;
    pf[0] = (struct pollfd){.fd = pl_listener_fd(m->cfg.listener), .events = POLLIN};
    for (int i = 0; i < np; i++) {
        const pl_conn *c = m->pending[i];
        pf[i + 1] = (struct pollfd){.fd = pl_conn_fd(c), .events = pl_conn_handshake_events(c)};
        if ((double)pl_conn_handshake_deadline(c) < wake)
            wake = (double)pl_conn_handshake_deadline(c);
    }
    if (poll(pf, (nfds_t)np + 1, wake <= now ? 0 : (int)(wake - now) + 1) < 0 && errno != EINTR)
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "accept: poll: %s", strerror(errno));
    now = pl_now_ms();
    for (int i = np - 1; i >= 0; i--) /* backwards: a removal leaves the rest in place */
        if ((pf[i + 1].revents || now >= (double)pl_conn_handshake_deadline(m->pending[i])) &&
            progress(m, i, want, later, out))
            return 1;
    return pf[0].revents ? accept_waiting(m, id, err, errlen) : 0;
}

int pl_mesh_accept(pl_mesh *m, unsigned want, unsigned later, double deadline, pl_conn **out,
                   char *err, size_t errlen)
{
    *out = NULL;
    if (take_stashed(m, want, out)) return 0;
    if (!m->cfg.listener)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "accept: this mesh has no listener");
    const pl_comm_ident id = ident(m, PL_CONN_ANY);
    for (;;) {
        if (cancelled(m)) return pl_comm_errf(err, errlen, PL_COMM_ECANCELED, "accept: cancelled");
        if (deadline - pl_now_ms() <= 0)
            return pl_comm_errf(err, errlen, PL_COMM_ETIMEOUT, "timed out waiting for peers%s%s",
                                m->last_refused[0] ? "; last refused: " : "", m->last_refused);
        int rc = accept_round(m, &id, want, later, deadline, out, err, errlen);
        if (rc) return rc == 1 ? 0 : rc;
    }
}

/* ---- the connections of a plan ---- */

static const char *rank_name(const pl_mesh_peers *p, int r, char *buf, size_t len)
{
    if (p->names && p->names[r]) return p->names[r];
    snprintf(buf, len, "rank %d", r);
    return buf;
}

static void close_links(const pl_mesh_peers *p, pl_mesh_links *out)
{
    for (int r = 0; r < p->nranks; r++) {
        pl_conn_close(out->ring[r]);
        out->ring[r] = NULL;
    }
    pl_conn_close(out->prev);
    pl_conn_close(out->next);
    pl_conn_close(out->wrap);
    out->prev = out->next = out->wrap = NULL;
}

/* The slot of the stage link with rank r, or NULL (none wanted). */
static pl_conn **link_slot(const pl_mesh_peers *p, pl_mesh_links *out, int r)
{
    return r == p->link_prev ? &out->prev
           : r == p->link_next ? &out->next
           : r == p->link_wrap ? &out->wrap
                               : NULL;
}

static int wants_ring(const pl_mesh_peers *p, int r)
{
    return p->ring && p->ring[r];
}

/* The lower ranks: a ring connection and a stage link each where wanted. */
static int dial_lower(pl_mesh *m, const pl_mesh_peers *p, int timeout_ms, pl_mesh_links *out,
                      char *err, size_t errlen)
{
    for (int r = 0; r < m->rank; r++) {
        const int ring = wants_ring(p, r);
        pl_conn **link = link_slot(p, out, r);
        if (!ring && !link) continue;
        char buf[32];
        const char *name = rank_name(p, r, buf, sizeof buf);
        if (!p->hosts || !p->hosts[r] || !p->ports || p->ports[r] <= 0)
            return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "no address for peer %s", name);
        out->failed_rank = r;
        int rc = 0;
        if (ring)
            rc = pl_mesh_dial(m, p->hosts[r], p->ports[r], PL_CONN_RING, r, timeout_ms,
                              &out->ring[r], err, errlen);
        if (rc == 0 && link)
            rc = pl_mesh_dial(m, p->hosts[r], p->ports[r], PL_CONN_STAGE_LINK, r, timeout_ms,
                              link, err, errlen);
        if (rc) return rc;
        out->failed_rank = -1;
    }
    return 0;
}

/* Where an accepted connection goes among the higher ranks' slots; NULL: not wanted. */
static pl_conn **slot_of(const pl_mesh *m, const pl_mesh_peers *p, pl_mesh_links *out,
                         const pl_conn *c)
{
    const int r = pl_conn_peer_rank(c);
    if (r <= m->rank || r >= p->nranks) return NULL;
    pl_conn **slot = NULL;
    if (pl_conn_purpose_of(c) == PL_CONN_RING && wants_ring(p, r)) slot = &out->ring[r];
    else if (pl_conn_purpose_of(c) == PL_CONN_STAGE_LINK) slot = link_slot(p, out, r);
    return slot && !*slot ? slot : NULL;
}

static int accept_higher(pl_mesh *m, const pl_mesh_peers *p, int timeout_ms, pl_mesh_links *out,
                         char *err, size_t errlen)
{
    int missing = 0;
    for (int r = m->rank + 1; r < p->nranks; r++)
        missing += wants_ring(p, r) + (link_slot(p, out, r) != NULL);
    const double deadline = pl_now_ms() + timeout_ms;
    const unsigned want = PL_MESH_PURPOSE(PL_CONN_RING) | PL_MESH_PURPOSE(PL_CONN_STAGE_LINK);
    while (missing > 0) {
        pl_conn *c = NULL;
        int rc = pl_mesh_accept(m, want, 0, deadline, &c, err, errlen);
        if (rc == PL_COMM_ETIMEOUT)
            return pl_comm_errf(err, errlen, rc, "rank %d still waits for %d connection(s) from "
                                "higher ranks%s%s", (int)m->rank, missing,
                                m->last_refused[0] ? "; last refused: " : "", m->last_refused);
        if (rc) return rc;
        pl_conn **slot = slot_of(m, p, out, c);
        if (!slot) {
            refused(m, "closed a %s connection from %s (rank %d): a stranger or a duplicate",
                    pl_conn_purpose_name(pl_conn_purpose_of(c)), pl_conn_peer_name(c),
                    (int)pl_conn_peer_rank(c));
            pl_conn_close(c);
            continue;
        }
        *slot = c;
        missing--;
    }
    return 0;
}

int pl_mesh_connect(pl_mesh *m, const pl_mesh_peers *p, int timeout_ms, pl_mesh_links *out,
                    char *err, size_t errlen)
{
    out->prev = out->next = out->wrap = NULL;
    out->failed_rank = -1;
    if (m->rank < 0 || m->rank >= p->nranks)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "mesh: rank %d of %d", (int)m->rank,
                            p->nranks);
    for (int r = 0; r < p->nranks; r++) out->ring[r] = NULL;
    int rc = dial_lower(m, p, timeout_ms, out, err, errlen);
    if (rc == 0) rc = accept_higher(m, p, timeout_ms, out, err, errlen);
    if (rc) close_links(p, out);
    return rc;
}

int pl_comm_mesh(pl_listener *l, const pl_comm_ident *self, int nranks,
                 const char *const *hosts, const int *ports, int timeout_ms, pl_conn **conns,
                 char *err, size_t errlen)
{
    const int me = self ? self->rank : -1;
    if (nranks < 1 || me < 0 || me >= nranks)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "mesh: rank %d of %d", me, nranks);
    for (int r = 0; r < nranks; r++) conns[r] = NULL;
    pl_mesh_config cfg = {.listener = l, .token = self->token, .token_len = self->token_len,
                          .name = self->name, .protection = self->protection,
                          .cipher = self->cipher};
    pl_mesh *m;
    int rc = pl_mesh_create(&cfg, &m, err, errlen);
    if (rc) return rc;
    unsigned char *ring = malloc((size_t)nranks);
    if (!ring) {
        pl_mesh_destroy(m);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "mesh: out of memory");
    }
    for (int r = 0; r < nranks; r++) ring[r] = r != me;
    pl_mesh_set_plan(m, self->generation, me);
    const pl_mesh_peers peers = {.nranks = nranks, .hosts = hosts, .ports = ports, .ring = ring,
                                 .link_prev = -1, .link_next = -1, .link_wrap = -1};
    pl_mesh_links links = {.ring = conns};
    rc = pl_mesh_connect(m, &peers, timeout_ms, &links, err, errlen);
    free(ring);
    pl_mesh_destroy(m);
    return rc;
}
