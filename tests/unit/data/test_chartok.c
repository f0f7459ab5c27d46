// The char tokenizer: vocab = sorted distinct bytes, exact round trips, errors naming byte and offset.
#include "test_util.h"

#include "data/tokenizer.h"
#include "io/fsutil.h"
#include "util/error.h"

static void test_chartok_vocab_is_sorted_distinct_bytes(void **state) {
    uint64_t s = test_seed();
    char text[2000];
    size_t n = 1 + test_rand_u64(&s) % sizeof(text);
    int seen[256] = {0};
    for (size_t i = 0; i < n; i++) {
        text[i] = (char)(test_rand_u64(&s) % 97 + 20); // bytes 20..116
        seen[(unsigned char)text[i]] = 1;
    }
    struct kiln_tokenizer *t = kiln_chartok_from_text(text, n);
    const char *chars;
    size_t nc;
    assert_int_equal(kiln_tokenizer_vocab_string(t, &chars, &nc), 0);
    size_t k = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) {
            assert_true(k < nc);
            assert_int_equal((unsigned char)chars[k++], b);
        }
    assert_int_equal(k, nc);
    assert_int_equal(kiln_tokenizer_vocab_size(t), (int)nc);
    assert_int_equal(kiln_tokenizer_eot(t), -1);
    assert_string_equal(kiln_tokenizer_name(t), "char");

    struct kiln_ids ids = {0};
    struct kiln_bytes back = {0};
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_encode(t, text, n, &ids, &err), 0);
    assert_int_equal(ids.n, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal((unsigned char)chars[ids.data[i]], (unsigned char)text[i]);
    assert_int_equal(kiln_tokenizer_decode(t, ids.data, ids.n, &back, &err), 0);
    assert_int_equal(back.n, n);
    assert_memory_equal(back.data, text, n);

    // from_vocab is the inverse of vocab_string: same ids
    struct kiln_tokenizer *t2 = kiln_chartok_from_vocab(chars, nc);
    assert_non_null(t2);
    struct kiln_ids ids2 = {0};
    assert_int_equal(kiln_tokenizer_encode(t2, text, n, &ids2, &err), 0);
    assert_memory_equal(ids2.data, ids.data, n * sizeof(int32_t));
    kiln_ids_free(&ids);
    kiln_ids_free(&ids2);
    kiln_bytes_free(&back);
    kiln_tokenizer_free(t);
    kiln_tokenizer_free(t2);
}

static void test_chartok_rejects_unknown_bytes_and_ids(void **state) {
    struct kiln_tokenizer *t = kiln_chartok_from_text("hello", 5); // vocab "ehlo"
    struct kiln_ids ids = {0};
    struct kiln_bytes out = {0};
    struct kiln_error err = {0};
    assert_int_equal(kiln_tokenizer_vocab_size(t), 4);
    assert_int_equal(kiln_tokenizer_encode(t, "hole!", 5, &ids, &err), KILN_ERR_USAGE);
    assert_string_equal(err.msg,
                        "character not in the char vocab (byte '!' 0x21 at offset 4): the vocab has 4 chars "
                        "from the training text; use that text's characters or --tokenizer=gpt2");
    assert_int_equal(kiln_tokenizer_encode(t, "h\xff", 2, &ids, &err), KILN_ERR_USAGE);
    assert_non_null(strstr(err.msg, "(byte 0xff at offset 1)"));
    int32_t bad[] = {0, 4};
    assert_int_equal(kiln_tokenizer_decode(t, bad, 2, &out, &err), KILN_ERR_USAGE);
    assert_string_equal(err.msg, "token id 4 (index 1) out of range: the char vocab has ids 0..3");
    assert_null(kiln_chartok_from_vocab("abca", 4)); // repeated byte
    assert_null(kiln_chartok_from_vocab("", 0));
    kiln_ids_free(&ids);
    kiln_bytes_free(&out);
    kiln_tokenizer_free(t);
}

static void test_chartok_opens_from_text_file_and_manifest(void **state) {
    char dir[256], path[300];
    test_tmpdir(dir, sizeof(dir));
    struct kiln_error err = {0};
    snprintf(path, sizeof(path), "%s/text.txt", dir);
    assert_int_equal(kiln_write_file_atomic(path, "banana", 6, &err), 0);
    struct kiln_tokenizer *t;
    assert_int_equal(kiln_tokenizer_open(&t, "char", path, &err), 0);
    const char *chars;
    size_t n;
    assert_int_equal(kiln_tokenizer_vocab_string(t, &chars, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(chars, "abn", 3);
    kiln_tokenizer_free(t);
    // a manifest's saved vocab keeps its order
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    const char *m = "{\"tokenizer\": {\"name\": \"char\", \"char_vocab\": [110, 97, 98]}}";
    assert_int_equal(kiln_write_file_atomic(path, m, strlen(m), &err), 0);
    assert_int_equal(kiln_tokenizer_open(&t, "char", path, &err), 0);
    assert_int_equal(kiln_tokenizer_vocab_string(t, &chars, &n), 0);
    assert_memory_equal(chars, "nab", 3);
    kiln_tokenizer_free(t);
    assert_int_equal(kiln_tokenizer_open(&t, "char", NULL, &err), KILN_ERR_USAGE);
    test_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chartok_vocab_is_sorted_distinct_bytes),
        cmocka_unit_test(test_chartok_rejects_unknown_bytes_and_ids),
        cmocka_unit_test(test_chartok_opens_from_text_file_and_manifest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
