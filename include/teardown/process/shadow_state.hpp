// teardown/process/shadow_state.hpp — the process's one shadow state (whichever copy of
// process.hpp made it): the descriptors the owner holds, the helper's arguments, and the lookup
// that makes every copy share the first exported state. Internal: part of process.hpp.
//
// Who may call what: shared_state any thread (wait-free after the first call, which takes the
// loader's lock in dlsym). The members marked "under mutex" only with shadow_state::mutex held;
// owner and pid are published with release stores and read with acquire loads.
// Design: docs/design.md, "process.hpp: shadow teardown of a whole process (Linux x86-64)".
#pragma once

#include "teardown/process/shadow_helper.hpp"
#include "teardown/process/shadow_options.hpp"

#if TEARDOWN_SHADOW_SUPPORTED

namespace teardown::process {
namespace detail {

// ---- the owner's side ---------------------------------------------------------------------

// A descriptor of ours and what it is (device and inode), so that a number the program reused
// after closing ours is never closed, or signalled through, by mistake.
struct owned_fd {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;

  // Takes `fd` (closes it on failure); false if it cannot be identified.
  bool adopt(int new_fd) noexcept {
    struct stat st {};
    if (fstat(new_fd, &st) != 0) {
      close(new_fd);
      return false;
    }
    fd = new_fd;
    dev = st.st_dev;
    ino = st.st_ino;
    return true;
  }
  bool is_ours() const noexcept {
    struct stat st {};
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
  }
  void close_if_ours() noexcept {
    if (is_ours()) close(fd);
    fd = -1;
    dev = 0;
    ino = 0;
  }
};

struct shadow_state {
  std::mutex mutex;                 // serializes enable, disable and the fork handlers
  // The helper and the process it serves, in one word (serving_word): whoever reads it has both,
  // with no order to pair. 0: none.
  std::atomic<std::uint64_t> helper{0};
  // Under mutex:
  owned_fd write_end;  // the pipe's write end
  owned_fd pidfd;      // the helper's pidfd; fd -1 where the kernel offers none (before 5.3)
  void* stack = nullptr;
  std::size_t stack_bytes = 0;
  bool fork_handlers = false;
  helper_args args;
};

struct serving_ids {
  pid_t owner = 0;  // getpid() of the process the helper serves
  pid_t pid = 0;    // the helper
};
inline std::uint64_t serving_word(serving_ids ids) noexcept {
  return (std::uint64_t{static_cast<std::uint32_t>(ids.owner)} << 32) | static_cast<std::uint32_t>(ids.pid);
}
inline serving_ids serving_helper(const shadow_state& s) noexcept {
  const std::uint64_t word = s.helper.load(std::memory_order_relaxed);  // one word: nothing to order
  return {static_cast<pid_t>(word >> 32), static_cast<pid_t>(word & 0xffffffffu)};
}

// Never destroyed in any way that matters: every member is trivially destructible, so the state
// outlives static destruction and a fork handler can run at any time.
inline constinit shadow_state state{};

}  // namespace detail
}  // namespace teardown::process

// One helper per process, whichever copy of this header starts it. A program built with this
// header and run under libteardown_shadow.so holds two copies (the preload library's, with every
// symbol local, and its own), and a plugin may hold a third: each would see only its own state,
// report no helper while another's lives, and start a second one. So every copy uses the state of
// the first object in the global lookup scope that exports this function (the preload library
// does; a shared object built with this header does; an executable only with -rdynamic), and its
// own where none does. The name carries the layout's version and the argument its size: a copy
// built from another version of the header finds no match and keeps to its own state. Change
// the suffix whenever shadow_state changes.
// (`used`: emitted by every copy, called or not, so that an object that exports it has it.)
extern "C" __attribute__((visibility("default"), used)) inline void* teardown_process_shadow_state_v2(
    unsigned long size) noexcept {
#if TEARDOWN_SHADOW_SUPPORTED
  return size == sizeof(teardown::process::detail::shadow_state) ? &teardown::process::detail::state : nullptr;
#else
  (void)size;
  return nullptr;
#endif
}

namespace teardown::process {
namespace detail {

// The process's one state (above). Looked up once per copy (dlsym takes the loader's lock, which
// a preload constructor already holds: the lock is recursive); constant-initialized, so the cache
// needs no guard. Relaxed: every state it can point to is constant-initialized, so the pointer
// publishes nothing, and a thread that reads null looks it up again and finds the same one.
inline shadow_state& shared_state() noexcept {
  static constinit std::atomic<shadow_state*> cached{nullptr};
  shadow_state* found = cached.load(std::memory_order_relaxed);
  if (found != nullptr) return *found;
  found = &state;
  // Whichever definition comes first answers, ours included: it returns its own object's state.
  if (void* const symbol = dlsym(RTLD_DEFAULT, "teardown_process_shadow_state_v2"); symbol != nullptr) {
    using lookup = void* (*)(unsigned long) noexcept;
    auto* const other = static_cast<shadow_state*>(
        reinterpret_cast<lookup>(reinterpret_cast<std::uintptr_t>(symbol))(sizeof(shadow_state)));
    if (other != nullptr) found = other;
  }
  cached.store(found, std::memory_order_relaxed);
  return *found;
}

}  // namespace detail
}  // namespace teardown::process

#endif  // TEARDOWN_SHADOW_SUPPORTED
