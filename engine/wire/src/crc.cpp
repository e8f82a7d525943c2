// CRC32C (Castagnoli), by the fastest of three ways this CPU can run:
// - AVX-512 with VPCLMULQDQ: the stretch is folded 256 bytes at a time by carry-less
//   multiplication (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
//   Instruction", Intel, 2009), four 128-bit lanes to an instruction, and the last 16 bytes
//   are reduced by the crc32 instruction. The copy rides along: each 64-byte load is stored.
// - SSE4.2: three independent runs of the crc32 instruction over three lanes of a stretch,
//   joined by shifting the registers over the lanes that follow (a linear map, looked up byte
//   by byte): one run alone waits for each step's three-cycle latency.
// - a table, a byte at a time.
// Every payload byte is checked twice (sent and received), so at 10-100 GbE the CRC is a
// large part of the engine's work per byte.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "aapc/wire/crc.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
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

const bool kHaveFold = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("vpclmulqdq") != 0 && kHaveSse42;
}();

// x^n mod P, as the crc32 instruction holds a register (reflected: bit 31 is x^0).
constexpr std::uint64_t x_pow_mod(unsigned n) {
  std::uint32_t v = 0x80000000U;
  for (unsigned i = 0; i < n; ++i) v = (v & 1) != 0 ? (v >> 1) ^ 0x82F63B78U : v >> 1;
  return v;
}

// The constants that carry a 128-bit lane `bits` further on (Gopal et al.'s folding step):
// a lane is H * x^64 + L, and it moves to H * x^(64+bits) + L * x^bits. A carry-less product
// of two reflected 64-bit words is the polynomial product times x, and a 32-bit constant in a
// word's low half stands for itself times x^32; so H is multiplied by x^(bits+31) mod P and L
// by x^(bits-33) mod P, each product at most 127 bits long.
struct Fold {
  std::uint64_t h, l;
};
constexpr Fold fold_by(unsigned bits) { return {x_pow_mod(bits + 31), x_pow_mod(bits - 33)}; }
static_assert(fold_by(128).h == 0xF20C0DFEU && fold_by(128).l == 0x493C7D27U, "the published 16-byte fold constants of CRC32C");

#define AAPC_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

AAPC_FOLD_TARGET inline __m512i fold_constants(Fold f) {
  // (The masked forms: GCC 12 warns that the plain ones read an undefined register.)
  return _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_set_epi64x(static_cast<long long>(f.l), static_cast<long long>(f.h)));
}

// Each 128-bit lane of x carried on by k's distance, plus `data`.
AAPC_FOLD_TARGET inline __m512i fold512(__m512i x, __m512i k, __m512i data) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), data, 0x96);
}
AAPC_FOLD_TARGET inline __m128i fold128(__m128i x, __m128i k, __m128i data) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), data);
}

// How crc32c_fold() copies: not at all (dst is null), by cached stores, or by non-temporal
// stores to a destination aligned to 64 bytes (Ahead::kStream).
enum class Copy : std::uint8_t { kNo, kCached, kStreamed };

// 64 bytes at src + at (stored at dst + at when copying).
template <Copy kCopy>
AAPC_FOLD_TARGET inline __m512i load64(std::uint8_t* dst, const std::uint8_t* src, std::size_t at = 0) {
  const __m512i v = _mm512_loadu_si512(src + at);
  if constexpr (kCopy == Copy::kCached) _mm512_storeu_si512(dst + at, v);
  if constexpr (kCopy == Copy::kStreamed) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + at), v);
  return v;
}
template <bool kCopy>
AAPC_FOLD_TARGET inline __m128i load16(std::uint8_t* dst, const std::uint8_t* src) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
  return v;
}

// At least 64 bytes. The register's invariant: the CRC of everything so far is the CRC, from
// zero, of the accumulators' bytes followed by what is still to come. The last 16-63 bytes are
// copied by cached stores.
template <Copy kCopy>
AAPC_FOLD_TARGET std::uint32_t crc32c_fold(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
  auto advance = [&](std::size_t n) {
    src += n;
    if constexpr (kCopy != Copy::kNo) dst += n;
    len -= n;
  };
  constexpr bool kCopies = kCopy != Copy::kNo;
  // The register enters as the first 32 bits of the message, XORed in.
  __m512i x0 = _mm512_xor_si512(load64<kCopy>(dst, src), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  advance(64);
  const __m512i k64 = fold_constants(fold_by(512));
  if (len >= 192) {
    // Four accumulators, 256 bytes a round, so that their products' latencies overlap.
    __m512i x1 = load64<kCopy>(dst, src), x2 = load64<kCopy>(dst, src, 64), x3 = load64<kCopy>(dst, src, 128);
    advance(192);
    const __m512i k256 = fold_constants(fold_by(2048));
    while (len >= 256) {
      x0 = fold512(x0, k256, load64<kCopy>(dst, src));
      x1 = fold512(x1, k256, load64<kCopy>(dst, src, 64));
      x2 = fold512(x2, k256, load64<kCopy>(dst, src, 128));
      x3 = fold512(x3, k256, load64<kCopy>(dst, src, 192));
      advance(256);
    }
    x0 = fold512(fold512(fold512(x0, k64, x1), k64, x2), k64, x3);
  }
  while (len >= 64) {
    x0 = fold512(x0, k64, load64<kCopy>(dst, src));
    advance(64);
  }
  const Fold f16 = fold_by(128);
  const __m128i k16 = _mm_set_epi64x(static_cast<long long>(f16.l), static_cast<long long>(f16.h));
  __m128i y = _mm512_maskz_extracti32x4_epi32(0xF, x0, 0);
  y = fold128(y, k16, _mm512_maskz_extracti32x4_epi32(0xF, x0, 1));
  y = fold128(y, k16, _mm512_maskz_extracti32x4_epi32(0xF, x0, 2));
  y = fold128(y, k16, _mm512_maskz_extracti32x4_epi32(0xF, x0, 3));
  while (len >= 16) {
    y = fold128(y, k16, load16<kCopies>(dst, src));
    advance(16);
  }
  // Clean upper halves before the SSE code that follows (and the caller's): GCC does not add
  // the vzeroupper itself before a tail call, and SSE instructions after 512-bit ones that
  // left them dirty run far slower (the engine bench lost a quarter at MTU 1500).
  _mm256_zeroupper();
  // The CRC from zero of the last 16 bytes, then the rest.
  std::uint64_t c = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(y)));
  c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_extract_epi64(y, 1)));
  return crc32c_hw<kCopies>(~static_cast<std::uint32_t>(c), dst, src, len);
}
#undef AAPC_FOLD_TARGET
#endif

std::uint32_t soft_crc(std::uint32_t crc, const void* data, std::size_t len) {
  return crc32c_soft(crc, static_cast<const std::uint8_t*>(data), len);
}
std::uint32_t soft_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
  std::memcpy(dst, src, len);
  return crc32c_soft(crc, src, len);
}
#if defined(__x86_64__)
std::uint32_t lanes_crc(std::uint32_t crc, const void* data, std::size_t len) {
  return crc32c_hw<false>(crc, nullptr, static_cast<const std::uint8_t*>(data), len);
}
std::uint32_t lanes_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
  return crc32c_hw<true>(crc, dst, src, len);
}
std::uint32_t fold_crc(std::uint32_t crc, const void* data, std::size_t len) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  return len >= 64 ? crc32c_fold<Copy::kNo>(crc, nullptr, p, len) : crc32c_hw<false>(crc, nullptr, p, len);
}
std::uint32_t fold_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
  return len >= 64 ? crc32c_fold<Copy::kCached>(crc, dst, src, len) : crc32c_hw<true>(crc, dst, src, len);
}
// The bytes up to the destination's next 64-byte boundary by cached stores, the rest streamed.
std::uint32_t fold_stream(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
  const std::size_t head = std::min<std::size_t>(len, -reinterpret_cast<std::uintptr_t>(dst) & 63);
  crc = crc32c_hw<true>(crc, dst, src, head);
  dst += head;
  src += head;
  len -= head;
  return len >= 64 ? crc32c_fold<Copy::kStreamed>(crc, dst, src, len) : crc32c_hw<true>(crc, dst, src, len);
}
#endif

constexpr Crc32cPath kSoft{"table", soft_crc, soft_copy};
#if defined(__x86_64__)
constexpr Crc32cPath kLanes{"sse4.2 lanes", lanes_crc, lanes_copy};
constexpr Crc32cPath kFold{"avx512 vpclmulqdq", fold_crc, fold_copy, fold_stream};
const std::vector<Crc32cPath> kPaths = [] {
  std::vector<Crc32cPath> v{kSoft};
  if (kHaveSse42) v.push_back(kLanes);
  if (kHaveFold) v.push_back(kFold);
  return v;
}();
#else
const std::vector<Crc32cPath> kPaths{kSoft};
#endif

const Crc32cPath* g_chosen = nullptr;  // use_crc32c_path(); null: the fastest

const Crc32cPath& active() {
  if (g_chosen != nullptr) return *g_chosen;
#if defined(__x86_64__)
  if (kHaveFold) return kFold;
  if (kHaveSse42) return kLanes;
#endif
  return kSoft;
}

// A copy through a block runs in pieces of kPiece bytes; after each, the block's lines that lie
// kReach bytes past it are fetched. Each line is fetched once: from where the piece before left
// off, in this call or in the copy before, which ended where this one begins. Fetching past a
// block's end is harmless (a prefetch never faults) and rare: only its last copy does.
// Chosen with aapc-engine-bench at MTU 1500 and 9000 (docs/benchmarks.md), among pieces of 1-4
// KiB and reaches of 2-4 KiB, which were within a few percent of each other. Fetching after a
// copy only the next one's bytes was as good at 1500 and 7-10% slower at 9000; fetching inside
// the folding loop was no better, and serves one path only.
// The loop over offsets in fetch() ran 10% faster at 1500 than one over addresses (from, to)
// in repeated side-by-side runs; why, is not known.
constexpr std::uintptr_t kPiece = 1536, kReach = 3072, kLine = 64;

// For reading, also where the block is written to: a line no other core holds arrives
// exclusive, and a store to it then needs no further request.
void fetch(std::uintptr_t from, std::uintptr_t to) {
  for (std::uintptr_t i = 0; i < to - from; i += kLine)
    __builtin_prefetch(reinterpret_cast<const void*>(from + i));  // NOLINT(performance-no-int-to-ptr): the address is only fetched
}

bool g_fetch_ahead = true;  // fetch_ahead()

// `piece(at, n)` over [0, len), fetching ahead through `block` (null: one piece, no fetching).
template <class Piece>
void in_pieces(const std::uint8_t* block, std::size_t len, Piece&& piece) {
  if (block == nullptr || !g_fetch_ahead) {
    piece(std::size_t{0}, len);
    return;
  }
  for (std::size_t at = 0; at < len;) {
    const std::size_t n = std::min<std::size_t>(kPiece, len - at);
    piece(at, n);
    const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(block) + at, e = b + n;
    fetch(std::max(e, b + kReach), e + kReach);
    at += n;
  }
}

const std::uint8_t* walked(Ahead ahead, const std::uint8_t* dst, const std::uint8_t* src) {
  return ahead == Ahead::kSource ? src : ahead == Ahead::kDestination ? dst : nullptr;
}

thread_local bool t_streamed = false;  // stores of this thread wait for stream_fence()

// memcpy by non-temporal stores (Ahead::kStream).
void stream_memcpy(std::uint8_t* dst, const std::uint8_t* src, std::size_t len) {
#if defined(__x86_64__)
  const std::size_t head = std::min<std::size_t>(len, -reinterpret_cast<std::uintptr_t>(dst) & 15);
  std::memcpy(dst, src, head);
  std::size_t at = head;
  for (; at + 16 <= len; at += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at)));
  std::memcpy(dst + at, src + at, len - at);
#else
  std::memcpy(dst, src, len);
#endif
}

}  // namespace

void stream_fence() {
  if (!t_streamed) return;
#if defined(__x86_64__)
  _mm_sfence();
#endif
  t_streamed = false;
}

std::span<const Crc32cPath> crc32c_paths() { return kPaths; }

void use_crc32c_path(const Crc32cPath* path) { g_chosen = path; }

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t len) { return active().crc(crc, data, len); }

std::uint32_t crc32c_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len, Ahead ahead) {
  const Crc32cPath& path = active();
  if (ahead == Ahead::kStream) {
    t_streamed = true;
    return (path.stream != nullptr ? path.stream : path.copy)(crc, dst, src, len);
  }
  in_pieces(walked(ahead, dst, src), len,
            [&](std::size_t at, std::size_t n) { crc = path.copy(crc, dst + at, src + at, n); });
  return crc;
}

std::uint32_t crc32c_ahead(std::uint32_t crc, const std::uint8_t* data, std::size_t len) {
  const Crc32cPath& path = active();
  in_pieces(data, len, [&](std::size_t at, std::size_t n) { crc = path.crc(crc, data + at, n); });
  return crc;
}

void fetch_ahead(bool on) { g_fetch_ahead = on; }

void copy_ahead(std::uint8_t* dst, const std::uint8_t* src, std::size_t len, Ahead ahead) {
  if (ahead == Ahead::kStream) {
    t_streamed = true;
    stream_memcpy(dst, src, len);
    return;
  }
  in_pieces(walked(ahead, dst, src), len,
            [&](std::size_t at, std::size_t n) { std::memcpy(dst + at, src + at, n); });
}

}  // namespace aapc::engine
