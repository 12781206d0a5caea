/* Kubeconfig parsing (contexts, relative paths, base64 data fields, errors
 * that name the field), the in-cluster service account from a temporary
 * directory, the default search order and token rotation. */
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "kube_config.h"
#include "tmpfiles.h"

#define CLUSTER(body) "clusters:\n- name: c\n  cluster:\n" body
#define CONTEXT(body) "contexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\n" body
#define USER(body) "users:\n- name: u\n  user:\n" body
#define SERVER "    server: https://k8s.example:6443\n"

static char err_[1024];

static int write_text(const char *name, const char *text)
{
    return write_raw(path_in(name), text, strlen(text));
}

/* Loads text as DIR/name; the error (or "(loaded)") for checks. */
static const char *load_fails(const char *text)
{
    pl_kube_config c;
    err_[0] = '\0';
    if (write_text("bad.yaml", text)) return "(cannot write)";
    if (pl_kube_config_load_file(&c, path_in("bad.yaml"), NULL, err_, sizeof err_) == 0) {
        pl_kube_config_free(&c);
        return "(loaded without error)";
    }
    if (c.server || c.token_ || c.has_lock_) return "(error left fields set)";
    return err_;
}

static void test_token_and_relative_ca(void)
{
    const char *text = "apiVersion: v1\nkind: Config\ncurrent-context: second\n"
                       "clusters:\n"
                       "- name: other\n  cluster: {server: 'https://other:1'}\n"
                       "- name: c\n  cluster:\n    server: https://k8s.example:6443//\n"
                       "    certificate-authority: certs/ca.crt\n"
                       "contexts:\n"
                       "- name: first\n  context: {cluster: other, user: nobody}\n"
                       "- name: second\n  context: {cluster: c, user: u, namespace: 123}\n"
                       "users:\n- name: u\n  user:\n    token: abc.def\n";
    CHECK_EQ_INT(write_text("config", text), 0);
    pl_kube_config c;
    int rc = pl_kube_config_load_file(&c, path_in("config"), NULL, err_, sizeof err_);
    if (rc) printf("    %s\n", err_);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(c.server, "https://k8s.example:6443") == 0);
    CHECK(strcmp(c.ca_file, path_in("certs/ca.crt")) == 0);
    CHECK(c.ca.data == NULL && !c.insecure && !c.cert_file && !c.key_file);
    CHECK(strcmp(c.namespace_, "123") == 0);
    CHECK(c.token_file == NULL);
    char *tok;
    CHECK_EQ_INT(pl_kube_config_token(&c, &tok, err_, sizeof err_), 0);
    CHECK(tok && strcmp(tok, "abc.def") == 0);
    free(tok);
    pl_kube_config_free(&c);
    pl_kube_config_free(&c); /* twice is harmless */
}

static void test_data_fields(void)
{
    /* "abc", "hello" (one '='), "a" (two '='), "abcdef" folded over lines */
    const char *text = "current-context: ctx\n"
        CLUSTER(SERVER "    certificate-authority-data: YWJj\n") CONTEXT("")
        USER("    client-certificate-data: aGVsbG8=\n    client-key-data: YQ==\n");
    CHECK_EQ_INT(write_text("data.yaml", text), 0);
    pl_kube_config c;
    CHECK_EQ_INT(pl_kube_config_load_file(&c, path_in("data.yaml"), NULL, err_, sizeof err_), 0);
    CHECK(c.ca.len == 3 && memcmp(c.ca.data, "abc", 3) == 0);
    CHECK(c.cert.len == 5 && memcmp(c.cert.data, "hello", 5) == 0);
    CHECK(c.key.len == 1 && c.key.data[0] == 'a');
    CHECK(strcmp(c.namespace_, "default") == 0);
    char *tok;
    CHECK_EQ_INT(pl_kube_config_token(&c, &tok, err_, sizeof err_), 0);
    CHECK(tok == NULL);
    pl_kube_config_free(&c);

    text = "current-context: ctx\n" CLUSTER(SERVER "    certificate-authority-data: >-\n"
                                                   "      YWJj\n      ZGVm\n") CONTEXT("")
        USER("    token: x\n");
    CHECK_EQ_INT(write_text("fold.yaml", text), 0);
    CHECK_EQ_INT(pl_kube_config_load_file(&c, path_in("fold.yaml"), NULL, err_, sizeof err_), 0);
    CHECK(c.ca.len == 6 && memcmp(c.ca.data, "abcdef", 6) == 0);
    pl_kube_config_free(&c);
}

static void test_context_override_and_token_file(void)
{
    CHECK_EQ_INT(write_text("tok", "file-token\n"), 0);
    const char *text = "current-context: ctx\n"
                       "clusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:8080/',"
                       " insecure-skip-tls-verify: true}\n"
                       "contexts:\n- name: ctx\n  context: {cluster: missing}\n"
                       "- name: dev\n  context: {cluster: c, user: u, namespace: ml}\n"
                       "users:\n- name: u\n  user: {tokenFile: tok, client-certificate: a.crt,"
                       " client-key: /abs/a.key}\n";
    CHECK_EQ_INT(write_text("ctx.yaml", text), 0);
    pl_kube_config c;
    int rc = pl_kube_config_load_file(&c, path_in("ctx.yaml"), "dev", err_, sizeof err_);
    if (rc) printf("    %s\n", err_);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(c.server, "http://127.0.0.1:8080") == 0);
    CHECK(c.insecure == 1);
    CHECK(strcmp(c.namespace_, "ml") == 0);
    CHECK(strcmp(c.token_file, path_in("tok")) == 0);
    CHECK(strcmp(c.cert_file, path_in("a.crt")) == 0);
    CHECK(strcmp(c.key_file, "/abs/a.key") == 0);
    char *tok;
    CHECK_EQ_INT(pl_kube_config_token(&c, &tok, err_, sizeof err_), 0);
    CHECK(tok && strcmp(tok, "file-token") == 0); /* trailing newline dropped */
    free(tok);
    pl_kube_config_free(&c);
}

static void test_errors_name_the_field(void)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {CLUSTER(SERVER) CONTEXT(""), "current-context: missing"},
        {"current-context: nope\n" CLUSTER(SERVER) CONTEXT(""),
         "current-context: no entry named \"nope\" in contexts"},
        {"current-context: ctx\nclusters:\n- name: c2\n  cluster: {server: 'https://a'}\n"
         CONTEXT(""), "contexts[0].context.cluster: no entry named \"c\" in clusters"},
        {"current-context: ctx\n" CLUSTER(SERVER) CONTEXT(""),
         "contexts[0].context.user: no entry named \"u\" in users"},
        {"current-context: ctx\n" CLUSTER("    insecure-skip-tls-verify: true\n") CONTEXT(""),
         "clusters[0].cluster.server: missing"},
        {"current-context: ctx\n" CLUSTER("    server: k8s:6443\n") CONTEXT(""),
         "clusters[0].cluster.server: \"k8s:6443\" must start with https:// or http://"},
        {"current-context: ctx\n" CLUSTER("    server: https://\n") CONTEXT(""),
         "clusters[0].cluster.server: \"https://\" names no host"},
        {"current-context: ctx\n" CLUSTER(SERVER "    insecure-skip-tls-verify: 'yes'\n")
         CONTEXT(""),
         "clusters[0].cluster.insecure-skip-tls-verify: must be a boolean, not a string"},
        {"current-context: ctx\n" CLUSTER(SERVER "    certificate-authority: a\n"
                                          "    certificate-authority-data: YWJj\n") CONTEXT(""),
         "clusters[0].cluster.certificate-authority: both it and certificate-authority-data"},
        {"current-context: ctx\n" CLUSTER(SERVER) CONTEXT("")
         USER("    client-certificate-data: YWJj\n    client-key-data: 'Y$=='\n"),
         "users[0].user.client-key-data: invalid base64"},
        {"current-context: ctx\n" CLUSTER(SERVER) CONTEXT("") USER("    client-key-data: Y\n"),
         "users[0].user.client-key-data: invalid base64"},
        {"current-context: ctx\n" CLUSTER(SERVER) CONTEXT("") USER("    client-certificate: a\n"),
         "users[0].user.client-key: missing (a client certificate needs its key)"},
        {"current-context: ctx\n" CLUSTER(SERVER) CONTEXT("") USER("    exec: {command: aws}\n"),
         "users[0].user.exec: not supported"},
        {"current-context: ctx\n" CLUSTER(SERVER) CONTEXT("") USER("    token: [a]\n"),
         "users[0].user.token: must be a string, not a list"},
        {"current-context: ctx\nclusters: {c: 1}\n" CONTEXT(""), "clusters: must be a list"},
        {"current-context: ctx\nclusters:\n- name: c\n  cluster: 7\n" CONTEXT(""),
         "clusters[0].cluster: must be a mapping"},
        {"- a\n- b\n", "(top level): must be a mapping"},
        {"current-context: [\n", "line"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = load_fails(cases[i].text);
        CHECK_STR_CONTAINS(got, cases[i].want);
        CHECK_STR_CONTAINS(got, path_in("bad.yaml")); /* every message names the file */
    }
    const char *missing = "current-context: ctx\n" CLUSTER(SERVER) CONTEXT("")
        USER("    tokenFile: no-such-token\n");
    const char *got = load_fails(missing);
    CHECK_STR_CONTAINS(got, "users[0].user.tokenFile: ");
    CHECK_STR_CONTAINS(got, path_in("no-such-token"));
    CHECK_STR_CONTAINS(got, "No such file");

    pl_kube_config c;
    CHECK_EQ_INT(pl_kube_config_load_file(&c, path_in("absent"), NULL, err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, "kubeconfig ");
    CHECK_STR_CONTAINS(err_, "absent: No such file");
}

/* A service-account directory in DIR/sa with the given files (NULL: absent). */
static void make_sa(const char *token, const char *ca, const char *ns)
{
    rm_rf(path_in("sa"));
    mkdir(path_in("sa"), 0700);
    if (token) write_text("sa/token", token);
    if (ca) write_text("sa/ca.crt", ca);
    if (ns) write_text("sa/namespace", ns);
}

static void test_in_cluster(void)
{
    pl_kube_config c;
    make_sa("sa-token", "PEM", "training\n");
    unsetenv("KUBERNETES_SERVICE_HOST");
    CHECK_EQ_INT(pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, "KUBERNETES_SERVICE_HOST");

    setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    int rc = pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_);
    if (rc) printf("    %s\n", err_);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(c.server, "https://10.96.0.1:443") == 0);
    CHECK(strcmp(c.ca_file, path_in("sa/ca.crt")) == 0);
    CHECK(strcmp(c.token_file, path_in("sa/token")) == 0);
    CHECK(strcmp(c.namespace_, "training") == 0);
    pl_kube_config_free(&c);

    setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
    make_sa("sa-token", "PEM", NULL);
    CHECK_EQ_INT(pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_), 0);
    CHECK(strcmp(c.server, "https://[fd00::1]:443") == 0);
    CHECK(strcmp(c.namespace_, "default") == 0);
    pl_kube_config_free(&c);

    make_sa(NULL, "PEM", NULL);
    CHECK_EQ_INT(pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, path_in("sa/token"));
    make_sa("t", NULL, NULL);
    CHECK_EQ_INT(pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, path_in("sa/ca.crt"));
    make_sa("\n", "PEM", NULL);
    CHECK_EQ_INT(pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, "empty token");
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
}

static int token_is(pl_kube_config *c, const char *want)
{
    char *tok;
    if (pl_kube_config_token(c, &tok, err_, sizeof err_)) return 0;
    int same = tok && strcmp(tok, want) == 0;
    if (!same) printf("    token \"%s\", expected \"%s\"\n", tok ? tok : "(none)", want);
    free(tok);
    return same;
}

static void test_token_rotation(void)
{
    pl_kube_config c;
    make_sa("first", "PEM", NULL);
    setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
    CHECK_EQ_INT(pl_kube_config_in_cluster(&c, path_in("sa"), err_, sizeof err_), 0);
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
    CHECK(token_is(&c, "first"));
    /* kubelet's way: a new file renamed over the old one */
    CHECK_EQ_INT(write_text("sa/token.new", "second-token"), 0);
    CHECK_EQ_INT(rename(path_in("sa/token.new"), path_in("sa/token")), 0);
    CHECK(token_is(&c, "second-token"));
    CHECK_EQ_INT(count_entries(path_in("sa"), "token"), 1);
    /* rewritten in place, another size */
    CHECK_EQ_INT(write_text("sa/token", "third"), 0);
    CHECK(token_is(&c, "third"));
    /* briefly missing mid-swap: the last token is kept */
    CHECK_EQ_INT(unlink(path_in("sa/token")), 0);
    CHECK(token_is(&c, "third"));
    CHECK_EQ_INT(write_text("sa/token", "fourth"), 0);
    CHECK(token_is(&c, "fourth"));
    pl_kube_config_free(&c);
}

static void test_default_search_order(void)
{
    const char *text = "current-context: ctx\n" CLUSTER(SERVER) CONTEXT("") USER("    token: t\n");
    CHECK_EQ_INT(write_text("env.yaml", text), 0);
    char list[256];
    snprintf(list, sizeof list, "%s:/elsewhere/config", path_in("env.yaml"));
    setenv("KUBECONFIG", list, 1);
    pl_kube_config c;
    int rc = pl_kube_config_load_default(&c, NULL, err_, sizeof err_);
    if (rc) printf("    %s\n", err_);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(c.server, "https://k8s.example:6443") == 0);
    pl_kube_config_free(&c);
    /* an explicit path wins */
    CHECK_EQ_INT(pl_kube_config_load_default(&c, path_in("absent"), err_, sizeof err_), -1);
    CHECK_STR_CONTAINS(err_, path_in("absent"));
    unsetenv("KUBECONFIG");
    /* then the in-cluster account, then ~/.kube/config */
    setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    rc = pl_kube_config_load_default(&c, NULL, err_, sizeof err_);
    if (rc == 0) pl_kube_config_free(&c); /* a real service account on this machine */
    else CHECK_STR_CONTAINS(err_, PL_KUBE_SA_DIR);
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
    const char *home = getenv("HOME");
    char saved[512];
    snprintf(saved, sizeof saved, "%s", home ? home : "");
    mkdir(path_in(".kube"), 0700);
    CHECK_EQ_INT(write_text(".kube/config", text), 0);
    setenv("HOME", dir, 1);
    rc = pl_kube_config_load_default(&c, NULL, err_, sizeof err_);
    if (home) setenv("HOME", saved, 1);
    else unsetenv("HOME");
    CHECK_EQ_INT(rc, 0);
    CHECK(token_is(&c, "t"));
    pl_kube_config_free(&c);
}

TEST_MAIN_BEGIN
snprintf(dir, sizeof dir, "/tmp/pliant_kcfg_XXXXXX");
if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
}
RUN(test_token_and_relative_ca);
RUN(test_data_fields);
RUN(test_context_override_and_token_file);
RUN(test_errors_name_the_field);
RUN(test_in_cluster);
RUN(test_token_rotation);
RUN(test_default_search_order);
rm_rf(dir);
TEST_MAIN_END
