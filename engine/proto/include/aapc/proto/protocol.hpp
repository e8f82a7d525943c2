// The control protocol between aapcd and its clients (not installed): typed, versioned
// messages over a Unix SOCK_SEQPACKET socket, one message per packet, file descriptors
// (memfd buffers) passed with SCM_RIGHTS. Every field a client sends is checked like a wire
// field; a malformed message gets an error reply, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <type_traits>
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
  kGroupQuery,       // -> kGroupQueryReply: the group slots free here
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
  // Marks the payload malformed: a field read whole but not valid.
  void fail() { ok_ = false; }
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

// --- how a message's fields are written and read ----------------------------------------------
// Each message lists its payload once, in wire order: `static void fields(auto& m, auto& io)`.
// encode() runs that list with an Encoder over the message, decode() with a Decoder into a
// default one, and the protocol tests with a filler of their own; which call of `io` names a
// field says what it is on the wire (docs/design.md, The control protocol). A bad field fails
// the Reader and the list runs on to its end: once failed, no count sizes anything, and
// decode() is false.

inline constexpr std::size_t kMaxName = 4096;   // names, jobs and schedules
inline constexpr std::size_t kMaxText = 65536;  // error messages
inline constexpr std::size_t kMaxSpec = 256;    // a schedule spec ("tree+sender-partial:4")

// One item of a list or a fixed run, whatever `io` does with numbers: a number, a pair of
// numbers, or a record that lists its own fields (T::fields). The Encoder, the Decoder and the
// protocol tests' filler walk items alike.
template <typename Io, typename T>
void walk_item(Io& io, T& x) {
  using V = std::remove_const_t<T>;
  if constexpr (std::is_arithmetic_v<V>) {
    io.num(x);
  } else if constexpr (requires { x.first; x.second; }) {
    io.num(x.first);
    io.num(x.second);
  } else {
    V::fields(x, io);
  }
}

class Encoder {
 public:
  explicit Encoder(Writer& w) : w_(w) {}
  // A fixed-width number (an integer or a double), little-endian.
  template <typename T>
  void num(const T& x) {
    static_assert(std::is_arithmetic_v<T>);
    w_.put(x);
  }
  // A string, after its length (u32); a decoder takes at most `max` bytes.
  void text(const std::string& s, std::size_t /*max*/) { w_.str(s); }
  // An enumeration, in its underlying type; a decoder takes `lowest` to `highest`.
  template <typename E>
  void choice(const E& e, E /*lowest*/, E /*highest*/) {
    w_.put(static_cast<std::underlying_type_t<E>>(e));
  }
  // A bool, as the byte `yes` or the byte `no`.
  void flag(const bool& b, std::uint8_t yes, std::uint8_t no) { w_.put(b ? yes : no); }
  // A list: its length (u32), then its items.
  template <typename T>
  void list(const std::vector<T>& v) {
    w_.put(static_cast<std::uint32_t>(v.size()));
    for (const T& x : v) item(x);
  }
  // Two lists of one length: the length once (the first's), then the first's items, then the
  // second's.
  template <typename T>
  void lists(const std::vector<T>& a, const std::vector<T>& b) {
    w_.put(static_cast<std::uint32_t>(a.size()));
    for (const T& x : a) item(x);
    for (const T& x : b) item(x);
  }
  // Exactly `n` items, without a length: those the vector lacks are sent as 0, extra ones not.
  template <typename T>
  void fixed(const std::vector<T>& v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) item(i < v.size() ? v[i] : T{});
  }
  // The payload's last field, sent only when it is not its default: a message without it is
  // the older kind of its message, and a decoder refuses the field at its default.
  template <typename T>
  void last(const T& x) {
    if (x != T{}) num(x);
  }
  void last(const std::string& s, std::size_t max) {
    if (!s.empty()) text(s, max);
  }
  // Not on the wire: the header's type says it (the message's type() chooses that type).
  void by_type(const bool& /*b*/, Type /*when*/) {}

 private:
  template <typename T>
  void item(const T& x) {
    walk_item(*this, x);
  }
  Writer& w_;
};

class Decoder {
 public:
  // `type`: the header's type, for the fields it says (by_type); without one they are left.
  explicit Decoder(Reader& r, std::optional<Type> type = std::nullopt) : r_(r), type_(type) {}
  template <typename T>
  void num(T& x) {
    static_assert(std::is_arithmetic_v<T>);
    x = r_.get<T>();
  }
  void text(std::string& s, std::size_t max) { s = r_.str(max); }
  template <typename E>
  void choice(E& e, E lowest, E highest) {
    using U = std::underlying_type_t<E>;
    const U v = r_.get<U>();
    if (v < static_cast<U>(lowest) || v > static_cast<U>(highest)) {
      r_.fail();
    } else {
      e = static_cast<E>(v);
    }
  }
  void flag(bool& b, std::uint8_t yes, std::uint8_t no) {
    const auto v = r_.get<std::uint8_t>();
    b = v == yes;
    if (v != yes && v != no) r_.fail();
  }
  // A forged length never sizes a vector: the items must fit in what is left.
  template <typename T>
  void list(std::vector<T>& v) {
    const auto n = r_.get<std::uint32_t>();
    if (!r_.fits(n, item_bytes<T>())) return;
    v.resize(n);
    for (T& x : v) item(x);
  }
  template <typename T>
  void lists(std::vector<T>& a, std::vector<T>& b) {
    const auto n = r_.get<std::uint32_t>();
    if (!r_.fits(2ULL * n, item_bytes<T>())) return;
    a.resize(n);
    b.resize(n);
    for (T& x : a) item(x);
    for (T& x : b) item(x);
  }
  template <typename T>
  void fixed(std::vector<T>& v, std::size_t n) {
    v.resize(n);
    for (T& x : v) item(x);
  }
  // Taken when the payload goes on; there it must not be at its default.
  template <typename T>
  void last(T& x) {
    if (!r_.ok() || r_.at_end()) return;
    num(x);
    if (x == T{}) r_.fail();
  }
  void last(std::string& s, std::size_t max) {
    if (!r_.ok() || r_.at_end()) return;
    text(s, max);
    if (s.empty()) r_.fail();
  }
  void by_type(bool& b, Type when) {
    if (type_) b = *type_ == when;
  }

 private:
  template <typename T>
  void item(T& x) {
    walk_item(*this, x);
  }
  // The bytes of one item on the wire: its numbers' sizes.
  template <typename T>
  static constexpr std::size_t item_bytes() {
    if constexpr (std::is_arithmetic_v<T>) {
      return sizeof(T);
    } else if constexpr (requires { typename T::first_type; typename T::second_type; }) {
      return sizeof(typename T::first_type) + sizeof(typename T::second_type);
    } else {
      T x{};
      Sizer sizer;
      T::fields(x, sizer);
      return sizer.bytes;
    }
  }
  // Counts the bytes of an item's numbers (items hold nothing else).
  struct Sizer {
    std::size_t bytes = 0;
    template <typename N>
    constexpr void num(const N& /*x*/) {
      bytes += sizeof(N);
    }
  };
  Reader& r_;
  std::optional<Type> type_;
};

// --- the messages ---------------------------------------------------------------------------
// Each request and reply is one struct and its field list, used by the client and the daemon
// alike. A request also names the header types it comes with (kTypes) and what the daemon's
// errors call it; a reply has its one kType. decode() is false unless the payload is exactly
// one well-formed message (lengths bounded, nothing left over).

// A request's type in the header, and its name in the daemon's errors ("malformed START").
struct RequestType {
  Type type;
  const char* name;
};

struct HelloRequest {
  static constexpr RequestType kTypes[] = {{Type::kHello, "HELLO"}};
  std::string client;  // who is asking, for the log
  // The job the client belongs to (Client::job_id: $AAPC_JOB, the launcher's job), so that the
  // cluster's collectives run only among one job's clients. Sent only when not empty, after
  // the name: a HELLO without it is one of protocol version 2's first kind.
  std::string job;
  static void fields(auto& m, auto& io) {
    io.text(m.client, kMaxName);
    io.last(m.job, kMaxName);
  }
  friend bool operator==(const HelloRequest&, const HelloRequest&) = default;
};

struct HelloReply {
  static constexpr Type kType = Type::kHelloReply;
  std::uint32_t rank = 0, size = 0, epoch = 0, mtu = 0;
  double peak_bps = 0;
  std::string machine, topology;
  static void fields(auto& m, auto& io) {
    io.num(m.rank);
    io.num(m.size);
    io.num(m.epoch);
    io.num(m.mtu);
    io.num(m.peak_bps);
    io.text(m.machine, kMaxName);
    io.text(m.topology, kMaxName);
  }
  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

// Comes with the memory file descriptor of the buffer (SCM_RIGHTS).
struct RegisterRequest {
  static constexpr RequestType kTypes[] = {{Type::kRegister, "REGISTER (it carries a size and nothing else)"}};
  std::uint64_t size = 0;
  static void fields(auto& m, auto& io) { io.num(m.size); }
  friend bool operator==(const RegisterRequest&, const RegisterRequest&) = default;
};

struct RegisterReply {
  static constexpr Type kType = Type::kRegisterReply;
  std::uint32_t buffer = 0;
  static void fields(auto& m, auto& io) { io.num(m.buffer); }
  friend bool operator==(const RegisterReply&, const RegisterReply&) = default;
};

struct FreeRequest {
  static constexpr RequestType kTypes[] = {{Type::kFree, "FREE"}};
  std::uint32_t buffer = 0;
  static void fields(auto& m, auto& io) { io.num(m.buffer); }
  friend bool operator==(const FreeRequest&, const FreeRequest&) = default;
};

// One block of an alltoallv, in bytes of its buffer.
struct Block {
  std::uint64_t offset = 0, length = 0;
  static constexpr void fields(auto& m, auto& io) {
    io.num(m.offset);
    io.num(m.length);
  }
  friend bool operator==(const Block&, const Block&) = default;
};

struct StartRequest {
  // RUN instead of START: no STARTED reply, DONE when it finished (a blocking collective costs
  // one round trip to the daemon, not two). The same payload; the type says which.
  static constexpr RequestType kTypes[] = {{Type::kStart, "START"}, {Type::kRun, "RUN"}};
  Kind kind = Kind::kAlltoall;
  bool run = false;
  Type type() const { return run ? Type::kRun : Type::kStart; }
  // Schedule and sync in the one notation of aapc/sched/spec.hpp ("auto", "tree+sender-all").
  std::string spec = "auto";
  std::uint32_t timeout_ms = 0;  // 0: derived from the exchange's size (engine.hpp, default_timeout)
  // Not for a barrier:
  std::uint32_t send_buffer = 0, recv_buffer = 0;
  std::uint64_t block = 0;          // alltoall: every block has this size, block d at d x block
  std::vector<Block> sends, recvs;  // alltoallv: one per rank
  // The group slot the collective runs in: 0, the whole cluster, or a group this client opened
  // (GroupOpenRequest), whose ranks the blocks are then for. Sent only when not 0, after
  // everything else: a START without it is one of protocol version 2's first kind.
  std::uint8_t group = 0;

  static void fields(auto& m, auto& io) {
    io.by_type(m.run, Type::kRun);
    io.choice(m.kind, Kind::kAlltoall, Kind::kBarrier);
    io.text(m.spec, kMaxSpec);
    io.num(m.timeout_ms);
    if (m.kind != Kind::kBarrier) {
      io.num(m.send_buffer);
      io.num(m.recv_buffer);
      if (m.kind == Kind::kAlltoall) {
        io.num(m.block);
      } else {
        io.lists(m.sends, m.recvs);  // as many of each
      }
    }
    io.last(m.group);
  }

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
  static void fields(auto& m, auto& io) {
    io.num(m.exchange);
    io.text(m.schedule, kMaxName);
    io.text(m.sync, kMaxName);
  }
  friend bool operator==(const StartedReply&, const StartedReply&) = default;
};

// WAIT blocks until the exchange finished; TEST answers kRunning while it runs.
struct WaitRequest {
  static constexpr RequestType kTypes[] = {{Type::kWait, "WAIT"}, {Type::kTest, "TEST"}};
  std::uint32_t exchange = 0;
  bool block = true;
  // A WAIT's bound in microseconds: the daemon answers RUNNING once it passed with the exchange
  // still running (Request::wait_for). 0, not sent: until the exchange is over.
  std::uint32_t bound_us = 0;
  Type type() const { return block ? Type::kWait : Type::kTest; }
  static void fields(auto& m, auto& io) {
    io.by_type(m.block, Type::kWait);
    io.num(m.exchange);
    io.last(m.bound_us);
  }
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
  static void fields(auto& m, auto& io) {
    io.num(m.exchange);
    io.flag(m.ok, 1, 2);
    io.num(m.code);
    io.text(m.message, kMaxText);
    io.text(m.schedule, kMaxName);
    io.text(m.sync, kMaxName);
    io.num(m.duration_ns);
    io.num(m.bytes_sent);
    io.num(m.bytes_received);
    io.num(m.retransmissions);
    io.num(m.wait_ns);
    io.num(m.cpu_ns);
    io.list(m.rounds);
  }
  friend bool operator==(const DoneReply&, const DoneReply&) = default;
};

// Groups: exchanges among some machines of the cluster, with ids of their own (docs/design.md,
// Jobs kept apart). The members' clients agree on a slot free on every member and on its first
// sequence (the largest `next` of that slot among them), then each opens the group at its daemon.
struct GroupQueryRequest {
  static constexpr RequestType kTypes[] = {{Type::kGroupQuery, "GROUP_QUERY"}};
  static void fields(auto& /*m*/, auto& /*io*/) {}
  friend bool operator==(const GroupQueryRequest&, const GroupQueryRequest&) = default;
};
inline constexpr std::size_t kGroupSlots = 256;  // slot 0 is the whole cluster's
struct GroupQueryReply {
  static constexpr Type kType = Type::kGroupQueryReply;
  std::vector<std::uint64_t> free;  // kGroupSlots bits: slot s is free here when bit s is set
  std::vector<std::uint32_t> next;  // by slot: the first sequence a new group of it may use here
  static void fields(auto& m, auto& io) {
    io.fixed(m.free, kGroupSlots / 64);
    io.fixed(m.next, kGroupSlots);
  }
  friend bool operator==(const GroupQueryReply&, const GroupQueryReply&) = default;
};
// The slot a group of machines takes, given the slots free on every member (`free`, as
// GroupQueryReply's): the first free one from the group's own start, 1 + its lowest member's
// rank mod 255, going round. Groups on disjoint machines have different lowest members, so in a
// cluster of up to 255 machines they start on different slots and get different exchange ids
// (unless slots that other groups hold push one onto another's start). Where ids still meet,
// the groups are kept apart by membership (docs/design.md, "Jobs kept apart"). nullopt when no
// slot is free.
std::optional<std::uint8_t> group_slot(const std::vector<std::uint64_t>& free, int lowest_member);
struct GroupOpenRequest {
  static constexpr RequestType kTypes[] = {{Type::kGroupOpen, "GROUP_OPEN"}};
  std::uint8_t slot = 0;
  std::uint32_t first = 0;             // the sequence of the group's first exchange
  std::vector<std::uint32_t> members;  // cluster ranks, by group rank
  static void fields(auto& m, auto& io) {
    io.num(m.slot);
    io.num(m.first);
    io.list(m.members);
  }
  friend bool operator==(const GroupOpenRequest&, const GroupOpenRequest&) = default;
};
struct GroupCloseRequest {
  static constexpr RequestType kTypes[] = {{Type::kGroupClose, "GROUP_CLOSE"}};
  std::uint8_t slot = 0;
  // Tell the members (an ABORT of the group's next exchange), who may wait in it. Not when
  // the group did not open on every member (Client::open_group takes it back): its members
  // may hold the slot for another group, whose exchange of that id the ABORT would hit.
  bool tell = true;
  static void fields(auto& m, auto& io) {
    io.num(m.slot);
    io.flag(m.tell, 1, 0);
  }
  friend bool operator==(const GroupCloseRequest&, const GroupCloseRequest&) = default;
};

struct StatusRequest {
  static constexpr RequestType kTypes[] = {{Type::kStatus, "STATUS"}};
  static void fields(auto& /*m*/, auto& /*io*/) {}
  friend bool operator==(const StatusRequest&, const StatusRequest&) = default;
};

struct StatusReply {
  static constexpr Type kType = Type::kStatusReply;
  std::string json;
  static void fields(auto& m, auto& io) { io.text(m.json, kMaxMessage); }
  friend bool operator==(const StatusReply&, const StatusReply&) = default;
};

struct ErrorReply {
  static constexpr Type kType = Type::kError;
  std::uint32_t code = 0;  // an aapc::Errc
  std::string message;
  static void fields(auto& m, auto& io) {
    io.num(m.code);
    io.text(m.message, kMaxText);
  }
  friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

// Replies without a payload: kOk (FREE), kRunning (TEST).
struct EmptyReply {
  Type reply = Type::kOk;
  Type type() const { return reply; }
  static void fields(auto& /*m*/, auto& /*io*/) {}
};

// --- encoding and decoding any of them -----------------------------------------------------

template <typename M>
concept Message = requires(const M& m, Encoder& io) { M::fields(m, io); };

template <Message M>
void encode(Writer& w, const M& m) {
  Encoder io(w);
  M::fields(m, io);
}

// Reads the payload into `m`. The fields the header's type says (a WAIT's `block`, a START's
// `run`) are left as they are: decode_request() sets them.
template <Message M>
bool decode(Reader& r, M& m) {
  Decoder io(r);
  M::fields(m, io);
  return r.done();
}

template <Message M>
Type type_of(const M& m) {
  if constexpr (requires { m.type(); }) {
    return m.type();
  } else if constexpr (requires { M::kType; }) {
    return M::kType;
  } else {
    static_assert(std::size(M::kTypes) == 1, "a request of several types says which in type()");
    return M::kTypes[0].type;
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

// A request as the daemon serves it: one of the requests above, or why it is not one. The
// daemon's decoder tries each by its kTypes, and the daemon hands it to its serve() overload.
using AnyRequest = std::variant<HelloRequest, RegisterRequest, FreeRequest, StartRequest, WaitRequest, StatusRequest, GroupQueryRequest,
                                GroupOpenRequest, GroupCloseRequest>;
struct DecodedRequest {
  Header header;      // request 0 when the header itself was not ours
  bool ours = false;  // magic and version are ours: the error (if any) is in the payload or type
  std::optional<AnyRequest> request;
  std::string error;  // why not, when there is no request: answered with Errc::kProtocol
};
// Checks header, version and type, then decodes the payload as the request of that type (the
// fields its type says included). Never throws on any input.
DecodedRequest decode_request(const std::vector<std::uint8_t>& msg);

// Sends one message, with an optional file descriptor; false when the socket failed.
bool send_message(int sock, const std::vector<std::uint8_t>& msg, int fd = -1);
enum class Received : std::uint8_t { kMessage, kNothing, kClosed };
// Receives one message (up to kMaxMessage) and at most one descriptor: kNothing when a
// non-blocking socket has none, kClosed on end of file or error. `truncated` tells a message
// that did not fit.
Received recv_message(int sock, std::vector<std::uint8_t>& msg, int& fd, bool& truncated);

}  // namespace aapc::proto
