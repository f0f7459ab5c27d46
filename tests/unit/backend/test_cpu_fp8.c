// The CPU's FP8 rounding (backend/cpu/fp8.c), the reference every backend's casts must equal bit for bit:
// the OCP e4m3 and e5m2 formats' values, round to nearest with ties to even (subnormals included), saturation
// to +-fmax, NaN kept. The oracle is the formats' definition, enumerated: a value's nearest code is found by
// searching every code, not by the code under test's arithmetic.
#include <stddef.h>
#include "test_cpu_common.h"

#include "backend/cpu/cpu_internal.h"

#include <math.h>

static const enum kiln_fp8_fmt fmts[2] = {KILN_FP8_E4M3, KILN_FP8_E5M2};

// The value of a code from the formats' definition: (-1)^s 2^(e - bias) (1 + m / 2^mbits), subnormals at
// e = 0, e4m3's S.1111.111 NaN, e5m2's exponent 31 for infinities and NaNs
static double spec_value(int c, enum kiln_fp8_fmt f) {
    int mb = f == KILN_FP8_E4M3 ? 3 : 2, bias = f == KILN_FP8_E4M3 ? 7 : 15, eb = 7 - mb;
    int s = c >> 7, e = (c >> mb) & ((1 << eb) - 1), m = c & ((1 << mb) - 1);
    double v;
    if (f == KILN_FP8_E4M3 && (c & 0x7f) == 0x7f)
        return NAN;
    if (f == KILN_FP8_E5M2 && e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = pow(2.0, 1 - bias) * m / (1 << mb);
    else
        v = pow(2.0, e - bias) * (1.0 + (double)m / (1 << mb));
    return s ? -v : v;
}

static int is_finite_code(int c, enum kiln_fp8_fmt f) {
    return isfinite(spec_value(c, f));
}

// The nearest finite code to x by search (ties: the even code, i.e. mantissa bit 0 clear), saturating
static int nearest_code(double x, enum kiln_fp8_fmt f) {
    double fmax = kiln_fp8_max(f);
    if (x >= fmax)
        return f == KILN_FP8_E4M3 ? 0x7e : 0x7b;
    if (x <= -fmax)
        return f == KILN_FP8_E4M3 ? 0xfe : 0xfb;
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        if (!is_finite_code(c, f) || (signbit(spec_value(c, f)) != signbit(x)))
            continue;
        double d = fabs(spec_value(c, f) - x);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return best;
}

static void test_every_code_decodes_to_its_defined_value_and_finite_codes_round_trip(void **state) {
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 256; c++) {
            double want = spec_value(c, fmts[k]);
            float got = kiln_fp8_decode((uint8_t)c, fmts[k]);
            if (isnan(want)) {
                assert_true(isnan(got));
                assert_true(isnan(kiln_fp8_decode(kiln_fp8_encode(got, fmts[k]), fmts[k])));
                continue;
            }
            assert_true((double)got == want);
            if (isinf(want)) // e5m2's infinities saturate on the way back (the casts are saturating)
                assert_int_equal(kiln_fp8_encode(got, fmts[k]), c < 128 ? 0x7b : 0xfb);
            else
                assert_int_equal(kiln_fp8_encode(got, fmts[k]), c);
        }
    // spot values from the formats' tables
    assert_true(kiln_fp8_decode(0x01, KILN_FP8_E4M3) == ldexpf(1, -9));
    assert_true(kiln_fp8_decode(0x38, KILN_FP8_E4M3) == 1.0f);
    assert_true(kiln_fp8_decode(0x7e, KILN_FP8_E4M3) == 448.0f);
    assert_true(kiln_fp8_decode(0x01, KILN_FP8_E5M2) == ldexpf(1, -16));
    assert_true(kiln_fp8_decode(0x3c, KILN_FP8_E5M2) == 1.0f);
    assert_true(kiln_fp8_decode(0x7b, KILN_FP8_E5M2) == 57344.0f);
}

// Between each two neighbouring finite values: the midpoint goes to the even code, a hair either side to the
// nearer one; zero and the smallest subnormal, the subnormal/normal boundary and the binades all included
static void test_midpoints_round_to_even_and_neighbours_to_the_nearer(void **state) {
    for (int k = 0; k < 2; k++) {
        enum kiln_fp8_fmt f = fmts[k];
        int top = f == KILN_FP8_E4M3 ? 0x7e : 0x7b;
        for (int c = 0; c < top; c++) {
            float lo = kiln_fp8_decode((uint8_t)c, f), hi = kiln_fp8_decode((uint8_t)(c + 1), f);
            float mid = (lo + hi) / 2; // exact in f32: the two differ in the last of at most 4 bits
            assert_true((double)mid == ((double)lo + hi) / 2);
            int even = (c & 1) == 0 ? c : c + 1;
            assert_int_equal(kiln_fp8_encode(mid, f), even);
            assert_int_equal(kiln_fp8_encode(nextafterf(mid, 0), f), c);
            assert_int_equal(kiln_fp8_encode(nextafterf(mid, INFINITY), f), c + 1);
            assert_int_equal(kiln_fp8_encode(-mid, f), even | 0x80); // symmetric
        }
    }
}

static void test_values_beyond_the_largest_saturate_and_nan_stays_nan(void **state) {
    const float e4[] = {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, 3e38f, INFINITY};
    for (size_t i = 0; i < sizeof(e4) / sizeof(e4[0]); i++) {
        assert_int_equal(kiln_fp8_encode(e4[i], KILN_FP8_E4M3), 0x7e);
        assert_int_equal(kiln_fp8_encode(-e4[i], KILN_FP8_E4M3), 0xfe);
    }
    const float e5[] = {57344.0f, 57345.0f, 61440.0f, 65536.0f, 1e9f, INFINITY};
    for (size_t i = 0; i < sizeof(e5) / sizeof(e5[0]); i++) {
        assert_int_equal(kiln_fp8_encode(e5[i], KILN_FP8_E5M2), 0x7b);
        assert_int_equal(kiln_fp8_encode(-e5[i], KILN_FP8_E5M2), 0xfb);
    }
    for (int k = 0; k < 2; k++) {
        assert_true(isnan(kiln_fp8_decode(kiln_fp8_encode(NAN, fmts[k]), fmts[k])));
        assert_true(isnan(kiln_fp8_decode(kiln_fp8_encode(-NAN, fmts[k]), fmts[k])));
        // below half the smallest subnormal: zero, with its sign
        float tiny = kiln_fp8_decode(0x01, fmts[k]) / 2;
        assert_int_equal(kiln_fp8_encode(nextafterf(tiny, 0), fmts[k]), 0x00);
        assert_int_equal(kiln_fp8_encode(-nextafterf(tiny, 0), fmts[k]), 0x80);
    }
    // the scale of a tensor with a NaN or an infinity is 1 (the NaN reaches the loss, where guards see it)
    assert_true(kiln_fp8_scale(NAN, KILN_FP8_E4M3) == 1.0f);
    assert_true(kiln_fp8_scale(INFINITY, KILN_FP8_E5M2) == 1.0f);
    assert_true(kiln_fp8_scale(2.0f, KILN_FP8_E4M3) == 224.0f);
    assert_true(isfinite(kiln_fp8_scale(0.0f, KILN_FP8_E4M3)));
}

// Random values over every binade the formats reach (and past them) against the search
static void test_random_values_round_to_the_nearest_code(void **state) {
    for (int k = 0; k < 2; k++) {
        enum kiln_fp8_fmt f = fmts[k];
        int lo = f == KILN_FP8_E4M3 ? -12 : -19, hi = f == KILN_FP8_E4M3 ? 10 : 17;
        for (int i = 0; i < 20000; i++) {
            float m = test_rand_uniform(&g_rng) + 0.5f;
            int e = lo + (int)(test_rand_u64(&g_rng) % (uint64_t)(hi - lo + 1));
            float x = ldexpf(m, e) * (test_rand_u64(&g_rng) & 1 ? -1.0f : 1.0f);
            int want = nearest_code(x, f), got = kiln_fp8_encode(x, f);
            if (want != got)
                fail_msg("%s: %.9g -> 0x%02x, want 0x%02x", f == KILN_FP8_E4M3 ? "e4m3" : "e5m2", x, got, want);
        }
    }
}

// The cast op: scale, round, transpose (x's codes, x^T's, or both in one pass); its codes are
// kiln_fp8_encode's of x * s, its inverse scales 1 / s in f32, and the amax it records the larger of the
// tensor's and what the record held
static void test_cast_scales_each_group_and_transposes(void **state) {
    int R = 5, C = 7;
    float *x = frand((size_t)R * C, 3.0f), *amax = falloc(C), *sinv = falloc(C), *seen = falloc(1);
    uint8_t *q = g_be.ops->alloc(g_be.ctx, (size_t)R * C), *qt = g_be.ops->alloc(g_be.ctx, (size_t)R * C);
    float x_amax = 0;
    for (int i = 0; i < R * C; i++)
        x_amax = fmaxf(x_amax, fabsf(x[i]));
    for (int per = 0; per < 3; per++)
        for (int layouts = 1; layouts < 4; layouts++) { // 1: x's codes, 2: x^T's, 3: both
            struct kiln_amax_args am = {.amax = amax, .x = x, .rows = R, .cols = C, .per = per};
            g_be.ops->amax(g_be.ctx, &am);
            memset(q, 0xff, (size_t)R * C);
            memset(qt, 0xff, (size_t)R * C);
            float before = layouts == 3 ? x_amax * 2 : x_amax / 2; // the record stays, or takes the tensor's
            seen[0] = before;
            struct kiln_fp8_cast_args ca = {.out = layouts & 1 ? q : NULL,
                                            .out_t = layouts & 2 ? qt : NULL,
                                            .x = x,
                                            .amax = amax,
                                            .scale_inv = sinv,
                                            .amax_seen = per == KILN_FP8_TENSOR ? seen : NULL,
                                            .rows = R,
                                            .cols = C,
                                            .fmt = KILN_FP8_E4M3,
                                            .per = per};
            g_be.ops->fp8_cast(g_be.ctx, &ca);
            if (per == KILN_FP8_TENSOR)
                assert_true(seen[0] == fmaxf(before, x_amax));
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) {
                    float want_amax = 0;
                    for (int i = 0; i < (per == KILN_FP8_COLS ? R : C); i++) {
                        float v = per == KILN_FP8_COLS ? x[i * C + c] : x[r * C + i];
                        want_amax = fmaxf(want_amax, fabsf(v));
                    }
                    if (per == KILN_FP8_TENSOR)
                        want_amax = x_amax;
                    float s = 448.0f / want_amax;
                    int g = per == KILN_FP8_ROWS ? r : per == KILN_FP8_COLS ? c : 0;
                    assert_true(sinv[g] == 1.0f / s);
                    int want = kiln_fp8_encode(x[r * C + c] * s, KILN_FP8_E4M3);
                    // a layout not asked for is not written
                    assert_int_equal(q[r * C + c], layouts & 1 ? want : 0xff);
                    assert_int_equal(qt[c * R + r], layouts & 2 ? want : 0xff);
                    // the group's largest element lands on fmax itself
                    if (fabsf(x[r * C + c]) == want_amax)
                        assert_int_equal(want & 0x7f, 0x7e);
                }
        }
    ffree(q);
    ffree(qt);
    ffree(amax);
    ffree(sinv);
    ffree(seen);
    ffree(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_decodes_to_its_defined_value_and_finite_codes_round_trip),
        cmocka_unit_test(test_midpoints_round_to_even_and_neighbours_to_the_nearer),
        cmocka_unit_test(test_values_beyond_the_largest_saturate_and_nan_stays_nan),
        cmocka_unit_test(test_random_values_round_to_the_nearest_code),
        cmocka_unit_test(test_cast_scales_each_group_and_transposes),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
