// TensorBoard event files (see tensorboard.h), encoded by protobuf-c from tensorboard_event.proto.
#include "io/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "io/crc32c.h"
#include "io/fsutil.h"
#include "tensorboard_event.pb-c.h"

enum { DT_STRING = 7 }; // TensorFlow's DataType for a string tensor

struct kiln_tb {
    FILE *f;
    char path[1400];
    char what[64];
};

int kiln_tb_available(void) {
    return 1;
}

static double wall_time_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

static void put_u64_le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u32_le(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

// Packs the event into one TFRecord and flushes it, so that a killed run keeps every logged step.
static int write_event(struct kiln_tb *tb, const KilnTb__Event *ev, struct kiln_error *err) {
    size_t n = kiln_tb__event__get_packed_size(ev);
    unsigned char *rec = kiln_xmalloc(n + 16);
    put_u64_le(rec, n);
    put_u32_le(rec + 8, kiln_crc32c_mask(kiln_crc32c(0, rec, 8)));
    kiln_tb__event__pack(ev, rec + 12);
    put_u32_le(rec + 12 + n, kiln_crc32c_mask(kiln_crc32c(0, rec + 12, n)));
    int ok = fwrite(rec, 1, n + 16, tb->f) == n + 16 && fflush(tb->f) == 0;
    free(rec);
    if (!ok)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot write TensorBoard events (%s): %s; check the disk",
                           tb->path, strerror(errno));
    return 0;
}

// A new file named as TensorFlow names its own; a second writer in the same second and process gets .kiln.N
// (which sorts after .kiln, so TensorBoard reads the files in the order they were made).
static FILE *create_event_file(const char *dir, char *path, size_t cap) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof(host) - 1) != 0)
        strcpy(host, "localhost");
    host[sizeof(host) - 1] = '\0';
    long long now = (long long)wall_time_s();
    for (int i = 0; i < 1000; i++) {
        int len = i == 0 ? snprintf(path, cap, "%s/events.out.tfevents.%lld.%s.%d.kiln", dir, now, host,
                                    (int)getpid())
                         : snprintf(path, cap, "%s/events.out.tfevents.%lld.%s.%d.kiln.%d", dir, now, host,
                                    (int)getpid(), i);
        if (len < 0 || (size_t)len >= cap) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            FILE *f = fdopen(fd, "wb");
            if (!f)
                close(fd);
            return f;
        }
        if (errno != EEXIST)
            return NULL;
    }
    return NULL;
}

int kiln_tb_open(const char *dir, const char *what, struct kiln_tb **out, struct kiln_error *err) {
    *out = NULL;
    struct kiln_error e;
    if (kiln_mkdir_p(dir, &e))
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "cannot write TensorBoard events (%s=%s): %s; pick a "
                           "writable directory",
                           what, dir, e.msg);
    struct kiln_tb *tb = kiln_xcalloc(1, sizeof(*tb));
    snprintf(tb->what, sizeof(tb->what), "%s", what);
    tb->f = create_event_file(dir, tb->path, sizeof(tb->path));
    if (!tb->f) {
        int rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "cannot write TensorBoard events (%s=%s): %s; pick a "
                             "writable directory",
                             what, dir, strerror(errno));
        free(tb);
        return rc;
    }
    KilnTb__Event ev = KILN_TB__EVENT__INIT;
    ev.wall_time = wall_time_s();
    ev.what_case = KILN_TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    int rc = write_event(tb, &ev, err);
    if (rc) {
        kiln_tb_close(tb);
        return rc;
    }
    *out = tb;
    return 0;
}

int kiln_tb_write_start(struct kiln_tb *tb, int64_t step, struct kiln_error *err) {
    KilnTb__SessionLog log = KILN_TB__SESSION_LOG__INIT;
    log.status = KILN_TB__SESSION_LOG__STATUS__START;
    KilnTb__Event ev = KILN_TB__EVENT__INIT;
    ev.wall_time = wall_time_s();
    ev.step = step;
    ev.what_case = KILN_TB__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &log;
    return write_event(tb, &ev, err);
}

int kiln_tb_write_scalars(struct kiln_tb *tb, int64_t step, const struct kiln_tb_scalar *v, int n,
                          struct kiln_error *err) {
    KilnTb__Summary__Value *vals = kiln_xcalloc((size_t)n, sizeof(*vals));
    KilnTb__Summary__Value **ptrs = kiln_xcalloc((size_t)n, sizeof(*ptrs));
    for (int i = 0; i < n; i++) {
        kiln_tb__summary__value__init(&vals[i]);
        vals[i].tag = (char *)v[i].tag;
        vals[i].value_case = KILN_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = (float)v[i].value;
        ptrs[i] = &vals[i];
    }
    KilnTb__Summary sum = KILN_TB__SUMMARY__INIT;
    sum.n_value = (size_t)n;
    sum.value = ptrs;
    KilnTb__Event ev = KILN_TB__EVENT__INIT;
    ev.wall_time = wall_time_s();
    ev.step = step;
    ev.what_case = KILN_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = write_event(tb, &ev, err);
    free(ptrs);
    free(vals);
    return rc;
}

int kiln_tb_write_text(struct kiln_tb *tb, int64_t step, const char *tag, const char *text,
                       struct kiln_error *err) {
    // TensorBoard's text plugin reads a scalar string tensor from a value whose metadata names the plugin
    KilnTb__Metadata__PluginData plugin = KILN_TB__METADATA__PLUGIN_DATA__INIT;
    plugin.plugin_name = "text";
    KilnTb__Metadata meta = KILN_TB__METADATA__INIT;
    meta.plugin_data = &plugin;
    KilnTb__Shape shape = KILN_TB__SHAPE__INIT;
    ProtobufCBinaryData str = {.len = strlen(text), .data = (uint8_t *)text};
    KilnTb__Tensor tensor = KILN_TB__TENSOR__INIT;
    tensor.dtype = DT_STRING;
    tensor.tensor_shape = &shape;
    tensor.n_string_val = 1;
    tensor.string_val = &str;
    KilnTb__Summary__Value val = KILN_TB__SUMMARY__VALUE__INIT;
    val.tag = (char *)tag;
    val.metadata = &meta;
    val.value_case = KILN_TB__SUMMARY__VALUE__VALUE_TENSOR;
    val.tensor = &tensor;
    KilnTb__Summary__Value *ptr = &val;
    KilnTb__Summary sum = KILN_TB__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = &ptr;
    KilnTb__Event ev = KILN_TB__EVENT__INIT;
    ev.wall_time = wall_time_s();
    ev.step = step;
    ev.what_case = KILN_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(tb, &ev, err);
}

const char *kiln_tb_path(const struct kiln_tb *tb) {
    return tb->path;
}

void kiln_tb_close(struct kiln_tb *tb) {
    if (!tb)
        return;
    if (tb->f)
        fclose(tb->f);
    free(tb);
}
