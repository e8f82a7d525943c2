// A body of code with a stack of its own that can pause itself and be resumed later where it
// paused: libaapc-mpi makes a communicator's plan in one, so that an MPI_Ialltoall returns at
// once however many steps of agreement the plan needs (plan.cpp). Without MPI; glibc's
// ucontext, with AddressSanitizer told of every switch.
//
// Not thread-safe: one thread at a time resumes a fiber (libaapc-mpi holds its process's lock
// for it), and the body keeps nothing thread-local across a pause.
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <exception>
#include <functional>

namespace aapc::mpi {

class Fiber {
 public:
  explicit Fiber(std::function<void()> body, std::size_t stack_bytes = std::size_t{1} << 20);
  ~Fiber();  // a paused body is dropped where it paused: let it end first
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Runs the body until it pauses or ends; true once it has ended. An exception that the body
  // let out is thrown here. Not from inside the body.
  bool resume();
  // From inside the body: back to resume()'s caller, until the next resume().
  void pause();
  bool ended() const { return ended_; }

 private:
  static void entry(unsigned hi, unsigned lo);  // makecontext passes ints
  void run();
  void switch_out(bool last);

  std::function<void()> body_;
  void* stack_ = nullptr;
  std::size_t stack_bytes_ = 0;
  std::size_t guard_ = 0;
  ucontext_t self_{}, caller_{};
  bool ended_ = false, inside_ = false;
  std::exception_ptr failure_;
  // AddressSanitizer's view of the two stacks (unused without it).
  void* fake_stack_ = nullptr;
  const void* caller_bottom_ = nullptr;
  std::size_t caller_size_ = 0;
};

}  // namespace aapc::mpi
