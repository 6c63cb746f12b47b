// teardown/process.hpp — shadow teardown for a whole process (Linux x86-64): a helper process
// that shares the program's address space, so that when the program exits or is killed, the one
// who waits for it (a supervisor's waitpid, a shell, a test harness) does not wait for the
// address space to be torn down; the helper pays the teardown instead, on its own time.
//
//     int main() {
//       teardown::process::enable_shadow_teardown();          // once, early; throws on failure
//       ...                                                    // the program, unchanged
//     }
//
// Who may call what (all functions: any thread; none is async-signal-safe)
//   enable_shadow_teardown   may block until the helper reports that it is set up (bounded at
//                            30 s: std::system_error ETIMEDOUT). Returns the helper's pid.
//                            Throws std::invalid_argument for bad options and std::system_error
//                            when a step fails (ENOTSUP under valgrind; ENOSYS off Linux x86-64);
//                            either way nothing has changed. A second call while the helper
//                            lives returns its pid (the options are checked, not applied); a call
//                            after it died reaps it and starts a new one. Calls serialize. The
//                            shared object holding this code stays loaded from then on.
//   disable_shadow_teardown  may block briefly: kills this process's helper and reaps it (a
//                            detached one: waits for its exit). No-op without a helper. Never
//                            signals or reaps another process, even after the helper's pid was
//                            reaped by someone else and reused.
//   shadow_teardown_enabled, shadow_pid   wait-free snapshots (one getpid()).
//   All four act on the process's one helper, whichever copy of this header started it.
//
// The helper: clone(CLONE_VM | CLONE_CHILD_CLEARTID | CLONE_PIDFD) with exit signal 0 and every
// signal blocked; it runs only this header's raw-system-call code (never the program's, no
// thread-local storage), closes the descriptors it inherited, and exits (freeing the address
// space if it is the last user) when the program exits, is killed or exec()s: the pipe's write
// end, held close-on-exec by the program, closes; the enabling thread's clear-child-tid word
// and SIGHUP on the parent's death back that up. A fork child has no helper. Costs: the memory
// stays charged until the helper finishes; the helper shows in ps with the program's RSS; two
// descriptors stay open in the program (close-on-exec, above 2).
//
// Memory ordering: the helper reads its arguments, written before the clone system call (which
// orders them), and publishes one 32-bit word with a single store followed by a FUTEX_WAKE; the
// kernel clears the same word (and wakes) when the helper exits. The word alone carries the
// result (failed step and errno included), and the helper writes no other memory the owner
// reads, so both sides are relaxed: no data travels with it to order. A detached helper's
// intermediate reports the helper's pid and pidfd in two more fields, which the owner reads
// only after the intermediate's exit (the kernel orders those). The helper's pid and its owner
// share one 64-bit word, written under the mutex and read whole (relaxed) by the snapshots: no
// order to pair. The futex word is a plain int, not a std::atomic, because the kernel writes it;
// the owner's accesses are __atomic builtins.
//
//   process/shadow_options.hpp   shadow_options, the four calls declared, the platform test
//   process/shadow_helper.hpp    the helper's code (internal)
//   process/shadow_state.hpp     the process's one state and its lookup (internal)
//   process/shadow_control.hpp   the owner's side and the four calls (internal)
// Design: docs/design.md, "process.hpp: shadow teardown of a whole process (Linux x86-64)".
#pragma once

#include "teardown/process/shadow_control.hpp"
#include "teardown/process/shadow_options.hpp"
