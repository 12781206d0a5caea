/* Fuzz target: the control protocol's round trip (shared/protocol.c). Whatever
 * pl_msg_decode accepts, pl_msg_encode encodes; that text decodes again and encodes
 * to the same text; and a copy (pl_msg_dup) encodes to it too. */
#include "fuzz.h"
#include "protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pl_msg m, again, copy;
    char err[512];
    if (pl_msg_decode((const char *)data, size, &m, err, sizeof err)) return 0;
    char *text = pl_msg_encode_err(&m, err, sizeof err);
    if (!text) fprintf(stderr, "decoded but not encodable: %s\n", err);
    FUZZ_CHECK(text);
    int rc = pl_msg_decode(text, strlen(text), &again, err, sizeof err);
    if (rc) fprintf(stderr, "encoded %s\nbut not decodable: %s\n", text, err);
    FUZZ_CHECK(rc == 0);
    char *text2 = pl_msg_encode(&again);
    FUZZ_CHECK(text2);
    if (strcmp(text, text2)) fprintf(stderr, "first:  %s\nsecond: %s\n", text, text2);
    FUZZ_CHECK(!strcmp(text, text2));
    FUZZ_CHECK(pl_msg_dup(&m, &copy) == 0);
    pl_msg_free(&m);
    char *text3 = pl_msg_encode(&copy);
    FUZZ_CHECK(text3 && !strcmp(text, text3));
    free(text);
    free(text2);
    free(text3);
    pl_msg_free(&again);
    pl_msg_free(&copy);
    return 0;
}
