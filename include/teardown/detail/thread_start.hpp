// teardown/detail/thread_start.hpp — how every thread the library starts begins, and how an
// object knows that the calling thread is its own. Internal: not part of the API.
//
// Who may call what
//   start_thread_with_signals_blocked   any thread; the one pthread_create of the library: the
//                                       new thread blocks every signal sent to the process from
//                                       its first instruction, the fault signals excepted
//                                       (docs/design.md, "Reaper signals"). Returns pthread_create's error.
//   thread_owner<Owner>::mark           the owner's own thread, once, when it starts
//   thread_owner<Owner>::is             any thread: whether it is `owner`'s own thread (the
//                                       calls that would wait for themselves there refuse)
//   calls_here<Tag>::scope, ::contains  any thread: the objects whose call (a reap_on_caller, a
//                                       driven run) is in progress on this thread, however nested
// Memory ordering: none needed. thread_owner and calls_here are thread-local: each thread reads
// only what it wrote itself.
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <pthread.h>
#include <signal.h>

namespace teardown::detail {

// The synchronous fault signals: raised by the kernel on the thread that faults, never left
// blocked on a library thread (see "Signals" in reaper.hpp).
inline constexpr int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};

// pthread_create for every thread the library starts: the new thread blocks every signal sent
// to the process (all but SIGKILL, SIGSTOP, the C library's internal ones and the fault signals)
// from its first instruction, as liburcu's call_rcu threads do, so that a signal meant for the
// program never runs a handler (or the default action) on it. The creating thread blocks that
// set around the call and the new thread inherits it; the caller's own mask is restored before
// returning.
inline int start_thread_with_signals_blocked(pthread_t* thread, void* (*entry)(void*), void* arg) noexcept {
  sigset_t every;
  sigfillset(&every);
  for (const int fault : fault_signals) sigdelset(&every, fault);
  sigset_t callers;
  if (const int error = pthread_sigmask(SIG_SETMASK, &every, &callers); error != 0) return error;
  const int error = pthread_create(thread, nullptr, entry, arg);
  (void)pthread_sigmask(SIG_SETMASK, &callers, nullptr);
  return error;
}

// Which Owner's thread this is: marked by the owner's thread when it starts. One thread-local
// pointer per Owner type, so owners of different types never see each other's mark.
template <class Owner>
class thread_owner {
 public:
  static void mark(const Owner* owner) noexcept { current_ = owner; }
  static bool is(const Owner* owner) noexcept { return owner != nullptr && current_ == owner; }

 private:
  static inline thread_local const Owner* current_ = nullptr;
};

// The objects whose call of one kind (Tag) is in progress on this thread, innermost first: one
// scope per call, linked through the stack. A call nested inside another object's call that is
// itself inside ours (A inside B inside A) still finds ours: every enclosing call is seen, not
// only the innermost, so a call that would wait for itself there is refused, not deadlocked.
template <class Tag>
class calls_here {
 public:
  class scope {
   public:
    explicit scope(const void* object) noexcept : object_(object), outer_(innermost_) { innermost_ = this; }
    ~scope() { innermost_ = outer_; }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    friend class calls_here;
    const void* object_;
    scope* outer_;
  };
  static bool contains(const void* object) noexcept {
    for (const scope* call = innermost_; call != nullptr; call = call->outer_) {
      if (call->object_ == object) return true;
    }
    return false;
  }

 private:
  static inline thread_local scope* innermost_ = nullptr;
};

}  // namespace teardown::detail
