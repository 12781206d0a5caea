/* Frame protection with an OpenSSL AEAD and a counter nonce: see aead.h. */
#include "aead.h"
#include "tcp.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#define NONCE_BYTES 12
#define PIECE ((size_t)1 << 30) /* EVP takes int lengths */

int pl_aead_cpu_has_aes(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
#elif defined(__aarch64__) && defined(HWCAP_AES) && defined(HWCAP_PMULL)
    const unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_AES) && (hw & HWCAP_PMULL);
#else
    return 0;
#endif
}

int pl_aead_init(pl_aead *a, int cipher, int encrypt, int sealing,
                 const unsigned char key[PL_AEAD_KEY_BYTES])
{
    memset(a, 0, sizeof *a);
    const EVP_CIPHER *c = cipher == PL_CIPHER_AES_256_GCM          ? EVP_aes_256_gcm()
                          : cipher == PL_CIPHER_CHACHA20_POLY1305 ? EVP_chacha20_poly1305()
                                                                    : NULL;
    EVP_CIPHER_CTX *ctx = c ? EVP_CIPHER_CTX_new() : NULL;
    if (!ctx) return -1;
    const int ok = EVP_CipherInit_ex(ctx, c, NULL, NULL, NULL, sealing) == 1 &&
                   EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, NONCE_BYTES, NULL) == 1 &&
                   EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, sealing) == 1;
    if (!ok) {
        EVP_CIPHER_CTX_free(ctx);
        return -1;
    }
    a->ctx = ctx;
    a->encrypt = encrypt != 0;
    a->sealing = sealing != 0;
    return 0;
}

void pl_aead_free(pl_aead *a)
{
    if (!a) return;
    EVP_CIPHER_CTX_free(a->ctx); /* clears the key schedule */
    memset(a, 0, sizeof *a);
}

int pl_aead_begin(pl_aead *a, const unsigned char hdr[PL_AEAD_AAD_BYTES])
{
    unsigned char nonce[NONCE_BYTES] = {0};
    uint64_t n = a->counter++;
    for (int i = 0; i < 8; i++) nonce[i] = (unsigned char)(n >> (8 * i));
    int outl = 0;
    if (EVP_CipherInit_ex(a->ctx, NULL, NULL, NULL, nonce, a->sealing) != 1 ||
        EVP_CipherUpdate(a->ctx, NULL, &outl, hdr, PL_AEAD_AAD_BYTES) != 1)
        return -1;
    return 0;
}

int pl_aead_update(pl_aead *a, const void *in, void *out, size_t len)
{
    const unsigned char *p = in;
    unsigned char *q = out;
    while (len > 0) {
        const int n = (int)(len < PIECE ? len : PIECE);
        int outl = 0;
        if (EVP_CipherUpdate(a->ctx, a->encrypt ? q : NULL, &outl, p, n) != 1) return -1;
        if (a->encrypt && outl != n) return -1; /* the AEADs here are stream ciphers */
        p += n;
        if (a->encrypt) q += n;
        len -= (size_t)n;
    }
    return 0;
}

int pl_aead_seal_final(pl_aead *a, unsigned char tag[PL_AEAD_TAG_BYTES])
{
    unsigned char end[32];
    int outl = 0;
    if (EVP_CipherFinal_ex(a->ctx, end, &outl) != 1 || outl != 0) return -1;
    return EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, PL_AEAD_TAG_BYTES, tag) == 1 ? 0
                                                                                          : -1;
}

int pl_aead_open_final(pl_aead *a, const unsigned char tag[PL_AEAD_TAG_BYTES])
{
    unsigned char t[PL_AEAD_TAG_BYTES], end[32];
    memcpy(t, tag, sizeof t);
    int outl = 0;
    if (EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_TAG, PL_AEAD_TAG_BYTES, t) != 1) return -1;
    return EVP_CipherFinal_ex(a->ctx, end, &outl) == 1 && outl == 0 ? 0 : -1;
}

int pl_aead_seal(pl_aead *a, const unsigned char hdr[PL_AEAD_AAD_BYTES], const void *in,
                 void *out, size_t len, unsigned char tag[PL_AEAD_TAG_BYTES])
{
    if (pl_aead_begin(a, hdr) || pl_aead_update(a, in, out, len)) return -1;
    return pl_aead_seal_final(a, tag);
}

int pl_aead_seal_written(pl_aead *a, const unsigned char *payload, size_t len, size_t before,
                         size_t after, unsigned char tag[PL_AEAD_TAG_BYTES])
{
    const size_t from = before > PL_AEAD_AAD_BYTES ? before - PL_AEAD_AAD_BYTES : 0;
    const size_t to = after > PL_AEAD_AAD_BYTES ? after - PL_AEAD_AAD_BYTES : 0;
    if (to > from && pl_aead_update(a, payload + from, NULL, (to < len ? to : len) - from))
        return -1;
    if (after < PL_AEAD_AAD_BYTES + len) return 0;
    return pl_aead_seal_final(a, tag) ? -1 : 1;
}
