/* The control channel end to end in one process: the coordinator's server and
 * several workers' clients, serviced alternately from this thread, over TLS
 * with a generated self-signed certificate. */
#include "check.h"
#include "control_client.h"
#include "control_server.h"
#include "tls_selfsigned.h"
#include "util.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOKEN "job-token-0123456789"
#define MAXC 8

typedef struct {
    int registered, heartbeats, messages, closes;
    pl_ctl_conn *conns[MAXC];
    int64_t last_hb_step, last_reduced, last_committed;
    char last_closed_name[64], last_closed_reason[256];
} srv_state;

typedef struct {
    int welcomed, refused, closed, start_steps, plans;
    int64_t last_start_step;
    int plan_nodes;
    char close_reason[256];
} cli_state;

static srv_state S;

static int conn_index(pl_ctl_conn *c)
{
    for (int i = 0; i < MAXC; i++)
        if (S.conns[i] == c)
            return i;
    return -1;
}

static void on_register(pl_ctl_server *s, pl_ctl_conn *c, const pl_msg *m, void *user)
{
    (void)user;
    int i = 0;
    while (i < MAXC && S.conns[i])
        i++;
    if (i == MAXC)
        return;
    S.conns[i] = c;
    S.registered++;
    pl_msg w;
    pl_msg_init(&w, PL_MSG_WELCOME, 0);
    w.u.welcome.rank = i;
    snprintf(w.u.welcome.job, sizeof w.u.welcome.job, "%s", m->u.reg.job);
    w.u.welcome.token_ok = 1;
    w.u.welcome.heartbeat_ms = 100;
    pl_ctl_server_send(s, c, &w);
}

static void on_message(pl_ctl_server *s, pl_ctl_conn *c, const pl_msg *m, void *user)
{
    (void)s;
    (void)c;
    (void)user;
    S.messages++;
    if (m->type == PL_MSG_HEARTBEAT) {
        S.heartbeats++;
        S.last_hb_step = m->u.heartbeat.step;
    } else if (m->type == PL_MSG_REDUCED) {
        S.last_reduced = m->u.reduced.step;
    } else if (m->type == PL_MSG_COMMITTED) {
        S.last_committed = m->u.committed.step;
    }
}

static void on_close(pl_ctl_server *s, pl_ctl_conn *c, const char *reason, void *user)
{
    (void)s;
    (void)user;
    int i = conn_index(c);
    S.closes++;
    snprintf(S.last_closed_name, sizeof S.last_closed_name, "%s", pl_ctl_conn_name(c));
    snprintf(S.last_closed_reason, sizeof S.last_closed_reason, "%s", reason);
    if (i >= 0)
        S.conns[i] = NULL;
}

static void cli_on_message(pl_ctl_client *c, const pl_msg *m, void *user)
{
    (void)c;
    cli_state *st = user;
    if (m->type == PL_MSG_WELCOME)
        st->welcomed++;
    else if (m->type == PL_MSG_REFUSE)
        st->refused++;
    else if (m->type == PL_MSG_START_STEP) {
        st->start_steps++;
        st->last_start_step = m->u.start_step.step;
    } else if (m->type == PL_MSG_PLAN) {
        st->plans++;
        st->plan_nodes = m->u.plan.pipelines[0].nnodes;
    }
}

static void cli_on_close(pl_ctl_client *c, const char *reason, void *user)
{
    (void)c;
    cli_state *st = user;
    st->closed++;
    snprintf(st->close_reason, sizeof st->close_reason, "%s", reason);
}

static pl_ctl_server *srv;
static pl_ctl_client *cli[MAXC];

/* Services the server and every client until pred() holds or max_ms pass. */
static int pump(int (*pred)(void), int max_ms)
{
    int64_t end = pl_now_ms() + max_ms;
    for (;;) {
        if (pred && pred())
            return 1;
        if (pl_now_ms() >= end)
            return pred ? 0 : 1;
        pl_ctl_server_service(srv, 2);
        for (int i = 0; i < MAXC; i++)
            if (cli[i])
                pl_ctl_client_service(cli[i], 0);
    }
}

static pl_ctl_client *make_client(const char *name, const char *token, cli_state *st,
                                  const char *fingerprint, char *err, size_t errlen)
{
    pl_ctl_client_config cc;
    memset(&cc, 0, sizeof cc);
    cc.host = "127.0.0.1";
    cc.port = pl_ctl_server_port(srv);
    cc.ca_path = pl_ctl_server_cert_path(srv);
    cc.fingerprint = fingerprint;
    cc.token = token;
    cc.token_len = strlen(token);
    snprintf(cc.reg.job, sizeof cc.reg.job, "job-a");
    snprintf(cc.reg.name, sizeof cc.reg.name, "%s", name);
    snprintf(cc.reg.node, sizeof cc.reg.node, "node-1");
    snprintf(cc.reg.host, sizeof cc.reg.host, "127.0.0.1");
    cc.reg.port = 29500;
    cc.reg.gpus = 0;
    cc.reg.pid = getpid();
    cc.on_message = cli_on_message;
    cc.on_close = cli_on_close;
    cc.user = st;
    return pl_ctl_client_create(&cc, err, errlen);
}

static cli_state good, bad, malformed, big;

static int good_welcomed_and_heard(void) { return good.welcomed && S.heartbeats >= 1; }
static int good_got_step(void) { return good.start_steps >= 1; }
static int bad_done(void) { return bad.closed && bad.refused; }
static int malformed_welcomed(void) { return malformed.welcomed == 1; }
static int malformed_done(void) { return malformed.closed && S.closes >= 1; }
static int big_welcomed(void) { return big.welcomed == 1; }
static int big_done(void) { return big.closed && S.closes >= 2; }
static int good_got_plan(void) { return good.plans >= 1; }
static int good_two_steps(void) { return good.start_steps >= 2; }
static int all_gone(void) { return pl_ctl_server_nconns(srv) == 1; }
static int got_reduced(void) { return S.last_reduced == 42; }
static int got_committed(void) { return S.last_committed == 43; }

static void *poster(void *arg)
{
    pl_msg m;
    pl_msg_init(&m, PL_MSG_COMMITTED, 1);
    m.u.committed.step = 43;
    usleep(20000);
    pl_ctl_client_post(arg, &m);
    return NULL;
}

static void test_token_proof_and_cert(void)
{
    char out[65];
    CHECK(pl_token_proof("key", 3, "The quick brown fox jumps over the lazy dog", out) == 0);
    CHECK(strcmp(out, "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8") == 0);

    pl_tls_selfsigned t;
    char err[256];
    CHECK(pl_tls_selfsigned_create(&t, "coordinator.example", 1, NULL, err, sizeof err) == 0);
    struct stat st;
    CHECK(stat(t.dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(stat(t.key_path, &st) == 0 && (st.st_mode & 0777) == 0600);
    char fp[65];
    CHECK(pl_tls_cert_fingerprint(t.cert_path, fp, err, sizeof err) == 0);
    CHECK(strcmp(fp, t.fingerprint) == 0);
    char dir[PL_TLS_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", t.dir);
    pl_tls_selfsigned_remove(&t);
    CHECK(stat(dir, &st) != 0);
}

/* A client trusting another certificate never gets to register. */
static void test_untrusted_certificate(void)
{
    char err[256];
    memset(&S, 0, sizeof S);
    pl_ctl_server_config sc;
    memset(&sc, 0, sizeof sc);
    sc.token = TOKEN;
    sc.token_len = strlen(TOKEN);
    sc.cb.on_register = on_register;
    srv = pl_ctl_server_create(&sc, err, sizeof err);
    CHECK(srv != NULL);
    pl_tls_selfsigned other;
    CHECK(pl_tls_selfsigned_create(&other, NULL, 1, NULL, err, sizeof err) == 0);
    cli_state st;
    memset(&st, 0, sizeof st);
    pl_ctl_client_config cc;
    memset(&cc, 0, sizeof cc);
    cc.host = "127.0.0.1";
    cc.port = pl_ctl_server_port(srv);
    cc.ca_path = other.cert_path;
    cc.token = TOKEN;
    cc.token_len = strlen(TOKEN);
    snprintf(cc.reg.job, sizeof cc.reg.job, "job-a");
    snprintf(cc.reg.name, sizeof cc.reg.name, "w-x");
    snprintf(cc.reg.node, sizeof cc.reg.node, "node-1");
    snprintf(cc.reg.host, sizeof cc.reg.host, "127.0.0.1");
    cc.reg.port = 29500;
    cc.reg.pid = 1;
    cc.on_message = cli_on_message;
    cc.on_close = cli_on_close;
    cc.user = &st;
    cli[0] = pl_ctl_client_create(&cc, err, sizeof err);
    pl_tls_selfsigned_remove(&other);
    CHECK(cli[0] != NULL);
    int64_t end = pl_now_ms() + 5000;
    while (!st.closed && pl_now_ms() < end)
        pump(NULL, 10);
    CHECK(st.closed == 1);
    CHECK(pl_ctl_client_get_state(cli[0]) == PL_CTL_CLOSED);
    CHECK_EQ_INT(S.registered, 0);
    pl_ctl_client_destroy(cli[0]);
    cli[0] = NULL;
    pl_ctl_server_destroy(srv);
    srv = NULL;
}

static void test_channel(void)
{
    char err[256];
    memset(&S, 0, sizeof S);
    pl_ctl_server_config sc;
    memset(&sc, 0, sizeof sc);
    sc.port = 0;
    sc.token = TOKEN;
    sc.token_len = strlen(TOKEN);
    sc.cb.on_register = on_register;
    sc.cb.on_message = on_message;
    sc.cb.on_close = on_close;
    srv = pl_ctl_server_create(&sc, err, sizeof err);
    if (!srv)
        printf("    %s\n", err);
    CHECK(srv != NULL);
    CHECK(pl_ctl_server_port(srv) > 0);
    CHECK(pl_ctl_server_authenticates(srv));
    char certdir[PL_TLS_PATH_MAX];
    snprintf(certdir, sizeof certdir, "%s", pl_ctl_server_cert_path(srv));

    /* A pinned fingerprint that does not match the certificate file: refused at once. */
    CHECK(make_client("w-pin", TOKEN, &bad, "00", err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "fingerprint");

    /* The good worker: challenge → register → welcome; heartbeats arrive. */
    cli[0] = make_client("w-good", TOKEN, &good, pl_ctl_server_fingerprint(srv), err, sizeof err);
    if (!cli[0])
        printf("    %s\n", err);
    CHECK(cli[0] != NULL);
    pl_ctl_client_set_step(cli[0], 5);
    if (!pump(good_welcomed_and_heard, 5000))
        printf("    client state %d: %s\n", pl_ctl_client_get_state(cli[0]),
               pl_ctl_client_close_reason(cli[0]));
    CHECK(good.welcomed == 1);
    CHECK(pl_ctl_client_get_state(cli[0]) == PL_CTL_WELCOMED);
    CHECK_EQ_INT(pl_ctl_client_rank(cli[0]), 0);
    CHECK_EQ_INT(pl_ctl_client_heartbeat_ms(cli[0]), 100);
    CHECK(S.conns[0] != NULL);
    CHECK(strcmp(pl_ctl_conn_name(S.conns[0]), "w-good") == 0);
    CHECK_EQ_INT(S.last_hb_step, 5);
    int64_t heard1 = pl_ctl_conn_last_heard_ms(S.conns[0]);
    int hb1 = S.heartbeats;

    pl_msg m;
    pl_msg_init(&m, PL_MSG_START_STEP, 0);
    m.u.start_step.step = 7;
    CHECK(pl_ctl_server_send(srv, S.conns[0], &m) == 0);
    CHECK(pump(good_got_step, 3000));
    CHECK_EQ_INT(good.last_start_step, 7);

    /* Heartbeats keep coming and last-heard advances. */
    pump(NULL, 350);
    CHECK(S.heartbeats >= hb1 + 2);
    CHECK(pl_ctl_conn_last_heard_ms(S.conns[0]) > heard1);

    /* A wrong token: refused and closed; the good worker is untouched. */
    cli[1] = make_client("w-bad", "wrong-token", &bad, NULL, err, sizeof err);
    CHECK(cli[1] != NULL);
    CHECK(pump(bad_done, 5000));
    CHECK(pl_ctl_client_get_state(cli[1]) == PL_CTL_REFUSED);
    CHECK_STR_CONTAINS(pl_ctl_client_close_reason(cli[1]), "bad token proof");
    CHECK(pl_ctl_client_service(cli[1], 0) == -1);
    CHECK_EQ_INT(S.registered, 1);
    CHECK_EQ_INT(S.closes, 0);

    /* A registered worker that sends a malformed message: only it is closed. */
    cli[2] = make_client("w-malformed", TOKEN, &malformed, NULL, err, sizeof err);
    CHECK(cli[2] != NULL);
    CHECK(pump(malformed_welcomed, 5000));
    const char junk[] = "{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":\"x\"}";
    CHECK(pl_ctl_client_send_raw(cli[2], junk, strlen(junk)) == 0);
    CHECK(pump(malformed_done, 5000));
    CHECK(pl_ctl_client_get_state(cli[2]) == PL_CTL_CLOSED);
    CHECK_STR_CONTAINS(pl_ctl_client_close_reason(cli[2]), "invalid message");
    CHECK(strcmp(S.last_closed_name, "w-malformed") == 0);
    CHECK_STR_CONTAINS(S.last_closed_reason, "invalid message");
    CHECK(pl_ctl_client_get_state(cli[0]) == PL_CTL_WELCOMED);

    /* One over PL_PROTO_MAX_BYTES (arriving in many pieces): only it is closed. */
    cli[3] = make_client("w-big", TOKEN, &big, NULL, err, sizeof err);
    CHECK(cli[3] != NULL);
    CHECK(pump(big_welcomed, 5000));
    size_t n = PL_PROTO_MAX_BYTES + 100;
    char *huge = malloc(n);
    CHECK(huge != NULL);
    memset(huge, 'a', n);
    memcpy(huge, "{\"x\":\"", 6);
    memcpy(huge + n - 2, "\"}", 2);
    int rc = pl_ctl_client_send_raw(cli[3], huge, n);
    free(huge);
    CHECK(rc == 0);
    CHECK(pump(big_done, 10000));
    CHECK(strcmp(S.last_closed_name, "w-big") == 0);
    CHECK_STR_CONTAINS(S.last_closed_reason, "over");
    CHECK(pl_ctl_client_get_state(cli[3]) == PL_CTL_CLOSED);

    /* The good one still works, including a large plan (reassembled from pieces). */
    CHECK(pl_ctl_client_get_state(cli[0]) == PL_CTL_WELCOMED);
    CHECK(S.conns[0] != NULL);
    pl_msg_init(&m, PL_MSG_PLAN, 1);
    m.u.plan.generation = 1;
    m.u.plan.step = 0;
    m.u.plan.global_batch = 1;
    m.u.plan.micro = 1;
    m.u.plan.seq_len = 64;
    m.u.plan.npipelines = 1;
    m.u.plan.pipelines = calloc(1, sizeof *m.u.plan.pipelines);
    CHECK(m.u.plan.pipelines != NULL);
    m.u.plan.pipelines[0].nnodes = PL_PROTO_MAX_NODES;
    m.u.plan.pipelines[0].template_nodes = PL_PROTO_MAX_NODES;
    m.u.plan.pipelines[0].microbatches = 1;
    m.u.plan.pipelines[0].nodes = calloc(PL_PROTO_MAX_NODES, sizeof(pl_proto_name));
    CHECK(m.u.plan.pipelines[0].nodes != NULL);
    m.u.plan.pipelines[0].layers = calloc(PL_PROTO_MAX_NODES + 1, sizeof(int));
    CHECK(m.u.plan.pipelines[0].layers != NULL);
    for (int i = 0; i < PL_PROTO_MAX_NODES; i++) {
        snprintf(m.u.plan.pipelines[0].nodes[i], sizeof(pl_proto_name), "worker-name-%05d", i);
        m.u.plan.pipelines[0].layers[i + 1] = i + 1;
    }
    m.u.plan.you_pipeline = -1;
    rc = pl_ctl_server_send(srv, S.conns[0], &m);
    pl_msg_free(&m);
    CHECK(rc == 0);
    CHECK(pump(good_got_plan, 5000));
    CHECK_EQ_INT(good.plan_nodes, PL_PROTO_MAX_NODES);
    pl_msg_init(&m, PL_MSG_START_STEP, 1);
    m.u.start_step.step = 8;
    CHECK(pl_ctl_server_send(srv, S.conns[0], &m) == 0);
    CHECK(pump(good_two_steps, 3000));
    CHECK_EQ_INT(good.last_start_step, 8);
    CHECK(pump(all_gone, 3000));

    /* A message in WebSocket fragments is reassembled; a post from another thread arrives. */
    const char frag[] = "{\"v\":1,\"type\":\"reduced\",\"gen\":1,\"step\":42}";
    CHECK(pl_ctl_client_send_fragmented(cli[0], frag, strlen(frag), 5) == 0);
    CHECK(pump(got_reduced, 3000));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, poster, cli[0]) == 0);
    int got = pump(got_committed, 3000);
    pthread_join(th, NULL);
    CHECK(got);
    int hb2 = S.heartbeats;
    int64_t heard2 = pl_ctl_conn_last_heard_ms(S.conns[0]);
    pump(NULL, 250);
    CHECK(S.heartbeats > hb2);
    CHECK(pl_ctl_conn_last_heard_ms(S.conns[0]) > heard2);

    /* The server closes the good worker: on_close on both sides. */
    pl_ctl_server_close(srv, S.conns[0], "test done");
    CHECK(pump(NULL, 0));
    int64_t end = pl_now_ms() + 3000;
    while (!good.closed && pl_now_ms() < end)
        pump(NULL, 10);
    CHECK(good.closed == 1);
    CHECK(strcmp(S.last_closed_name, "w-good") == 0);
    CHECK_STR_CONTAINS(S.last_closed_reason, "test done");

    for (int i = 0; i < MAXC; i++) {
        pl_ctl_client_destroy(cli[i]);
        cli[i] = NULL;
    }
    pl_ctl_server_destroy(srv);
    srv = NULL;
    /* The generated certificate is gone. */
    struct stat st;
    CHECK(stat(certdir, &st) != 0);
}

TEST_MAIN_BEGIN
RUN(test_token_proof_and_cert);
RUN(test_untrusted_certificate);
RUN(test_channel);
for (int i = 0; i < MAXC; i++)
    pl_ctl_client_destroy(cli[i]);
pl_ctl_server_destroy(srv);
TEST_MAIN_END
