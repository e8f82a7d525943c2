// One message of every kind of the control protocol (aapc/proto/protocol.hpp), each field set to
// a value of its own, and every optional or conditional part both present and absent: what the
// protocol tests encode, cut and mutate (unit/test_protocol_bytes.cpp), fill through the field
// list (unit/test_protocol.cpp), and what the request fuzzer starts from. A message with a
// sample here is tested in full.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "aapc/proto/protocol.hpp"
#include "aapc/result.hpp"

namespace aapc::test {

// How a receiver reads bytes like a sample's: the daemon's request decoder for a request, the
// client's decode() of that reply for a reply. The text names the outcome (an error, "refused",
// or "ok" and the decoded message encoded again), so that two decoders can be compared.
using ReadFn = std::string (*)(const std::vector<std::uint8_t>&);
// Fills a message of the sample's kind through its field list (Filler, `pick` 0 to
// kFillerPicks - 1), sends it and reads it back as its receiver does: empty when it comes back
// equal, else what went wrong.
using FilledFn = std::string (*)(int pick);

struct ProtocolSample {
  const char* name;
  std::vector<std::uint8_t> bytes;  // the whole message, numbered kSampleRequest
  ReadFn read;                      // nullptr: a reply nobody decodes (kOk, kRunning)
  // A request's error when its payload is malformed ("malformed START"); empty for a reply.
  std::string malformed;
  // A cut of the message that leaves a whole message of the older kind (an optional field at
  // the end left out); 0 when none.
  std::size_t valid_cut = 0;
  FilledFn filled = nullptr;  // nullptr: a reply without a payload
};

inline constexpr std::uint32_t kSampleRequest = 0x01020304;

inline std::string hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (std::uint8_t b : bytes) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

inline std::string read_request(const std::vector<std::uint8_t>& msg) {
  const proto::DecodedRequest d = proto::decode_request(msg);
  if (!d.request) return "error " + d.error;
  return "ok " + hex(std::visit([&](const auto& m) { return proto::message(m, d.header.request); }, *d.request));
}

template <typename M>
std::string read_reply(const std::vector<std::uint8_t>& msg) {
  const auto h = proto::header_of(msg);
  if (!h) return "not ours";
  M m{};
  proto::Reader r = proto::payload_of(msg);
  if (!proto::decode(r, m)) return "refused";
  return "ok " + hex(proto::message(m, h->request));
}

// Sets every field a message's field list names to a value of its own: numbers count up, texts
// name their number, lists get `pick` % 3 items, an enumeration its (`pick` % 3)th value,
// flags alternate, and the last optional field is there for `pick` 3 to 5. Over every `pick`
// below kFillerPicks the list's every branch is taken; the list is all the test knows of a
// message.
inline constexpr int kFillerPicks = 6;
class Filler {
 public:
  explicit Filler(int pick) : pick_(pick) {}
  template <typename T>
  void num(T& x) {
    x = static_cast<T>(++n_);
  }
  void text(std::string& s, std::size_t /*max*/) { s = "field " + std::to_string(++n_); }
  template <typename E>
  void choice(E& e, E lowest, E highest) {
    using U = std::underlying_type_t<E>;
    e = static_cast<E>(std::min<int>(static_cast<U>(lowest) + pick_ % 3, static_cast<U>(highest)));
  }
  void flag(bool& b, std::uint8_t /*yes*/, std::uint8_t /*no*/) { b = (++n_ + pick_) % 2 == 0; }
  template <typename T>
  void list(std::vector<T>& v) {
    v.resize(static_cast<std::size_t>(pick_ % 3));
    for (T& x : v) item(x);
  }
  template <typename T>
  void lists(std::vector<T>& a, std::vector<T>& b) {
    list(a);
    list(b);
  }
  template <typename T>
  void fixed(std::vector<T>& v, std::size_t n) {
    v.resize(n);
    for (T& x : v) item(x);
  }
  template <typename T>
  void last(T& x) {
    if (pick_ < 3) return;
    num(x);
    if (x == T{}) x = 1;
  }
  void last(std::string& s, std::size_t max) {
    if (pick_ >= 3) text(s, max);
  }
  void by_type(bool& b, proto::Type /*when*/) { b = pick_ % 2 == 1; }

 private:
  template <typename T>
  void item(T& x) {
    proto::walk_item(*this, x);
  }
  int pick_;
  int n_ = 0;
};

template <typename M>
std::string filled_request(int pick) {
  M m{};
  Filler filler(pick);
  M::fields(m, filler);
  const proto::DecodedRequest d = proto::decode_request(proto::message(m, kSampleRequest));
  if (!d.request) return d.error;
  const M* back = std::get_if<M>(&*d.request);
  if (back == nullptr) return "decoded as another request";
  return *back == m ? "" : "decoded as another message";
}

template <typename M>
std::string filled_reply(int pick) {
  M m{};
  Filler filler(pick);
  M::fields(m, filler);
  const auto msg = proto::message(m, kSampleRequest);
  proto::Reader r = proto::payload_of(msg);
  M back{};
  if (!proto::decode(r, back)) return "refused";
  return back == m ? "" : "decoded as another message";
}

template <typename M>
ProtocolSample request_sample(const char* name, const M& m, const char* malformed, std::size_t valid_cut = 0) {
  return {name, proto::message(m, kSampleRequest), read_request, malformed, valid_cut, filled_request<M>};
}

template <typename M>
ProtocolSample reply_sample(const char* name, const M& m) {
  return {name, proto::message(m, kSampleRequest), read_reply<M>, "", 0, filled_reply<M>};
}

inline proto::StartRequest sample_alltoallv() {
  return {.kind = proto::Kind::kAlltoallv,
          .spec = "tree+sender-partial:4",
          .timeout_ms = 2500,
          .send_buffer = 3,
          .recv_buffer = 4,
          .sends = {{0, 10}, {10, 0}, {10, 7}},
          .recvs = {{5, 5}, {0, 5}, {10, 1}}};
}

inline proto::DoneReply sample_done() {
  proto::DoneReply m;
  m.exchange = 0x00050012;
  m.ok = true;
  m.schedule = "tree";
  m.sync = "sender-all";
  m.duration_ns = 123456789;
  m.bytes_sent = 1 << 20;
  m.bytes_received = 1 << 21;
  m.retransmissions = 3;
  m.wait_ns = 5;
  m.cpu_ns = -6;
  m.rounds = {{1, 2}, {3, 0x7fffffffffffffff}};
  return m;
}

// Every sample, requests first.
inline std::vector<ProtocolSample> protocol_samples() {
  using namespace aapc::proto;
  const std::size_t hello_size = message(HelloRequest{"aapc-client 1", ""}, kSampleRequest).size();
  StartRequest alltoall{.kind = Kind::kAlltoall,
                        .spec = "tree+sender-all",
                        .timeout_ms = 0,
                        .send_buffer = 1,
                        .recv_buffer = 2,
                        .block = 65536,
                        .sends = {},
                        .recvs = {}};
  StartRequest barrier{.kind = Kind::kBarrier, .sends = {}, .recvs = {}};
  StartRequest run = alltoall;
  run.run = true;
  StartRequest grouped = sample_alltoallv();
  grouped.group = 3;
  StartRequest grouped_barrier = barrier;
  grouped_barrier.group = 200;
  const std::size_t grouped_cut = message(sample_alltoallv(), kSampleRequest).size();
  const std::size_t barrier_cut = message(barrier, kSampleRequest).size();
  DoneReply failed = sample_done();
  failed.ok = false;
  failed.code = static_cast<std::uint32_t>(Errc::kPeerSilent);
  failed.message = "rank 3 stayed silent";
  failed.rounds.clear();
  GroupQueryReply query{std::vector<std::uint64_t>(4, 0x5555000000000001), std::vector<std::uint32_t>(256, 7)};
  query.next[200] = 0xABCDEF;
  query.free[3] = 0x8000000000000000;
  return {
      request_sample("hello", HelloRequest{"aapc-client 1", ""}, "malformed HELLO"),
      request_sample("hello-job", HelloRequest{"aapc-client 1", "pmix:prterun-n0-1234@1"}, "malformed HELLO", hello_size),
      request_sample("register", RegisterRequest{0x0102030405060708}, "malformed REGISTER (it carries a size and nothing else)"),
      request_sample("free", FreeRequest{0xA0B0C0D0}, "malformed FREE"),
      request_sample("start-alltoall", alltoall, "malformed START"),
      request_sample("start-alltoallv", sample_alltoallv(), "malformed START"),
      request_sample("start-barrier", barrier, "malformed START"),
      request_sample("start-group", grouped, "malformed START", grouped_cut),
      request_sample("start-barrier-group", grouped_barrier, "malformed START", barrier_cut),
      request_sample("run-alltoall", run, "malformed RUN"),
      request_sample("wait", WaitRequest{0x00050009, true}, "malformed WAIT"),
      request_sample("test", WaitRequest{0x00050009, false}, "malformed TEST"),
      request_sample("status", StatusRequest{}, "malformed STATUS"),
      request_sample("group-query", GroupQueryRequest{}, "malformed GROUP_QUERY"),
      request_sample("group-open", GroupOpenRequest{9, 1234, {3, 0, 2}}, "malformed GROUP_OPEN"),
      request_sample("group-close", GroupCloseRequest{9, true}, "malformed GROUP_CLOSE"),
      request_sample("group-close-quiet", GroupCloseRequest{9, false}, "malformed GROUP_CLOSE"),
      reply_sample("hello-reply", HelloReply{2, 8, 99, 1500, 3.5e8, "m2", "8-two-switch"}),
      reply_sample("register-reply", RegisterReply{5}),
      reply_sample("started", StartedReply{0x00050009, "tree", "sender-all"}),
      reply_sample("done", sample_done()),
      reply_sample("done-failed", failed),
      reply_sample("status-reply", StatusReply{"{\"rank\": 0}"}),
      reply_sample("error", ErrorReply{static_cast<std::uint32_t>(Errc::kInvalidArgument), "no buffer 3"}),
      reply_sample("group-query-reply", query),
      // Shorter lists than the slots: sent padded with zeros.
      reply_sample("group-query-reply-short", GroupQueryReply{{1}, {2, 3}}),
      {"ok", message(EmptyReply{Type::kOk}, kSampleRequest), nullptr, "", 0, nullptr},
      {"running", message(EmptyReply{Type::kRunning}, kSampleRequest), nullptr, "", 0, nullptr},
  };
}

}  // namespace aapc::test
