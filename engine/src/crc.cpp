// CRC32C (Castagnoli). With SSE4.2, three independent runs of the crc32 instruction over
// three lanes of a stretch, joined by shifting the registers over the lanes that follow (a
// linear map, looked up byte by byte): one run alone waits for each step's three-cycle
// latency, and every payload byte is checked twice (sent and received) on one core.
#include <cstring>

#include "aapc/engine/wire.hpp"
#include "crc.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#include <smmintrin.h>
#endif

namespace aapc::engine {
namespace {

// Software CRC32C, table driven (used when the CPU lacks SSE4.2).
struct Table {
  std::uint32_t t[256];
  constexpr Table() : t{} {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82F63B78U : c >> 1;
      t[i] = c;
    }
  }
};
constexpr Table kTable;

std::uint32_t crc32c_soft(std::uint32_t crc, const std::uint8_t* p, std::size_t len) {
  crc = ~crc;
  for (std::size_t i = 0; i < len; ++i) crc = kTable.t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)
const bool kHaveSse42 = [] {
  __builtin_cpu_init();  // static initialisers may run before libgcc's
  return __builtin_cpu_supports("sse4.2") != 0;
}();

// The raw CRC register carried over `n` zero bytes (n a multiple of 8), as four tables of
// its bytes: the map is linear, so the register's image is the XOR of its bytes' images.
struct Shift {
  std::uint32_t t[4][256];
};

__attribute__((target("sse4.2"))) Shift make_shift(std::size_t n) {
  Shift s{};
  for (std::uint32_t k = 0; k < 4; ++k)
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint64_t c = static_cast<std::uint64_t>(i) << (8 * k);
      for (std::size_t z = 0; z < n; z += 8) c = _mm_crc32_u64(c, 0);
      s.t[k][i] = static_cast<std::uint32_t>(c);
    }
  return s;
}

inline std::uint32_t shifted(const Shift& s, std::uint64_t r) {
  return s.t[0][r & 0xFF] ^ s.t[1][(r >> 8) & 0xFF] ^ s.t[2][(r >> 16) & 0xFF] ^ s.t[3][(r >> 24) & 0xFF];
}

constexpr std::size_t kLong = 512, kShort = 64;  // bytes per lane
const Shift kShiftLong = kHaveSse42 ? make_shift(kLong) : Shift{};
const Shift kShiftShort = kHaveSse42 ? make_shift(kShort) : Shift{};

// The register after 3 * lane bytes from `src` (copied to `dst` when kCopy).
template <bool kCopy>
__attribute__((target("sse4.2"))) std::uint64_t lanes3(std::uint64_t c, std::uint8_t* dst, const std::uint8_t* src, std::size_t lane,
                                                      const Shift& s) {
  std::uint64_t a = c, b = 0, d = 0;
  if constexpr (kCopy) {
    // Copying: 16-byte loads and stores, each checked as two 8-byte words.
    for (std::size_t i = 0; i < lane; i += 16) {
      const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + lane + i));
      const __m128i vd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * lane + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), va);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + lane + i), vb);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * lane + i), vd);
      a = _mm_crc32_u64(_mm_crc32_u64(a, static_cast<std::uint64_t>(_mm_cvtsi128_si64(va))), static_cast<std::uint64_t>(_mm_extract_epi64(va, 1)));
      b = _mm_crc32_u64(_mm_crc32_u64(b, static_cast<std::uint64_t>(_mm_cvtsi128_si64(vb))), static_cast<std::uint64_t>(_mm_extract_epi64(vb, 1)));
      d = _mm_crc32_u64(_mm_crc32_u64(d, static_cast<std::uint64_t>(_mm_cvtsi128_si64(vd))), static_cast<std::uint64_t>(_mm_extract_epi64(vd, 1)));
    }
    return shifted(s, shifted(s, a) ^ b) ^ d;
  }
  for (std::size_t i = 0; i < lane; i += 8) {
    std::uint64_t va, vb, vd;
    std::memcpy(&va, src + i, 8);
    std::memcpy(&vb, src + lane + i, 8);
    std::memcpy(&vd, src + 2 * lane + i, 8);
    if constexpr (kCopy) {
      std::memcpy(dst + i, &va, 8);
      std::memcpy(dst + lane + i, &vb, 8);
      std::memcpy(dst + 2 * lane + i, &vd, 8);
    }
    a = _mm_crc32_u64(a, va);
    b = _mm_crc32_u64(b, vb);
    d = _mm_crc32_u64(d, vd);
  }
  return shifted(s, shifted(s, a) ^ b) ^ d;
}

template <bool kCopy>
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hw(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
  std::uint64_t c = ~crc & 0xFFFFFFFFULL;
  for (const auto& [lane, shift] : {std::pair<std::size_t, const Shift*>{kLong, &kShiftLong}, {kShort, &kShiftShort}}) {
    while (len >= 3 * lane) {
      c = lanes3<kCopy>(c, dst, src, lane, *shift);
      src += 3 * lane;
      if constexpr (kCopy) dst += 3 * lane;
      len -= 3 * lane;
    }
  }
  while (len >= 8) {
    std::uint64_t v;
    std::memcpy(&v, src, 8);
    if constexpr (kCopy) std::memcpy(dst, &v, 8), dst += 8;
    c = _mm_crc32_u64(c, v);
    src += 8;
    len -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (len > 0) {
    if constexpr (kCopy) *dst++ = *src;
    c32 = _mm_crc32_u8(c32, *src++);
    --len;
  }
  return ~c32;
}
#endif

}  // namespace

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t len) {
  const auto* p = static_cast<const std::uint8_t*>(data);
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_hw<false>(crc, nullptr, p, len);
#endif
  return crc32c_soft(crc, p, len);
}

std::uint32_t crc32c_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_hw<true>(crc, dst, src, len);
#endif
  std::memcpy(dst, src, len);
  return crc32c_soft(crc, src, len);
}

}  // namespace aapc::engine
