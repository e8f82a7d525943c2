// The cluster key: one secret shared by every aapcd of a cluster, so that
// a node without it cannot forge DATA, SYNC, ABORT or PING frames (wire.hpp, version 2).
#pragma once

#include <string>

#include "aapc/result.hpp"
#include "aapc/wire/wire.hpp"

namespace aapc::engine {

// Reads the key from `path`: 32 raw bytes, or 64 hex digits (a trailing newline allowed), as
// `head -c 32 /dev/urandom > key` or `openssl rand -hex 32 > key` write them. Refuses, with an
// error saying what to do, a file that is not a regular file, that the group or others may
// read or write (mode 0600 or stricter is required), or of another size.
Result<FrameKey> load_cluster_key(const std::string& path);

}  // namespace aapc::engine
