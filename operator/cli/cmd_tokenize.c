/* `pliant tokenize --bytes INPUT.txt OUTPUT_PREFIX`: byte-level llm.c shards
 * OUTPUT_PREFIX_train.bin (first 90%) and OUTPUT_PREFIX_val.bin (last 10%). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tokens.h"

int cmd_tokenize(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--help")) {
        printf("usage: pliant tokenize --bytes INPUT.txt OUTPUT_PREFIX\n");
        return 0;
    }
    if (argc != 4 || strcmp(argv[1], "--bytes")) {
        fprintf(stderr, "pliant tokenize: usage: pliant tokenize --bytes INPUT.txt OUTPUT_PREFIX "
                        "(only byte-level tokenization is built in)\n");
        return 2;
    }
    char err[1024];
    if (pl_tokenize_bytes(argv[2], argv[3], err, sizeof err)) {
        fprintf(stderr, "pliant tokenize: %s\n", err);
        return 1;
    }
    printf("wrote %s_train.bin and %s_val.bin\n", argv[3], argv[3]);
    return 0;
}
