// teardown/deferred/deleters.hpp — the user's entry points: deferred_deleter, deferred_ptr,
// make_deferred, deferred_delete and async_munmap.
//
//     teardown::deferred_ptr<cache> c = teardown::make_deferred<cache>(args);   // a unique_ptr
//     c.reset();                          // big: destroyed on the reaper; small: right here
//     std::shared_ptr<cache> s(new cache, teardown::deferred_deleter<cache>{});
//     teardown::async_munmap(addr, length);     // big mappings are unmapped on the reaper
//
// Who may call what
//   deferred_deleter::operator(), deferred_delete
//                       any thread, concurrently; noexcept (deferred_domain::delete_object). A
//                       destructor that throws terminates when it runs here (as with
//                       std::default_delete); on the reaper it is counted in errors.
//   async_munmap        the same, but may throw: std::invalid_argument for bad input (refused
//                       before the default domain is even created), std::system_error if an
//                       inline munmap fails.
// async_munmap hands the range over: until it is unmapped the caller must not touch it, nor
// mmap(MAP_FIXED) over it (the deferred munmap would remove the new mapping); flush() first to
// reuse the addresses. Plain mmap never returns addresses that are still mapped. After fork()
// the child inherits the mappings and unmaps its own copy of what the parent had queued. A
// range longer than the domain's unmap_chunk (8 MiB) is queued in chunks, one item each
// (deferred/domain.hpp, "Chunks"): it may be unmapped piece by piece, by more than one thread.
//
// Memory ordering: none of its own (deferred/domain.hpp).
// Design: docs/design.md, "deferred.hpp: deleters and async_munmap".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "teardown/async_teardown/options.hpp"
#include "teardown/deferred/default_domain.hpp"
#include "teardown/deferred/domain.hpp"
#include "teardown/deferred/node.hpp"

namespace teardown {

// ---- the deleter ------------------------------------------------------------------------------

/// A deleter for std::unique_ptr<T, deferred_deleter<T>> and std::shared_ptr<T>: deletes through
/// a domain (the default one unless given). Two pointers wide, trivially copyable. Not
/// convertible between types (a cost function is typed): for a hierarchy, use
/// deferred_deleter<Base> throughout (Base needs a virtual destructor, as with delete).
template <class T>
class deferred_deleter {
 public:
  using cost_function = std::uint64_t (*)(const T&);

  /// The default domain; the cost by lookup (steps 2-5).
  constexpr deferred_deleter() noexcept = default;
  constexpr explicit deferred_deleter(deferred_domain& through) noexcept : domain_(&through) {}
  /// A null cost function means the lookup.
  constexpr explicit deferred_deleter(cost_function measure) noexcept : cost_(measure) {}
  constexpr deferred_deleter(deferred_domain& through, cost_function measure) noexcept
      : domain_(&through), cost_(measure) {}

  void operator()(T* object) const noexcept {
    deferred_domain* target = domain_ != nullptr ? domain_ : detail::default_domain_or_null();
    if (target == nullptr) {
      delete object;  // the default domain's reaper could not start: as std::default_delete
    } else if (cost_ != nullptr) {
      (void)target->delete_object(object, cost_);
    } else {
      (void)target->delete_object(object);
    }
  }

  /// The domain it deletes through; nullptr for the default one.
  deferred_domain* domain() const noexcept { return domain_; }
  cost_function cost() const noexcept { return cost_; }

 private:
  deferred_domain* domain_ = nullptr;
  cost_function cost_ = nullptr;
};

/// A std::unique_ptr that deletes through a domain.
template <class T>
using deferred_ptr = std::unique_ptr<T, deferred_deleter<T>>;

/// new T(args...) in a deferred_ptr on the default domain (new T{args...} for an aggregate).
template <class T, class... Args>
  requires(!std::is_array_v<T>)
deferred_ptr<T> make_deferred(Args&&... args) {
  if constexpr (std::is_constructible_v<T, Args...>) {
    return deferred_ptr<T>(new T(std::forward<Args>(args)...));
  } else {
    return deferred_ptr<T>(new T{std::forward<Args>(args)...});
  }
}

/// Deletes `object` through the default domain; see deferred_domain::delete_object. If the
/// default domain cannot be created (its reaper cannot start), deletes inline: inline_stopped.
template <class T>
decision deferred_delete(T* object) noexcept {
  deferred_domain* domain = detail::default_domain_or_null();
  if (domain == nullptr) {
    delete object;
    return decision::inline_stopped;
  }
  return domain->delete_object(object);
}

/// munmap(addr, length) through the default domain; see deferred_domain::unmap. Bad input is
/// refused before the default domain is even created. If it cannot be created, unmaps inline
/// (inline_stopped).
inline decision async_munmap(void* addr, std::size_t length) {
  (void)detail::checked_unmap_length(addr, length);
  deferred_domain* domain = detail::default_domain_or_null();
  if (domain == nullptr) {
    detail::unmap_range(addr, length);
    return decision::inline_stopped;
  }
  return domain->unmap(addr, length);
}


}  // namespace teardown
