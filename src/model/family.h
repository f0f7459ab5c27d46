// Model families: the architectures kiln trains, one row each in a table (family.c), chosen by --family.
//
// A family is a parameter layout, a memory plan, a forward and backward over the model's state, decoding,
// and the hook points it offers strategies. The model's state itself (model/model.h's struct kiln_model: the
// flat buffers carved by the parameter table, the windows, the hooks) is the same for every family, and so
// is everything above model/: the trainer, data and sequence parallelism, checkpoints and export see a
// parameter table and the hooks, never a family's insides. Adding a family is a folder model/<family>/ with
// its functions and one row below; nothing of the GPT's code changes.
#ifndef KILN_MODEL_FAMILY_H
#define KILN_MODEL_FAMILY_H

#include <stdint.h>

#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "util/error.h"

// The hook points of model/model.h a family calls (bits of kiln_model_family.hooks): a strategy that needs
// one the family lacks refuses it in one line.
enum {
    KILN_HOOKS_LAYER = 1 << 0,     // kiln_model_set_hooks: around each layer's forward and backward (ZeRO)
    KILN_HOOKS_ATTENTION = 1 << 1, // kiln_model_set_attention: the attention core (sequence parallelism)
    KILN_HOOKS_LINEAR = 1 << 2,    // kiln_model_set_linear: every linear layer (tensor parallelism, FP8)
    KILN_HOOKS_VOCAB = 1 << 3, // kiln_model_set_vocab: the embedding and the LM head's loss (vocab-parallel)
    KILN_HOOKS_SPLIT = 1 << 4, // struct kiln_model_split: the shapes a rank holds
};

struct kiln_model_family {
    const char *name;  // --family
    const char *about; // one line for kiln help and kiln info
    unsigned hooks;    // KILN_HOOKS_* it offers
    // whether config m can run, split s ways (NULL: whole): a usage error naming the option where not
    int (*check)(const struct kiln_model_config *m, const struct kiln_model_split *s, struct kiln_error *err);
    // the parameter table (names, shapes, offsets; a rank's share under s) and its initial values
    void (*params_build)(struct kiln_param_table *t, const struct kiln_model_config *m,
                         const struct kiln_model_split *s);
    void (*params_init)(const struct kiln_param_table *t, const struct kiln_model_config *m, float *params,
                        uint64_t seed);
    // tensor i of table t's initial values alone (t whole), into x
    void (*params_init_tensor)(const struct kiln_param_table *t, const struct kiln_model_config *m, int i,
                               float *x, uint64_t seed);
    // where part r of split s of tensor i (of local, the table built with s) sits in the whole tensor
    // (kiln_params_split_runs)
    void (*split_runs)(const struct kiln_model_config *m, const struct kiln_model_split *s, int r,
                       const struct kiln_param_table *local, int i,
                       void (*f)(void *user, size_t local_at, size_t whole_at, size_t n), void *user);
    // which tensors of table t are the blocks' linear-layer weights (kiln_model_linear_groups)
    void (*linear_groups)(const struct kiln_model_config *m, const struct kiln_param_table *t, int *group);
    // the memory a model of these options needs (kiln_model_plan)
    void (*plan)(const struct kiln_model_config *m, const struct kiln_model_opts *o, enum kiln_dtype act,
                 enum kiln_dtype grad, int weights_alias_master, struct kiln_mem_plan *plan);
    // the passes over a created model's state (kiln_model_forward, kiln_model_backward, decoding)
    double (*forward)(struct kiln_model *g, const int32_t *inputs, const int32_t *targets, float dloss,
                      float z_loss);
    void (*backward)(struct kiln_model *g);
    int (*decode_begin)(struct kiln_model *g, int B, int maxT, struct kiln_error *err);
    void (*decode_step)(struct kiln_model *g, const int32_t *tokens, int pos, float *logits);
};

// The family of a config (every value of enum kiln_family has a row)
const struct kiln_model_family *kiln_model_family_of(const struct kiln_model_config *m);
// The rows, for kiln info and tests: *n gets the count
const struct kiln_model_family *const *kiln_model_families(int *n);

// The GPT family's row (model/gpt/family.c)
extern const struct kiln_model_family kiln_family_gpt;

#endif
