// CRC-32C (Castagnoli), the checksum of TFRecord framing (TensorBoard event files).
#ifndef KILN_IO_CRC32C_H
#define KILN_IO_CRC32C_H

#include <stddef.h>
#include <stdint.h>

// CRC-32C of n bytes, continuing from crc (0 to start): kiln_crc32c(0, "123456789", 9) = 0xe3069283.
uint32_t kiln_crc32c(uint32_t crc, const void *data, size_t n);

// The masked form TFRecord stores: a CRC of data that holds CRCs is itself weak, so the stored value is
// rotated and offset.
uint32_t kiln_crc32c_mask(uint32_t crc);

#endif
