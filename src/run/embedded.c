// Tiny Shakespeare, embedded with the assembler's .incbin (no generated source, no build step).
#include "run/embedded.h"

__asm__(".section .rodata\n"
        ".balign 64\n"
        "kiln_shakespeare_begin:\n"
        ".incbin \"" KILN_SOURCE_DIR "/data/tinyshakespeare.txt\"\n"
        "kiln_shakespeare_end:\n"
        ".byte 0\n"
        ".previous\n");

extern const char kiln_shakespeare_begin[];
extern const char kiln_shakespeare_end[];

const char *kiln_embedded_shakespeare(size_t *n) {
    *n = (size_t)(kiln_shakespeare_end - kiln_shakespeare_begin);
    return kiln_shakespeare_begin;
}
