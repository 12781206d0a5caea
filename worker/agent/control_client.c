/* The worker's control client (see control_client.h). */
#include "control_client.h"

#include "tls_selfsigned.h"
#include "util.h"
#include "ws_queue.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libwebsockets.h>
#include <openssl/crypto.h>
#include <openssl/ssl.h>

#define CTL_PATH "/control"
#define CTL_MAX_QUEUED ((size_t)64 << 20) /* unsent bytes before the connection is dropped */

struct pl_ctl_client {
    struct lws_context *ctx;
    struct lws *wsi;
    struct lws_protocols protocols[2];
    SSL_CTX *ssl_ctx; /* ours: trusts only ca_path (lws's own would add the system CAs) */
    pl_ctl_client_config cfg; /* token points at token below */
    unsigned char *token;
    char host[PL_PROTO_HOST_MAX + 1];
    pl_ctl_client_state state;
    int closing, destroying, closed_reported;
    char close_reason[256];
    int rank, heartbeat_ms;
    int64_t next_hb_ms;
    _Atomic int64_t step, gen;
    char *rx;
    size_t rx_len, rx_cap;
    pl_ws_queue tx;
    pthread_mutex_t post_lock; /* guards posts (pl_ctl_client_post) */
    pl_ws_queue posts;
    lws_sorted_usec_list_t wake;
};

static void client_fail(pl_ctl_client *c, const char *why);

/* Appends t to the send queue (takes it); -1 when closed or over the limit. */
static int tx_append(pl_ctl_client *c, pl_ws_frame *t)
{
    if (!c->wsi || c->closing || c->state >= PL_CTL_REFUSED) {
        free(t);
        return -1;
    }
    if (c->tx.bytes + t->len > CTL_MAX_QUEUED) {
        free(t);
        client_fail(c, "send queue over its limit");
        return -1;
    }
    pl_ws_queue_push(&c->tx, t);
    lws_callback_on_writable(c->wsi);
    return 0;
}

static int queue_text(pl_ctl_client *c, const char *text, size_t len)
{
    pl_ws_frame *t = pl_ws_frame_new(text, len, LWS_WRITE_TEXT);
    return t ? tx_append(c, t) : -1;
}

int pl_ctl_client_send_fragmented(pl_ctl_client *c, const char *text, size_t len, int nfrags)
{
    if (nfrags < 1 || (size_t)nfrags > len)
        return -1;
    size_t off = 0;
    for (int i = 0; i < nfrags; i++) {
        size_t n = i == nfrags - 1 ? len - off : len / (size_t)nfrags;
        int fl = (i == 0 ? LWS_WRITE_TEXT : LWS_WRITE_CONTINUATION) |
                 (i == nfrags - 1 ? 0 : LWS_WRITE_NO_FIN);
        pl_ws_frame *t = pl_ws_frame_new(text + off, n, fl);
        if (!t || tx_append(c, t))
            return -1;
        off += n;
    }
    return 0;
}

/* Moves messages posted from other threads onto the send queue (control thread). */
static void drain_posts(pl_ctl_client *c)
{
    pthread_mutex_lock(&c->post_lock);
    pl_ws_queue posts = c->posts;
    memset(&c->posts, 0, sizeof c->posts);
    pthread_mutex_unlock(&c->post_lock);
    pl_ws_frame *t;
    while ((t = pl_ws_queue_pop(&posts))) tx_append(c, t);
}

int pl_ctl_client_post(pl_ctl_client *c, const pl_msg *m)
{
    char *text = pl_msg_encode(m);
    if (!text)
        return -1;
    pl_ws_frame *t = pl_ws_frame_new(text, strlen(text), LWS_WRITE_TEXT);
    free(text);
    if (!t)
        return -1;
    pthread_mutex_lock(&c->post_lock);
    pl_ws_queue_push(&c->posts, t);
    pthread_mutex_unlock(&c->post_lock);
    lws_cancel_service(c->ctx);
    return 0;
}

int pl_ctl_client_send(pl_ctl_client *c, const pl_msg *m)
{
    char *text = pl_msg_encode(m);
    if (!text)
        return -1;
    int rc = queue_text(c, text, strlen(text));
    free(text);
    return rc;
}

int pl_ctl_client_send_raw(pl_ctl_client *c, const char *text, size_t len)
{
    return queue_text(c, text, len);
}

static void set_reason(pl_ctl_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_reason(pl_ctl_client *c, const char *fmt, ...)
{
    if (c->close_reason[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->close_reason, sizeof c->close_reason, fmt, ap);
    va_end(ap);
}

/* Closes after the queue drains. */
static void client_fail(pl_ctl_client *c, const char *why)
{
    set_reason(c, "%s", why);
    c->closing = 1;
    if (c->wsi)
        lws_callback_on_writable(c->wsi);
}

void pl_ctl_client_close(pl_ctl_client *c)
{
    client_fail(c, "closed by the worker");
}

static void report_closed(pl_ctl_client *c)
{
    if (c->state != PL_CTL_REFUSED)
        c->state = PL_CTL_CLOSED;
    set_reason(c, "connection lost");
    c->wsi = NULL;
    if (!c->closed_reported && !c->destroying && c->cfg.on_close) {
        c->closed_reported = 1;
        c->cfg.on_close(c, c->close_reason, c->cfg.user);
    }
    c->closed_reported = 1;
}

/* The first message must be challenge: answered with register, whose token proof
 * is computed from its nonce. */
static void answer_challenge(pl_ctl_client *c, const pl_msg *m)
{
    if (m->type != PL_MSG_CHALLENGE) {
        client_fail(c, "expected challenge");
        return;
    }
    pl_msg r;
    pl_msg_init(&r, PL_MSG_REGISTER, atomic_load(&c->gen));
    r.u.reg = c->cfg.reg;
    if (pl_token_proof(c->token, c->cfg.token_len, m->u.challenge.nonce, r.u.reg.token_proof) ||
        pl_ctl_client_send(c, &r)) {
        client_fail(c, "cannot build register");
    } else {
        c->state = PL_CTL_CHALLENGED;
    }
    OPENSSL_cleanse(r.u.reg.token_proof, sizeof r.u.reg.token_proof);
}

/* After register: welcome and refuse move the state on; every message (those two
 * included) then goes to on_message. */
static void deliver(pl_ctl_client *c, const pl_msg *m)
{
    if (m->type == PL_MSG_WELCOME && c->state == PL_CTL_CHALLENGED) {
        c->state = PL_CTL_WELCOMED;
        c->rank = m->u.welcome.rank;
        c->heartbeat_ms = c->cfg.heartbeat_ms > 0 ? c->cfg.heartbeat_ms
                                                   : m->u.welcome.heartbeat_ms;
        c->next_hb_ms = pl_now_ms(); /* the first heartbeat at once */
    } else if (m->type == PL_MSG_REFUSE) {
        c->state = PL_CTL_REFUSED;
        set_reason(c, "refused: %s", m->u.refuse.reason);
        c->closing = 1;
        lws_callback_on_writable(c->wsi);
    } else if (m->type == PL_MSG_WELCOME || m->type == PL_MSG_CHALLENGE) {
        client_fail(c, "unexpected welcome or challenge");
    }
    if (c->cfg.on_message)
        c->cfg.on_message(c, m, c->cfg.user);
}

static void handle_message(pl_ctl_client *c, const char *text, size_t len)
{
    pl_msg m;
    char err[256];
    if (pl_msg_decode(text, len, &m, err, sizeof err)) {
        char why[300];
        snprintf(why, sizeof why, "invalid message from the coordinator: %s", err);
        client_fail(c, why);
        return;
    }
    if (pl_msg_from_worker(m.type) != 0)
        client_fail(c, "worker message from the coordinator");
    else if (c->state == PL_CTL_CONNECTING)
        answer_challenge(c, &m);
    else if (c->state == PL_CTL_CHALLENGED && m.type != PL_MSG_WELCOME && m.type != PL_MSG_REFUSE)
        client_fail(c, "expected welcome or refuse");
    else
        deliver(c, &m);
    pl_msg_free(&m);
}

/* A close frame carries a two-byte status code before its reason text. */
static void on_peer_close(pl_ctl_client *c, const void *in, size_t len)
{
    if (len > 2 && in)
        set_reason(c, "closed by the coordinator (%.*s)", (int)(len - 2), (const char *)in + 2);
    else
        set_reason(c, "closed by the coordinator");
}

/* Gathers fragments into one message; a complete one is handled at once. */
static int on_receive(pl_ctl_client *c, struct lws *wsi, const void *in, size_t len)
{
    if (c->closing)
        return 0;
    if (lws_frame_is_binary(wsi)) {
        client_fail(c, "binary frame from the coordinator");
        return 0;
    }
    switch (pl_ws_rx_append(&c->rx, &c->rx_len, &c->rx_cap, in, len, PL_PROTO_MAX_BYTES)) {
    case 1:
        client_fail(c, "message from the coordinator over the size limit");
        return 0;
    case -1:
        client_fail(c, "out of memory");
        return 0;
    }
    if (lws_is_final_fragment(wsi)) {
        size_t n = c->rx_len;
        c->rx_len = 0;
        handle_message(c, c->rx, n);
    }
    return 0;
}

/* Writes what is queued; a closing client says goodbye once its queue drained. */
static int on_writeable(pl_ctl_client *c, struct lws *wsi)
{
    int w = pl_ws_queue_service(&c->tx, wsi, c->closing);
    if (w < 0) {
        set_reason(c, "write failed");
        return -1;
    }
    if (w > 0 || !c->closing)
        return 0;
    lws_close_reason(wsi, LWS_CLOSE_STATUS_NORMAL, (unsigned char *)"bye", 3);
    return -1;
}

static int cli_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                        size_t len)
{
    (void)user;
    if (!wsi)
        return 0;
    struct lws_context *ctx = lws_get_context(wsi);
    pl_ctl_client *c = ctx ? lws_context_user(ctx) : NULL;
    if (!c)
        return 0;
    switch (reason) {
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        set_reason(c, "cannot connect: %s", in ? (const char *)in : "unknown error");
        report_closed(c);
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        drain_posts(c);
        return 0;
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        on_peer_close(c, in, len);
        return 0;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        return on_receive(c, wsi, in, len);
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        return on_writeable(c, wsi);
    case LWS_CALLBACK_CLIENT_CLOSED:
        report_closed(c);
        return 0;
    default:
        return 0;
    }
}

static void wake_cb(lws_sorted_usec_list_t *sul)
{
    (void)sul;
}

/* The coordinator's address, and a certificate to trust unless insecure; with a
 * fingerprint, ca_path must be that certificate. 0, or -1 and err. */
static int check_config(const pl_ctl_client_config *cfg, char *err, size_t errlen)
{
    if (!cfg->host || !*cfg->host || strlen(cfg->host) > PL_PROTO_HOST_MAX || cfg->port <= 0 ||
        cfg->port > 65535)
        return pl_errf(err, errlen, "control client: bad coordinator address");
    if (!cfg->ca_path && !cfg->insecure)
        return pl_errf(err, errlen, "control client: no certificate to trust (ca_path)");
    if (cfg->ca_path && cfg->fingerprint) {
        char fp[65];
        if (pl_tls_cert_fingerprint(cfg->ca_path, fp, err, errlen))
            return -1;
        if (strcasecmp(fp, cfg->fingerprint) != 0)
            return pl_errf(err, errlen, "control client: %s: fingerprint %s, expected %s",
                           cfg->ca_path, fp, cfg->fingerprint);
    }
    return 0;
}

/* The client, with its own copies of the host and the token (ca_path and fingerprint
 * serve create only: not kept). NULL and err. */
static pl_ctl_client *client_new(const pl_ctl_client_config *cfg, char *err, size_t errlen)
{
    pl_ctl_client *c = calloc(1, sizeof *c);
    if (!c) {
        pl_errf(err, errlen, "control client: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->rank = -1;
    pthread_mutex_init(&c->post_lock, NULL);
    snprintf(c->host, sizeof c->host, "%s", cfg->host);
    c->token = malloc(cfg->token_len ? cfg->token_len : 1);
    if (!c->token) {
        free(c);
        pl_errf(err, errlen, "control client: out of memory");
        return NULL;
    }
    if (cfg->token_len)
        memcpy(c->token, cfg->token, cfg->token_len);
    c->cfg.token = NULL;
    c->cfg.host = c->host;
    c->cfg.ca_path = NULL; /* only used by create */
    c->cfg.fingerprint = NULL;
    return c;
}

/* Our own TLS context: it trusts ca_path alone (lws's would add the system CAs);
 * NULL ca_path (insecure) trusts nothing. 0, or -1 and err. */
static int create_ssl_ctx(pl_ctl_client *c, const char *ca_path, char *err, size_t errlen)
{
    c->ssl_ctx = SSL_CTX_new(TLS_client_method());
    if (!c->ssl_ctx || SSL_CTX_set_min_proto_version(c->ssl_ctx, TLS1_2_VERSION) != 1 ||
        (ca_path && SSL_CTX_load_verify_locations(c->ssl_ctx, ca_path, NULL) != 1))
        return pl_errf(err, errlen, "control client: cannot load %s", ca_path ? ca_path : "TLS");
    SSL_CTX_set_verify(c->ssl_ctx, SSL_VERIFY_PEER, NULL);
    return 0;
}

/* The lws context: the pliant.v1 protocol, no listening socket, the TLS context of
 * create_ssl_ctx. 0, or -1 and err. */
static int create_context(pl_ctl_client *c, const char *ca_path, char *err, size_t errlen)
{
    lws_set_log_level(LLL_ERR, NULL);
    c->protocols[0].name = PL_PROTO_SUBPROTOCOL;
    c->protocols[0].callback = cli_callback;
    c->protocols[0].rx_buffer_size = 65536;
    if (create_ssl_ctx(c, ca_path, err, errlen))
        return -1;
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    info.port = CONTEXT_PORT_NO_LISTEN;
    info.protocols = c->protocols;
    info.provided_client_ssl_ctx = c->ssl_ctx;
    info.user = c;
    info.gid = -1;
    info.uid = -1;
    c->ctx = lws_create_context(&info);
    if (!c->ctx)
        return pl_errf(err, errlen, "control client: cannot create the TLS context");
    return 0;
}

/* Dials wss://host:port/control; the handshake goes on in pl_ctl_client_service. */
static void start_connecting(pl_ctl_client *c)
{
    struct lws_client_connect_info ci;
    memset(&ci, 0, sizeof ci);
    ci.context = c->ctx;
    ci.address = c->host;
    ci.port = c->cfg.port;
    ci.path = CTL_PATH;
    ci.host = c->host;
    ci.origin = c->host;
    ci.protocol = PL_PROTO_SUBPROTOCOL;
    ci.ssl_connection = LCCSCF_USE_SSL;
    if (c->cfg.insecure)
        ci.ssl_connection |= LCCSCF_ALLOW_SELFSIGNED | LCCSCF_SKIP_SERVER_CERT_HOSTNAME_CHECK |
                             LCCSCF_ALLOW_EXPIRED | LCCSCF_ALLOW_INSECURE;
    ci.pwsi = &c->wsi;
    c->state = PL_CTL_CONNECTING;
    if (!lws_client_connect_via_info(&ci) && c->state == PL_CTL_CONNECTING) {
        /* Failed before any callback: the caller sees state CLOSED. */
        set_reason(c, "cannot start connecting to %s:%d", c->host, c->cfg.port);
        c->state = PL_CTL_CLOSED;
        c->wsi = NULL;
        c->closed_reported = 1;
    }
}

pl_ctl_client *pl_ctl_client_create(const pl_ctl_client_config *cfg, char *err, size_t errlen)
{
    if (check_config(cfg, err, errlen))
        return NULL;
    pl_ctl_client *c = client_new(cfg, err, errlen);
    if (!c)
        return NULL;
    if (create_context(c, cfg->ca_path, err, errlen)) {
        pl_ctl_client_destroy(c);
        return NULL;
    }
    start_connecting(c);
    return c;
}

void pl_ctl_client_destroy(pl_ctl_client *c)
{
    if (!c)
        return;
    c->destroying = 1;
    if (c->ctx) {
        lws_sul_cancel(&c->wake);
        lws_context_destroy(c->ctx);
    }
    SSL_CTX_free(c->ssl_ctx);
    pl_ws_queue_clear(&c->tx);
    pl_ws_queue_clear(&c->posts);
    pthread_mutex_destroy(&c->post_lock);
    free(c->rx);
    if (c->token) {
        OPENSSL_cleanse(c->token, c->cfg.token_len ? c->cfg.token_len : 1);
        free(c->token);
    }
    free(c);
}

int pl_ctl_client_service(pl_ctl_client *c, int timeout_ms)
{
    if (c->state >= PL_CTL_REFUSED && !c->wsi)
        return -1;
    drain_posts(c);
    int64_t now = pl_now_ms();
    if (c->state == PL_CTL_WELCOMED && !c->closing && c->wsi && now >= c->next_hb_ms) {
        pl_msg hb;
        pl_msg_init(&hb, PL_MSG_HEARTBEAT, atomic_load(&c->gen));
        hb.u.heartbeat.step = atomic_load(&c->step);
        pl_ctl_client_send(c, &hb);
        c->next_hb_ms += c->heartbeat_ms;
        if (c->next_hb_ms <= now)
            c->next_hb_ms = now + c->heartbeat_ms;
    }
    if (c->state == PL_CTL_WELCOMED && timeout_ms > c->next_hb_ms - now)
        timeout_ms = (int)(c->next_hb_ms - now);
    if (timeout_ms > 0)
        lws_sul_schedule(c->ctx, 0, &c->wake, wake_cb, (lws_usec_t)timeout_ms * 1000);
    int rc = lws_service(c->ctx, timeout_ms > 0 ? 0 : -1);
    lws_sul_cancel(&c->wake);
    if (rc < 0 || (c->state >= PL_CTL_REFUSED && !c->wsi))
        return -1;
    return 0;
}

pl_ctl_client_state pl_ctl_client_get_state(const pl_ctl_client *c) { return c->state; }
int pl_ctl_client_rank(const pl_ctl_client *c) { return c->rank; }
int pl_ctl_client_heartbeat_ms(const pl_ctl_client *c) { return c->heartbeat_ms; }
const char *pl_ctl_client_close_reason(const pl_ctl_client *c)
{
    return c->state >= PL_CTL_REFUSED ? c->close_reason : "";
}
void pl_ctl_client_set_step(pl_ctl_client *c, int64_t step) { atomic_store(&c->step, step); }
void pl_ctl_client_set_gen(pl_ctl_client *c, int64_t gen) { atomic_store(&c->gen, gen); }
