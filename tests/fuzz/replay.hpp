// What replay_main.cpp needs of a fuzz target besides LLVMFuzzerTestOneInput: its seeds, how
// to tell a seed is valid input, and how to repair a mutation's checksum (when it has one).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace aapc::fuzz {

extern const char* const kReplayName;  // the replay program, for messages

std::vector<std::pair<std::string, std::vector<std::uint8_t>>> seeds();
// Empty when `input` is valid input for the target, else why not.
std::string seed_fault(const std::vector<std::uint8_t>& input);
// Makes a mutated input's checksum right again, so mutations reach the checks after it.
void reseal(std::vector<std::uint8_t>& input);

}  // namespace aapc::fuzz
