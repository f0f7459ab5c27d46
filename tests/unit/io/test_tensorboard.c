// TensorBoard event files: CRC-32C against published vectors, and the files kiln_metrics writes read back by
// this test's own reader (TFRecord framing with both masked CRCs checked, then the protobuf wire format
// decoded by hand from the schema's field numbers, independently of the writer's protobuf-c code).
#include "test_util.h"

#include "io/crc32c.h"
#include "io/fsutil.h"
#include "io/tensorboard.h"
#include "run/options.h"
#include "run/metrics.h"

#include <dirent.h>

// ----------------------------------------------------------------------------
// CRC-32C

static void test_crc32c_matches_published_vectors(void **state) {
    (void)state;
    // the check value of CRC-32C, and the iSCSI vectors of RFC 3720, appendix B.4
    assert_int_equal(kiln_crc32c(0, "123456789", 9), 0xe3069283u);
    unsigned char buf[32];
    memset(buf, 0, sizeof(buf));
    assert_int_equal(kiln_crc32c(0, buf, 32), 0x8a9136aau);
    memset(buf, 0xff, sizeof(buf));
    assert_int_equal(kiln_crc32c(0, buf, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    assert_int_equal(kiln_crc32c(0, buf, 32), 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    assert_int_equal(kiln_crc32c(0, buf, 32), 0x113fdb5cu);
    assert_int_equal(kiln_crc32c(0, buf, 0), 0u);
}

static void test_crc32c_continues_across_pieces(void **state) {
    (void)state;
    const char *s = "123456789";
    for (size_t cut = 0; cut <= 9; cut++)
        assert_int_equal(kiln_crc32c(kiln_crc32c(0, s, cut), s + cut, 9 - cut), 0xe3069283u);
}

static uint32_t unmask(uint32_t m) {
    uint32_t r = m - 0xa282ead8u;
    return (r >> 17) | (r << 15);
}

static void test_crc32c_mask_rotates_right_15_and_adds_the_constant(void **state) {
    (void)state;
    assert_int_equal(kiln_crc32c_mask(0), 0xa282ead8u);
    assert_int_equal(kiln_crc32c_mask(1u << 15), 0xa282ead8u + 1); // bit 15 rotates to bit 0
    assert_int_equal(kiln_crc32c_mask(1), 0xa282ead8u + (1u << 17));
    uint64_t rng = test_seed();
    for (int i = 0; i < 1000; i++) {
        uint32_t x = (uint32_t)test_rand_u64(&rng);
        assert_int_equal(unmask(kiln_crc32c_mask(x)), x);
    }
}

// ----------------------------------------------------------------------------
// the test's reader: records, then Events decoded from the wire format

struct record {
    const unsigned char *data;
    uint64_t len;
};

static uint64_t get_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

// TFRecord's mask, written out here again so that the reader checks the framing against the format, not
// against the writer's own helper
static uint32_t tfrecord_crc(const void *p, size_t n) {
    uint32_t c = kiln_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Splits a file into records; returns how many, or -1 with *why set for a short or corrupted one.
static int read_records(const unsigned char *buf, size_t n, struct record *out, int cap, const char **why) {
    size_t off = 0;
    int k = 0;
    while (off < n) {
        if (n - off < 12 || k == cap)
            return *why = "short header", -1;
        uint64_t len = get_le(buf + off, 8);
        if ((uint32_t)get_le(buf + off + 8, 4) != tfrecord_crc(buf + off, 8))
            return *why = "length crc", -1;
        if (n - off - 12 < len + 4)
            return *why = "short data", -1;
        const unsigned char *d = buf + off + 12;
        if ((uint32_t)get_le(d + len, 4) != tfrecord_crc(d, len))
            return *why = "data crc", -1;
        out[k++] = (struct record){d, len};
        off += 12 + len + 4;
    }
    return k;
}

struct wire {
    const unsigned char *p, *end;
};

static uint64_t wire_varint(struct wire *w) {
    uint64_t v = 0;
    for (int shift = 0; w->p < w->end; shift += 7) {
        unsigned char b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    fail_msg("truncated varint");
    return 0;
}

// The next field: its number, wire type, and either a scalar (varint, fixed32, fixed64) or a sub-message.
struct field {
    int num, type;
    uint64_t v;
    struct wire sub;
};

static int wire_next(struct wire *w, struct field *f) {
    if (w->p >= w->end)
        return 0;
    uint64_t key = wire_varint(w);
    f->num = (int)(key >> 3);
    f->type = (int)(key & 7);
    switch (f->type) {
    case 0:
        f->v = wire_varint(w);
        break;
    case 1:
        assert_true(w->end - w->p >= 8);
        f->v = get_le(w->p, 8);
        w->p += 8;
        break;
    case 5:
        assert_true(w->end - w->p >= 4);
        f->v = get_le(w->p, 4);
        w->p += 4;
        break;
    case 2: {
        uint64_t len = wire_varint(w);
        assert_true((uint64_t)(w->end - w->p) >= len);
        f->sub = (struct wire){w->p, w->p + len};
        w->p += len;
        break;
    }
    default:
        fail_msg("unexpected wire type %d", f->type);
    }
    return 1;
}

static void copy_str(char *dst, size_t cap, const struct wire *s) {
    size_t n = (size_t)(s->end - s->p);
    assert_true(n < cap);
    memcpy(dst, s->p, n);
    dst[n] = '\0';
}

struct tb_value {
    char tag[64];
    int has_simple;
    float simple;
    char plugin[32]; // metadata.plugin_data.plugin_name
    int dtype;       // tensor.dtype
    char text[8192]; // tensor.string_val[0]
};

struct tb_event {
    double wall_time;
    int64_t step;
    char file_version[32];
    int session_status; // session_log.status: 1 = START
    int n;
    struct tb_value v[32];
};

// Event: 1 wall_time (double), 2 step, 3 file_version, 5 summary { 1 value { 1 tag, 2 simple_value (float),
// 8 tensor { 1 dtype, 8 string_val }, 9 metadata { 1 plugin_data { 1 plugin_name } } } }, 7 session_log
// { 1 status }
static void decode_event(const struct record *r, struct tb_event *e) {
    memset(e, 0, sizeof(*e));
    struct wire w = {r->data, r->data + r->len}, s, vw, t, m, pd;
    struct field f, g, h, k, l;
    while (wire_next(&w, &f)) {
        if (f.num == 1 && f.type == 1)
            memcpy(&e->wall_time, &f.v, 8);
        else if (f.num == 2 && f.type == 0)
            e->step = (int64_t)f.v;
        else if (f.num == 3 && f.type == 2)
            copy_str(e->file_version, sizeof(e->file_version), &f.sub);
        else if (f.num == 7 && f.type == 2) {
            s = f.sub;
            while (wire_next(&s, &g))
                if (g.num == 1)
                    e->session_status = (int)g.v;
        } else if (f.num == 5 && f.type == 2) {
            s = f.sub;
            while (wire_next(&s, &g)) {
                assert_int_equal(g.num, 1);
                assert_true(e->n < 32);
                struct tb_value *v = &e->v[e->n++];
                vw = g.sub;
                while (wire_next(&vw, &h)) {
                    if (h.num == 1)
                        copy_str(v->tag, sizeof(v->tag), &h.sub);
                    else if (h.num == 2 && h.type == 5) {
                        uint32_t bits = (uint32_t)h.v;
                        memcpy(&v->simple, &bits, 4);
                        v->has_simple = 1;
                    } else if (h.num == 8) {
                        t = h.sub;
                        while (wire_next(&t, &k))
                            if (k.num == 1)
                                v->dtype = (int)k.v;
                            else if (k.num == 8)
                                copy_str(v->text, sizeof(v->text), &k.sub);
                    } else if (h.num == 9) {
                        m = h.sub;
                        while (wire_next(&m, &k))
                            if (k.num == 1) {
                                pd = k.sub;
                                while (wire_next(&pd, &l))
                                    if (l.num == 1)
                                        copy_str(v->plugin, sizeof(v->plugin), &l.sub);
                            }
                    }
                }
            }
        }
    }
}

static const struct tb_value *find_tag(const struct tb_event *e, const char *tag) {
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->v[i].tag, tag))
            return &e->v[i];
    return NULL;
}

static void assert_scalar(const struct tb_event *e, const char *tag, double want) {
    const struct tb_value *v = find_tag(e, tag);
    if (!v)
        fail_msg("step %lld: no %s", (long long)e->step, tag);
    assert_true(v->has_simple);
    assert_true(v->simple == (float)want); // stored as a float, exactly
}

// The event files in dir, sorted by name (TensorBoard's reading order); returns how many.
static int event_files(const char *dir, char names[][512], int cap) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "events.out.tfevents.", 20)) {
            assert_true(n < cap);
            snprintf(names[n++], 512, "%s/%s", dir, de->d_name);
        }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[512];
            strcpy(t, names[j]);
            strcpy(names[j], names[j - 1]);
            strcpy(names[j - 1], t);
        }
    return n;
}

// ----------------------------------------------------------------------------
// files written through kiln_metrics

static void open_config(struct kiln_config *cfg, const char *dir) {
    struct kiln_error err = {0};
    assert_int_equal(kiln_config_init(cfg, NULL, &err), 0);
    snprintf(cfg->out, sizeof(cfg->out), "%s/run", dir);
    snprintf(cfg->tensorboard, sizeof(cfg->tensorboard), "%s/tb", dir);
    assert_int_equal(kiln_mkdir_p(cfg->out, &err), 0);
}

static struct kiln_metrics_row row_at(int64_t step) {
    struct kiln_metrics_row r = {.step = step,
                                 .loss = 4.0 - 0.125 * (double)step,
                                 .lr = 3e-4 * (double)step,
                                 .grad_norm = 1.5 + 0.01 * (double)step,
                                 .tokens_per_s = 12345.5 * (double)step,
                                 .ms = 81.25,
                                 .peak_mem_bytes = (size_t)3 << 30,
                                 .val_loss = NAN,
                                 .ckpt_stall_ms = NAN,
                                 .comm_wait_ms = NAN};
    return r;
}

static void test_event_file_holds_the_config_and_every_row(void **state) {
    (void)state;
    if (!kiln_tb_available())
        skip();
    char dir[256];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_config cfg;
    open_config(&cfg, dir);
    struct kiln_metrics *m;
    struct kiln_error err = {0};
    assert_int_equal(kiln_metrics_open(&cfg, 0, &m, &err), 0);
    struct kiln_metrics_row rows[3] = {row_at(1), row_at(2), row_at(3)};
    rows[1].val_loss = 3.75;
    rows[1].mfu = 0.42;
    rows[1].mfu_causal = 0.31;
    rows[1].hfu = 0.5;
    rows[1].comm_wait_ms = 7.5;
    rows[1].tokens = 8192;
    rows[2].skipped = "nan";
    rows[2].skipped_total = 1;
    rows[2].skipped_nan = 1;
    rows[2].ckpt_stall_ms = 2.5;
    rows[2].prev_ckpt_write_ms = 40;
    for (int i = 0; i < 3; i++)
        kiln_metrics_write(m, &rows[i]);
    kiln_metrics_close(m);

    char names[4][512];
    assert_int_equal(event_files(cfg.tensorboard, names, 4), 1);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    char suffix[320];
    snprintf(suffix, sizeof(suffix), ".%s.%d.kiln", host, (int)getpid());
    assert_non_null(strstr(names[0], suffix));

    char *data;
    size_t n;
    assert_int_equal(kiln_read_file(names[0], &data, &n, &err), 0);
    struct record rec[16];
    const char *why = "";
    int nrec = read_records((unsigned char *)data, n, rec, 16, &why);
    if (nrec < 0)
        fail_msg("%s: %s", names[0], why);
    assert_int_equal(nrec, 1 + 1 + 1 + 3); // version, session start, config, rows
    struct tb_event *e = malloc(sizeof(*e));

    decode_event(&rec[0], e);
    assert_string_equal(e->file_version, "brain.Event:2");
    assert_true(e->wall_time > 1.0e9); // seconds since the epoch

    decode_event(&rec[1], e); // a session starting at step 1
    assert_int_equal(e->session_status, 1);
    assert_int_equal(e->step, 1);
    assert_int_equal(e->n, 0);

    decode_event(&rec[2], e); // the config as text at step 0
    assert_int_equal(e->step, 0);
    assert_int_equal(e->n, 1);
    assert_string_equal(e->v[0].tag, "config");
    assert_string_equal(e->v[0].plugin, "text");
    assert_int_equal(e->v[0].dtype, 7); // DT_STRING
    char *cfg_text = NULL;
    size_t cfg_n = 0;
    FILE *mf = open_memstream(&cfg_text, &cfg_n);
    kiln_config_write(&cfg, mf);
    fclose(mf);
    for (char *line = strtok(cfg_text, "\n"); line; line = strtok(NULL, "\n")) {
        char want[1200];
        snprintf(want, sizeof(want), "    %s\n", line); // each option a line of a Markdown code block
        if (!strstr(e->v[0].text, want))
            fail_msg("config text lacks '%s'", line);
    }
    free(cfg_text);

    for (int i = 0; i < 3; i++) {
        const struct kiln_metrics_row *r = &rows[i];
        decode_event(&rec[3 + i], e);
        assert_int_equal(e->step, r->step);
        assert_scalar(e, "train/loss", r->loss);
        assert_scalar(e, "train/lr", r->lr);
        assert_scalar(e, "train/grad_norm", r->grad_norm);
        assert_scalar(e, "perf/tokens_per_s", r->tokens_per_s);
        assert_scalar(e, "perf/step_ms", r->ms);
        assert_scalar(e, "perf/peak_mem_bytes", (double)r->peak_mem_bytes);
        // what the row leaves out, the event leaves out
        assert_int_equal(find_tag(e, "val/loss") != NULL, !isnan(r->val_loss));
        assert_int_equal(find_tag(e, "perf/mfu") != NULL, r->mfu > 0);
        assert_int_equal(find_tag(e, "guards/skipped_steps") != NULL, r->skipped_total > 0);
        assert_int_equal(find_tag(e, "ckpt/stall_ms") != NULL, !isnan(r->ckpt_stall_ms));
        assert_int_equal(find_tag(e, "perf/comm_wait_ms") != NULL, !isnan(r->comm_wait_ms));
        assert_int_equal(find_tag(e, "train/tokens") != NULL, r->tokens > 0);
    }
    decode_event(&rec[4], e);
    assert_scalar(e, "val/loss", 3.75);
    assert_scalar(e, "perf/mfu", 0.42);
    assert_scalar(e, "perf/mfu_causal", 0.31);
    assert_scalar(e, "perf/hfu", 0.5);
    assert_scalar(e, "perf/comm_wait_ms", 7.5);
    assert_scalar(e, "train/tokens", 8192);
    decode_event(&rec[5], e);
    assert_scalar(e, "guards/skipped_steps", 1);
    assert_scalar(e, "guards/skipped_nan", 1);
    assert_scalar(e, "guards/skipped_spike_loss", 0);
    assert_scalar(e, "guards/skipped_spike_grad", 0);
    assert_scalar(e, "ckpt/stall_ms", 2.5);
    assert_scalar(e, "ckpt/prev_write_ms", 40);
    free(e);
    free(data);
    test_rmrf(dir);
}

static void test_reader_detects_a_corrupted_byte(void **state) {
    (void)state;
    if (!kiln_tb_available())
        skip();
    char dir[256];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_tb *tb;
    struct kiln_error err = {0};
    assert_int_equal(kiln_tb_open(dir, "--tensorboard", &tb, &err), 0);
    struct kiln_tb_scalar v[2] = {{"train/loss", 2.5}, {"train/lr", 1e-3}};
    assert_int_equal(kiln_tb_write_scalars(tb, 7, v, 2, &err), 0);
    char path[1400];
    snprintf(path, sizeof(path), "%s", kiln_tb_path(tb));
    kiln_tb_close(tb);
    char *data;
    size_t n;
    assert_int_equal(kiln_read_file(path, &data, &n, &err), 0);
    struct record rec[4];
    const char *why = "";
    assert_int_equal(read_records((unsigned char *)data, n, rec, 4, &why), 2);
    struct tb_event e;
    decode_event(&rec[1], &e);
    assert_int_equal(e.step, 7);
    assert_scalar(&e, "train/loss", 2.5);
    assert_scalar(&e, "train/lr", 1e-3);

    // every byte of the file, flipped in turn, is caught by one of the CRCs (or cuts a record short)
    unsigned char *copy = malloc(n);
    for (size_t i = 0; i < n; i++) {
        memcpy(copy, data, n);
        copy[i] ^= 0x20;
        why = "";
        if (read_records(copy, n, rec, 4, &why) >= 0)
            fail_msg("a flipped byte at %zu of %zu went unnoticed", i, n);
    }
    // and the two kinds are told apart
    size_t second = (size_t)(rec[1].data - (unsigned char *)data) - 12; // the second record's header
    memcpy(copy, data, n);
    copy[second + 12 + 3] ^= 1; // its data
    assert_int_equal(read_records(copy, n, rec, 4, &why), -1);
    assert_string_equal(why, "data crc");
    memcpy(copy, data, n);
    copy[second + 9] ^= 1; // its length's crc
    assert_int_equal(read_records(copy, n, rec, 4, &why), -1);
    assert_string_equal(why, "length crc");
    free(copy);
    free(data);
    test_rmrf(dir);
}

// TensorBoard drops what the first file holds for steps >= the second's session start, as metrics.jsonl drops
// the lines past the resumed step.
static void test_resume_starts_a_new_event_file_that_restarts_the_session(void **state) {
    (void)state;
    if (!kiln_tb_available())
        skip();
    char dir[256];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_config cfg;
    open_config(&cfg, dir);
    struct kiln_metrics *m;
    struct kiln_error err = {0};
    assert_int_equal(kiln_metrics_open(&cfg, 0, &m, &err), 0);
    struct kiln_metrics_row r1 = row_at(1), r2 = row_at(2), r3 = row_at(3);
    kiln_metrics_write(m, &r1);
    kiln_metrics_write(m, &r2);
    kiln_metrics_close(m);
    assert_int_equal(kiln_metrics_open(&cfg, 1, &m, &err), 0); // resumed at step 1: step 2 again
    r2.loss = 9.5;
    kiln_metrics_write(m, &r2);
    kiln_metrics_write(m, &r3);
    kiln_metrics_close(m);

    char names[4][512];
    assert_int_equal(event_files(cfg.tensorboard, names, 4), 2);
    // the second file (in TensorBoard's reading order) is the resumed one
    char *data;
    size_t n;
    assert_int_equal(kiln_read_file(names[1], &data, &n, &err), 0);
    struct record rec[8];
    const char *why = "";
    assert_int_equal(read_records((unsigned char *)data, n, rec, 8, &why), 5);
    struct tb_event *e = malloc(sizeof(*e));
    decode_event(&rec[0], e);
    assert_string_equal(e->file_version, "brain.Event:2");
    decode_event(&rec[1], e);
    assert_int_equal(e->session_status, 1);
    assert_int_equal(e->step, 2);
    decode_event(&rec[2], e);
    assert_int_equal(e->step, 1);
    assert_string_equal(e->v[0].tag, "config");
    decode_event(&rec[3], e);
    assert_int_equal(e->step, 2);
    assert_scalar(e, "train/loss", 9.5);
    decode_event(&rec[4], e);
    assert_int_equal(e->step, 3);
    free(e);
    free(data);
    test_rmrf(dir);
}

static void test_unwritable_directory_is_an_error_naming_the_option(void **state) {
    (void)state;
    char dir[256], file[300];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_config cfg;
    open_config(&cfg, dir);
    snprintf(file, sizeof(file), "%s/a_file", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(cfg.tensorboard, sizeof(cfg.tensorboard), "%s/sub", file); // a directory under a file
    struct kiln_metrics *m = (struct kiln_metrics *)&m;
    struct kiln_error err = {0};
    assert_int_not_equal(kiln_metrics_open(&cfg, 0, &m, &err), 0);
    assert_null(m);
    assert_non_null(strstr(err.msg, "--tensorboard"));
    assert_null(strchr(err.msg, '\n'));
    if (!kiln_tb_available())
        assert_non_null(strstr(err.msg, "protobuf-c")); // what the build lacks
    test_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_matches_published_vectors),
        cmocka_unit_test(test_crc32c_continues_across_pieces),
        cmocka_unit_test(test_crc32c_mask_rotates_right_15_and_adds_the_constant),
        cmocka_unit_test(test_event_file_holds_the_config_and_every_row),
        cmocka_unit_test(test_reader_detects_a_corrupted_byte),
        cmocka_unit_test(test_resume_starts_a_new_event_file_that_restarts_the_session),
        cmocka_unit_test(test_unwritable_directory_is_an_error_naming_the_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
