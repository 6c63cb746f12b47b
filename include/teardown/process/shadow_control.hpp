// teardown/process/shadow_control.hpp — the owner's side of shadow teardown: start, watch,
// kill and reap the helper, and the four public calls. Internal: part of process.hpp, which is
// the header to include; the contract is there.
// Design: docs/design.md, "process.hpp: shadow teardown of a whole process (Linux x86-64)".
#pragma once

#include "teardown/process/shadow_helper.hpp"
#include "teardown/process/shadow_options.hpp"
#include "teardown/process/shadow_state.hpp"

namespace teardown::process {
namespace detail {

#if TEARDOWN_SHADOW_SUPPORTED

[[noreturn]] inline void throw_errno(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), "teardown::process::enable_shadow_teardown: " + what);
}

// Whether this process runs under valgrind, which cannot run a clone(CLONE_VM) process that is
// not a thread: it ends the whole program ("Unsupported clone() flags ... Valgrind has to exit
// now"). Its client request is exact where valgrind's header was found; without it, valgrind's
// own objects in our mappings tell: the preload object its core injects into every dynamically
// linked program, and the tool itself (<tool>-<arch>-linux), mapped into every program it runs.
inline bool under_valgrind() noexcept {
#if defined(TEARDOWN_SHADOW_VALGRIND_H)
  return RUNNING_ON_VALGRIND != 0;
#else
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no /proc: nothing to go by
  std::string maps;
  char chunk[4096];
  for (;;) {
    const ssize_t got = read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    maps.append(chunk, static_cast<std::size_t>(got));
  }
  close(fd);
  for (std::size_t at = 0; at < maps.size();) {
    std::size_t end = maps.find('\n', at);
    if (end == std::string::npos) end = maps.size();
    const std::string_view line(maps.data() + at, end - at);
    if (line.find("/vgpreload_core-") != std::string_view::npos) return true;
    if (line.find("/valgrind/") != std::string_view::npos && line.ends_with("-linux")) return true;
    at = end + 1;
  }
  return false;
#endif
}

// Makes the shared object that holds `code` permanent (RTLD_NODELETE), so that a dlclose() leaves
// it mapped. Nothing to do for the program itself, or for code outside any object dladdr knows
// (a static program: nothing there can be unloaded).
inline void pin_object(const void* code) {
  Dl_info object{};
  if (dladdr(code, &object) == 0 || object.dli_fname == nullptr) return;
  Dl_info program{};
  const unsigned long program_headers = getauxval(AT_PHDR);
  if (program_headers != 0 && dladdr(reinterpret_cast<const void*>(program_headers), &program) != 0 &&
      program.dli_fbase == object.dli_fbase) {
    return;
  }
  // The extra reference is never dropped: the object stays for the life of the process.
  if (dlopen(object.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE) == nullptr) {
    throw_errno(ELIBACC, std::string("cannot keep ") + object.dli_fname +
                             " loaded for the helper (dlopen with RTLD_NOLOAD | RTLD_NODELETE failed)");
  }
}

// The helper runs this header's code and reads `state`, in whichever objects hold them: the
// program, or a shared object (a plugin) that a dlclose() would unmap under the running helper,
// which would crash on its next wake-up. Both stay loaded for the life of the process. Not under
// the mutex: dlopen takes the loader's lock, which a plugin's constructor that enables holds.
// Once per copy of this header: the helper runs the code of the copy that starts it.
inline void pin_code(shadow_state& s) {
  static constinit std::atomic<bool> pinned{false};
  if (pinned.load(std::memory_order_relaxed)) return;
  pin_object(reinterpret_cast<const void*>(&helper_main));
  pin_object(&s);
  pinned.store(true, std::memory_order_relaxed);
}

// Kills this process's helper unless it has exited already, and reaps it. Never signals or reaps
// another process, even after a waiter of the program's (waitpid with __WALL or __WCLONE) reaped
// the helper behind our back and its pid went to a new process:
//   - the word reads nonzero until the helper exits (the kernel clears it then), and a pid is
//     reused only after its process has exited and been reaped: a helper whose word reads zero
//     is not signalled;
//   - with a pidfd (CLONE_PIDFD, Linux 5.2; pidfd_open, 5.3), the signal and the wait name the
//     process, not a number: pidfd_send_signal and waitid(P_PIDFD) cannot reach another one, and
//     return ESRCH / ECHILD once it is gone;
//   - without one (older kernels, or a sandbox that refuses both), kill() and waitpid() take the
//     number that the word vouched for just before: only a waiter that reaps the helper between
//     that check and the kill, with a new process taking the number in that instant, could
//     still be hit.
// Under the mutex.
inline void kill_and_reap(shadow_state& s, pid_t pid) noexcept {
  const bool by_pidfd = s.pidfd.is_ours();
  if (load_word(s.args.word) != word_exited) {
    if (by_pidfd) {
      (void)syscall(nr_pidfd_send_signal, s.pidfd.fd, SIGKILL, nullptr, 0);
    } else {
      (void)kill(pid, SIGKILL);
    }
  }
  if (s.args.detached) {
    // Not our child: init or a subreaper reaps it. Its exit is what counts, and the kernel
    // clears the word then (before the reaper can see it).
    for (int word = load_word(s.args.word); word != word_exited; word = load_word(s.args.word)) {
      (void)syscall(SYS_futex, &s.args.word, FUTEX_WAIT, word, nullptr, nullptr, 0);
    }
  } else if (by_pidfd) {
    siginfo_t info{};
    while (syscall(SYS_waitid, waitid_by_pidfd, s.pidfd.fd, &info, WEXITED | __WALL, nullptr) < 0 && errno == EINTR) {
    }
  } else {
    int status = 0;
    while (waitpid(pid, &status, static_cast<int>(__WCLONE)) < 0 && errno == EINTR) {
    }
  }
}

// Closes what this process holds for a helper that is gone (reaped, or never ours: a raw-clone
// child of the owner). Under the mutex.
inline void forget_helper(shadow_state& s, bool unmap_stack) noexcept {
  s.write_end.close_if_ours();
  s.pidfd.close_if_ours();
  if (unmap_stack && s.stack != nullptr) munmap(s.stack, s.stack_bytes);
  s.stack = nullptr;
  s.stack_bytes = 0;
  s.helper.store(0, std::memory_order_relaxed);  // one word, read whole: nothing to order
}

// Kills (when alive) and reaps this process's helper, then forgets it. Under the mutex.
inline void retire_helper(shadow_state& s) noexcept {
  const auto [owner, pid] = serving_helper(s);
  if (owner != getpid() || pid == 0) {
    forget_helper(s, false);  // a copy inherited without the fork handlers: nothing of it is ours
    return;
  }
  kill_and_reap(s, pid);
  forget_helper(s, true);
}

inline void register_fork_handlers(shadow_state& s) {
  if (s.fork_handlers) return;
  // Registered once per process (the flag is in the shared state): two copies' handlers would
  // lock the one mutex twice.
  const int error = pthread_atfork([] { shared_state().mutex.lock(); }, [] { shared_state().mutex.unlock(); },
                                   [] {
                                     // The child's stack copy does not exist (MADV_DONTFORK); the
                                     // helper is the parent's.
                                     shadow_state& st = shared_state();
                                     forget_helper(st, false);
                                     store_word_relaxed(st.args.word, word_exited);
                                     st.mutex.unlock();
                                   });
  if (error != 0) throw_errno(error, "pthread_atfork");
  s.fork_handlers = true;
}

// A descriptor moved off 0..2, which programs redirect with dup2 (and so would close it); -1 and
// errno if that fails (`fd` is closed either way).
inline int off_standard_streams(int fd) noexcept {
  if (fd > 2) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  const int error = errno;
  close(fd);
  errno = error;
  return moved;
}

// Creates the helper; on any failure throws with nothing left behind. Under the mutex.
inline pid_t start_helper(shadow_state& s, const shadow_options& options) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw_errno(errno, "pipe2");
  int read_fd = fds[0];
  const int write_fd = off_standard_streams(fds[1]);
  if (write_fd < 0) {
    const int error = errno;
    close(read_fd);
    throw_errno(error, "fcntl(F_DUPFD_CLOEXEC)");
  }
  owned_fd write_end;
  if (!write_end.adopt(write_fd)) {
    const int error = errno;
    close(read_fd);
    throw_errno(error, "fstat");
  }
  auto close_pipe = [&] {
    if (read_fd >= 0) close(read_fd);
    close(write_end.fd);
  };

  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t usable = (options.stack_size + page - 1) / page * page;
  const std::size_t bytes = usable + page;
  void* const base = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    close_pipe();
    throw_errno(error, "mmap (the helper's stack)");
  }
  auto* const low = static_cast<unsigned char*>(base);
  if (mprotect(low + page, usable, PROT_READ | PROT_WRITE) != 0) {
    const int error = errno;
    munmap(base, bytes);
    close_pipe();
    throw_errno(error, "mprotect (the helper's stack)");
  }
  // A fork child must not inherit a copy: nothing there would use it. Advice only.
  (void)madvise(base, bytes, MADV_DONTFORK);

  rlimit files{};
  const unsigned long fd_limit =
      getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY ? files.rlim_cur : 1024 * 1024;
  const pid_t self = getpid();
  s.args.owner = self;
  s.args.read_fd = read_fd;
  s.args.nice = options.nice;
  s.args.sched_idle = options.sched_idle;
  s.args.detached = options.detached;
  s.args.fd_limit = fd_limit;
  // The calling thread's clear-child-tid word (the C library's, which holds its tid): the helper
  // watches it to see an exec() that the pipe misses, when the program cleared FD_CLOEXEC on the
  // write end. Needs PR_GET_TID_ADDRESS (CONFIG_CHECKPOINT_RESTORE); else the pipe alone.
  int* tid_word = nullptr;
  s.args.watch_word = nullptr;
  s.args.watch_value = 0;
  if (prctl(PR_GET_TID_ADDRESS, &tid_word, 0, 0, 0) == 0 && tid_word != nullptr) {
    const int tid = static_cast<int>(syscall(SYS_gettid));
    if (__atomic_load_n(tid_word, __ATOMIC_RELAXED) == tid) {  // our own thread's word: nothing to order
      s.args.watch_word = tid_word;
      s.args.watch_value = tid;
    }
  }
  const std::size_t name_length = options.name.size() < 15 ? options.name.size() : 15;
  for (std::size_t i = 0; i < sizeof s.args.name; ++i) s.args.name[i] = i < name_length ? options.name[i] : '\0';
  store_word_relaxed(s.args.word, word_starting);

  // Every signal blocked across the clone, the two glibc keeps for itself included (which
  // pthread_sigmask would leave out): the helper inherits this mask and keeps it.
  const std::uint64_t all = ~std::uint64_t{0};
  std::uint64_t previous = 0;
  (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &previous, sizeof all);
  // The pidfd comes with the clone, so that it names the helper before anyone can reap it. A
  // sandbox may refuse the flag (a filter that allows known clone flags only); kernels before 5.2
  // ignore it. Either way the helper works the same, with the word as its identity (above).
  const unsigned long flags = CLONE_VM | CLONE_CHILD_CLEARTID;
  int pidfd = -1;
  long cloned = 0;
  if (options.detached) {
    // The intermediate runs on the lowest 4 KiB above the guard page (it needs a few hundred
    // bytes), the helper from the top, so the two never meet.
    s.args.helper_stack_top = low + bytes;
    s.args.detach_result = 0;
    s.args.detach_pidfd = -1;
    store_word_relaxed(s.args.detach_word, 1);
    int unused = -1;
    const long intermediate = helper_clone(CLONE_VM | CLONE_FILES | CLONE_CHILD_CLEARTID, low + page + 4096, &unused,
                                           &s.args.detach_word, &s.args, &helper_detach_main);
    if (intermediate < 0) {
      cloned = intermediate;
    } else {
      for (int word = load_word(s.args.detach_word); word != 0; word = load_word(s.args.detach_word)) {
        (void)syscall(SYS_futex, &s.args.detach_word, FUTEX_WAIT, word, nullptr, nullptr, 0);
      }
      // Reap it (it has exit signal 0: nobody is told); ECHILD if a __WALL waiter did.
      int status = 0;
      while (waitpid(static_cast<pid_t>(intermediate), &status, static_cast<int>(__WCLONE)) < 0 && errno == EINTR) {
      }
      // Relaxed: after the intermediate's exit (see helper_detach_main), nothing to pair with.
      cloned = __atomic_load_n(&s.args.detach_result, __ATOMIC_RELAXED);
      pidfd = cloned >= 0 ? s.args.detach_pidfd : -1;
    }
  } else {
    cloned = helper_clone(flags | clone_pidfd, low + bytes, &pidfd, &s.args.word, &s.args);
    if (cloned < 0) {
      pidfd = -1;
      cloned = helper_clone(flags, low + bytes, &pidfd, &s.args.word, &s.args);
    }
  }
  (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, &previous, nullptr, sizeof previous);
  close(read_fd);  // the helper has its own copy
  read_fd = -1;
  if (cloned < 0) {
    munmap(base, bytes);
    close_pipe();
    store_word_relaxed(s.args.word, word_exited);
    throw_errno(static_cast<int>(-cloned), "clone(CLONE_VM)");
  }
  const auto pid = static_cast<pid_t>(cloned);
  // The helper cannot be reaped before it reports unless it is killed: pidfd_open names it too.
  if (pidfd < 0) pidfd = static_cast<int>(syscall(nr_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pidfd = off_standard_streams(pidfd);
    if (pidfd >= 0) (void)s.pidfd.adopt(pidfd);  // unidentifiable: go on without it
  }

  // Wait for the report. The bound only guards against a helper stopped before it reported.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int word = load_word(s.args.word);
  while (word == word_starting) {
    const auto left = give_up - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) break;
    const auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(
        left < std::chrono::seconds(1) ? left : std::chrono::nanoseconds(std::chrono::seconds(1)));
    // rep is long, as time_t and tv_nsec
    timespec timeout{slice.count() / 1'000'000'000, slice.count() % 1'000'000'000};
    (void)syscall(SYS_futex, &s.args.word, FUTEX_WAIT, word_starting, &timeout, nullptr, 0);
    word = load_word(s.args.word);
  }
  if (word == word_ready) {
    s.write_end = write_end;
    s.stack = base;
    s.stack_bytes = bytes;
    s.helper.store(serving_word({self, pid}), std::memory_order_relaxed);  // one word: nothing to order
    return pid;
  }
  kill_and_reap(s, pid);
  s.pidfd.close_if_ours();
  munmap(base, bytes);
  close_pipe();
  store_word_relaxed(s.args.word, word_exited);
  if (word == word_starting) throw_errno(ETIMEDOUT, "the helper did not report within 30 s");
  if (word == word_exited) throw_errno(ECHILD, "the helper died while it was being set up");
  throw_errno(word & 0xffff, std::string("the helper's ") + step_description(word >> 16) + " failed");
}

#endif  // TEARDOWN_SHADOW_SUPPORTED

}  // namespace detail

inline pid_t enable_shadow_teardown(const shadow_options& options) {
  detail::check_shadow_options(options);
#if TEARDOWN_SHADOW_SUPPORTED
  if (detail::under_valgrind()) {
    detail::throw_errno(ENOTSUP, "valgrind cannot run the helper (a clone(CLONE_VM) process that is not a thread)");
  }
  detail::shadow_state& s = detail::shared_state();
  detail::pin_code(s);
  const std::lock_guard lock(s.mutex);
  detail::register_fork_handlers(s);
  if (const auto [owner, pid] = detail::serving_helper(s); owner == getpid() && pid != 0 &&
      detail::load_word(s.args.word) == detail::word_ready) {
    return pid;
  }
  detail::retire_helper(s);  // a dead one, or one inherited without the fork handlers
  return detail::start_helper(s, options);
#else
  throw std::system_error(ENOSYS, std::generic_category(),
                          "teardown::process::enable_shadow_teardown: not implemented on this platform "
                          "(Linux on x86-64 only)");
#endif
}

inline void disable_shadow_teardown() noexcept {
#if TEARDOWN_SHADOW_SUPPORTED
  detail::shadow_state& s = detail::shared_state();
  const std::lock_guard lock(s.mutex);
  detail::retire_helper(s);
#endif
}

inline bool shadow_teardown_enabled() noexcept { return shadow_pid() != 0; }

inline pid_t shadow_pid() noexcept {
#if TEARDOWN_SHADOW_SUPPORTED
  detail::shadow_state& s = detail::shared_state();
  // One word: a reader has the helper's pid with the owner it serves, never one retired before.
  const auto [owner, pid] = detail::serving_helper(s);
  if (owner != getpid()) return 0;
  return pid != 0 && detail::load_word(s.args.word) == detail::word_ready ? pid : 0;
#else
  return 0;
#endif
}

}  // namespace teardown::process
