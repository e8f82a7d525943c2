// The builders of the registry's algorithms (not installed), declared from their rows in
// aapc/sched/algorithms.def; each is defined beside the algorithm it builds.
#pragma once

#include "aapc/sched/algorithms.hpp"

namespace aapc::sched {

#define AAPC_ALGORITHM(ID, NAME, PARAM, DEFAULT, KIND, INPUT, SYNC, BUILDER, DESCRIPTION) Schedule BUILDER(const BuildInput& in);
#include "aapc/sched/algorithms.def"
#undef AAPC_ALGORITHM

}  // namespace aapc::sched
