// teardown/process.hpp — shadow teardown for a whole process (Linux): a helper process that
// shares the program's address space, so that when the program exits or is killed, the one who
// waits for it (a supervisor's waitpid, a shell, a test harness) does not wait for the address
// space to be torn down.
//
//     int main() {
//       teardown::process::enable_shadow_teardown();          // once, early; throws on failure
//       ...                                                    // the program, unchanged
//     }
//
// This is the process-level form of the kernel series' deferred teardown, and what QEMU does
// with -run-with async-teardown=on. A process's exit pays for unmapping its address space:
// every page freed, every page table walked, tens to hundreds of milliseconds per GiB. Its
// parent's waitpid() returns only after that. enable_shadow_teardown() creates a helper with
// clone(CLONE_VM): a process of its own that uses the same address space (the mm gains a second
// user). When the program exits, or is SIGKILLed, its exit path only drops its reference to the
// mm and goes on, so the waiter's waitpid() returns at once; the helper, told that its program
// is gone, then exits too and pays the whole teardown, on its own time. The cost does not vanish:
// it moves from the waiter's path to the helper (see "What it costs").
//
// Who may call what (all functions: any thread; none is async-signal-safe)
//   enable_shadow_teardown   may block: until the helper reports that it is set up (0.1 to 0.3 ms
//                            in process_bench; bounded at 30 s, then std::system_error
//                            ETIMEDOUT).
//                            Returns the helper's pid. Throws std::invalid_argument for bad
//                            options and std::system_error when a step fails (ENOTSUP under
//                            valgrind, which cannot run the helper); either way nothing has
//                            changed: no helper, no descriptor, no mapping is left behind.
//                            The shared object that holds this code, if it is not the program
//                            (a plugin), stays loaded from the first call on: its dlclose() no
//                            longer unmaps it (see "Plugins").
//                            A second call while this process's helper lives returns its pid and
//                            changes nothing (the options are checked, not applied). A call after
//                            the helper died (someone killed it) reaps it and starts a new one.
//                            Calls from several threads serialize.
//                            A detached helper (options.detached) costs one more clone: the
//                            intermediate's, which enable also waits for and reaps.
//   disable_shadow_teardown  may block briefly: kills the helper and reaps it (a detached one: waits
//                            for its exit; init or a subreaper reaps it). The program's exit
//                            is inline again. No-op when there is no helper. Cheap: the helper's
//                            exit frees nothing while the program still uses the mm.
//                            Neither it nor enable signals or reaps any process but this
//                            process's helper, even after a waiter of the program's reaped a
//                            dead helper and its pid went to another process (see "Identity").
//   shadow_teardown_enabled, shadow_pid
//                            wait-free snapshots (one getpid() system call): whether this process
//                            has a live helper, and its pid (0 if none).
//   All four act on the process's one helper, whichever copy of this header started it: the
//   first call of any copy looks up the process's shared state once (dlsym; see "One helper per
//   process").
//
// How the helper is made, and what it does (everything here is in enable_shadow_teardown)
//   - Its stack: a small mapping of its own (stack_size, a PROT_NONE guard page below it, kept
//     out of fork children by MADV_DONTFORK). It lives as long as the process.
//   - clone(CLONE_VM | CLONE_CHILD_CLEARTID | CLONE_PIDFD) with exit signal 0, made by the
//     calling thread with a raw system call (not glibc's clone(): ThreadSanitizer intercepts that
//     one and treats the child as a fork, which corrupts its state when the child shares the
//     memory); again without CLONE_PIDFD if that is refused. No CLONE_FILES, CLONE_FS,
//     CLONE_SIGHAND: the helper has copies of the descriptor table, the working directory and
//     the signal handlers, not the program's own.
//   - Every signal is blocked across the clone, so the helper starts, and stays, with all of
//     them blocked: no handler of the program's can ever run on it. SIGKILL and SIGSTOP act.
//   - The helper runs only code of this header that makes raw system calls, and never the
//     program's: not a handler, not a hook. It shares the calling thread's thread pointer (no
//     CLONE_SETTLS), so it must never touch thread-local storage: not errno (hence no libc
//     syscall()), not the stack protector's canary, not a sanitizer's per-thread state. Its
//     functions are built without sanitizers, stack protector, -finstrument-functions hooks,
//     profiling counters, coverage callbacks or XRay (the list is at TEARDOWN_SHADOW_HELPER_CODE),
//     and never return. The calling thread may exit afterwards.
//   - Then, in order: names itself (PR_SET_NAME, options.name, Linux keeps 15 bytes); unless
//     detached, asks for SIGHUP when its parent dies (PR_SET_PDEATHSIG) and exits at once if its
//     parent already died (getppid() is no longer the program); moves to "/" so that it does not
//     keep a mount busy;
//     closes every descriptor it inherited (close_range; below RLIMIT_NOFILE one by one on
//     kernels before 5.9) except the read end of a pipe of its own — otherwise it would hold the
//     program's pipes and sockets open after the program died, and a reader waiting for EOF on
//     the program's stdout would wait for the helper; sets its nice value (options.nice) and,
//     with options.sched_idle, the SCHED_IDLE policy; opens a signalfd for SIGHUP. It reports
//     success or the failed step through a word in the shared memory (a futex), and
//     enable_shadow_teardown() returns.
//   - It first waits on the enabling thread's clear-child-tid word (the C library's, found with
//     PR_GET_TID_ADDRESS): the kernel clears it and wakes its futex when that thread leaves the
//     address space, which its exit, the process's exit (any way) and an exec() by any thread all
//     do. It looks at the word once a second as well (a pthread_join of that thread that waits
//     on the same futex may take the kernel's one wake). The helper passes the wake on and
//     asks kcmp(KCMP_VM) whether the program still uses this address space, for up to 100 ms
//     (an exec switches the mm a moment after the wake): if not, it exits; if so (only that
//     thread ended), it goes on to the pipe. This is what ends it at an exec() by a program that
//     cleared FD_CLOEXEC on the pipe's write end, which then survives into the new image. Without
//     PR_GET_TID_ADDRESS (CONFIG_CHECKPOINT_RESTORE) or kcmp (CONFIG_KCMP, or a sandbox that
//     refuses it) it skips this wait; the helper of a thread that ended has only the pipe left.
//   - Then it waits in ppoll() on the pipe and the signalfd, and exits (freeing the address space,
//     if it is the last user) when
//       * the pipe's write end closes. The program holds it (close-on-exec, descriptor 3 or above),
//         so it closes when the program exits, whatever killed it, and when it exec()s;
//       * or SIGHUP arrives and getppid() is no longer the program. PR_SET_PDEATHSIG fires when
//         the parent *thread* exits: a helper made on a thread that later exits gets SIGHUP, sees
//         the same parent (the process lives on; the helper was handed to another of its
//         threads), and keeps waiting. This path ends the helper even if the pipe's write end
//         leaked into another process.
//   - Reaped by init: when the program dies, the kernel hands the helper to the nearest
//     subreaper (PR_SET_CHILD_SUBREAPER) above it, or else to the pid namespace's init, with an
//     exit signal of SIGCHLD, and that process reaps it. The helper is never the waiter's child
//     (unless the waiter is a subreaper). While the program lives, the helper is its child with
//     exit signal 0: waitpid(-1) and wait() without __WALL or __WCLONE never see it (a
//     "wait until ECHILD" loop ends as before) and SIGCHLD never announces it, so a program's own
//     child handling is undisturbed. A program that waits for all its children with __WALL or
//     __WCLONE would wait for the helper too, which only ends with the program: such a program
//     calls disable_shadow_teardown() first, or does not enable. If such a waiter reaps a helper
//     that someone killed, nothing breaks: the library finds it gone (see "Identity").
//
// Detached helpers (options.detached; libteardown_shadow.so's): the calling thread clones an
// intermediate (CLONE_VM | CLONE_FILES, exit signal 0, on the lowest 4 KiB of the helper's stack
// mapping), which clones the helper and exits; enable waits for the intermediate (its own
// clear-child-tid word) and reaps it. The helper is then an orphan: the kernel hands it to the
// nearest subreaper, or init, with exit signal SIGCHLD. So no wait of the program's, __WALL and
// __WCLONE included, nor a tracer's (strace -f, gdb: they wait for every tracee, and the helper
// ends with the program) waits for it, and an exec() leaves no zombie in the program: the old
// image's helper exits and its new parent reaps it. What it changes: that reaper (a supervisor
// that is a subreaper sees an extra child while the program runs, as it does today once the
// program died); the reaper must reap promptly, since under a pids limit (pids.max) an exited
// helper counts until reaped; no PR_SET_PDEATHSIG (its parent is gone at once), the pipe and the
// watched word instead; disable waits for the exit instead of reaping. A __WALL waiter of the
// program's thread that runs during enable may reap the intermediate first: harmless.
//
// One helper per process: a program built with this header and run under libteardown_shadow.so
// holds two copies of this code (the library's, with every symbol local, and its own), a plugin
// may hold a third, and each would keep its own state: report no helper while another's lives,
// and start a second. So every copy uses the state of the first object in the global lookup scope
// that exports teardown_process_shadow_state_v1 (libteardown_shadow.so does; any shared object
// built with this header does; an executable only with -rdynamic), else its own. The program's
// copy thus sees, returns and disables the library's helper. The name carries the layout's
// version and the call checks its size: another version of the header keeps to its own state.
//
// Identity: the library names its helper by a pidfd (CLONE_PIDFD, Linux 5.2; else pidfd_open,
// 5.3), held close-on-exec beside the pipe's write end, and signals and reaps it through that
// (pidfd_send_signal, waitid(P_PIDFD)): once the helper is reaped, by us or by a __WALL waiter of
// the program's, the pidfd reaches nothing, whatever process has the pid number since. Without
// pidfds (older kernels, or a sandbox that refuses them) it goes by the shared word instead: the
// kernel clears it when the helper exits, before the pid can be reaped and reused, so a helper
// whose word reads zero is never signalled. There, only a __WALL waiter that reaps the helper
// in the instant between our check and our kill(), with a new process taking the pid in that
// same instant, could still be hit.
//
// Plugins: the helper runs this header's code and reads its state wherever they are. When they
// are in a shared object that a dlclose() would unmap (GCC's unique symbols keep most such objects
// loaded anyway; Clang's, and GCC's with -fno-gnu-unique, do unload), the helper would wake up in
// unmapped memory when the program exits and die of SIGSEGV. So the first
// enable_shadow_teardown() makes that object permanent (dlopen with RTLD_NOLOAD | RTLD_NODELETE;
// std::system_error ELIBACC if that fails): a later dlclose() leaves it mapped, and its static
// destructors run at exit instead.
//
// What it costs, and the failure modes
//   - The teardown moved; it did not vanish. Until the helper finishes, the memory stays
//     allocated and charged (MemAvailable, the memory cgroup). A supervisor that restarts the
//     program at once runs the new instance beside the old image for as long as the teardown
//     takes: a higher peak, which under a tight memory.max can push the new instance into reclaim
//     or an OOM kill (the objection to deferred teardown in the seed 004 review, and why the
//     kernel series bounds what it defers).
//   - Whoever waits for the whole cgroup still waits for the teardown: systemd (KillMode=
//     control-group) considers a unit stopped only once its cgroup is empty, and a container
//     runtime waits for every process of the container. The gain is for a parent's waitpid().
//   - A helper killed while the program lives (kill -9, an administrator, pkill -f matching the
//     program's command line, which the helper shares): the program's exit is inline again,
//     nothing else is lost. The dead helper stays a zombie (no memory) until the next
//     enable_shadow_teardown() or disable_shadow_teardown() reaps it, or the program exits.
//     shadow_teardown_enabled() says false as soon as the helper is dead (the kernel clears the
//     shared word: CLONE_CHILD_CLEARTID).
//   - The OOM killer kills every process that shares the victim's mm: an OOM-killed program
//     takes its helper with it (and the oom_reaper frees the memory as usual), and if the helper
//     is chosen (it shows the same RSS), the program dies with it. The helper inherits the
//     program's oom_score_adj.
//   - While it watches the enabling thread (until that thread ends), the helper wakes once a
//     second to read one word: no system call but the futex wait, no memory touched but that.
//   - It is visible: ps lists the helper with options.name as its command (comm) and the
//     program's command line (cmdline lives in the shared memory), and with the program's RSS.
//     Tools that add up RSS over processes count the program twice; the memory cgroup does not.
//   - Two descriptors stay open in the program, close-on-exec and above 2: the pipe's write end
//     and the helper's pidfd (none without pidfds). A program that closes all its descriptors
//     (closefrom(3), a daemon's close loop) or dup2()s over the write end ends the helper: no harm,
//     no deferral. The library recognizes its descriptors by device and inode, and never closes
//     or uses a number the program has reused.
//   - valgrind cannot run the helper (it ends a program that makes a clone(CLONE_VM) process
//     that is not a thread): enable_shadow_teardown() throws std::system_error(ENOTSUP) there,
//     found by valgrind's client request (RUNNING_ON_VALGRIND, where <valgrind/valgrind.h> is
//     installed; TEARDOWN_NO_VALGRIND_H leaves it out) or else by valgrind's objects in
//     /proc/self/maps.
//   - Sandboxes: a seccomp filter or an LSM may refuse clone with CLONE_VM but without
//     CLONE_THREAD, or prctl: enable_shadow_teardown() then throws std::system_error (the failed
//     step and errno) and changes nothing. Kernels without close_range (before 5.9) close
//     descriptors one by one, which is slow only with a huge RLIMIT_NOFILE.
//   - Privileges: the helper keeps the credentials, capabilities and seccomp filters it was
//     created with, and it executes code in memory the program can write. A program that drops
//     privileges or enters a sandbox after enabling leaves a more privileged process running in
//     its memory: a way out. Enable once the process has its final credentials and sandbox.
//
// fork(), exec() and threads
//   - fork(): the child has its own address space, which the helper does not share. In the
//     child, shadow_teardown_enabled() is false, shadow_pid() is 0 and the pipe's write end is
//     closed (a pthread_atfork handler; a child made by a raw clone system call keeps that
//     descriptor until it exits or execs, and still reports no helper). A child that wants a
//     helper calls enable_shadow_teardown() itself; daemon() is a fork, so call it after.
//     fork() waits for an enable_shadow_teardown() in progress on another thread.
//   - exec(): execve replaces the mm, and the helper would hold the old one: we checked on Linux
//     6.18 that a CLONE_VM sharer keeps the whole old image (its RSS) alive after the program
//     exec()s, for as long as the sharer lives. Here the exec closes the pipe's write end
//     (close-on-exec), and the watched word wakes the helper even where the program cleared
//     FD_CLOEXEC, so the helper exits and frees the old image off the exec path. Unless detached,
//     it stays a zombie (no memory) of the new image, which does not know it, until that image
//     exits: one per exec, for a program that re-execs itself, which under a pids limit may run
//     out of pids; detached, its new parent reaps it. The new image starts without a helper and
//     may enable its own.
//   - Threads: any thread may enable; the helper does not depend on that thread (see above).
//
// Sanitizers and instrumentation: the helper's code is built without instrumentation and makes
// only raw system calls, so it runs under AddressSanitizer, UndefinedBehaviorSanitizer and
// ThreadSanitizer, and in programs built with -finstrument-functions, -pg, profiling or coverage;
// the clone bypasses ThreadSanitizer's clone interceptor (above).
//
// Toolchains: GCC and Clang, libstdc++ and libc++ (no std::atomic_ref needed).
//
// Platforms: Linux on x86-64. Elsewhere shadow_teardown_supported is false and
// enable_shadow_teardown() throws std::system_error(ENOSYS) (after checking its options).
//
// Memory ordering: the helper reads its arguments, written before the clone system call (which
// orders them), and publishes one 32-bit word with a single store followed by a FUTEX_WAKE; the
// kernel clears the same word (and wakes) when the helper exits. enable_shadow_teardown() reads
// it with acquire loads; the word alone carries the result (failed step and errno included), so
// no other data travels with it. The pid and owner are published under the mutex with release
// stores and read by the snapshots with acquire loads. The word is a plain int, not a
// std::atomic, because the kernel writes it; the owner's accesses are __atomic builtins.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__linux__)
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#endif

#include "teardown/detail/pidfd.hpp"

#if defined(__linux__) && defined(__x86_64__)
#define TEARDOWN_SHADOW_SUPPORTED 1
#else
#define TEARDOWN_SHADOW_SUPPORTED 0
#endif

// valgrind's client request, exact where its header is installed (Debian: valgrind);
// TEARDOWN_NO_VALGRIND_H leaves it out. A check of the mappings backs it either way.
#if TEARDOWN_SHADOW_SUPPORTED && !defined(TEARDOWN_NO_VALGRIND_H) && defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define TEARDOWN_SHADOW_VALGRIND_H 1
#endif
#endif

namespace teardown::process {

struct shadow_options {
  // The helper's name (/proc/<pid>/comm, ps). Not empty, no NUL; Linux keeps the first 15 bytes.
  std::string name = "teardown-shadow";
  // The helper's stack, rounded up to whole pages, with a PROT_NONE guard page below it. The
  // helper uses a few hundred bytes of it and touches one or two pages: the rest costs address
  // space only.
  std::size_t stack_size = 64 * 1024;
  // The helper's nice value (-20..19), and so the priority of the teardown it runs once the
  // program is gone: by default the lowest, as the kernel series' reaper, so that the teardown
  // yields the CPU to whatever replaces the program. A value below the program's needs
  // CAP_SYS_NICE (else std::system_error EACCES).
  int nice = 19;
  // SCHED_IDLE instead of the normal class: any other runnable task, the waiter included, then
  // preempts the helper at once, and the scheduler counts the helper's CPU as idle when it places
  // a waking task. On a busy machine that keeps the teardown, which starts on the CPU the program
  // just left, from delaying the waiter by a scheduler slice (process_bench measures both), at
  // the price of a teardown that waits longer for spare CPU time, and so memory that stays
  // charged longer.
  bool sched_idle = false;
  // The helper is not the program's child: a short-lived intermediate creates it and exits, so
  // the kernel hands it at once to the nearest subreaper or to init, which reap it. The program's
  // waits, __WALL and __WCLONE included, and a tracer's, never wait for it, and an exec() leaves no
  // zombie behind. disable_shadow_teardown() then kills it and waits for its exit without reaping
  // it. libteardown_shadow.so sets this (see "Detached helpers").
  bool detached = false;

  static constexpr std::size_t min_stack_size = 16 * 1024;
  static constexpr std::size_t max_stack_size = 16 * 1024 * 1024;
};

inline constexpr bool shadow_teardown_supported = TEARDOWN_SHADOW_SUPPORTED != 0;

inline pid_t enable_shadow_teardown(const shadow_options& options = {});
inline void disable_shadow_teardown() noexcept;
inline bool shadow_teardown_enabled() noexcept;
inline pid_t shadow_pid() noexcept;

// ---- end of the public interface ------------------------------------------------------------

namespace detail {

inline void check_shadow_options(const shadow_options& options) {
  if (options.name.empty()) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.name is empty");
  }
  if (options.name.find('\0') != std::string::npos) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.name contains a NUL byte");
  }
  if (options.stack_size < shadow_options::min_stack_size || options.stack_size > shadow_options::max_stack_size) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.stack_size " +
                                std::to_string(options.stack_size) + " is outside [" +
                                std::to_string(shadow_options::min_stack_size) + ", " +
                                std::to_string(shadow_options::max_stack_size) + "]");
  }
  if (options.nice < -20 || options.nice > 19) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.nice " +
                                std::to_string(options.nice) + " is outside [-20, 19]");
  }
}

#if TEARDOWN_SHADOW_SUPPORTED

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
inline int load_word(const int& word) noexcept { return __atomic_load_n(&word, __ATOMIC_ACQUIRE); }
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
// tests/process_test.cpp checks the machine code (no call out, no %fs), and
// tests/process_instrument_test.cpp runs it under -finstrument-functions.

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
  // Release: pairs with the owner's acquire load_word (what the helper did is done).
  __atomic_store_n(&args->word, value, __ATOMIC_RELEASE);
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
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == value) {
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
// tests/process_test.cpp's machine-code check allows it in.
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
  args->detach_pidfd = pidfd;
  __atomic_store_n(&args->detach_result, cloned, __ATOMIC_RELEASE);
  helper_exit();
}

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
  std::atomic<pid_t> owner{0};      // getpid() of the process the helper serves; 0: none
  std::atomic<pid_t> pid{0};        // the helper; 0: none
  // Under mutex:
  owned_fd write_end;  // the pipe's write end
  owned_fd pidfd;      // the helper's pidfd; fd -1 where the kernel offers none (before 5.3)
  void* stack = nullptr;
  std::size_t stack_bytes = 0;
  bool fork_handlers = false;
  helper_args args;
};

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
extern "C" __attribute__((visibility("default"), used)) inline void* teardown_process_shadow_state_v1(
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
// needs no guard.
inline shadow_state& shared_state() noexcept {
  static constinit std::atomic<shadow_state*> cached{nullptr};
  shadow_state* found = cached.load(std::memory_order_acquire);
  if (found != nullptr) return *found;
  found = &state;
  // Whichever definition comes first answers, ours included: it returns its own object's state.
  if (void* const symbol = dlsym(RTLD_DEFAULT, "teardown_process_shadow_state_v1"); symbol != nullptr) {
    using lookup = void* (*)(unsigned long) noexcept;
    auto* const other = static_cast<shadow_state*>(
        reinterpret_cast<lookup>(reinterpret_cast<std::uintptr_t>(symbol))(sizeof(shadow_state)));
    if (other != nullptr) found = other;
  }
  cached.store(found, std::memory_order_release);
  return *found;
}

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
  s.pid.store(0, std::memory_order_release);
  s.owner.store(0, std::memory_order_release);
}

// Kills (when alive) and reaps this process's helper, then forgets it. Under the mutex.
inline void retire_helper(shadow_state& s) noexcept {
  const pid_t pid = s.pid.load(std::memory_order_relaxed);
  if (s.owner.load(std::memory_order_relaxed) != getpid() || pid == 0) {
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
    if (__atomic_load_n(tid_word, __ATOMIC_ACQUIRE) == tid) {
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
      cloned = __atomic_load_n(&s.args.detach_result, __ATOMIC_ACQUIRE);
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
    timespec timeout{slice.count() / 1'000'000'000, slice.count() % 1'000'000'000};  // rep is long, as time_t and tv_nsec
    (void)syscall(SYS_futex, &s.args.word, FUTEX_WAIT, word_starting, &timeout, nullptr, 0);
    word = load_word(s.args.word);
  }
  if (word == word_ready) {
    s.write_end = write_end;
    s.stack = base;
    s.stack_bytes = bytes;
    s.pid.store(pid, std::memory_order_release);    // pairs with shadow_pid's acquire loads
    s.owner.store(self, std::memory_order_release);
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
  if (s.owner.load(std::memory_order_relaxed) == getpid() && s.pid.load(std::memory_order_relaxed) != 0 &&
      detail::load_word(s.args.word) == detail::word_ready) {
    return s.pid.load(std::memory_order_relaxed);
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
  if (s.owner.load(std::memory_order_acquire) != getpid()) return 0;
  const pid_t pid = s.pid.load(std::memory_order_acquire);
  return pid != 0 && detail::load_word(s.args.word) == detail::word_ready ? pid : 0;
#else
  return 0;
#endif
}

}  // namespace teardown::process
