/* The coordinator's control server (see control_server.h). */
#include "control_server.h"

#include "tls_selfsigned.h"
#include "util.h"
#include "ws_queue.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libwebsockets.h>
#include <openssl/crypto.h>
#include <openssl/ssl.h>

#define CTL_PATH "/control"
#define CTL_NONCE_BYTES 32
#define CTL_MAX_QUEUED ((size_t)256 << 20) /* unsent bytes before a connection is dropped */

struct pl_ctl_conn {
    pl_ctl_server *s;
    struct lws *wsi;
    pl_ctl_conn *prev, *next;
    uint64_t id;
    int registered, closing;
    char close_reason[256];
    char nonce[2 * CTL_NONCE_BYTES + 1];
    pl_proto_name name;
    int64_t opened_ms, last_heard_ms;
    char *rx;
    size_t rx_len, rx_cap;
    pl_ws_queue tx;
    void *user;
};

struct pl_ctl_server {
    struct lws_context *ctx;
    struct lws_vhost *vh;
    struct lws_protocols protocols[2];
    /* Given to lws as the vhost's (unused) client TLS context, so that lws does
     * not build its own: with libwebsockets 4.1 that one can leak. */
    SSL_CTX *client_ssl_ctx;
    pl_ctl_server_callbacks cb;
    unsigned char *token;
    size_t token_len;
    int authenticate;
    int port;
    int destroying;
    int nconns;
    uint64_t next_id;
    pl_ctl_conn *conns;
    pl_tls_selfsigned generated;
    char cert_path[PL_TLS_PATH_MAX];
    char fingerprint[65];
    lws_sorted_usec_list_t wake;
};

static void conn_log(const pl_ctl_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_log(const pl_ctl_conn *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "pliant control: connection %llu%s%s%s: %s\n", (unsigned long long)c->id,
            c->name[0] ? " (" : "", c->name, c->name[0] ? ")" : "", msg);
}

static int queue_text(pl_ctl_conn *c, const char *text, size_t len)
{
    if (c->tx.bytes + len > CTL_MAX_QUEUED) {
        /* A worker that does not read: drop it (nothing more is queued). */
        if (!c->closing) {
            snprintf(c->close_reason, sizeof c->close_reason, "send queue over %zu bytes",
                     CTL_MAX_QUEUED);
            conn_log(c, "closing: %s", c->close_reason);
            c->closing = 1;
            lws_callback_on_writable(c->wsi);
        }
        return -1;
    }
    pl_ws_frame *t = pl_ws_frame_new(text, len, LWS_WRITE_TEXT);
    if (!t)
        return -1;
    pl_ws_queue_push(&c->tx, t);
    lws_callback_on_writable(c->wsi);
    return 0;
}

static int queue_msg(pl_ctl_conn *c, const pl_msg *m)
{
    char err[256];
    char *text = pl_msg_encode_err(m, err, sizeof err);
    if (!text) {
        conn_log(c, "cannot encode %s: %s", pl_msg_type_name(m->type), err);
        return -1;
    }
    int rc = queue_text(c, text, strlen(text));
    free(text);
    return rc;
}

/* Marks c for closing after its queue drains (a refuse first while unregistered). */
static void conn_fail(pl_ctl_conn *c, int refuse, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_fail(pl_ctl_conn *c, int refuse, const char *fmt, ...)
{
    if (c->closing)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->close_reason, sizeof c->close_reason, fmt, ap);
    va_end(ap);
    conn_log(c, "closing: %s", c->close_reason);
    if (refuse && !c->registered) {
        pl_msg r;
        pl_msg_init(&r, PL_MSG_REFUSE, 0);
        snprintf(r.u.refuse.reason, sizeof r.u.refuse.reason, "%s", c->close_reason);
        queue_msg(c, &r);
    }
    c->closing = 1;
    free(c->rx);
    c->rx = NULL;
    c->rx_len = c->rx_cap = 0;
    lws_callback_on_writable(c->wsi);
}

static void handle_message(pl_ctl_conn *c, const char *text, size_t len)
{
    pl_ctl_server *s = c->s;
    pl_msg m;
    char err[256];
    if (pl_msg_decode(text, len, &m, err, sizeof err)) {
        conn_fail(c, 1, "invalid message: %s", err);
        return;
    }
    c->last_heard_ms = pl_now_ms();
    if (pl_msg_from_worker(m.type) != 1) {
        conn_fail(c, 1, "%s is not a worker message", pl_msg_type_name(m.type));
    } else if (!c->registered) {
        if (m.type != PL_MSG_REGISTER) {
            conn_fail(c, 1, "expected register, got %s", pl_msg_type_name(m.type));
        } else {
            int ok = 1;
            if (s->authenticate) {
                char want[65], got[65];
                for (int i = 0; i < 65; i++)
                    got[i] = (char)tolower((unsigned char)m.u.reg.token_proof[i]);
                ok = pl_token_proof(s->token, s->token_len, c->nonce, want) == 0 &&
                     strlen(got) == 64 && CRYPTO_memcmp(want, got, 64) == 0;
                OPENSSL_cleanse(want, sizeof want);
            }
            if (!ok) {
                snprintf(c->name, sizeof c->name, "%s", m.u.reg.name);
                conn_fail(c, 1, "bad token proof");
            } else {
                c->registered = 1;
                snprintf(c->name, sizeof c->name, "%s", m.u.reg.name);
                if (s->cb.on_register)
                    s->cb.on_register(s, c, &m, s->cb.user);
            }
        }
    } else if (m.type == PL_MSG_REGISTER) {
        conn_fail(c, 0, "second register on one connection");
    } else if (s->cb.on_message) {
        s->cb.on_message(s, c, &m, s->cb.user);
    }
    pl_msg_free(&m);
}

static void conn_free(pl_ctl_conn *c)
{
    pl_ctl_server *s = c->s;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    pl_ws_queue_clear(&c->tx);
    free(c->rx);
    free(c);
}

/* A worker connected on CTL_PATH: a new connection, challenged at once. */
static int on_established(pl_ctl_server *s, struct lws *wsi, pl_ctl_conn **pc)
{
    char uri[64] = "";
    if (lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) < 0 || strcmp(uri, CTL_PATH) != 0)
        return -1;
    pl_ctl_conn *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->s = s;
    c->wsi = wsi;
    c->id = ++s->next_id;
    c->opened_ms = c->last_heard_ms = pl_now_ms();
    if (pl_random_hex(c->nonce, CTL_NONCE_BYTES)) {
        free(c);
        return -1;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    *pc = c;
    pl_msg ch;
    pl_msg_init(&ch, PL_MSG_CHALLENGE, 0);
    memcpy(ch.u.challenge.nonce, c->nonce, sizeof c->nonce);
    if (queue_msg(c, &ch))
        return -1;
    return 0;
}

/* Appends a fragment to the message being received; −1 when it fails the connection. */
static int rx_append(pl_ctl_conn *c, const void *in, size_t len)
{
    int r = pl_ws_rx_append(&c->rx, &c->rx_len, &c->rx_cap, in, len, PL_PROTO_MAX_BYTES);
    if (r > 0)
        conn_fail(c, 1, "message over %u bytes", PL_PROTO_MAX_BYTES);
    else if (r < 0)
        conn_fail(c, 0, "out of memory");
    return r ? -1 : 0;
}

/* A text fragment; the message is handled once its last fragment is in. */
static int on_receive(pl_ctl_conn *c, struct lws *wsi, const void *in, size_t len)
{
    if (!c || c->closing)
        return 0;
    if (lws_frame_is_binary(wsi)) {
        conn_fail(c, 1, "binary frame (text frames only)");
        return 0;
    }
    if (rx_append(c, in, len) || !lws_is_final_fragment(wsi))
        return 0;
    size_t n = c->rx_len;
    c->rx_len = 0;
    handle_message(c, c->rx, n);
    return 0;
}

/* Writes what is queued; a closing connection closes once its queue drained. */
static int on_writeable(pl_ctl_conn *c, struct lws *wsi)
{
    if (!c)
        return -1;
    int w = pl_ws_queue_service(&c->tx, wsi, c->closing);
    if (w < 0) {
        if (!c->closing)
            snprintf(c->close_reason, sizeof c->close_reason, "write failed");
        return -1;
    }
    if (w > 0 || !c->closing)
        return 0;
    /* The reason travels in the close frame (at most 123 bytes there). */
    size_t n = strlen(c->close_reason);
    lws_close_reason(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, (unsigned char *)c->close_reason,
                     n > 120 ? 120 : n);
    return -1;
}

static int on_closed(pl_ctl_server *s, pl_ctl_conn *c, pl_ctl_conn **pc)
{
    if (!c)
        return 0;
    *pc = NULL;
    const char *why = c->close_reason[0] ? c->close_reason
                      : s->destroying    ? "server shutting down"
                                         : "connection closed by the worker";
    if (c->registered && s->cb.on_close)
        s->cb.on_close(s, c, why, s->cb.user);
    conn_free(c);
    return 0;
}

static int ctl_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                        size_t len)
{
    if (!wsi)
        return 0;
    pl_ctl_conn **pc = user;
    pl_ctl_server *s = lws_context_user(lws_get_context(wsi));
    pl_ctl_conn *c = pc ? *pc : NULL;
    switch (reason) {
    case LWS_CALLBACK_ESTABLISHED:
        return on_established(s, wsi, pc);
    case LWS_CALLBACK_RECEIVE:
        return on_receive(c, wsi, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return on_writeable(c, wsi);
    case LWS_CALLBACK_CLOSED:
        return on_closed(s, c, pc);
    default:
        return 0;
    }
}

static void wake_cb(lws_sorted_usec_list_t *sul)
{
    (void)sul;
}

/* A certificate with its key, or neither (generated); a port in 0..65535. */
static int check_config(const pl_ctl_server_config *cfg, char *err, size_t errlen)
{
    if ((cfg->cert_path == NULL) != (cfg->key_path == NULL))
        return pl_errf(err, errlen,
                       "control server: give both a certificate and a key, or neither");
    if (cfg->port < 0 || cfg->port > 65535)
        return pl_errf(err, errlen, "control server: bad port %d", cfg->port);
    return 0;
}

/* The server's own copy of the job token: proofs are checked only with one. */
static int copy_token(pl_ctl_server *s, const pl_ctl_server_config *cfg, char *err,
                      size_t errlen)
{
    if (!cfg->token)
        return 0;
    s->authenticate = 1;
    s->token_len = cfg->token_len;
    s->token = malloc(cfg->token_len ? cfg->token_len : 1);
    if (!s->token)
        return pl_errf(err, errlen, "control server: out of memory");
    memcpy(s->token, cfg->token, cfg->token_len);
    return 0;
}

/* The certificate and key to serve (*cert, *key): the given pair, or a self-signed
 * one generated now; its path and fingerprint are kept for workers. 0, or -1 and err. */
static int use_certificate(pl_ctl_server *s, const pl_ctl_server_config *cfg, const char **cert,
                           const char **key, char *err, size_t errlen)
{
    *cert = cfg->cert_path;
    *key = cfg->key_path;
    if (!*cert) {
        if (pl_tls_selfsigned_create(&s->generated, cfg->cert_host, 0, NULL, err, errlen))
            return -1;
        *cert = s->generated.cert_path;
        *key = s->generated.key_path;
        memcpy(s->fingerprint, s->generated.fingerprint, sizeof s->fingerprint);
    } else if (pl_tls_cert_fingerprint(*cert, s->fingerprint, err, errlen)) {
        return -1;
    }
    snprintf(s->cert_path, sizeof s->cert_path, "%s", *cert);
    return 0;
}

/* The lws context with one TLS vhost listening on host:port; s->port is the port
 * bound (an ephemeral one for port 0). 0, or -1 and err. */
static int start_listening(pl_ctl_server *s, const char *host, int port, const char *cert,
                           const char *key, char *err, size_t errlen)
{
    lws_set_log_level(LLL_ERR, NULL);
    s->protocols[0].name = PL_PROTO_SUBPROTOCOL;
    s->protocols[0].callback = ctl_callback;
    s->protocols[0].per_session_data_size = sizeof(pl_ctl_conn *);
    s->protocols[0].rx_buffer_size = 65536;
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    /* No LWS_SERVER_OPTION_VALIDATE_UTF8: pl_msg_decode checks text, and its
     * failures are logged with the field path. */
    info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    if (!strchr(host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    info.port = port;
    info.iface = host;
    info.protocols = s->protocols;
    info.ssl_cert_filepath = cert;
    info.ssl_private_key_filepath = key;
    info.user = s;
    info.gid = -1;
    info.uid = -1;
    info.vhost_name = "pliant-control";
    s->client_ssl_ctx = SSL_CTX_new(TLS_client_method());
    if (!s->client_ssl_ctx)
        return pl_errf(err, errlen, "control server: cannot create a TLS context");
    info.provided_client_ssl_ctx = s->client_ssl_ctx;
    s->ctx = lws_create_context(&info);
    if (!s->ctx)
        return pl_errf(err, errlen, "control server: cannot listen on %s:%d with TLS", host, port);
    s->vh = lws_get_vhost_by_name(s->ctx, "pliant-control");
    s->port = s->vh ? lws_get_vhost_listen_port(s->vh) : 0;
    if (s->port <= 0)
        return pl_errf(err, errlen, "control server: no listening port");
    return 0;
}

pl_ctl_server *pl_ctl_server_create(const pl_ctl_server_config *cfg, char *err, size_t errlen)
{
    if (check_config(cfg, err, errlen))
        return NULL;
    pl_ctl_server *s = calloc(1, sizeof *s);
    if (!s) {
        pl_errf(err, errlen, "control server: out of memory");
        return NULL;
    }
    s->cb = cfg->cb;
    const char *cert, *key;
    if (copy_token(s, cfg, err, errlen) || use_certificate(s, cfg, &cert, &key, err, errlen) ||
        start_listening(s, cfg->host ? cfg->host : "127.0.0.1", cfg->port, cert, key, err,
                        errlen)) {
        pl_ctl_server_destroy(s);
        return NULL;
    }
    return s;
}

void pl_ctl_server_destroy(pl_ctl_server *s)
{
    if (!s)
        return;
    s->destroying = 1;
    if (s->ctx) {
        lws_sul_cancel(&s->wake);
        lws_context_destroy(s->ctx);
        s->ctx = NULL;
    }
    SSL_CTX_free(s->client_ssl_ctx);
    while (s->conns) {
        pl_ctl_conn *c = s->conns;
        if (c->registered && s->cb.on_close)
            s->cb.on_close(s, c, "server shutting down", s->cb.user);
        conn_free(c);
    }
    pl_tls_selfsigned_remove(&s->generated);
    if (s->token) {
        OPENSSL_cleanse(s->token, s->token_len);
        free(s->token);
    }
    free(s);
}

int pl_ctl_server_service(pl_ctl_server *s, int timeout_ms)
{
    if (timeout_ms > 0)
        lws_sul_schedule(s->ctx, 0, &s->wake, wake_cb, (lws_usec_t)timeout_ms * 1000);
    int rc = lws_service(s->ctx, timeout_ms > 0 ? 0 : -1);
    lws_sul_cancel(&s->wake);
    int64_t now = pl_now_ms();
    for (pl_ctl_conn *c = s->conns; c; c = c->next)
        if (!c->registered && !c->closing && now - c->opened_ms > PL_PROTO_REGISTER_TIMEOUT_MS)
            conn_fail(c, 1, "no register within %d ms", PL_PROTO_REGISTER_TIMEOUT_MS);
    return rc < 0 ? -1 : 0;
}

int pl_ctl_server_port(const pl_ctl_server *s) { return s->port; }
const char *pl_ctl_server_cert_path(const pl_ctl_server *s) { return s->cert_path; }
const char *pl_ctl_server_fingerprint(const pl_ctl_server *s) { return s->fingerprint; }
int pl_ctl_server_nconns(const pl_ctl_server *s) { return s->nconns; }
int pl_ctl_server_authenticates(const pl_ctl_server *s) { return s->authenticate; }

int pl_ctl_server_send(pl_ctl_server *s, pl_ctl_conn *c, const pl_msg *m)
{
    (void)s;
    if (!c || c->closing)
        return -1;
    return queue_msg(c, m);
}

void pl_ctl_server_refuse(pl_ctl_server *s, pl_ctl_conn *c, int64_t gen, const char *reason)
{
    pl_msg x;
    pl_msg_init(&x, PL_MSG_REFUSE, gen);
    snprintf(x.u.refuse.reason, sizeof x.u.refuse.reason, "%s", reason);
    pl_ctl_server_send(s, c, &x);
    pl_ctl_server_close(s, c, "refused");
}

void pl_ctl_server_close(pl_ctl_server *s, pl_ctl_conn *c, const char *reason)
{
    (void)s;
    if (c)
        conn_fail(c, 0, "%s", reason ? reason : "closed by the coordinator");
}

uint64_t pl_ctl_conn_id(const pl_ctl_conn *c) { return c->id; }
const char *pl_ctl_conn_name(const pl_ctl_conn *c) { return c->name; }
int64_t pl_ctl_conn_last_heard_ms(const pl_ctl_conn *c) { return c->last_heard_ms; }
void pl_ctl_conn_set_user(pl_ctl_conn *c, void *user) { c->user = user; }
void *pl_ctl_conn_user(const pl_ctl_conn *c) { return c->user; }

int pl_ctl_port_in_use(const char *host, int port)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM},
                    *res = NULL;
    if (getaddrinfo(host, service, &hints, &res)) return 0;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, busy = 0;
    if (fd >= 0) {
        /* as the server binds: a connection in TIME_WAIT does not hold the port */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        busy = bind(fd, res->ai_addr, res->ai_addrlen) != 0 && errno == EADDRINUSE;
        close(fd);
    }
    freeaddrinfo(res);
    return busy;
}
