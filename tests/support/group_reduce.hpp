// Opening a group (Client::open_group) from threads of one process: the reduce that MPI
// would do among the members, done over threads.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "aapc/client.hpp"

namespace aapc::test {

// Client::open_group's reduce over threads of this process: `n` callers per step.
struct ThreadReduce {
  explicit ThreadReduce(int callers) : n(callers) {}
  std::mutex m;
  std::condition_variable cv;
  int n, arrived = 0;
  std::uint64_t generation = 0;
  std::vector<std::uint64_t> acc, result;
  void operator()(std::vector<std::uint64_t>& words, ReduceOp op) {
    std::unique_lock lock(m);
    if (arrived == 0) {
      acc = words;
    } else {
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = op == ReduceOp::kAnd ? (acc[i] & words[i]) : std::max(acc[i], words[i]);
    }
    if (++arrived == n) {
      result = acc;
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      const auto g = generation;
      cv.wait(lock, [&] { return generation != g; });
    }
    words = result;
  }
};

// One member's side of opening the group of `members` over `reduce`.
inline Result<Client> open_in(const Client& c, const std::vector<int>& members, ThreadReduce& reduce) {
  return c.open_group(members, [&](std::vector<std::uint64_t>& w, ReduceOp op) { reduce(w, op); });
}

// Both ranks open a group at once, x with members `mx`, y with `my`.
inline std::pair<Result<Client>, Result<Client>> open_both(const Client& x, const std::vector<int>& mx, const Client& y, const std::vector<int>& my) {
  ThreadReduce reduce(2);
  Result<Client> gy = Error(Errc::kInternal, "not run");
  std::thread t([&] { gy = open_in(y, my, reduce); });
  Result<Client> gx = open_in(x, mx, reduce);
  t.join();
  return {std::move(gx), std::move(gy)};
}

}  // namespace aapc::test

