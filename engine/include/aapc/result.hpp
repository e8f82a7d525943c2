// Results with an error code and a message a person can act on (setup and control paths; the
// data path never throws).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace aapc {

enum class Errc : int {
  kOk = 0,
  kInvalidArgument = 1,  // the request is malformed or inconsistent
  kBusy = 2,             // a limit is reached (live exchanges, clients)
  kPeerSilent = 3,       // a peer stopped answering within the deadline
  kPeerAborted = 4,      // a peer aborted the exchange
  kTimeout = 5,          // the exchange did not finish in time
  kDaemonRestarted = 6,  // the daemon restarted; its earlier exchanges are gone
  kIo = 7,               // socket, file or device trouble
  kPermission = 8,       // not allowed (credentials, file modes)
  kProtocol = 9,         // a peer or client spoke something we do not understand
  kAborted = 10,         // aborted here (client gone, shutdown, explicit abort)
  kInternal = 11,
};
const char* errc_name(Errc code);

class Error {
 public:
  Error(Errc code, std::string message) : code_(code), message_(std::move(message)) {}
  Errc code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Errc code_;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  explicit operator bool() const { return v_.index() == 0; }
  bool ok() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  explicit operator bool() const { return ok_; }
  bool ok() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{Errc::kOk, ""};
  bool ok_ = true;
};

inline const char* errc_name(Errc code) {
  switch (code) {
    case Errc::kOk: return "ok";
    case Errc::kInvalidArgument: return "invalid argument";
    case Errc::kBusy: return "busy";
    case Errc::kPeerSilent: return "peer silent";
    case Errc::kPeerAborted: return "peer aborted";
    case Errc::kTimeout: return "timeout";
    case Errc::kDaemonRestarted: return "daemon restarted";
    case Errc::kIo: return "i/o error";
    case Errc::kPermission: return "permission denied";
    case Errc::kProtocol: return "protocol error";
    case Errc::kAborted: return "aborted";
    case Errc::kInternal: return "internal error";
  }
  return "unknown";
}

}  // namespace aapc
