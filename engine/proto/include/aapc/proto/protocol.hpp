// The control protocol between aapcd and its clients (not installed): typed, versioned
// messages over a Unix SOCK_SEQPACKET socket, one message per packet, file descriptors
// (memfd buffers) passed with SCM_RIGHTS. Every field a client sends is checked like a wire
// field; a malformed message gets an error reply, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace aapc::proto {

inline constexpr std::uint32_t kMagic = 0x43504141;  // "AAPC"
// 2: every message has one struct below; START carries one schedule spec and, for an
// alltoall, the block size once instead of n block lists.
inline constexpr std::uint16_t kVersion = 2;
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
  kRun,              // exchange request -> kDone once it finished here: START and WAIT in one
  kGroupQuery,       // -> kGroupQueryReply: the group slots free here (issue 13)
  kGroupQueryReply,
  kGroupOpen,        // slot, first sequence, members -> kOk
  kGroupClose,       // slot -> kOk
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
  // True when the whole payload was read without a fault: what every decode() ends with.
  bool done() const { return ok_ && at_end(); }
  // Whether `count` items of `item_bytes` each can still follow; marks the reader failed if
  // not, so a forged count never sizes a vector.
  bool fits(std::uint64_t count, std::size_t item_bytes) {
    if (count > static_cast<std::size_t>(end_ - p_) / item_bytes) ok_ = false;
    return ok_;
  }

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

// --- the messages ---------------------------------------------------------------------------
// Each request and reply is one struct with one encode() and one decode(), used by the client
// and the daemon alike. decode() reads the payload after the header and is false unless the
// payload is exactly one well-formed message (lengths bounded, nothing left over).

struct HelloRequest {
  static constexpr Type kType = Type::kHello;
  std::string client;  // who is asking, for the log
  // The job the client belongs to (Client::job_id: $AAPC_JOB, the launcher's job), so that the
  // cluster's collectives run only among one job's clients. Sent only when not empty, after
  // the name: a HELLO without it is one of protocol version 2's first kind.
  std::string job;
  friend bool operator==(const HelloRequest&, const HelloRequest&) = default;
};

struct HelloReply {
  static constexpr Type kType = Type::kHelloReply;
  std::uint32_t rank = 0, size = 0, epoch = 0, mtu = 0;
  double peak_bps = 0;
  std::string machine, topology;
  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

// Comes with the memory file descriptor of the buffer (SCM_RIGHTS).
struct RegisterRequest {
  static constexpr Type kType = Type::kRegister;
  std::uint64_t size = 0;
  friend bool operator==(const RegisterRequest&, const RegisterRequest&) = default;
};

struct RegisterReply {
  static constexpr Type kType = Type::kRegisterReply;
  std::uint32_t buffer = 0;
  friend bool operator==(const RegisterReply&, const RegisterReply&) = default;
};

struct FreeRequest {
  static constexpr Type kType = Type::kFree;
  std::uint32_t buffer = 0;
  friend bool operator==(const FreeRequest&, const FreeRequest&) = default;
};

// One block of an alltoallv, in bytes of its buffer.
struct Block {
  std::uint64_t offset = 0, length = 0;
  friend bool operator==(const Block&, const Block&) = default;
};

struct StartRequest {
  Kind kind = Kind::kAlltoall;
  // RUN instead of START: no STARTED reply, DONE when it finished (issue 14: a blocking
  // collective costs one round trip to the daemon, not two).
  bool run = false;
  Type type() const { return run ? Type::kRun : Type::kStart; }
  // Schedule and sync in the one notation of aapc/sched/spec.hpp ("auto", "tree+sender-all").
  std::string spec = "auto";
  std::uint32_t timeout_ms = 0;  // 0: derived from the exchange's size (engine.hpp, default_timeout)
  // Not for a barrier:
  std::uint32_t send_buffer = 0, recv_buffer = 0;
  std::uint64_t block = 0;          // alltoall: every block has this size, block d at d x block
  std::vector<Block> sends, recvs;  // alltoallv: one per rank
  // The group slot the collective runs in (issue 13): 0, the whole cluster, or a group this
  // client opened (GroupOpenRequest), whose ranks the blocks are then for. Sent only when not
  // 0, after everything else: a START without it is one of protocol version 2's first kind.
  std::uint8_t group = 0;

  // Where block i lies in the send (receive) buffer, for either kind.
  Block send_block(std::size_t i) const { return kind == Kind::kAlltoall ? Block{i * block, block} : sends[i]; }
  Block recv_block(std::size_t i) const { return kind == Kind::kAlltoall ? Block{i * block, block} : recvs[i]; }
  friend bool operator==(const StartRequest&, const StartRequest&) = default;
};

// Whether `b` lies within a buffer of `size` bytes (without overflow: lengths and offsets
// come from the socket).
inline bool fits(const Block& b, std::uint64_t size) { return b.length <= size && b.offset <= size - b.length; }

// A block's bytes [begin, end) in the memory behind its buffer, and which block it is: the
// daemon's view of a START's blocks when its send and receive buffers are the same memory.
struct Range {
  std::uint64_t begin = 0, end = 0;
  std::size_t block = 0;
};
struct Overlap {
  Range send, recv;
};
// A send range and a receive range that share a byte, if any (empty ranges share none).
// Sorted and swept: n log n for the n ranks of an alltoallv, never n squared.
std::optional<Overlap> find_overlap(const std::vector<Range>& sends, const std::vector<Range>& recvs);

struct StartedReply {
  static constexpr Type kType = Type::kStarted;
  std::uint32_t exchange = 0;
  std::string schedule, sync;  // what runs
  friend bool operator==(const StartedReply&, const StartedReply&) = default;
};

// WAIT blocks until the exchange finished; TEST answers kRunning while it runs.
struct WaitRequest {
  std::uint32_t exchange = 0;
  bool block = true;
  Type type() const { return block ? Type::kWait : Type::kTest; }
  friend bool operator==(const WaitRequest&, const WaitRequest&) = default;
};

struct DoneReply {
  static constexpr Type kType = Type::kDone;
  std::uint32_t exchange = 0;
  bool ok = false;
  std::uint32_t code = 0;  // an aapc::Errc when not ok
  std::string message;
  std::string schedule, sync;
  std::int64_t duration_ns = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0, retransmissions = 0;
  std::int64_t wait_ns = 0, cpu_ns = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> rounds;  // start and end of each round
  friend bool operator==(const DoneReply&, const DoneReply&) = default;
};

// Issue 13, groups: exchanges among some machines of the cluster, with ids of their own. The
// members' clients agree on a slot free on every member and on its first sequence (the largest
// `next` of that slot among them), then each opens the group at its daemon.
struct GroupQueryRequest {
  static constexpr Type kType = Type::kGroupQuery;
  friend bool operator==(const GroupQueryRequest&, const GroupQueryRequest&) = default;
};
inline constexpr std::size_t kGroupSlots = 256;  // slot 0 is the whole cluster's
struct GroupQueryReply {
  static constexpr Type kType = Type::kGroupQueryReply;
  std::vector<std::uint64_t> free;  // kGroupSlots bits: slot s is free here when bit s is set
  std::vector<std::uint32_t> next;  // by slot: the first sequence a new group of it may use here
  friend bool operator==(const GroupQueryReply&, const GroupQueryReply&) = default;
};
struct GroupOpenRequest {
  static constexpr Type kType = Type::kGroupOpen;
  std::uint8_t slot = 0;
  std::uint32_t first = 0;            // the sequence of the group's first exchange
  std::vector<std::uint32_t> members;  // cluster ranks, by group rank
  friend bool operator==(const GroupOpenRequest&, const GroupOpenRequest&) = default;
};
struct GroupCloseRequest {
  static constexpr Type kType = Type::kGroupClose;
  std::uint8_t slot = 0;
  // Tell the members (an ABORT of the group's next exchange), who may wait in it. Not when
  // the group did not open on every member (Client::open_group takes it back): its members
  // may hold the slot for another group, whose exchange of that id the ABORT would hit.
  bool tell = true;
  friend bool operator==(const GroupCloseRequest&, const GroupCloseRequest&) = default;
};

struct StatusRequest {
  static constexpr Type kType = Type::kStatus;
  friend bool operator==(const StatusRequest&, const StatusRequest&) = default;
};

struct StatusReply {
  static constexpr Type kType = Type::kStatusReply;
  std::string json;
  friend bool operator==(const StatusReply&, const StatusReply&) = default;
};

struct ErrorReply {
  static constexpr Type kType = Type::kError;
  std::uint32_t code = 0;  // an aapc::Errc
  std::string message;
  friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

// Replies without a payload: kOk (FREE), kRunning (TEST).
struct EmptyReply {
  Type reply = Type::kOk;
  Type type() const { return reply; }
};

void encode(Writer& w, const HelloRequest& m);
void encode(Writer& w, const HelloReply& m);
void encode(Writer& w, const RegisterRequest& m);
void encode(Writer& w, const RegisterReply& m);
void encode(Writer& w, const FreeRequest& m);
void encode(Writer& w, const StartRequest& m);
void encode(Writer& w, const StartedReply& m);
void encode(Writer& w, const WaitRequest& m);
void encode(Writer& w, const DoneReply& m);
void encode(Writer& w, const StatusRequest& m);
void encode(Writer& w, const GroupQueryRequest& m);
void encode(Writer& w, const GroupQueryReply& m);
void encode(Writer& w, const GroupOpenRequest& m);
void encode(Writer& w, const GroupCloseRequest& m);
void encode(Writer& w, const StatusReply& m);
void encode(Writer& w, const ErrorReply& m);
void encode(Writer& w, const EmptyReply& m);

bool decode(Reader& r, HelloRequest& m);
bool decode(Reader& r, HelloReply& m);
bool decode(Reader& r, RegisterRequest& m);
bool decode(Reader& r, RegisterReply& m);
bool decode(Reader& r, FreeRequest& m);
bool decode(Reader& r, StartRequest& m);
bool decode(Reader& r, StartedReply& m);
bool decode(Reader& r, WaitRequest& m);
bool decode(Reader& r, DoneReply& m);
bool decode(Reader& r, StatusRequest& m);
bool decode(Reader& r, GroupQueryRequest& m);
bool decode(Reader& r, GroupQueryReply& m);
bool decode(Reader& r, GroupOpenRequest& m);
bool decode(Reader& r, GroupCloseRequest& m);
bool decode(Reader& r, StatusReply& m);
bool decode(Reader& r, ErrorReply& m);

template <typename M>
Type type_of(const M& m) {
  if constexpr (requires { M::kType; }) {
    return M::kType;
  } else {
    return m.type();
  }
}

// The whole message (header and payload) of `m`, answering or numbered `request`.
template <typename M>
std::vector<std::uint8_t> message(const M& m, std::uint32_t request) {
  Writer w(type_of(m), request);
  encode(w, m);
  return w.done();
}

// The payload of a message whose header was checked by header_of().
inline Reader payload_of(const std::vector<std::uint8_t>& msg) {
  return Reader(msg.data() + sizeof(Header), msg.size() - sizeof(Header));
}

// A request as the daemon serves it: one of the requests above, or why it is not one.
using AnyRequest = std::variant<HelloRequest, RegisterRequest, FreeRequest, StartRequest, WaitRequest, StatusRequest, GroupQueryRequest,
                                GroupOpenRequest, GroupCloseRequest>;
struct DecodedRequest {
  Header header;      // request 0 when the header itself was not ours
  bool ours = false;  // magic and version are ours: the error (if any) is in the payload or type
  std::optional<AnyRequest> request;
  std::string error;  // why not, when there is no request: answered with Errc::kProtocol
};
// Checks header, version and type, then decodes the payload. Never throws on any input.
DecodedRequest decode_request(const std::vector<std::uint8_t>& msg);

// Sends one message, with an optional file descriptor; false when the socket failed.
bool send_message(int sock, const std::vector<std::uint8_t>& msg, int fd = -1);
enum class Received : std::uint8_t { kMessage, kNothing, kClosed };
// Receives one message (up to kMaxMessage) and at most one descriptor: kNothing when a
// non-blocking socket has none, kClosed on end of file or error. `truncated` tells a message
// that did not fit.
Received recv_message(int sock, std::vector<std::uint8_t>& msg, int& fd, bool& truncated);

}  // namespace aapc::proto
