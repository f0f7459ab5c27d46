// kiln: pretrain GPT-style language models. main() dispatches to a subcommand in src/cmd/.
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"

int main(int argc, char **argv) {
    return kiln_cmd_main(argc, argv);
}
