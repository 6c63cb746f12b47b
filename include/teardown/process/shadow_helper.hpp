// teardown/process/shadow_helper.hpp — the shadow helper's own code: what runs in the clone
// that shares the program's address space. Raw system calls only, no thread-local storage, no
// instrumentation (TEARDOWN_SHADOW_HELPER_CODE). Internal: part of process.hpp.
//
// Who may call what: helper_* run only on the helper (and a detached helper's intermediate),
// never on a thread of the program's, helper_clone excepted (the owner calls it). The word
// helper_args::word is the one thing the owner and the helper share while the helper lives:
// a store plus FUTEX_WAKE here, load_word there, relaxed both (process.hpp, "Memory ordering").
// Design: docs/design.md, "process.hpp: shadow teardown of a whole process (Linux x86-64)".
#pragma once

#include "teardown/process/shadow_options.hpp"

#if TEARDOWN_SHADOW_SUPPORTED

namespace teardown::process::detail {

// The word the helper reports through (and the kernel clears when the helper exits).
inline constexpr int word_exited = 0;    // CLONE_CHILD_CLEARTID: the helper is gone
inline constexpr int word_ready = 1;     // set up and waiting
inline constexpr int word_starting = 2;  // cloned, not yet reported
// Any other value is a failure: (step << 16) | errno.
enum helper_step : int { step_name = 1, step_parent_death, step_close, step_nice, step_policy, step_signalfd };

inline const char* step_description(int step) noexcept {
  switch (step) {
    case step_name: return "prctl(PR_SET_NAME)";
    case step_parent_death: return "prctl(PR_SET_PDEATHSIG)";
    case step_close: return "close_range";
    case step_nice: return "setpriority";
    case step_policy: return "sched_setscheduler(SCHED_IDLE)";
    case step_signalfd: return "signalfd";
    default: return "an unknown step";
  }
}

inline constexpr int parent_death_signal = SIGHUP;

// System calls and flags newer than some C libraries' headers: the same numbers on every
// architecture.
#if defined(SYS_close_range)
inline constexpr long sys_close_range = SYS_close_range;
#else
inline constexpr long sys_close_range = 436;
#endif
inline constexpr unsigned long clone_pidfd = 0x00001000;  // CLONE_PIDFD, Linux 5.2

// What the helper reads. In static storage of the shared memory: written by the owner before the
// clone, read by the helper afterwards; the owner writes it again only once that helper is
// reaped.
struct helper_args {
  alignas(64) int word = word_exited;  // only through __atomic builtins (the kernel writes it too)
  pid_t owner = 0;
  int read_fd = -1;
  int nice = 19;
  bool sched_idle = false;
  bool detached = false;
  unsigned long fd_limit = 0;  // close one by one below this when close_range is missing
  char name[16] = {};
  // The enabling thread's clear-child-tid word (PR_GET_TID_ADDRESS) and the tid it holds; null
  // where unknown. The kernel clears it and wakes its futex when that thread leaves the address
  // space: its exit, the process's exit, and an exec() by any thread.
  int* watch_word = nullptr;
  int watch_value = 0;
  // Detached: what the intermediate needs, and what it reports (the helper's pid or -errno, and
  // its pidfd or -1). The intermediate's own clear-child-tid word tells the owner it is done.
  alignas(64) int detach_word = 0;
  long detach_result = 0;
  int detach_pidfd = -1;
  void* helper_stack_top = nullptr;
};

// The word is a plain int because the kernel writes it (CLONE_CHILD_CLEARTID) and futexes wait on
// its address; the __atomic builtins make every access of ours atomic, are seen by
// ThreadSanitizer, and exist with every standard library (libc++ 14 has no std::atomic_ref).
// Relaxed: the word's value is the whole report (process.hpp, "Memory ordering").
inline int load_word(const int& word) noexcept { return __atomic_load_n(&word, __ATOMIC_RELAXED); }
inline void store_word_relaxed(int& word, int value) noexcept { __atomic_store_n(&word, value, __ATOMIC_RELAXED); }

// ---- the helper's code: raw system calls only, no thread-local storage, no instrumentation ----
//
// The helper runs with the creating thread's thread pointer but is not that thread, and nothing
// of the program may run on it. So each of its functions carries every attribute that keeps a
// compiler from adding calls or thread-local accesses to it:
//   no_instrument_function          -finstrument-functions, -p, -pg: the program's own
//                                   __cyg_profile_func_enter/exit, or mcount.
//   no_profile_instrument_function  -fprofile-generate/-fprofile-arcs/-fprofile-instr-generate:
//                                   counters, and GCC's indirect-call profiler (thread-local).
//   no_sanitize(...)                ASan, TSan, UBSan, MSan and safe-stack keep per-thread state or
//   disable_sanitizer_instrumentation  call runtime hooks; Clang's no_sanitize("thread") still
//                                   emits TSan's function entry and exit hooks, which
//                                   disable_sanitizer_instrumentation removes (Clang 14 still
//                                   needs no_sanitize for ASan and UBSan).
//   no_sanitize_coverage, "coverage" -fsanitize-coverage's callbacks, which programs define.
//   xray_never_instrument           Clang's XRay, whose handler the program installs.
//   no_stack_protector              the canary is thread-local: a read would use the calling
//                                   thread's block, which is gone if that thread has exited.
// (-fsplit-stack, which keeps the stack limit in thread-local storage, is not covered: GCC
// accepts no_split_stack only before a function's definition.)
// tests/unit/process_test.cpp checks the machine code (no call out, no %fs), and
// tests/unit/process_instrument_test.cpp runs it under -finstrument-functions.

#if defined(__clang__) && __has_attribute(disable_sanitizer_instrumentation)
#define TEARDOWN_SHADOW_NO_SANITIZE \
  __attribute__((disable_sanitizer_instrumentation, \
                 no_sanitize("address", "thread", "undefined", "memory", "safe-stack", "coverage")))
#elif defined(__clang__)
#define TEARDOWN_SHADOW_NO_SANITIZE \
  __attribute__((no_sanitize("address", "thread", "undefined", "memory", "safe-stack", "coverage")))
#else
#define TEARDOWN_SHADOW_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
#endif
#if __has_attribute(no_sanitize_coverage)
#define TEARDOWN_SHADOW_NO_COVERAGE __attribute__((no_sanitize_coverage))
#else
#define TEARDOWN_SHADOW_NO_COVERAGE
#endif
#if __has_attribute(no_profile_instrument_function)
#define TEARDOWN_SHADOW_NO_PROFILE __attribute__((no_profile_instrument_function))
#else
#define TEARDOWN_SHADOW_NO_PROFILE
#endif
#if __has_attribute(xray_never_instrument)
#define TEARDOWN_SHADOW_NO_XRAY __attribute__((xray_never_instrument))
#else
#define TEARDOWN_SHADOW_NO_XRAY
#endif
#if __has_attribute(no_stack_protector)
#define TEARDOWN_SHADOW_NO_CANARY __attribute__((no_stack_protector))
#else
#define TEARDOWN_SHADOW_NO_CANARY __attribute__((optimize("no-stack-protector")))
#endif
#define TEARDOWN_SHADOW_HELPER_CODE                                                                    \
  __attribute__((no_instrument_function)) TEARDOWN_SHADOW_NO_SANITIZE TEARDOWN_SHADOW_NO_COVERAGE      \
  TEARDOWN_SHADOW_NO_PROFILE TEARDOWN_SHADOW_NO_XRAY TEARDOWN_SHADOW_NO_CANARY

// A system call that leaves errno alone: returns the result, or -errno.
TEARDOWN_SHADOW_HELPER_CODE inline long helper_syscall(long number, long a1 = 0, long a2 = 0, long a3 = 0,
                                                       long a4 = 0, long a5 = 0) noexcept {
  long result = number;
  __asm__ volatile(
      "mov %[a4], %%r10\n\t"
      "mov %[a5], %%r8\n\t"
      "syscall"
      : "+a"(result)
      : "D"(a1), "S"(a2), "d"(a3), [a4] "r"(a4), [a5] "r"(a5)
      : "rcx", "r8", "r10", "r11", "memory", "cc");
  return result;
}

[[noreturn]] TEARDOWN_SHADOW_HELPER_CODE inline void helper_exit() noexcept {
  for (;;) helper_syscall(SYS_exit, 0);
}

TEARDOWN_SHADOW_HELPER_CODE inline void helper_publish(helper_args* args, int value) noexcept {
  // Relaxed: the value is the whole report; what the helper did before are system calls, whose
  // effects the kernel orders, and it wrote no memory that the owner reads.
  __atomic_store_n(&args->word, value, __ATOMIC_RELAXED);
  // Not FUTEX_PRIVATE: the owner waits with a shared futex, as the kernel's clear-and-wake on
  // exit uses one, and the two kinds do not wake each other.
  helper_syscall(SYS_futex, reinterpret_cast<long>(&args->word), FUTEX_WAKE, INT_MAX);
}

// Reports the failed step and waits for the owner to kill it (exiting would let the kernel
// clear the word before the owner has read it).
[[noreturn]] TEARDOWN_SHADOW_HELPER_CODE inline void helper_fail(helper_args* args, int step, long result) noexcept {
  helper_publish(args, (step << 16) | static_cast<int>(-result & 0xffff));
  for (;;) helper_syscall(SYS_ppoll, 0, 0, 0, 0, 0);  // no descriptors, no timeout
}

TEARDOWN_SHADOW_HELPER_CODE inline bool helper_parent_gone(const helper_args* args) noexcept {
  return helper_syscall(SYS_getppid) != args->owner;
}

inline constexpr long kcmp_vm = 1;  // KCMP_VM

// 0 while the program (its pid) still uses our address space; nonzero once it exited (ESRCH, or
// a task without an mm) or exec()ed (another mm).
TEARDOWN_SHADOW_HELPER_CODE inline long helper_program_moved(const helper_args* args) noexcept {
  return helper_syscall(SYS_kcmp, helper_syscall(SYS_getpid), args->owner, kcmp_vm, 0, 0);
}

// Waits until the enabling thread leaves the address space (the kernel clears its tid word and
// wakes the futex), then decides: if the program no longer uses this address space (it exited or
// exec()ed; exec switches the mm a moment after the wake, hence the short retries) the helper
// exits; if only that thread ended, it returns, and the pipe alone tells from then on. The wake
// is passed on at once: the kernel wakes one waiter, and a pthread_join() of that thread may be
// waiting beside us. For the same reason the wait is bounded: a joiner that queued first takes
// the kernel's one wake, and the helper, still asleep on a word that now reads 0 (or, once the C
// library reused that thread's stack, another tid), would never learn of the program's exit. So
// it looks at the word once a second.
TEARDOWN_SHADOW_HELPER_CODE inline void helper_watch(helper_args* args) noexcept {
  int* const word = args->watch_word;
  const int value = args->watch_value;
  const long period[2] = {1, 0};  // struct timespec: 1 s
  // Relaxed: the kernel's clear publishes nothing; what follows are system calls and arguments
  // written before the clone.
  while (__atomic_load_n(word, __ATOMIC_RELAXED) == value) {
    (void)helper_syscall(SYS_futex, reinterpret_cast<long>(word), FUTEX_WAIT, value, reinterpret_cast<long>(period));
  }
  (void)helper_syscall(SYS_futex, reinterpret_cast<long>(word), FUTEX_WAKE, INT_MAX);
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (helper_program_moved(args) != 0) helper_exit();
    const long pause[2] = {0, 2'000'000};  // struct timespec: 2 ms
    (void)helper_syscall(SYS_nanosleep, reinterpret_cast<long>(pause), 0);
  }
}

[[noreturn]] TEARDOWN_SHADOW_HELPER_CODE inline void helper_main(void* raw) noexcept {
  auto* const args = static_cast<helper_args*>(raw);
  long result = helper_syscall(SYS_prctl, PR_SET_NAME, reinterpret_cast<long>(args->name));
  if (result < 0) helper_fail(args, step_name, result);
  // Detached, the parent is the intermediate, which exits at once: the program's death shows
  // through the pipe and the watched word instead.
  if (!args->detached) {
    result = helper_syscall(SYS_prctl, PR_SET_PDEATHSIG, parent_death_signal);
    if (result < 0) helper_fail(args, step_parent_death, result);
    // The death signal is only sent by deaths after the prctl: one before it shows here.
    if (helper_parent_gone(args)) helper_exit();
  }
  (void)helper_syscall(SYS_chdir, reinterpret_cast<long>("/"));

  const int keep = args->read_fd;
  result = keep > 0 ? helper_syscall(sys_close_range, 0, keep - 1, 0) : 0;
  if (result == 0) result = helper_syscall(sys_close_range, keep + 1, static_cast<long>(~0U), 0);
  if (result == -ENOSYS) {
    for (unsigned long fd = 0; fd < args->fd_limit; ++fd) {
      if (fd != static_cast<unsigned long>(keep)) (void)helper_syscall(SYS_close, static_cast<long>(fd));
    }
  } else if (result < 0) {
    helper_fail(args, step_close, result);
  }

  result = helper_syscall(SYS_setpriority, PRIO_PROCESS, 0, args->nice);
  if (result < 0) helper_fail(args, step_nice, result);
  if (args->sched_idle) {
    const int priority = 0;  // struct sched_param
    result = helper_syscall(SYS_sched_setscheduler, 0, SCHED_IDLE, reinterpret_cast<long>(&priority));
    if (result < 0) helper_fail(args, step_policy, result);
  }

  std::uint64_t mask = std::uint64_t{1} << (parent_death_signal - 1);
  const long signal_fd = helper_syscall(SYS_signalfd4, -1, reinterpret_cast<long>(&mask), sizeof mask,
                                        SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) helper_fail(args, step_signalfd, signal_fd);

  // The watch needs kcmp (CONFIG_KCMP; a sandbox may refuse it): without it, the pipe alone.
  const bool watch = args->watch_word != nullptr && helper_program_moved(args) == 0;
  helper_publish(args, word_ready);
  if (watch) helper_watch(args);
  for (;;) {
    pollfd fds[2];
    fds[0].fd = keep;
    fds[0].events = POLLIN;
    fds[0].revents = 0;
    fds[1].fd = static_cast<int>(signal_fd);
    fds[1].events = POLLIN;
    fds[1].revents = 0;
    (void)helper_syscall(SYS_ppoll, reinterpret_cast<long>(fds), 2, 0, 0, 0);
    if (fds[0].revents != 0) helper_exit();  // the write end closed: the program exited or exec'd
    if (fds[1].revents != 0) {
      unsigned char siginfo[128];  // one signalfd_siginfo
      (void)helper_syscall(SYS_read, signal_fd, reinterpret_cast<long>(siginfo), sizeof siginfo);
      if (!args->detached && helper_parent_gone(args)) helper_exit();
    }
  }
}

// clone() as a raw system call: returns the child's pid, or -errno; with CLONE_PIDFD the kernel
// writes a pidfd (close-on-exec) to *pidfd. The child starts on stack_top with no frame, calls
// helper_main(args) and never comes back here. Everything it runs before helper_main is in this
// asm block: registers only, nothing on the owner's stack.
// Helper code too: the intermediate of a detached helper calls it. Never inlined, so that its
// one indirect call (the new process's entry) stays in this function, which
// tests/unit/process_test.cpp's machine-code check allows it in.
TEARDOWN_SHADOW_HELPER_CODE __attribute__((noinline)) inline long helper_clone(
    unsigned long flags, void* stack_top, int* pidfd, int* clear_tid, helper_args* args,
    void (*entry)(void*) noexcept = &helper_main) noexcept {
  long result = SYS_clone;
  __asm__ volatile(
      "mov %[clear_tid], %%r10\n\t"  // x86-64 order: flags, stack, parent_tid (the pidfd), child_tid, tls
      "xor %%r8d, %%r8d\n\t"
      "mov %[entry], %%r9\n\t"
      "mov %[args], %%r12\n\t"
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"  // the child: an empty frame chain on the new, 16-byte aligned stack
      "mov %%r12, %%rdi\n\t"
      "call *%%r9\n\t"
      "ud2\n"
      "1:"
      : "+a"(result)
      : "D"(flags), "S"(stack_top), "d"(pidfd), [clear_tid] "r"(clear_tid), [entry] "r"(entry), [args] "r"(args)
      : "rcx", "r8", "r9", "r10", "r11", "r12", "memory", "cc");
  return result;
}

// A detached helper's intermediate: shares the program's descriptor table (CLONE_FILES), so the
// helper's pidfd lands there; creates the helper, reports, and exits, which hands the helper to
// the nearest subreaper or init.
[[noreturn]] TEARDOWN_SHADOW_HELPER_CODE inline void helper_detach_main(void* raw) noexcept {
  auto* const args = static_cast<helper_args*>(raw);
  const unsigned long flags = CLONE_VM | CLONE_CHILD_CLEARTID;
  int pidfd = -1;
  long cloned = helper_clone(flags | clone_pidfd, args->helper_stack_top, &pidfd, &args->word, args);
  if (cloned < 0) {
    pidfd = -1;
    cloned = helper_clone(flags, args->helper_stack_top, &pidfd, &args->word, args);
  }
  // Relaxed, as the pidfd's plain store: the owner reads both only after this task's exit
  // (its clear-child-tid word, then waitpid), which the kernel orders after them; the exit
  // system call's asm clobbers memory, so no compiler moves them past it either.
  args->detach_pidfd = pidfd;
  __atomic_store_n(&args->detach_result, cloned, __ATOMIC_RELAXED);
  helper_exit();
}

}  // namespace teardown::process::detail

#endif  // TEARDOWN_SHADOW_SUPPORTED
