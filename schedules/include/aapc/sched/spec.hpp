// One notation for a schedule and its sync variant: "ALGORITHM[+SYNC]", e.g. "tree+sender-all",
// "group-shuffle:4", "auto". aapc-trace, aapc-bench, the daemon and the client's START all
// write it. Header-only and without a link dependency: the client library, which carries no
// schedules, writes the same text that the daemon reads with sched::choose() (choice.hpp).
#pragma once

#include <string>
#include <string_view>

namespace aapc::sched {

inline constexpr char kSpecSeparator = '+';

// The two parts of a spec, as text; `sync` is empty when the spec names none.
struct SpecText {
  std::string algorithm;
  std::string sync;
};

// Splits at the separator. (sched::read_spec() also takes the old spellings.)
inline SpecText split_spec(std::string_view text) {
  const auto at = text.find(kSpecSeparator);
  if (at == std::string_view::npos) return {std::string(text), {}};
  return {std::string(text.substr(0, at)), std::string(text.substr(at + 1))};
}

// The spec of `algorithm` with `sync`; an empty or "auto" sync is left out (the default).
inline std::string join_spec(std::string_view algorithm, std::string_view sync) {
  std::string out(algorithm);
  if (!sync.empty() && sync != "auto") out.append(1, kSpecSeparator).append(sync);
  return out;
}

}  // namespace aapc::sched
