// teardown/detail/fork.hpp — what a live worker does around fork(): one registry of
// pthread_atfork participants, and the check "is this still the process that started me".
// Internal: not part of the API.
//
// Who may call what
//   fork_registry::instance, add, remove   any thread; add and remove take the registry lock,
//                                          which fork() holds from prepare to parent/child
//                                          (so no worker is created or destroyed across a fork)
//   fork_participant's three handlers      the registry only, from fork()'s atfork handlers,
//                                          under that lock; they must not call add or remove
//   creator_process::here                  any thread; one getpid() system call
// Memory ordering: the participant set is guarded by the registry's mutex.
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <pthread.h>
#include <sys/types.h>
#include <unistd.h>

#include <mutex>
#include <set>

namespace teardown::detail {

// Every live reaper (a pool's workers included), for the pthread_atfork handlers.
class fork_participant {
 public:
  virtual void fork_prepare() noexcept = 0;
  virtual void fork_parent() noexcept = 0;
  virtual void fork_child() noexcept = 0;

 protected:
  ~fork_participant() = default;
};

class fork_registry {
 public:
  static fork_registry& instance() {
    // Never destroyed: a fork may happen while static destructors run.
    static fork_registry* const registry = [] {
      auto* created = new fork_registry;
      // No ordering against the shard index registry's handlers is needed: it has none (it
      // takes no lock; counter.hpp), so a worker parked here never waits on it.
      pthread_atfork(&prepare, &parent, &child);
      return created;
    }();
    return *registry;
  }

  void add(fork_participant* participant) {
    const std::lock_guard lock(mutex_);
    participants_.insert(participant);
  }
  void remove(fork_participant* participant) noexcept {
    const std::lock_guard lock(mutex_);
    participants_.erase(participant);
  }

 private:
  // The registry stays locked from prepare to parent/child, so no reaper is created or
  // destroyed across the fork.
  static void prepare() noexcept {
    instance().mutex_.lock();
    for (fork_participant* p : instance().participants_) p->fork_prepare();
  }
  static void parent() noexcept {
    for (fork_participant* p : instance().participants_) p->fork_parent();
    instance().mutex_.unlock();
  }
  static void child() noexcept {
    for (fork_participant* p : instance().participants_) p->fork_child();
    instance().mutex_.unlock();
  }

  std::mutex mutex_;
  std::set<fork_participant*> participants_;  // guarded by mutex_
};

// The process an object's thread was started in. In a fork child that thread does not exist:
// joining it, or waking it, would wait for ever, so stop paths ask here() first.
class creator_process {
 public:
  bool here() const noexcept { return ::getpid() == pid_; }
  pid_t pid() const noexcept { return pid_; }

 private:
  pid_t pid_ = ::getpid();
};

}  // namespace teardown::detail
