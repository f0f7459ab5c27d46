// kiln export / kiln import: Hugging Face interop. (Being written: issue 5.)
#include <stdio.h>

#include "cmd/cmd.h"

int cmd_export(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: kiln export is not implemented yet\n");
    return 1;
}

int cmd_import(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: kiln import is not implemented yet\n");
    return 1;
}
