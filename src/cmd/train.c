// kiln train: parse options, train, report.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "train/trainer.h"

int cmd_train(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            char *h[] = {"train"};
            return cmd_help(1, h);
        }
    struct kiln_config cfg;
    struct kiln_error err = {0};
    if (kiln_config_parse(&cfg, argc, argv, &err))
        return kiln_error_print(&err);
    struct kiln_train_result res;
    if (kiln_train(&cfg, &res, &err))
        return kiln_error_print(&err);
    if (!cfg.quiet) {
        fprintf(stderr, "kiln: done: %d steps, train loss %.4f", res.steps, res.final_loss);
        if (!isnan(res.final_val_loss))
            fprintf(stderr, ", val loss %.4f", res.final_val_loss);
        fprintf(stderr, ", %.0f tok/s", res.tokens_per_s);
        if (res.skipped_steps)
            fprintf(stderr, ", %d steps skipped (non-finite)", res.skipped_steps);
        fprintf(stderr, "%s%s\n", cfg.out[0] ? ", run in " : "", cfg.out);
    }
    return 0;
}
