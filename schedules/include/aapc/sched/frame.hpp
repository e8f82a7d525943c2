// What an aapc frame holds besides a block's bytes, in bytes. The wire lays its headers out to
// these lengths (aapc/wire/wire.hpp takes its constants from here), and the schedules count
// frames with them: auto_choice() sizes tiny blocks against one frame's payload, predict() a
// block's frames on the wire. Defined here, below both: schedules/ includes no engine header,
// and the engine may include schedules' (docs/internals.md, "Layout").
#pragma once

#include <cstddef>

namespace aapc::sched {

inline constexpr std::size_t kFrameEthHeaderBytes = 14;     // destination, source, EtherType
inline constexpr std::size_t kFrameControlHeaderBytes = 44;  // every frame but DATA
inline constexpr std::size_t kFrameDataHeaderBytes = 30;     // DATA: only what every frame needs
inline constexpr std::size_t kFrameTagBytes = 24;            // with a cluster key: counter (8) + MAC (16)

}  // namespace aapc::sched
