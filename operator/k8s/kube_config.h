/* Where the Kubernetes API is and how to authenticate to it: a kubeconfig file
 * (parsed with libyaml through yaml_tree.h) or the in-cluster service account.
 *
 * Kubeconfig: the context named by the caller or by current-context; from its
 * cluster `server`, `certificate-authority` or `certificate-authority-data`,
 * `insecure-skip-tls-verify`; from its user `token` or `tokenFile`,
 * `client-certificate(-data)` with `client-key(-data)`; its `namespace`.
 * Relative file paths are relative to the kubeconfig's directory; *-data fields
 * are base64 and decoded here. `exec`, `auth-provider` and basic auth are not
 * supported (an error that names the field).
 *
 * In-cluster: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the
 * CA bundle ca.crt, the token file token and the namespace file namespace of
 * the service-account directory.
 *
 * A token file is re-read whenever it changes (device, inode, size or mtime),
 * since Kubernetes rotates projected service-account tokens. pl_kube_config_token
 * may be called from several threads; everything else reads immutable fields. */
#ifndef PLIANT_KUBE_CONFIG_H
#define PLIANT_KUBE_CONFIG_H

#include <pthread.h>
#include <stddef.h>
#include <sys/stat.h>

#define PL_KUBE_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

typedef struct {
    char *data;  /* PEM text decoded from a *-data field, or NULL */
    size_t len;
} pl_kube_blob;

typedef struct {
    char *server;       /* "https://host:port" (no trailing slash) */
    char *ca_file;      /* CA bundle path, or NULL */
    pl_kube_blob ca;    /* CA bundle bytes (certificate-authority-data) */
    int insecure;       /* insecure-skip-tls-verify */
    char *cert_file;    /* client certificate path, or NULL */
    pl_kube_blob cert;  /* client certificate bytes */
    char *key_file;     /* client key path, or NULL */
    pl_kube_blob key;   /* client key bytes */
    char *namespace_;   /* default namespace: "default" when none is given */
    char *token_file;   /* bearer token file, re-read on change; or NULL */
    /* private: the bearer token and, for token_file, what it was read from */
    char *token_;
    struct stat token_stat_;
    pthread_mutex_t lock_;
    int has_lock_;
} pl_kube_config;

/* Loads path's context (NULL: its current-context). −1 with err naming the
 * file and the field ("kubeconfig K: users[0].user.client-key-data: invalid
 * base64"). On error *c is left freed. */
int pl_kube_config_load_file(pl_kube_config *c, const char *path, const char *context,
                             char *err, size_t errlen);

/* The in-cluster configuration; sa_dir NULL means PL_KUBE_SA_DIR (tests give
 * a temporary directory). −1 with err when a variable or file is missing. */
int pl_kube_config_in_cluster(pl_kube_config *c, const char *sa_dir, char *err, size_t errlen);

/* What client-go and kubectl would use: path (the --kubeconfig flag) if
 * given, else the first file of $KUBECONFIG, else the in-cluster service
 * account when $KUBERNETES_SERVICE_HOST is set, else ~/.kube/config. */
int pl_kube_config_load_default(pl_kube_config *c, const char *path, char *err, size_t errlen);

/* The current bearer token as a heap copy the caller frees; *token is NULL
 * when the user has none. Re-reads token_file if it changed. −1 with err
 * (the file's path and reason) when it cannot be read. Thread-safe. */
int pl_kube_config_token(pl_kube_config *c, char **token, char *err, size_t errlen);

/* Frees every field; twice is harmless. */
void pl_kube_config_free(pl_kube_config *c);

#endif
