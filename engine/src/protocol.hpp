// The control protocol between aapcd and its clients (not installed): typed, versioned
// messages over a Unix SOCK_SEQPACKET socket, one message per packet, file descriptors
// (memfd buffers) passed with SCM_RIGHTS. Every field a client sends is checked like a wire
// field; a malformed message gets an error reply, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace aapc::proto {

inline constexpr std::uint32_t kMagic = 0x43504141;  // "AAPC"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kMaxMessage = 1 << 20;  // requests larger than this are refused

enum class Type : std::uint16_t {
  kHello = 1,        // -> kHelloReply
  kHelloReply,
  kRegister,         // (+ memfd) size -> kRegisterReply
  kRegisterReply,
  kFree,             // buffer -> kOk
  kStart,            // exchange request -> kStarted
  kStarted,
  kWait,             // exchange -> kDone when it finishes
  kTest,             // exchange -> kDone or kRunning
  kDone,
  kRunning,
  kStatus,           // -> kStatusReply (JSON text)
  kStatusReply,
  kError,            // code, message
  kOk,
};

enum class Kind : std::uint8_t { kAlltoall = 1, kAlltoallv = 2, kBarrier = 3 };

struct Header {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  std::uint16_t type = 0;
  std::uint32_t request = 0;  // echoed in the reply
  std::uint32_t length = 0;   // payload bytes after the header
};
static_assert(sizeof(Header) == 16);

// Little-endian, fixed-width fields; strings and arrays length-prefixed.
class Writer {
 public:
  explicit Writer(Type type, std::uint32_t request = 0) {
    Header h;
    h.type = static_cast<std::uint16_t>(type);
    h.request = request;
    buf_.resize(sizeof h);
    std::memcpy(buf_.data(), &h, sizeof h);
  }
  template <typename T>
  Writer& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof v);
    return *this;
  }
  Writer& str(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
    return *this;
  }
  // The message, with its header's length set.
  const std::vector<std::uint8_t>& done() {
    auto len = static_cast<std::uint32_t>(buf_.size() - sizeof(Header));
    std::memcpy(buf_.data() + offsetof(Header, length), &len, sizeof len);
    return buf_;
  }

 private:
  std::vector<std::uint8_t> buf_;
};

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t len) : p_(data), end_(data + len) {}
  template <typename T>
  T get() {
    T v{};
    if (static_cast<std::size_t>(end_ - p_) < sizeof v) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  std::string str(std::size_t max = 4096) {
    auto n = get<std::uint32_t>();
    if (!ok_ || n > max || static_cast<std::size_t>(end_ - p_) < n) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  bool ok_ = true;
};

// Splits a received message into header and payload; nullopt when it is not one of ours.
inline std::optional<Header> header_of(const std::vector<std::uint8_t>& msg) {
  if (msg.size() < sizeof(Header)) return std::nullopt;
  Header h;
  std::memcpy(&h, msg.data(), sizeof h);
  if (h.magic != kMagic || h.length != msg.size() - sizeof h) return std::nullopt;
  return h;
}

// Sends one message, with an optional file descriptor; false when the socket failed.
bool send_message(int sock, const std::vector<std::uint8_t>& msg, int fd = -1);
enum class Received : std::uint8_t { kMessage, kNothing, kClosed };
// Receives one message (up to kMaxMessage) and at most one descriptor: kNothing when a
// non-blocking socket has none, kClosed on end of file or error. `truncated` tells a message
// that did not fit.
Received recv_message(int sock, std::vector<std::uint8_t>& msg, int& fd, bool& truncated);

}  // namespace aapc::proto
