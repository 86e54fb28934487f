#pragma once
// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), as zlib's crc32().

#include <cstddef>
#include <cstdint>

namespace colibri {

/// Continues `crc` over `n` bytes; start with 0.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

} // namespace colibri
