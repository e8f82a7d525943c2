// A case that cannot run on this machine (not root, one CPU, no such group) says why and
// stops: AAPC_SKIP(why). The runner (catch_main.cpp) lists the skipped cases after the run and
// exits 77, meson's "skipped", when every case it ran was skipped, so that a test that could
// not run is never reported as passed. Cases that may be skipped carry a tag ([root], [cpus])
// and tests/meson.build runs them as a test of their own.
#pragma once

#include <string>

namespace aapc::test {

// Records that the running case is skipped, and why.
void skip(const std::string& why);

}  // namespace aapc::test

#define AAPC_SKIP(why)          \
  do {                          \
    ::aapc::test::skip(why);    \
    return;                     \
  } while (false)
