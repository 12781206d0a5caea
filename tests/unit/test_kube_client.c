/* The Kubernetes client and watch against a small HTTP/1.1 server run in a
 * thread of this test: paths, keep-alive, bearer tokens and their rotation,
 * Status errors, timeouts, the 409 retry, status patches, deletes, Events,
 * and list + watch with pages, events split across chunks, bookmarks, 410
 * Gone (ERROR event and HTTP status), re-list differences, back-off and stop. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kube_client.h"
#include "kube_watch.h"
#include "tmpfiles.h"
#include "util.h"

/* ---- the server ---- */

typedef struct {
    char method[16];
    char target[2048]; /* path and query */
    char auth[256];
    char ctype[128];
    char *body;
} request;

/* Answers one request on fd; n is the request's number since the last reset. */
typedef void (*handler_fn)(int fd, const request *rq, int n);

#define LOG_MAX 32

static struct {
    int listen_fd, port;
    pthread_t thread;
    atomic_int quit;
    pthread_mutex_t lock;
    handler_fn handle;
    int connections, requests;
    request log[LOG_MAX]; /* the first LOG_MAX requests since the last reset */
} S;

static void send_all(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0) return; /* the client went away: fine, it may have given up */
        data += n;
        len -= (size_t)n;
    }
}

static void reply(int fd, int code, const char *json)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n", code, strlen(json));
    send_all(fd, head, (size_t)n);
    send_all(fd, json, strlen(json));
}

static void reply_status(int fd, int code, const char *reason, const char *message)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\","
             "\"message\":\"%s\",\"reason\":\"%s\",\"code\":%d}", message, reason, code);
    reply(fd, code, body);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A chunked response: begin, pieces (each its own chunk, sent apart), end. */
static void chunked_begin(int fd)
{
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n";
    send_all(fd, head, strlen(head));
}

static void chunk(int fd, const char *data, size_t len)
{
    char size[32];
    int n = snprintf(size, sizeof size, "%zx\r\n", len);
    send_all(fd, size, (size_t)n);
    send_all(fd, data, len);
    send_all(fd, "\r\n", 2);
    sleep_ms(2); /* so that the client reads the chunks apart */
}

static void chunked_end(int fd)
{
    send_all(fd, "0\r\n\r\n", 5);
}

/* A watch left open: returns when the client closes fd, or cuts the
 * connection when the server quits or after 5 s (a test gone wrong ends). */
static void hang(int fd)
{
    char buf[256];
    struct pollfd p = {fd, POLLIN, 0};
    for (int i = 0; i < 250 && !atomic_load(&S.quit); i++)
        if (poll(&p, 1, 20) > 0 && recv(fd, buf, sizeof buf, 0) <= 0) return;
    shutdown(fd, SHUT_RDWR);
}

/* One request from fd into rq (buf holds bytes already read). 0, or −1 at EOF. */
static int read_request(int fd, char *buf, size_t cap, size_t *have, request *rq)
{
    char *end;
    while (!(end = memmem(buf, *have, "\r\n\r\n", 4))) {
        struct pollfd p = {fd, POLLIN, 0};
        if (atomic_load(&S.quit) || *have + 1 >= cap) return -1;
        if (poll(&p, 1, 20) <= 0) continue;
        ssize_t n = recv(fd, buf + *have, cap - 1 - *have, 0);
        if (n <= 0) return -1;
        *have += (size_t)n;
    }
    *end = '\0';
    memset(rq, 0, sizeof *rq);
    sscanf(buf, "%15s %2047s", rq->method, rq->target);
    size_t body_len = 0;
    for (char *line = strstr(buf, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (!strncasecmp(h, "Authorization: ", 15)) sscanf(h + 15, "%255[^\r]", rq->auth);
        if (!strncasecmp(h, "Content-Type: ", 14)) sscanf(h + 14, "%127[^\r]", rq->ctype);
        if (!strncasecmp(h, "Content-Length: ", 16)) body_len = strtoul(h + 16, NULL, 10);
    }
    size_t head = (size_t)(end - buf) + 4;
    while (*have < head + body_len) {
        ssize_t n = recv(fd, buf + *have, cap - 1 - *have, 0);
        if (n <= 0) return -1;
        *have += (size_t)n;
    }
    rq->body = strndup(buf + head, body_len);
    memmove(buf, buf + head + body_len, *have - head - body_len);
    *have -= head + body_len;
    return 0;
}

static void *serve(void *arg)
{
    static char buf[1 << 16];
    while (!atomic_load(&S.quit)) {
        struct pollfd p = {S.listen_fd, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0) continue;
        int fd = accept(S.listen_fd, NULL, NULL);
        if (fd < 0) continue;
        pthread_mutex_lock(&S.lock);
        S.connections++;
        pthread_mutex_unlock(&S.lock);
        size_t have = 0;
        request rq;
        while (read_request(fd, buf, sizeof buf, &have, &rq) == 0) {
            pthread_mutex_lock(&S.lock);
            int n = S.requests++;
            handler_fn h = S.handle;
            if (n < LOG_MAX) S.log[n] = rq;
            pthread_mutex_unlock(&S.lock);
            h(fd, &rq, n);
            if (n >= LOG_MAX) free(rq.body);
        }
        close(fd);
    }
    return NULL;
}

static void server_reset(handler_fn h)
{
    pthread_mutex_lock(&S.lock);
    for (int i = 0; i < S.requests && i < LOG_MAX; i++) free(S.log[i].body);
    S.requests = S.connections = 0;
    S.handle = h;
    pthread_mutex_unlock(&S.lock);
}

static int requests(void)
{
    pthread_mutex_lock(&S.lock);
    int n = S.requests;
    pthread_mutex_unlock(&S.lock);
    return n;
}

static int server_start(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    S.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (S.listen_fd < 0 || bind(S.listen_fd, (struct sockaddr *)&a, sizeof a) ||
        listen(S.listen_fd, 8) || getsockname(S.listen_fd, (struct sockaddr *)&a, &len))
        return -1;
    S.port = ntohs(a.sin_port);
    pthread_mutex_init(&S.lock, NULL);
    return pthread_create(&S.thread, NULL, serve, NULL) ? -1 : 0;
}

static void server_stop(void)
{
    atomic_store(&S.quit, 1);
    pthread_join(S.thread, NULL);
    close(S.listen_fd);
    server_reset(NULL);
    pthread_mutex_destroy(&S.lock);
}

/* ---- the client side ---- */

static char err_[512];

/* Replaces DIR/name as kubelet rotates tokens: a new file renamed over it. */
static int write_file(const char *name, const char *text)
{
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path_in(name));
    return write_raw(tmp, text, strlen(text)) ? -1 : rename(tmp, path_in(name));
}

/* A config pointing at the test server with the token in DIR/token. */
static int config_for(pl_kube_config *cfg, int port)
{
    char text[512];
    snprintf(text, sizeof text,
             "current-context: t\nclusters: [{name: s, cluster: {server: 'http://127.0.0.1:%d'}}]\n"
             "contexts: [{name: t, context: {cluster: s, user: u, namespace: ns}}]\n"
             "users: [{name: u, user: {tokenFile: token}}]\n", port);
    if (write_file("token", "tok-1") || write_file("config", text)) return -1;
    int rc = pl_kube_config_load_file(cfg, path_in("config"), NULL, err_, sizeof err_);
    if (rc) printf("    %s\n", err_);
    return rc;
}

static pl_kube_config cfg_;

static pl_kube_client *client_new(void)
{
    pl_kube_client *c = pl_kube_client_new(&cfg_, err_, sizeof err_);
    if (!c) printf("    %s\n", err_);
    return c;
}

/* A fresh client, with the server's log cleared and h answering. */
static pl_kube_client *client_for(handler_fn h)
{
    server_reset(h);
    return client_new();
}

static const pl_kube_ref POD = {.version = "v1", .namespace_ = "ns", .plural = "pods", .name = "p"};
static const pl_kube_ref JOB = {.group = "pliant.dev", .version = "v1alpha1", .namespace_ = "ns",
                                .plural = "trainingjobs", .name = "j"};

static void test_paths(void)
{
    char p[256], e[128];
    CHECK_EQ_INT(pl_kube_path(&POD, NULL, p, sizeof p, e, sizeof e), 0);
    CHECK(strcmp(p, "/api/v1/namespaces/ns/pods/p") == 0);
    pl_kube_ref r = JOB;
    r.subresource = "status";
    CHECK_EQ_INT(pl_kube_path(&r, "x=1", p, sizeof p, e, sizeof e), 0);
    CHECK(strcmp(p, "/apis/pliant.dev/v1alpha1/namespaces/ns/trainingjobs/j/status?x=1") == 0);
    r = (pl_kube_ref){.version = "v1", .plural = "nodes"};
    CHECK_EQ_INT(pl_kube_path(&r, "", p, sizeof p, e, sizeof e), 0);
    CHECK(strcmp(p, "/api/v1/nodes") == 0);
    r.name = "a/b";
    CHECK_EQ_INT(pl_kube_path(&r, NULL, p, sizeof p, e, sizeof e), -1);
    CHECK_STR_CONTAINS(e, "name: \"a/b\" is not a valid path segment");
    r.name = "..";
    CHECK_EQ_INT(pl_kube_path(&r, NULL, p, sizeof p, e, sizeof e), -1);
    r = (pl_kube_ref){.version = "v1", .plural = "pods", .subresource = "log"};
    CHECK_EQ_INT(pl_kube_path(&r, NULL, p, sizeof p, e, sizeof e), -1);
    CHECK_STR_CONTAINS(e, "subresource: needs a name");
    r = (pl_kube_ref){.plural = "pods"};
    CHECK_EQ_INT(pl_kube_path(&r, NULL, p, sizeof p, e, sizeof e), -1);
    CHECK_STR_CONTAINS(e, "version: missing");
    char *esc = pl_kube_escape("app=x,tier in (a b)");
    CHECK(esc && strcmp(esc, "app%3Dx%2Ctier%20in%20%28a%20b%29") == 0);
    free(esc);
}

static void pod_handler(int fd, const request *rq, int n)
{
    reply(fd, 200, "{\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"resourceVersion\":\"7\"}}");
}

static void test_get_keepalive_and_token_rotation(void)
{
    pl_kube_client *c = client_for(pod_handler);
    CHECK(c);
    pl_kube_status st;
    cJSON *obj = NULL;
    for (int i = 0; i < 3; i++) {
        cJSON_Delete(obj);
        CHECK_EQ_INT(pl_kube_get(c, &POD, NULL, &obj, &st), 0);
    }
    CHECK(strcmp(pl_kube_field(obj, "metadata.resourceVersion"), "7") == 0);
    cJSON_Delete(obj);
    CHECK_EQ_INT(write_file("token", "tok-2-rotated\n"), 0);
    CHECK_EQ_INT(pl_kube_get(c, &POD, "labelSelector=a", NULL, &st), 0);
    pl_kube_client_free(c);
    CHECK_EQ_INT(requests(), 4);
    CHECK_EQ_INT(S.connections, 1); /* one connection, kept alive */
    CHECK(strcmp(S.log[0].method, "GET") == 0);
    CHECK(strcmp(S.log[0].target, "/api/v1/namespaces/ns/pods/p") == 0);
    CHECK(strcmp(S.log[2].auth, "Bearer tok-1") == 0);
    CHECK(strcmp(S.log[3].auth, "Bearer tok-2-rotated") == 0);
    CHECK(strcmp(S.log[3].target, "/api/v1/namespaces/ns/pods/p?labelSelector=a") == 0);
    CHECK_EQ_INT(count_entries(dir, ".tmp"), 0);
}

static void errors_handler(int fd, const request *rq, int n)
{
    if (strstr(rq->target, "/pods/missing")) {
        reply_status(fd, 404, "NotFound", "pods \\\"missing\\\" not found");
    } else if (strstr(rq->target, "/pods/plain")) {
        reply(fd, 500, "upstream exploded");
    } else if (strstr(rq->target, "/pods/slow")) {
        sleep_ms(600);
        reply(fd, 200, "{}");
    } else if (strstr(rq->target, "/pods/garbage")) {
        reply(fd, 200, "{not json");
    } else {
        reply(fd, 201, "");
    }
}

static void test_status_errors_and_timeouts(void)
{
    pl_kube_client *c = client_for(errors_handler);
    CHECK(c);
    static const struct {
        const char *name;
        long http;
        const char *reason, *message;
        int retriable;
    } cases[] = {
        {"missing", 404, "NotFound", "pods \"missing\" not found", 0},
        {"plain", 500, "", "HTTP 500: upstream exploded", 1},
        {"garbage", 200, "InvalidResponse", "response is not JSON: {not json", 0},
        {"bad/name", 0, "Invalid", "name: \"bad/name\" is not a valid path segment", 0},
        /* last: the server stays busy with it for a while */
        {"slow", 0, "Timeout", "GET /api/v1/namespaces/ns/pods/slow: ", 1}, /* after 150 ms */
    };
    pl_kube_status st;
    pl_kube_ref r = POD;
    cJSON *out = NULL;
    r.name = "empty"; /* 201 without a body: success, no object */
    CHECK_EQ_INT(pl_kube_get(c, &r, NULL, &out, &st), 0);
    CHECK(out == NULL);
    pl_kube_client_set_timeout(c, 150);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r.name = cases[i].name;
        CHECK_EQ_INT(pl_kube_get(c, &r, NULL, &out, &st), -1);
        CHECK(out == NULL);
        CHECK_EQ_INT(st.http, cases[i].http);
        CHECK(strcmp(st.reason, cases[i].reason) == 0);
        CHECK_STR_CONTAINS(st.message, cases[i].message);
        CHECK_EQ_INT(pl_kube_retriable(&st), cases[i].retriable);
    }
    pl_kube_client_free(c);

    /* nobody listening: a transport error */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    char server[64];
    snprintf(server, sizeof server, "http://127.0.0.1:%d", ntohs(a.sin_port));
    char *saved = cfg_.server;
    cfg_.server = server;
    c = client_new();
    int rc = c ? pl_kube_get(c, &POD, NULL, NULL, &st) : 0;
    cfg_.server = saved;
    pl_kube_client_free(c);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.http, 0);
    CHECK(strcmp(st.reason, "Transport") == 0);
    CHECK(pl_kube_retriable(&st));
}

/* ---- Retry-After ---- */

/* A 429 or 503 with a Retry-After header. */
static void reply_retry_after(int fd, int code, const char *after)
{
    char head[512], body[256];
    int b = snprintf(body, sizeof body,
                     "{\"kind\":\"Status\",\"status\":\"Failure\",\"reason\":\"%s\","
                     "\"message\":\"busy\",\"code\":%d}",
                     code == 429 ? "TooManyRequests" : "ServiceUnavailable", code);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n%s%s%s"
                     "Content-Length: %d\r\n\r\n",
                     code, after ? "Retry-After: " : "", after ? after : "", after ? "\r\n" : "", b);
    send_all(fd, head, (size_t)n);
    send_all(fd, body, (size_t)b);
}

/* /pods/once-N: 429 with Retry-After N the first time, then 200; /pods/long: 503 with
 * Retry-After 30; /pods/huge: 429 with a day; /pods/bare: 429 without the header. */
static void retry_after_handler(int fd, const request *rq, int n)
{
    const char *once = strstr(rq->target, "/pods/once-");
    if (once && n == 0) reply_retry_after(fd, 429, once + strlen("/pods/once-"));
    else if (once) reply(fd, 200, "{\"kind\":\"Pod\"}");
    else if (strstr(rq->target, "/pods/long")) reply_retry_after(fd, 503, "30");
    else if (strstr(rq->target, "/pods/huge")) reply_retry_after(fd, 429, "86400");
    else reply_retry_after(fd, 429, NULL);
}

/* A get of pods/name: its return code, the requests it made and its duration in ms. */
static int get_timed(pl_kube_client *c, const char *name, pl_kube_status *st, int *nreq,
                     double *ms)
{
    server_reset(retry_after_handler);
    pl_kube_ref r = POD;
    r.name = name;
    cJSON *out = NULL;
    const double t0 = pl_now_ms();
    int rc = pl_kube_get(c, &r, NULL, &out, st);
    *ms = pl_now_ms() - t0;
    *nreq = requests();
    cJSON_Delete(out);
    return rc;
}

static void test_retry_after(void)
{
    pl_kube_client *c = client_for(retry_after_handler);
    CHECK(c);
    pl_kube_status st;
    int n;
    double ms;
    /* a short wait is slept in the request, which then succeeds */
    CHECK_EQ_INT(get_timed(c, "once-1", &st, &n, &ms), 0);
    CHECK_EQ_INT(n, 2);
    CHECK(ms >= 950);
    /* a long one is the caller's: returned at once, with the wait */
    CHECK_EQ_INT(get_timed(c, "long", &st, &n, &ms), -1);
    CHECK_EQ_INT(n, 1);
    CHECK(ms < 900);
    CHECK_EQ_INT(st.http, 503);
    CHECK_EQ_INT((int)st.retry_after_ms, 30000);
    CHECK(pl_kube_retriable(&st));
    /* bounded */
    CHECK_EQ_INT(get_timed(c, "huge", &st, &n, &ms), -1);
    CHECK_EQ_INT((int)st.retry_after_ms, PL_KUBE_RETRY_AFTER_MAX_MS);
    /* without the header: no wait, no retry */
    CHECK_EQ_INT(get_timed(c, "bare", &st, &n, &ms), -1);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT((int)st.retry_after_ms, 0);
    CHECK_STR_CONTAINS(st.reason, "TooManyRequests");
    pl_kube_client_free(c);
}

/* ---- optimistic concurrency ---- */

static struct {
    int rv;            /* the stored object's resourceVersion */
    int racing_writes; /* GETs after which another writer bumps rv */
    int replicas;
    int puts;
} O;

static void conflict_handler(int fd, const request *rq, int n)
{
    char body[256];
    if (strcmp(rq->method, "GET") == 0) {
        snprintf(body, sizeof body,
                 "{\"metadata\":{\"name\":\"j\",\"resourceVersion\":\"%d\"},"
                 "\"spec\":{\"replicas\":%d}}", O.rv, O.replicas);
        reply(fd, 200, body);
        if (O.racing_writes > 0) {
            O.racing_writes--;
            O.rv++;
        }
        return;
    }
    O.puts++;
    cJSON *obj = cJSON_Parse(rq->body);
    const char *rv = pl_kube_field(obj, "metadata.resourceVersion");
    if (!rv || atoi(rv) != O.rv) {
        reply_status(fd, 409, "Conflict", "the object has been modified");
    } else {
        O.rv++;
        O.replicas = cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "spec"), "replicas")->valueint;
        snprintf(body, sizeof body, "{\"metadata\":{\"name\":\"j\",\"resourceVersion\":\"%d\"}}",
                 O.rv);
        reply(fd, 200, body);
    }
    cJSON_Delete(obj);
}

typedef struct {
    int calls;
    int result; /* what mutate returns */
} mutate_state;

static int add_replica(cJSON *obj, void *user, char *err, size_t errlen)
{
    mutate_state *m = user;
    m->calls++;
    if (m->result < 0) return pl_errf(err, errlen, "spec.replicas: refused");
    cJSON *r = cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "spec"), "replicas");
    cJSON_SetNumberValue(r, r->valueint + 1);
    return m->result;
}

static void test_update_retries_on_conflict(void)
{
    pl_kube_client *c = client_for(conflict_handler);
    CHECK(c);
    pl_kube_status st;
    O.rv = 5, O.racing_writes = 2, O.replicas = 1, O.puts = 0;
    mutate_state m = {0, 0};
    cJSON *out;
    CHECK_EQ_INT(pl_kube_update_retry(c, &JOB, 5, add_replica, &m, &out, &st), 0);
    CHECK_EQ_INT(m.calls, 3); /* two conflicts, then the write */
    CHECK_EQ_INT(O.puts, 3);
    CHECK_EQ_INT(O.replicas, 2); /* reapplied to the fresh object, not stacked */
    CHECK(strcmp(pl_kube_field(out, "metadata.resourceVersion"), "8") == 0);
    cJSON_Delete(out);
    CHECK(strcmp(S.log[1].method, "PUT") == 0);
    CHECK(strcmp(S.log[1].target, "/apis/pliant.dev/v1alpha1/namespaces/ns/trainingjobs/j") == 0);
    CHECK(strcmp(S.log[1].ctype, "application/json") == 0);

    O.racing_writes = 10, m.calls = 0;
    CHECK_EQ_INT(pl_kube_update_retry(c, &JOB, 3, add_replica, &m, NULL, &st), -1);
    CHECK_EQ_INT(m.calls, 3);
    CHECK_EQ_INT(st.http, 409);
    CHECK(strcmp(st.reason, "Conflict") == 0);

    O.racing_writes = 0, O.puts = 0, m = (mutate_state){0, 1}; /* nothing to change */
    CHECK_EQ_INT(pl_kube_update_retry(c, &JOB, 3, add_replica, &m, &out, &st), 0);
    CHECK(out && O.puts == 0);
    cJSON_Delete(out);
    m = (mutate_state){0, -1};
    CHECK_EQ_INT(pl_kube_update_retry(c, &JOB, 3, add_replica, &m, &out, &st), -1);
    CHECK(out == NULL && O.puts == 0);
    CHECK(strcmp(st.reason, "Mutate") == 0);
    CHECK_STR_CONTAINS(st.message, "spec.replicas: refused");
    pl_kube_client_free(c);
}

static void echo_handler(int fd, const request *rq, int n)
{
    reply(fd, strcmp(rq->method, "POST") == 0 ? 201 : 200, rq->body[0] ? rq->body : "{}");
}

static void test_patch_delete_and_events(void)
{
    pl_kube_client *c = client_for(echo_handler);
    CHECK(c);
    pl_kube_status st;
    cJSON *status = cJSON_Parse("{\"phase\":\"Running\",\"step\":3}"), *out;
    CHECK_EQ_INT(pl_kube_patch_status(c, &JOB, status, &out, &st), 0);
    cJSON_Delete(status);
    CHECK(strcmp(pl_kube_field(out, "status.phase"), "Running") == 0);
    cJSON_Delete(out);
    CHECK(strcmp(S.log[0].method, "PATCH") == 0);
    CHECK(strcmp(S.log[0].target,
                 "/apis/pliant.dev/v1alpha1/namespaces/ns/trainingjobs/j/status") == 0);
    CHECK(strcmp(S.log[0].ctype, "application/merge-patch+json") == 0);
    CHECK(strcmp(S.log[0].body, "{\"status\":{\"phase\":\"Running\",\"step\":3}}") == 0);

    cJSON *ops = cJSON_Parse("[{\"op\":\"remove\",\"path\":\"/metadata/finalizers/0\"}]");
    CHECK_EQ_INT(pl_kube_patch(c, &POD, PL_KUBE_JSON_PATCH, ops, NULL, &st), 0);
    cJSON_Delete(ops);
    CHECK(strcmp(S.log[1].ctype, "application/json-patch+json") == 0);

    CHECK_EQ_INT(pl_kube_delete(c, &POD, "Background", &st), 0);
    CHECK(strcmp(S.log[2].method, "DELETE") == 0);
    CHECK_STR_CONTAINS(S.log[2].body, "\"propagationPolicy\":\"Background\"");
    CHECK_EQ_INT(pl_kube_delete(c, &POD, NULL, &st), 0);
    CHECK(S.log[3].body[0] == '\0' && S.log[3].ctype[0] == '\0');

    cJSON *job = cJSON_Parse("{\"apiVersion\":\"pliant.dev/v1alpha1\",\"kind\":\"TrainingJob\","
                             "\"metadata\":{\"name\":\"j\",\"namespace\":\"ns\",\"uid\":\"u-1\"}}");
    char note[1100];
    memset(note, 'x', sizeof note);
    memcpy(note + 1023, "\xc3\xa9", 2); /* é across the 1024-byte limit */
    note[sizeof note - 1] = '\0';
    pl_kube_event ev = {.regarding = job, .type = "Warning", .reason = "NodeLost",
                        .action = "Reconfigure", .note = note, .instance = "op-0"};
    CHECK_EQ_INT(pl_kube_event_create(c, &ev, &st), 0);
    const request *e = &S.log[4];
    CHECK(strcmp(e->method, "POST") == 0);
    CHECK(strcmp(e->target, "/apis/events.k8s.io/v1/namespaces/ns/events") == 0);
    cJSON *sent = cJSON_Parse(e->body);
    CHECK(sent);
    CHECK(strcmp(pl_kube_field(sent, "apiVersion"), "events.k8s.io/v1") == 0);
    CHECK(strcmp(pl_kube_field(sent, "metadata.generateName"), "j.") == 0);
    CHECK(strcmp(pl_kube_field(sent, "regarding.kind"), "TrainingJob") == 0);
    CHECK(strcmp(pl_kube_field(sent, "regarding.uid"), "u-1") == 0);
    CHECK(strcmp(pl_kube_field(sent, "reason"), "NodeLost") == 0);
    CHECK(strcmp(pl_kube_field(sent, "type"), "Warning") == 0);
    CHECK(strcmp(pl_kube_field(sent, "reportingController"), "pliant.dev/operator") == 0);
    CHECK(strcmp(pl_kube_field(sent, "reportingInstance"), "op-0") == 0);
    CHECK_EQ_INT(strlen(pl_kube_field(sent, "note")), 1023); /* é did not fit whole */
    const char *when = pl_kube_field(sent, "eventTime"); /* 2026-01-02T03:04:05.123456Z */
    CHECK(when && strlen(when) == 27 && when[10] == 'T' && when[19] == '.' && when[26] == 'Z');
    cJSON_Delete(sent);

    ev.regarding = NULL;
    CHECK_EQ_INT(pl_kube_event_create(c, &ev, &st), -1);
    CHECK_STR_CONTAINS(st.message, "regarding.metadata.name");
    cJSON_Delete(job);
    pl_kube_client_free(c);
}

/* ---- list + watch ---- */

#define POD_JSON(name, rv) "{\"metadata\":{\"name\":\"" name "\",\"namespace\":\"ns\"," \
                           "\"resourceVersion\":\"" rv "\"}}"
#define EVENT(type, obj) "{\"type\":\"" type "\",\"object\":" obj "}\n"
#define LIST(rv, cont, items) "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":" \
                              "{\"resourceVersion\":\"" rv "\"" cont "},\"items\":[" items "]}"

static atomic_int stop_;
static char events_[2048];
static const char *stop_at_; /* the event line after which a watch test stops */
static int synced_;

static void send_pieces(int fd, const char *text, size_t piece)
{
    for (size_t i = 0, n = strlen(text); i < n; i += piece)
        chunk(fd, text + i, n - i < piece ? n - i : piece);
}

/* The API server's script: what each request of the watch test gets. */
static void watch_handler(int fd, const request *rq, int n)
{
    static const char *const first_watch =
        EVENT("ADDED", POD_JSON("p4", "22")) EVENT("MODIFIED", POD_JSON("p1", "30"))
        EVENT("DELETED", POD_JSON("p2", "31"))
        "\n" EVENT("BOOKMARK", "{\"metadata\":{\"resourceVersion\":\"35\"}}");
    static const char *const gone =
        EVENT("ERROR", "{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\","
                       "\"message\":\"too old resource version\"}");
    switch (n) {
    case 0: /* a list in two pages */
        reply(fd, 200, LIST("20", ",\"continue\":\"c1\"", POD_JSON("p1", "10") ","
                            POD_JSON("p2", "11")));
        break;
    case 1: reply(fd, 200, LIST("21", "", POD_JSON("p3", "12"))); break;
    case 2: /* events cut anywhere: 7-byte chunks, then ends (watch timeout) */
        chunked_begin(fd);
        send_pieces(fd, first_watch, 7);
        chunked_end(fd);
        break;
    case 3: /* the bookmark's version is too old: ERROR 410 in the stream */
        chunked_begin(fd);
        send_pieces(fd, gone, strlen(gone));
        hang(fd);
        break;
    case 4: /* re-list: p4 gone, p3 changed, p5 new, p1 unchanged */
    case 6:
        reply(fd, 200, LIST("50", "", POD_JSON("p1", "30") "," POD_JSON("p3", "40") ","
                            POD_JSON("p5", "41")));
        break;
    case 5: reply_status(fd, 410, "Expired", "too old resource version: 50"); break;
    case 7: /* one byte at a time, then a stream left open until the client stops */
        chunked_begin(fd);
        send_pieces(fd, EVENT("MODIFIED", POD_JSON("p5", "60")), 1);
        hang(fd);
        break;
    default: reply_status(fd, 500, "InternalError", "the script is over");
    }
}

static void on_event(pl_watch_event ev, const cJSON *obj, const cJSON *old, void *user)
{
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED"};
    const char *name = pl_kube_field(obj, "metadata.name");
    size_t len = strlen(events_);
    snprintf(events_ + len, sizeof events_ - len, "%s %s@%s%s%s%s;", names[ev], name,
             pl_kube_field(obj, "metadata.resourceVersion"), old ? " old@" : "",
             old ? pl_kube_field(old, "metadata.resourceVersion") : "",
             pl_kube_field(obj, "kind") ? " Pod" : "");
    size_t n = strlen(events_), k = strlen(stop_at_);
    if (n >= k && strcmp(events_ + n - k, stop_at_) == 0) atomic_store(&stop_, 1);
}

static void on_synced(void *user)
{
    synced_++;
}

/* Ends a watch test gone wrong instead of retrying for ever. */
static void stop_on_error(const pl_kube_status *st, void *user)
{
    printf("    watch error: %ld %s %s\n", st->http, st->reason, st->message);
    atomic_store(&stop_, 1);
}

static void test_list_watch_relist(void)
{
    pl_kube_client *c = client_for(watch_handler);
    CHECK(c);
    atomic_store(&stop_, 0);
    events_[0] = '\0';
    stop_at_ = "MODIFIED p5@60 old@41;";
    synced_ = 0;
    pl_kube_client_set_stop(c, &stop_);
    pl_watch_config wc = {.ref = {.version = "v1", .namespace_ = "ns", .plural = "pods"},
                          .label_selector = "app=x,tier in (a)", .timeout_seconds = 60,
                          .page_size = 2, .backoff_min_ms = 10, .on_event = on_event,
                          .on_synced = on_synced, .on_error = stop_on_error};
    pl_watch_stats stats;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = pl_watch_run(c, &wc, &stats, err_, sizeof err_);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pl_kube_client_free(c);
    CHECK_EQ_INT(rc, 0);
    const char *want = "ADDED p1@10 Pod;ADDED p2@11 Pod;ADDED p3@12 Pod;" /* first list */
                       "ADDED p4@22;MODIFIED p1@30 old@10;DELETED p2@31;" /* first watch */
                       "MODIFIED p3@40 old@12 Pod;ADDED p5@41 Pod;DELETED p4@22;" /* re-list */
                       "MODIFIED p5@60 old@41;";
    if (strcmp(events_, want) != 0) printf("    events: %s\n    wanted: %s\n", events_, want);
    CHECK(strcmp(events_, want) == 0);
    CHECK_EQ_INT(synced_, 3);
    CHECK_EQ_INT(stats.lists, 3);
    CHECK_EQ_INT(stats.relists_gone, 2);
    CHECK_EQ_INT(stats.watches, 4);
    CHECK_EQ_INT(stats.bookmarks, 1);
    CHECK_EQ_INT(stats.events, 4);
    CHECK(strcmp(stats.resource_version, "60") == 0);
    CHECK_EQ_INT(requests(), 8);
    CHECK_STR_CONTAINS(S.log[0].target, "/api/v1/namespaces/ns/pods?limit=2&"
                                        "labelSelector=app%3Dx%2Ctier%20in%20%28a%29");
    CHECK_STR_CONTAINS(S.log[1].target, "&continue=c1");
    CHECK_STR_CONTAINS(S.log[2].target, "?watch=1&allowWatchBookmarks=true&timeoutSeconds=");
    CHECK_STR_CONTAINS(S.log[2].target, "&labelSelector=app%3Dx");
    CHECK_STR_CONTAINS(S.log[2].target, "&resourceVersion=21");
    CHECK_STR_CONTAINS(S.log[3].target, "&resourceVersion=35"); /* from the bookmark */
    CHECK(!strstr(S.log[4].target, "watch=1") && !strstr(S.log[4].target, "resourceVersion"));
    CHECK_STR_CONTAINS(S.log[5].target, "&resourceVersion=50");
    CHECK_STR_CONTAINS(S.log[7].target, "&resourceVersion=50");
    int t = atoi(strstr(S.log[2].target, "timeoutSeconds=") + 15);
    CHECK(t >= 60 && t < 120); /* jittered */
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    CHECK(secs < 5.0); /* stopped promptly while the last stream stayed open */
}

/* A broken stream, then an empty one: each a failure with a back-off, and the
 * next watch resumes from the same resourceVersion (no re-list). */
static void broken_handler(int fd, const request *rq, int n)
{
    switch (n) {
    case 0: reply(fd, 200, LIST("5", "", "")); break;
    case 1:
        chunked_begin(fd);
        send_pieces(fd, "{\"type\":\"ADDED\",\"object\": nonsense}\n", 20);
        hang(fd);
        break;
    case 2:
        chunked_begin(fd);
        chunked_end(fd);
        break;
    case 3:
        chunked_begin(fd);
        send_pieces(fd, EVENT("ADDED", POD_JSON("p5", "6")), 64);
        hang(fd);
        break;
    default: reply_status(fd, 500, "InternalError", "the script is over");
    }
}

static char reasons_[256];

static void note_error(const pl_kube_status *st, void *user)
{
    size_t len = strlen(reasons_);
    snprintf(reasons_ + len, sizeof reasons_ - len, "%s;", st->reason);
    if (len > 100) atomic_store(&stop_, 1); /* gone wrong: end the test */
}

static void test_watch_resumes_after_broken_streams(void)
{
    pl_kube_client *c = client_for(broken_handler);
    CHECK(c);
    atomic_store(&stop_, 0);
    events_[0] = reasons_[0] = '\0';
    stop_at_ = "ADDED p5@6;";
    pl_kube_client_set_stop(c, &stop_);
    pl_watch_config wc = {.ref = {.version = "v1", .namespace_ = "ns", .plural = "pods"},
                          .backoff_min_ms = 10, .on_event = on_event, .on_error = note_error};
    pl_watch_stats stats;
    CHECK_EQ_INT(pl_watch_run(c, &wc, &stats, err_, sizeof err_), 0);
    pl_kube_client_free(c);
    CHECK(strcmp(events_, "ADDED p5@6;") == 0);
    CHECK(strcmp(reasons_, "InvalidResponse;EmptyWatch;") == 0);
    CHECK_EQ_INT(stats.errors, 2);
    CHECK_EQ_INT(stats.lists, 1);
    CHECK_EQ_INT(stats.watches, 3);
    CHECK_EQ_INT(requests(), 4);
    CHECK_STR_CONTAINS(S.log[2].target, "&resourceVersion=5");
    CHECK_STR_CONTAINS(S.log[3].target, "&resourceVersion=5");
}

static int error_count_;

static void failing_handler(int fd, const request *rq, int n)
{
    reply_status(fd, 503, "ServiceUnavailable", "etcd is down");
}

static void on_error(const pl_kube_status *st, void *user)
{
    if (++error_count_ == 6) atomic_store(&stop_, 1);
    if (st->http != 503) printf("    unexpected error: %ld %s\n", st->http, st->message);
}

static void test_back_off_and_stop(void)
{
    pl_kube_client *c = client_for(failing_handler);
    CHECK(c);
    atomic_store(&stop_, 0);
    error_count_ = 0;
    pl_kube_client_set_stop(c, &stop_);
    pl_watch_config wc = {.ref = {.version = "v1", .plural = "nodes"}, .backoff_min_ms = 40,
                          .backoff_max_ms = 160, .on_event = on_event, .on_error = on_error};
    pl_watch_config bad = wc;
    bad.ref.name = "x";
    CHECK_EQ_INT(pl_watch_run(c, &bad, NULL, err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, "must be a collection");
    pl_watch_stats stats;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ_INT(pl_watch_run(c, &wc, &stats, err_, sizeof err_), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pl_kube_client_free(c);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK_EQ_INT(stats.errors, 6);
    CHECK_EQ_INT(stats.lists, 0);
    CHECK_EQ_INT(requests(), 6); /* one list attempt per back-off: no busy loop */
    /* back-offs 40, 80, 160, 160, 160 ms less up to half each: at least 300 ms */
    if (ms < 300) printf("    %.0f ms\n", ms);
    CHECK(ms >= 300 && ms < 5000);
}

/* ---- against the API emulator: `test_kube_client --kubeconfig PATH` (run by
 * tests/cli/test_kube_client_emulator.py with tests/k8s/apiserver.py, TLS and a
 * token) ---- */

static const pl_kube_ref CM = {.version = "v1", .namespace_ = "default",
                               .plural = "configmaps", .name = "cm-1"};

/* An admin request of the emulator (/_emulator/...). */
static int emulator(pl_kube_client *c, const char *path, const char *json)
{
    pl_kube_status st;
    cJSON *body = json ? cJSON_Parse(json) : NULL;
    int rc = pl_kube_request(c, "POST", path, "application/json", body, NULL, &st);
    cJSON_Delete(body);
    if (rc) printf("    %s: %ld %s\n", path, st.http, st.message);
    return rc;
}

static int set_data(cJSON *obj, void *user, char *err, size_t errlen)
{
    mutate_state *m = user;
    m->calls++;
    cJSON *data = cJSON_GetObjectItem(obj, "data");
    cJSON_ReplaceItemInObject(data, "n", cJSON_CreateString("2"));
    return 0;
}

static void emu_crud_conflicts_events(void)
{
    pl_kube_client *c = client_new();
    CHECK(c);
    pl_kube_status st;
    pl_kube_ref coll = CM;
    coll.name = NULL;
    cJSON *cm = cJSON_Parse("{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":"
                            "{\"name\":\"cm-1\",\"labels\":{\"app\":\"kc\"}},"
                            "\"data\":{\"n\":\"0\"}}");
    cJSON *made = NULL, *got = NULL;
    int rc = pl_kube_create(c, &coll, cm, &made, &st);
    if (rc) printf("    create: %ld %s %s\n", st.http, st.reason, st.message);
    CHECK_EQ_INT(rc, 0);
    CHECK(pl_kube_field(made, "metadata.uid") && pl_kube_field(made, "metadata.resourceVersion"));
    CHECK_EQ_INT(pl_kube_create(c, &coll, cm, NULL, &st), -1);
    CHECK_EQ_INT(st.http, 409);
    CHECK(strcmp(st.reason, "AlreadyExists") == 0);
    cJSON_Delete(cm);

    /* a write with a stale resourceVersion: 409 Conflict */
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(made, "data"), "n", cJSON_CreateString("1"));
    CHECK_EQ_INT(pl_kube_replace(c, &CM, made, NULL, &st), 0);
    rc = pl_kube_replace(c, &CM, made, NULL, &st);
    cJSON_Delete(made);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.http, 409);
    CHECK(strcmp(st.reason, "Conflict") == 0);

    /* two injected conflicts: the update is reapplied to a fresh read */
    CHECK_EQ_INT(emulator(c, "/_emulator/faults",
                          "{\"status\":409,\"count\":2,\"method\":\"PUT\"}"), 0);
    mutate_state m = {0, 0};
    CHECK_EQ_INT(pl_kube_update_retry(c, &CM, 5, set_data, &m, &got, &st), 0);
    CHECK_EQ_INT(m.calls, 3);
    CHECK(strcmp(pl_kube_field(got, "data.n"), "2") == 0);
    cJSON_Delete(got);

    cJSON *patch = cJSON_Parse("{\"data\":{\"m\":\"x\"}}");
    CHECK_EQ_INT(pl_kube_patch(c, &CM, PL_KUBE_MERGE_PATCH, patch, &got, &st), 0);
    cJSON_Delete(patch);
    CHECK(strcmp(pl_kube_field(got, "data.m"), "x") == 0);
    cJSON_Delete(got);
    patch = cJSON_Parse("[{\"op\":\"replace\",\"path\":\"/data/n\",\"value\":\"3\"}]");
    CHECK_EQ_INT(pl_kube_patch(c, &CM, PL_KUBE_JSON_PATCH, patch, &got, &st), 0);
    cJSON_Delete(patch);
    CHECK(strcmp(pl_kube_field(got, "data.n"), "3") == 0);

    pl_kube_event ev = {.regarding = got, .reason = "Tested", .action = "Test",
                        .note = "from test_kube_client", .instance = "test"};
    rc = pl_kube_event_create(c, &ev, &st);
    cJSON_Delete(got);
    if (rc) printf("    event: %ld %s %s\n", st.http, st.reason, st.message);
    CHECK_EQ_INT(rc, 0);
    pl_kube_ref events = {.group = "events.k8s.io", .version = "v1", .namespace_ = "default",
                          .plural = "events"};
    CHECK_EQ_INT(pl_kube_get(c, &events, NULL, &got, &st), 0);
    int found = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(got, "items"))
        found += strcmp(pl_kube_field(e, "reason"), "Tested") == 0 &&
                 strcmp(pl_kube_field(e, "regarding.name"), "cm-1") == 0;
    cJSON_Delete(got);
    CHECK_EQ_INT(found, 1);

    /* a 503 with Retry-After: 1, as the API server sends it: waited out, then sent again */
    CHECK_EQ_INT(emulator(c, "/_emulator/faults", "{\"status\":503,\"count\":1}"), 0);
    const double t0 = pl_now_ms();
    CHECK_EQ_INT(pl_kube_get(c, &CM, NULL, NULL, &st), 0);
    CHECK(pl_now_ms() - t0 >= 900);
    CHECK_EQ_INT(pl_kube_delete(c, &CM, "Background", &st), 0);
    CHECK_EQ_INT(pl_kube_get(c, &CM, NULL, NULL, &st), -1);
    CHECK_EQ_INT(st.http, 404);
    CHECK(strcmp(st.reason, "NotFound") == 0);
    pl_kube_client_free(c);
}

static void emu_status_subresource(void)
{
    pl_kube_client *c = client_new();
    CHECK(c);
    pl_kube_status st;
    pl_kube_ref crds = {.group = "apiextensions.k8s.io", .version = "v1",
                        .plural = "customresourcedefinitions"};
    cJSON *crd = cJSON_Parse(
        "{\"apiVersion\":\"apiextensions.k8s.io/v1\",\"kind\":\"CustomResourceDefinition\","
        "\"metadata\":{\"name\":\"widgets.test.pliant.dev\"},"
        "\"spec\":{\"group\":\"test.pliant.dev\","
        "\"scope\":\"Namespaced\",\"names\":{\"kind\":\"Widget\",\"plural\":\"widgets\","
        "\"singular\":\"widget\",\"listKind\":\"WidgetList\"},\"versions\":[{\"name\":\"v1\","
        "\"served\":true,\"storage\":true,\"subresources\":{\"status\":{}},\"schema\":"
        "{\"openAPIV3Schema\":{\"type\":\"object\","
        "\"x-kubernetes-preserve-unknown-fields\":true}}}]}}");
    int rc = pl_kube_create(c, &crds, crd, NULL, &st);
    cJSON_Delete(crd);
    if (rc) printf("    CRD: %ld %s %s\n", st.http, st.reason, st.message);
    CHECK_EQ_INT(rc, 0);
    pl_kube_ref w = {.group = "test.pliant.dev", .version = "v1", .namespace_ = "default",
                     .plural = "widgets"};
    cJSON *obj = cJSON_Parse("{\"apiVersion\":\"test.pliant.dev/v1\",\"kind\":\"Widget\","
                             "\"metadata\":{\"name\":\"w\"},\"spec\":{\"size\":1}}");
    rc = pl_kube_create(c, &w, obj, NULL, &st);
    cJSON_Delete(obj);
    if (rc) printf("    create: %ld %s %s\n", st.http, st.reason, st.message);
    CHECK_EQ_INT(rc, 0);
    w.name = "w";
    cJSON *status = cJSON_Parse("{\"phase\":\"Running\",\"step\":7}");
    rc = pl_kube_patch_status(c, &w, status, &obj, &st);
    cJSON_Delete(status);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(pl_kube_field(obj, "status.phase"), "Running") == 0);
    const cJSON *gen = cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "metadata"), "generation");
    CHECK(cJSON_IsNumber(gen) && gen->valueint == 1); /* status writes leave generation */
    cJSON_Delete(obj);
    pl_kube_client_free(c);
}

/* A watch on its own thread and client, recording what it sees. */
static struct {
    pthread_mutex_t lock;
    char log[4096];
    int synced;
    pl_watch_stats stats;
} W;

static void emu_on_event(pl_watch_event ev, const cJSON *obj, const cJSON *old, void *user)
{
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED"};
    pthread_mutex_lock(&W.lock);
    size_t len = strlen(W.log);
    snprintf(W.log + len, sizeof W.log - len, "%s %s;", names[ev],
             pl_kube_field(obj, "metadata.name"));
    pthread_mutex_unlock(&W.lock);
}

static void emu_on_synced(void *user)
{
    pthread_mutex_lock(&W.lock);
    W.synced++;
    pthread_mutex_unlock(&W.lock);
}

static void *watch_thread(void *arg)
{
    pl_watch_config wc = {.ref = {.version = "v1", .namespace_ = "default",
                                  .plural = "configmaps"},
                          .label_selector = "app=watched", .timeout_seconds = 1,
                          .backoff_min_ms = 20, .on_event = emu_on_event,
                          .on_synced = emu_on_synced};
    pl_watch_run(arg, &wc, &W.stats, err_, sizeof err_);
    return NULL;
}

/* Waits up to 10 s for the watch log to contain want (or, want NULL, for synced ≥ n). */
static int wait_for(const char *want, int n)
{
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&W.lock);
        int done = want ? strstr(W.log, want) != NULL : W.synced >= n;
        pthread_mutex_unlock(&W.lock);
        if (done) return 1;
        sleep_ms(10);
    }
    pthread_mutex_lock(&W.lock);
    printf("    waited for %s; log: %s\n", want ? want : "a list", W.log);
    pthread_mutex_unlock(&W.lock);
    return 0;
}

static int make_cm(pl_kube_client *c, const char *name, const char *app)
{
    char text[256];
    snprintf(text, sizeof text, "{\"metadata\":{\"name\":\"%s\",\"labels\":{\"app\":\"%s\"}}}",
             name, app);
    pl_kube_ref coll = CM;
    coll.name = NULL;
    pl_kube_status st;
    cJSON *obj = cJSON_Parse(text);
    int rc = pl_kube_create(c, &coll, obj, NULL, &st);
    cJSON_Delete(obj);
    return rc;
}

static void emu_watch(void)
{
    pl_kube_client *c = client_new(), *wc = client_new();
    CHECK(c && wc);
    atomic_store(&stop_, 0);
    pl_kube_client_set_stop(wc, &stop_);
    pthread_mutex_init(&W.lock, NULL);
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, watch_thread, wc), 0);
    int ok = wait_for(NULL, 1) && make_cm(c, "w-1", "watched") == 0 &&
             make_cm(c, "other", "ignored") == 0 && wait_for("ADDED w-1;", 0);
    pl_kube_status st;
    pl_kube_ref r = CM;
    r.name = "w-1";
    cJSON *patch = cJSON_Parse("{\"data\":{\"k\":\"v\"}}");
    ok = ok && pl_kube_patch(c, &r, PL_KUBE_MERGE_PATCH, patch, NULL, &st) == 0 &&
         wait_for("MODIFIED w-1;", 0) && pl_kube_delete(c, &r, NULL, &st) == 0 &&
         wait_for("DELETED w-1;", 0) && make_cm(c, "w-2", "watched") == 0 &&
         wait_for("ADDED w-2;", 0);
    cJSON_Delete(patch);
    /* compaction ends the watch with 410: a re-list, then events again */
    ok = ok && emulator(c, "/_emulator/compact?endWatches=true", NULL) == 0 &&
         wait_for(NULL, 2) && make_cm(c, "w-3", "watched") == 0 && wait_for("ADDED w-3;", 0);
    sleep_ms(2500); /* a watch expires (timeoutSeconds) and bookmarks arrive */
    atomic_store(&stop_, 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_join(t, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pl_kube_client_free(wc);
    pl_kube_client_free(c);
    pthread_mutex_destroy(&W.lock);
    CHECK(ok);
    CHECK(!strstr(W.log, "other"));
    const char *w2 = strstr(W.log, "ADDED w-2;");
    CHECK(w2 && !strstr(w2 + 10, "w-2")); /* the re-list did not repeat it */
    CHECK(W.stats.relists_gone >= 1);
    CHECK(W.stats.lists >= 2);
    CHECK(W.stats.bookmarks >= 1);
    CHECK(W.stats.watches >= 3); /* the first, after the re-list, after expiry */
    CHECK(t1.tv_sec - t0.tv_sec < 5); /* stopped promptly */
}

static int emulator_main(const char *kubeconfig)
{
    int failures_ = 0;
    if (pl_kube_config_load_file(&cfg_, kubeconfig, NULL, err_, sizeof err_)) {
        printf("FAIL emulator_setup: %s\n", err_);
        return 1;
    }
    RUN(emu_crud_conflicts_events);
    RUN(emu_status_subresource);
    RUN(emu_watch);
    pl_kube_config_free(&cfg_);
    return failures_ ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--kubeconfig") == 0) return emulator_main(argv[2]);
    int failures_ = 0;
    snprintf(dir, sizeof dir, "/tmp/pliant_kcli_XXXXXX");
    if (!mkdtemp(dir) || server_start() || config_for(&cfg_, S.port)) {
        printf("FAIL setup: cannot start the test server or write its config\n");
        return 1;
    }
    RUN(test_paths);
    RUN(test_get_keepalive_and_token_rotation);
    RUN(test_status_errors_and_timeouts);
    RUN(test_retry_after);
    RUN(test_update_retries_on_conflict);
    RUN(test_patch_delete_and_events);
    RUN(test_list_watch_relist);
    RUN(test_watch_resumes_after_broken_streams);
    RUN(test_back_off_and_stop);
    server_stop();
    pl_kube_config_free(&cfg_);
    rm_rf(dir);
    return failures_ ? 1 : 0;
}
