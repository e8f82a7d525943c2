// Jobs kept apart on the wire (docs/design.md, "Jobs kept apart"): groups on disjoint machines
// may number their collectives alike, and a failure, an ABORT or a frame of one must never
// reach the other; a session's join fails when a machine's rank runs another user's
// collectives, before any block leaves.
#include <catch2/catch.hpp>

#include <array>
#include <optional>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/topology.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "frames.hpp"

using namespace aapc;
using engine::DropReason;
using engine::FrameType;

namespace {

std::uint64_t drops(const engine::Engine& e, DropReason r) { return e.counters().drops[static_cast<std::size_t>(r)]; }

// Exchange `id` of every group in `groups` (cluster ranks, by group rank) at once, blocks of
// `block` bytes; `before` runs after the starts, before the fabric moves a frame.
struct GroupRun {
  std::vector<std::optional<engine::ExchangeReport>> reports;  // by cluster rank
  std::vector<bool> byte_exact;                                 // by cluster rank
};
GroupRun run_groups(test::Fabric& fabric, const std::vector<std::vector<int>>& groups, std::uint32_t id, std::uint64_t block,
                    const std::function<void()>& before = {}) {
  const auto n = static_cast<std::size_t>(fabric.size());
  std::vector<std::vector<std::vector<std::uint8_t>>> send(n), recv(n);
  for (const auto& members : groups) {
    const auto schedule = sched::make_schedule(sched::single_switch_topology(static_cast<int>(members.size())), {sched::Algorithm::kRing, 0});
    for (std::size_t g = 0; g < members.size(); ++g) {
      const auto me = static_cast<std::size_t>(members[g]);
      auto spec = engine::exchange_spec(schedule, static_cast<engine::Rank>(g), id, members, n);
      send[me].assign(n, {});
      recv[me].assign(n, {});
      for (int peer : members) {
        const auto p = static_cast<std::size_t>(peer);
        send[me][p].resize(block);
        for (std::uint64_t k = 0; k < block; ++k) send[me][p][k] = test::pattern(static_cast<int>(me), peer, id, k);
        recv[me][p].assign(block, 0xEE);
        spec.send[p] = {send[me][p].data(), block};
        spec.recv[p] = {recv[me][p].data(), block};
      }
      auto started = fabric.engine(static_cast<int>(me)).start(std::move(spec));
      REQUIRE(started);
    }
  }
  if (before) before();
  GroupRun run;
  run.reports.resize(n);
  fabric.run_until(
      [&] {
        bool all = true;
        for (const auto& members : groups)
          for (int me : members) {
            for (auto& rep : fabric.engine(me).take_finished())
              if (rep.id == id) run.reports[static_cast<std::size_t>(me)] = rep;
            all = all && run.reports[static_cast<std::size_t>(me)].has_value();
          }
        return all;
      },
      std::chrono::milliseconds(20'000));
  run.byte_exact.assign(n, false);
  for (const auto& members : groups)
    for (int me : members) {
      bool exact = true;
      for (int peer : members)
        for (std::uint64_t k = 0; k < block && exact; ++k)
          exact = recv[static_cast<std::size_t>(me)][static_cast<std::size_t>(peer)][k] == test::pattern(peer, me, id, k);
      run.byte_exact[static_cast<std::size_t>(me)] = exact;
    }
  return run;
}

bool ok(const GroupRun& run, int rank) {
  const auto& rep = run.reports[static_cast<std::size_t>(rank)];
  return rep && rep->state == engine::ExchangeState::kDone && run.byte_exact[static_cast<std::size_t>(rank)];
}

}  // namespace

TEST_CASE("a group's failure reaches its members only, though another group on other machines runs the same id") {
  test::Fabric fabric(test::nodes(4));
  const std::uint32_t id = 7;
  auto run = run_groups(fabric, {{0, 1}, {2, 3}}, id, 5'000, [&] { fabric.engine(0).abort(id, "failed on purpose"); });
  REQUIRE(run.reports[1]);
  CHECK(run.reports[1]->state == engine::ExchangeState::kFailed);
  CHECK(run.reports[1]->code == Errc::kPeerAborted);
  CHECK(ok(run, 2));
  CHECK(ok(run, 3));
}

TEST_CASE("an ABORT or a token from a rank outside an exchange's members is dropped, counted, and fails nothing") {
  test::Fabric fabric(test::nodes(4));
  const std::uint32_t id = 9;
  const std::uint32_t epoch0 = fabric.engine(0).epoch();
  auto forge = [&](FrameType type) {
    engine::Header h;
    h.type = type;
    h.exchange = id;
    h.epoch = epoch0;
    h.aux = static_cast<std::uint32_t>(Errc::kInvalidArgument);
    const std::string why = type == FrameType::kAbort ? "rank 0 called alltoall with other blocks" : "";
    return test::fabric_frame(h, 0, 2, std::span(reinterpret_cast<const std::uint8_t*>(why.data()), why.size()));
  };
  // Rank 0 is not a member of {2, 3}: neither its ABORT nor its tokens may count there.
  auto run = run_groups(fabric, {{2, 3}}, id, 5'000, [&] {
    fabric.inject(2, forge(FrameType::kAbort));
    fabric.inject(2, forge(FrameType::kSync));
  });
  CHECK(ok(run, 2));
  CHECK(ok(run, 3));
  CHECK(drops(fabric.engine(2), DropReason::kNotMember) >= 2);
}

// The other user's daemons heard of our JOIN first, refused, and ended their sessions: their
// JOIN and the ABORT that ends their session can land together, before this rank looks. The
// refusal still names the other user, not "its client went away".
TEST_CASE("a join that meets another user's JOIN and its session's end in one batch still names that user") {
  test::Fabric fabric(test::nodes(4));
  fabric.engine(3).start_join(1, std::chrono::milliseconds(2'000), engine::JoinOwner{65534, 0});
  for (int src = 0; src < 3; ++src) {
    engine::Header join;
    join.type = FrameType::kJoin;
    join.seq = 1;
    join.aux = 0;  // uid 0
    join.epoch = fabric.engine(src).epoch();
    fabric.inject(3, test::fabric_frame(join, src, 3, {}));
    engine::Header end = join;
    end.type = FrameType::kAbort;
    end.exchange = 1;
    end.seq = engine::Engine::kAbortEndsSession;
    end.aux = static_cast<std::uint32_t>(Errc::kAborted);
    const std::string why = "another user (uid 65534; this one's is uid 0)";
    fabric.inject(3, test::fabric_frame(end, src, 3, std::span(reinterpret_cast<const std::uint8_t*>(why.data()), why.size())));
  }
  std::optional<Result<std::uint32_t>> got;
  REQUIRE(fabric.run_until(
      [&] {
        got = fabric.engine(3).join_result();
        return got.has_value();
      },
      std::chrono::milliseconds(10'000)));
  REQUIRE_FALSE(*got);
  CHECK(got->error().code() == Errc::kBusy);
  CHECK_THAT(got->error().message(), Catch::Contains("another user (uid 0"));
}

TEST_CASE("the session's join fails on every rank, naming the other user or job, when one machine's rank runs another's collectives") {
  test::Fabric fabric(test::nodes(4));
  auto join = [&](const std::array<engine::JoinOwner, 4>& owners) {
    for (int r = 0; r < 4; ++r) fabric.engine(r).start_join(1, std::chrono::milliseconds(5'000), owners[static_cast<std::size_t>(r)]);
    std::vector<std::optional<Result<std::uint32_t>>> got(4);
    fabric.run_until(
        [&] {
          bool all = true;
          for (int r = 0; r < 4; ++r) {
            if (!got[static_cast<std::size_t>(r)]) got[static_cast<std::size_t>(r)] = fabric.engine(r).join_result();
            all = all && got[static_cast<std::size_t>(r)].has_value();
          }
          return all;
        },
        std::chrono::milliseconds(10'000));
    return got;
  };
  const engine::JoinOwner root{0, 0}, user{1000, 0}, other_job{0, engine::job_tag("job 2")};
  auto got = join({root, root, root, user});
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(got[static_cast<std::size_t>(r)]);
    REQUIRE_FALSE(*got[static_cast<std::size_t>(r)]);
    CHECK(got[static_cast<std::size_t>(r)]->error().code() == Errc::kBusy);
    CHECK_THAT(got[static_cast<std::size_t>(r)]->error().message(), Catch::Contains(r == 3 ? "uid 0" : "uid 1000"));
  }
  // Another job of the same user: refused too, naming it a job.
  got = join({root, other_job, root, root});
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(got[static_cast<std::size_t>(r)]);
    REQUIRE_FALSE(*got[static_cast<std::size_t>(r)]);
    CHECK_THAT(got[static_cast<std::size_t>(r)]->error().message(), Catch::Contains("another job of uid 0"));
  }
  // Once they are gone, the job joins.
  got = join({root, root, root, root});
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(got[static_cast<std::size_t>(r)]);
    CHECK(*got[static_cast<std::size_t>(r)]);
  }
}
