// The single-process transport: a group of one, where every operation is a copy or nothing.
#include <string.h>

#include "parallel/comm/comm.h"

struct single {
    struct kiln_comm *c;
};

static void move(const struct kiln_comm *c, const struct kiln_coll *k, void *dst, const void *src,
                 size_t bytes) {
    if (dst == src || !bytes)
        return;
    if (k->device)
        c->be->ops->copy(c->be->ctx, dst, src, bytes);
    else
        memmove(dst, src, bytes);
}

static struct kiln_comm_work *single_submit(void *impl, const struct kiln_coll *k, void *after_event) {
    (void)after_event; // copies run in the compute stream's order already
    struct single *s = impl;
    size_t bytes = k->count * kiln_dtype_bytes(k->dtype);
    switch (k->op) {
    case KILN_COLL_ALL_REDUCE:
    case KILN_COLL_REDUCE_SCATTER: // the one slice is everything
    case KILN_COLL_ALL_GATHER:
    case KILN_COLL_ALL_TO_ALL:
    case KILN_COLL_BROADCAST:
    case KILN_COLL_SEND_RECV: // to and from itself
        move(s->c, k, k->recv, k->send, bytes);
        break;
    case KILN_COLL_BARRIER:
        break;
    case KILN_COLL_SEND:
    case KILN_COLL_RECV:
    case KILN_COLL_N:
        KILN_ASSERT(!"send/recv in a group of one: there is no peer");
    }
    return NULL;
}

static void single_wait(void *impl, struct kiln_comm_work *w) {
    (void)impl;
    KILN_ASSERT(!w);
}

static int single_split(void *impl, int color, int key, unsigned flags, void **out, int *rank, int *size,
                        struct kiln_error *err) {
    (void)err;
    (void)flags;
    (void)color;
    (void)key;
    *rank = 0;
    *size = 1;
    struct single *d = kiln_xcalloc(1, sizeof(*d));
    *d = *(struct single *)impl;
    *out = d;
    return 0;
}

static void single_close(void *impl) {
    free(impl);
}

static const struct kiln_comm_impl single_impl = {
    .name = "single",
    .submit = single_submit,
    .wait = single_wait,
    .wait_stream = single_wait,
    .split = single_split,
    .close = single_close,
};

int kiln_comm_single_open(struct kiln_comm *c, struct kiln_error *err) {
    (void)err;
    KILN_ASSERT(c->size == 1 && c->rank == 0);
    struct single *s = kiln_xcalloc(1, sizeof(*s));
    s->c = c;
    c->impl = &single_impl;
    c->state = s;
    return 0;
}
