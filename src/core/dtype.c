// What ops.h declares beside the table: the dtype helpers every layer uses.
#include "core/ops.h"

size_t kiln_dtype_bytes(enum kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
        return 4;
    case KILN_BF16:
        return 2;
    case KILN_I32:
        return 4;
    case KILN_U8:
        return 1;
    case KILN_F64:
        return 8;
    }
    return 0;
}

const char *kiln_dtype_name(enum kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
        return "f32";
    case KILN_BF16:
        return "bf16";
    case KILN_I32:
        return "i32";
    case KILN_U8:
        return "u8";
    case KILN_F64:
        return "f64";
    }
    return "unknown";
}
