// A body with a stack of its own: see aapc/mpi/fiber.hpp.
#include "aapc/mpi/fiber.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define AAPC_FIBER_ASAN 1
#endif

namespace aapc::mpi {

namespace {

// AddressSanitizer keeps its own record of the stack in use: each switch is announced before
// it is made and confirmed after (sanitizer/common_interface_defs.h).
void announce(void** fake, const void* bottom, std::size_t size) {
#ifdef AAPC_FIBER_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}

void arrived(void* fake, const void** old_bottom, std::size_t* old_size) {
#ifdef AAPC_FIBER_ASAN
  __sanitizer_finish_switch_fiber(fake, old_bottom, old_size);
#else
  (void)fake, (void)old_bottom, (void)old_size;
#endif
}

}  // namespace

Fiber::Fiber(std::function<void()> body, std::size_t stack_bytes) : body_(std::move(body)) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  guard_ = page;
  stack_bytes_ = (stack_bytes + page - 1) / page * page;
  // A page below the stack that faults: an overflow stops there rather than in other memory.
  void* m = ::mmap(nullptr, guard_ + stack_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  ::mprotect(m, guard_, PROT_NONE);
  stack_ = static_cast<std::uint8_t*>(m) + guard_;
  if (::getcontext(&self_) != 0) throw std::runtime_error("getcontext failed");
  self_.uc_stack.ss_sp = stack_;
  self_.uc_stack.ss_size = stack_bytes_;
  self_.uc_link = nullptr;  // run() never returns: it switches out for the last time
  const auto me = reinterpret_cast<std::uintptr_t>(this);
  makecontext(&self_, reinterpret_cast<void (*)()>(&Fiber::entry), 2, static_cast<unsigned>(me >> 32), static_cast<unsigned>(me & 0xffffffffU));
}

Fiber::~Fiber() { ::munmap(static_cast<std::uint8_t*>(stack_) - guard_, guard_ + stack_bytes_); }

void Fiber::entry(unsigned hi, unsigned lo) {
  reinterpret_cast<Fiber*>((static_cast<std::uintptr_t>(hi) << 32) | lo)->run();
}

void Fiber::run() {
  arrived(nullptr, &caller_bottom_, &caller_size_);
  try {
    body_();
  } catch (...) {
    failure_ = std::current_exception();
  }
  ended_ = true;
  switch_out(true);
}

// From the body to resume()'s caller; back here at the next resume() unless `last`.
void Fiber::switch_out(bool last) {
  announce(last ? nullptr : &fake_stack_, caller_bottom_, caller_size_);
  ::swapcontext(&self_, &caller_);
  arrived(fake_stack_, &caller_bottom_, &caller_size_);
}

bool Fiber::resume() {
  if (ended_) return true;
  if (inside_) throw std::logic_error("Fiber::resume from inside its body");
  inside_ = true;
  void* fake = nullptr;
  announce(&fake, stack_, stack_bytes_);
  ::swapcontext(&caller_, &self_);
  arrived(fake, nullptr, nullptr);
  inside_ = false;
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  return ended_;
}

void Fiber::pause() {
  if (!inside_) throw std::logic_error("Fiber::pause outside its body");
  switch_out(false);
}

}  // namespace aapc::mpi
