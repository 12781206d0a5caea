/* Fuzz target: control messages (shared/protocol.c pl_msg_decode) from the bytes
 * a WebSocket frame carries. Decoding must never crash or leak, and must name
 * the reason of every refusal. */
#include "fuzz.h"
#include "protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pl_msg m;
    char err[512] = "";
    if (pl_msg_decode((const char *)data, size, &m, err, sizeof err) == 0) {
        FUZZ_CHECK(m.type > PL_MSG_NONE && m.type < PL_MSG_COUNT);
        pl_msg_free(&m);
    } else {
        FUZZ_CHECK(err[0]);
    }
    return 0;
}
