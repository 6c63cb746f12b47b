// teardown/allocator_purge.hpp — which allocator serves this process's malloc, and its purge.
//
// A program may run under glibc's malloc, or under jemalloc, tcmalloc (gperftools) or mimalloc,
// linked in or LD_PRELOADed. Each keeps freed memory for later allocations, and each has its
// own call that hands free pages back; glibc's malloc_trim does nothing for the others. So the
// allocator is found at run time, once: the library that defines the `malloc` the dynamic
// linker resolves (dlsym(RTLD_DEFAULT, "malloc"), then dladdr) is compared with the library
// that defines each allocator's own entry point:
//   jemalloc  mallctl                        (Debian's libjemalloc2 exports it unprefixed)
//   tcmalloc  MallocExtension_ReleaseFreeMemory (and MallocExtension_MarkThreadIdle)
//   mimalloc  mi_collect
//   glibc     __libc_malloc
// A prefixed jemalloc (je_mallctl) or a statically linked allocator whose symbols are not
// exported is not found: allocator_kind::other, which has no purge.
//
//     teardown::detect_allocator();     // allocator_kind::jemalloc under LD_PRELOAD=libjemalloc.so.2
//     teardown::allocator_name();       // "jemalloc"
//     teardown::collect_here();         // this thread's cached blocks, then the purge
//
// What the purge does (detail::allocator_purge, the trimmer's default trim):
//   jemalloc  mallctl("thread.tcache.flush"), then mallctl("arena.4096.purge"): 4096 is
//             MALLCTL_ARENAS_ALL, every arena's unused dirty (and muzzy) pages given back
//   tcmalloc  MallocExtension_MarkThreadIdle (this thread's cache back to the central lists),
//             then MallocExtension_ReleaseFreeMemory (the page heap's free spans released)
//   mimalloc  mi_collect(true): this thread's heap collected, and the segments and pages
//             abandoned by exited threads. Blocks another thread freed that belong to a live
//             thread's heap are queued for that thread: only that thread's collect (or its
//             next allocations) returns them, hence collect_here() below.
//   glibc     malloc_trim(0)
//   other     nothing: returns -1 (the trimmer then counts no trim)
//
// Who may call what
//   detect_allocator, allocator_name
//                     any thread; the first call looks the symbols up (dlsym, dladdr: not
//                     async-signal-safe, and it may allocate), later calls read the result.
//   collect_here      any thread; blocking for as long as the allocator's purge takes
//                     (milliseconds for a big heap): call it where a stall costs nobody.
//   detail::allocator_purge
//                     the trimmer's default trim, for allocator_trimmer's callers.
// Design: docs/design.md, "allocator_trim: giving freed memory back".
#pragma once

#include <dlfcn.h>

#include <cstddef>

namespace teardown {

enum class allocator_kind { glibc, jemalloc, tcmalloc, mimalloc, other };

inline const char* allocator_name(allocator_kind kind) noexcept {
  switch (kind) {
    case allocator_kind::glibc: return "glibc";
    case allocator_kind::jemalloc: return "jemalloc";
    case allocator_kind::tcmalloc: return "tcmalloc";
    case allocator_kind::mimalloc: return "mimalloc";
    case allocator_kind::other: break;
  }
  return "other";
}

namespace detail {

// The allocator serving malloc, and the entry points its purge calls (null where absent).
struct allocator_entry_points {
  allocator_kind kind = allocator_kind::other;
  int (*mallctl)(const char*, void*, std::size_t*, void*, std::size_t) = nullptr;
  void (*mark_thread_idle)() = nullptr;
  void (*release_free_memory)() = nullptr;
  void (*mi_collect)(bool) = nullptr;
  int (*malloc_trim)(std::size_t) = nullptr;
};

// The load address of the object (executable or shared library) that holds `address`.
inline const void* defining_object(const void* address) noexcept {
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0) return nullptr;
  return info.dli_fbase;
}

template <class F>
F symbol_in(const void* object, const char* name) noexcept {
  void* const address = dlsym(RTLD_DEFAULT, name);
  if (address == nullptr || object == nullptr || defining_object(address) != object) return nullptr;
  return reinterpret_cast<F>(address);
}

inline allocator_entry_points find_allocator() noexcept {
  allocator_entry_points found;
  const void* const malloc_object = defining_object(dlsym(RTLD_DEFAULT, "malloc"));
  using mallctl_fn = int (*)(const char*, void*, std::size_t*, void*, std::size_t);
  if ((found.mallctl = symbol_in<mallctl_fn>(malloc_object, "mallctl")) != nullptr) {
    found.kind = allocator_kind::jemalloc;
  } else if ((found.release_free_memory = symbol_in<void (*)()>(malloc_object, "MallocExtension_ReleaseFreeMemory")) !=
             nullptr) {
    found.kind = allocator_kind::tcmalloc;
    found.mark_thread_idle = symbol_in<void (*)()>(malloc_object, "MallocExtension_MarkThreadIdle");
  } else if ((found.mi_collect = symbol_in<void (*)(bool)>(malloc_object, "mi_collect")) != nullptr) {
    found.kind = allocator_kind::mimalloc;
  } else if (symbol_in<void* (*)(std::size_t)>(malloc_object, "__libc_malloc") != nullptr) {
    found.malloc_trim = symbol_in<int (*)(std::size_t)>(malloc_object, "malloc_trim");
    if (found.malloc_trim != nullptr) found.kind = allocator_kind::glibc;
  }
  return found;
}

// Looked up once (a function-local static: the first caller's lookup, the others wait for it).
inline const allocator_entry_points& allocator_in_use() noexcept {
  static const allocator_entry_points found = find_allocator();
  return found;
}

// The allocator's purge: hands every free page it can back to the system. 1 or 0 as
// malloc_trim (1: glibc released something; the others always say 1), -1: no purge known
// (allocator_kind::other), nothing called. `pad` is malloc_trim's (glibc only).
inline int allocator_purge(std::size_t pad) noexcept {
  const allocator_entry_points& use = allocator_in_use();
  switch (use.kind) {
    case allocator_kind::jemalloc:
      (void)use.mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
      (void)use.mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // 4096: MALLCTL_ARENAS_ALL
      return 1;
    case allocator_kind::tcmalloc:
      if (use.mark_thread_idle != nullptr) use.mark_thread_idle();
      use.release_free_memory();
      return 1;
    case allocator_kind::mimalloc:
      use.mi_collect(true);
      return 1;
    case allocator_kind::glibc:
      return use.malloc_trim(pad);
    case allocator_kind::other:
      break;
  }
  return -1;
}

}  // namespace detail

/// The allocator that serves this process's malloc (looked up on the first call).
inline allocator_kind detect_allocator() noexcept { return detail::allocator_in_use().kind; }
inline const char* allocator_name() noexcept { return allocator_name(detect_allocator()); }

/// Runs the allocator's collect for the calling thread and its purge: under mimalloc,
/// mi_collect(true) on this thread, which also takes back the blocks other threads freed into
/// this thread's heap (a worker's purge cannot: they are queued for this thread); under the
/// others, the purge (jemalloc and tcmalloc flush this thread's cache first). False, calling
/// nothing, where no purge is known (allocator_kind::other). Blocking; any thread.
inline bool collect_here() noexcept { return detail::allocator_purge(0) >= 0; }

}  // namespace teardown
