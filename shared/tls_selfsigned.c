/* Self-signed certificates, fingerprints and token proofs (see tls_selfsigned.h). */
#include "tls_selfsigned.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static void hex_encode(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

int pl_random_hex(char *out, size_t nbytes)
{
    unsigned char buf[256];
    if (nbytes == 0 || nbytes > sizeof buf || RAND_bytes(buf, (int)nbytes) != 1)
        return -1;
    hex_encode(buf, nbytes, out);
    OPENSSL_cleanse(buf, sizeof buf);
    return 0;
}

int pl_token_proof(const void *token, size_t token_len, const char *nonce_hex, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    static const unsigned char empty = 0;
    if (!nonce_hex || token_len > (size_t)0x7fffffff)
        return -1;
    if (!HMAC(EVP_sha256(), token_len ? token : &empty, (int)token_len,
              (const unsigned char *)nonce_hex, strlen(nonce_hex), md, &mdlen) ||
        mdlen != 32)
        return -1;
    hex_encode(md, 32, out);
    return 0;
}

static int x509_fingerprint(X509 *x, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (X509_digest(x, EVP_sha256(), md, &n) != 1 || n != 32)
        return -1;
    hex_encode(md, 32, out);
    return 0;
}

int pl_tls_cert_fingerprint(const char *cert_path, char out[65], char *err, size_t errlen)
{
    FILE *f = fopen(cert_path, "r");
    if (!f)
        return pl_errf(err, errlen, "%s: %s", cert_path, strerror(errno));
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!x)
        return pl_errf(err, errlen, "%s: no PEM certificate", cert_path);
    int rc = x509_fingerprint(x, out);
    X509_free(x);
    if (rc)
        return pl_errf(err, errlen, "%s: cannot digest the certificate", cert_path);
    return 0;
}

static int add_ext(X509 *x, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    X509_EXTENSION *ex = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ex)
        return -1;
    int ok = X509_add_ext(x, ex, -1);
    X509_EXTENSION_free(ex);
    return ok == 1 ? 0 : -1;
}

static int host_ok(const char *h)
{
    size_t n = strlen(h);
    if (n == 0 || n > 253)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == ':'))
            return 0;
    }
    return 1;
}

static int write_pem(const char *path, int mode, EVP_PKEY *key, X509 *x)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return -1;
    }
    int ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
                 : PEM_write_X509(f, x);
    if (fclose(f) != 0)
        ok = 0;
    return ok == 1 ? 0 : -1;
}

int pl_tls_selfsigned_create(pl_tls_selfsigned *out, const char *host, int days,
                             const char *tmpdir, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (days <= 0)
        days = 365;
    if (host && *host && !host_ok(host))
        return pl_errf(err, errlen, "tls: bad host name for the certificate");
    if (!tmpdir || !*tmpdir)
        tmpdir = getenv("TMPDIR");
    if (!tmpdir || !*tmpdir)
        tmpdir = "/tmp";

    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    int rc = -1;
    if (!key || !x) {
        pl_errf(err, errlen, "tls: key generation failed");
        goto done;
    }
    unsigned char serial[16];
    if (RAND_bytes(serial, sizeof serial) != 1) {
        pl_errf(err, errlen, "tls: no random bytes");
        goto done;
    }
    serial[0] &= 0x7f;
    BIGNUM *bn = BN_bin2bn(serial, sizeof serial, NULL);
    ASN1_INTEGER *sn = bn ? BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) : NULL;
    BN_free(bn);
    X509_NAME *name = X509_get_subject_name(x);
    char san[400];
    int pos = snprintf(san, sizeof san, "DNS:localhost,IP:127.0.0.1,IP:::1");
    if (host && *host) {
        int is_ip = strspn(host, "0123456789.") == strlen(host) || strchr(host, ':');
        snprintf(san + pos, sizeof san - (size_t)pos, ",%s:%s", is_ip ? "IP" : "DNS", host);
    }
    if (!sn || X509_set_version(x, 2) != 1 ||
        !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), (long)days * 86400) ||
        X509_set_pubkey(x, key) != 1 ||
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   (const unsigned char *)"pliant-coordinator", -1, -1,
                                   0) != 1 ||
        X509_set_issuer_name(x, name) != 1 ||
        add_ext(x, NID_basic_constraints, "critical,CA:TRUE") ||
        add_ext(x, NID_key_usage, "critical,digitalSignature,keyCertSign") ||
        add_ext(x, NID_ext_key_usage, "serverAuth") ||
        add_ext(x, NID_subject_key_identifier, "hash") ||
        add_ext(x, NID_subject_alt_name, san) ||
        X509_sign(x, key, EVP_sha256()) <= 0 || x509_fingerprint(x, out->fingerprint)) {
        pl_errf(err, errlen, "tls: cannot build the certificate");
        goto done;
    }
    if (pl_pathf(out->dir, sizeof out->dir, err, errlen, "%s/pliant-tls-XXXXXX", tmpdir) ||
        pl_pathf(out->cert_path, sizeof out->cert_path, err, errlen, "%s/cert.pem", out->dir) ||
        pl_pathf(out->key_path, sizeof out->key_path, err, errlen, "%s/key.pem", out->dir))
        goto done;
    if (!mkdtemp(out->dir)) {
        pl_errf(err, errlen, "tls: mkdtemp %s: %s", out->dir, strerror(errno));
        out->dir[0] = '\0';
        goto done;
    }
    /* mkdtemp replaced the X's in place (same length): copy them into the file paths. */
    memcpy(out->cert_path, out->dir, strlen(out->dir));
    memcpy(out->key_path, out->dir, strlen(out->dir));
    if (write_pem(out->key_path, 0600, key, NULL) || write_pem(out->cert_path, 0644, NULL, x)) {
        pl_errf(err, errlen, "tls: cannot write into %s: %s", out->dir, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    ERR_clear_error();
    X509_free(x);
    EVP_PKEY_free(key);
    if (rc) {
        pl_tls_selfsigned_remove(out);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

void pl_tls_selfsigned_remove(pl_tls_selfsigned *t)
{
    if (!t || !t->dir[0])
        return;
    if (t->cert_path[0])
        unlink(t->cert_path);
    if (t->key_path[0])
        unlink(t->key_path);
    rmdir(t->dir);
    t->dir[0] = '\0';
}
