// Synchronisation planning for phased schedules (Faraj/Yuan/Patarasuk section 5).
#pragma once

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/schedule.hpp"
#include "aapc/sched/topology.hpp"

namespace aapc::sched {

// Returns `schedule` with the synchronisation of `spec`: the programs are rebuilt from the
// phases and carry, for each round, the tokens it waits for and emits (and, for
// receiver-based tokens, what each node emits when a block is complete). Barriers become
// dissemination barriers made of tokens (ceil(log2 N) stages of empty rounds), so the engine
// only ever executes tokens.
//
// Only the orderings that matter are computed: two messages need ordering only when they
// share a directed edge, and it is enough to order consecutive users of each edge (the rest
// follows transitively). A token is then dropped when vector clocks over the plan built so
// far show that its ordering already holds (a redundant synchronisation), so the plan costs
// about O(|M|^3) instead of the paper's O(|M|^6).
//
// Throws std::invalid_argument for a packet-level or combining schedule with a sync other than
// none (a combining schedule keeps its own local tokens).
Schedule plan_sync(const Topology& topology, const Schedule& schedule, const SyncSpec& spec);

// The same plan, of which only `node`'s part is kept (Schedule::part): its program and the
// syncs it emits or waits for, as plan_sync() makes them. What a daemon runs: the tokens are
// chosen over the whole cluster as above, but the other nodes' programs and tokens are never
// kept (at 4,096 machines the whole plan takes gigabytes; docs/scale.md). `schedule` is taken
// by value: a schedule moved in gives its programs up before the plan is made.
Schedule plan_sync_part(const Topology& topology, Schedule schedule, const SyncSpec& spec, Rank node);

// plan_sync_part() of make_schedule(topology, algorithm), where the schedule's builder need not
// make the programs that the planner would throw away (BuildInput::programs): what a daemon
// plans for its first exchange of a spec.
Schedule plan_part(const Topology& topology, const AlgorithmSpec& algorithm, const SyncSpec& spec, Rank node);

}  // namespace aapc::sched
