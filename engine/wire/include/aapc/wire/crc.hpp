// CRC32C of the wire format: crc32c(), and the copy that computes it on the way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace aapc::engine {

// CRC32C (Castagnoli), hardware-accelerated where the CPU has SSE4.2.
std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t len);

// The side of a copy that walks through a block, frame after frame: the send block that
// frames are built from (kSource), the receive block that payloads are placed into
// (kDestination). The other side is an mbuf, in cache. The block's next bytes, those of the
// copy after this one, are fetched ahead while this one runs.
//
// Why: with both engines of aapc-engine-bench on one core, most of the copies' time
// went to waiting for the block's lines. Fetched ahead, the bench moves 1.40x the payload at
// MTU 1500 and 1.16x at 9000 (docs/benchmarks.md).
//
// kStream: the destination is written around the caches (non-temporal stores, nothing fetched
// ahead), for a receive area larger than the caches would keep (EngineConfig::stream_bytes).
// A cached store first reads the line it writes, so the receive pass moved each
// payload byte over the memory bus twice. The stores are not fenced: the thread calls
// stream_fence() before it lets anyone else read the bytes (once a burst: a fence a frame
// cost 10% of aapc-engine-bench's time at MTU 9000).
enum class Ahead : std::uint8_t { kNone, kSource, kDestination, kStream };

// Copies `len` bytes from `src` to `dst` and returns crc32c(crc, src, len): one pass.
std::uint32_t crc32c_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len, Ahead ahead = Ahead::kNone);
// crc32c(crc, data, len), where `data` walks through a block (a payload sent without a copy).
std::uint32_t crc32c_ahead(std::uint32_t crc, const std::uint8_t* data, std::size_t len);
// memcpy, the side `ahead` fetched ahead.
void copy_ahead(std::uint8_t* dst, const std::uint8_t* src, std::size_t len, Ahead ahead);
// Orders the streamed stores (Ahead::kStream) this thread made since its last call before its
// later stores, such as those that tell a client its exchange is done. Free when it made none.
void stream_fence();
// For benchmarks: with `on` false, the copies above fetch nothing ahead (one piece each), as
// before they did. Not to be called while another thread copies.
void fetch_ahead(bool on);

// One way of computing the CRC (crc.cpp), with and without the copy.
struct Crc32cPath {
  std::string_view name;
  std::uint32_t (*crc)(std::uint32_t crc, const void* data, std::size_t len);
  std::uint32_t (*copy)(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len);
  // The copy by non-temporal stores (Ahead::kStream); null: `copy` serves.
  std::uint32_t (*stream)(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len) = nullptr;
};

// The ways this CPU can run, slowest first. crc32c() and crc32c_copy() take the last.
std::span<const Crc32cPath> crc32c_paths();

// For tests and benchmarks: crc32c() and crc32c_copy() take `path` from now on (null: the
// last of crc32c_paths() again). Not to be called while another thread computes a CRC.
void use_crc32c_path(const Crc32cPath* path);

}  // namespace aapc::engine
