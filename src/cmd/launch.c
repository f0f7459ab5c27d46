// kiln launch: supervises kiln train. (Being written: issue 6.)
#include <stdio.h>

#include "cmd/cmd.h"

int cmd_launch(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: kiln launch is not implemented yet\n");
    return 1;
}
