// teardown/deferred/cost.hpp — what an object costs to delete: the bytes its destruction frees,
// compared with the threshold and charged to the budget.
//
// First match wins:
//   1. the deleter's cost function: deferred_deleter<T>{cost} or {domain, cost}, where cost is
//      a std::uint64_t (*)(const T&) (a capture-less lambda converts);
//   2. teardown_cost(const T&), found by argument-dependent lookup only: declare it in T's
//      namespace or as a hidden friend;
//   3. T has capacity() and value_type (std::vector, std::string): sizeof(T) + capacity() *
//      sizeof(value_type), so a 1 GiB std::vector<char> costs 1 GiB whatever its size();
//   4. T is an allocator-aware container with size() (std::deque, std::list, std::map,
//      std::unordered_map...): sizeof(T) + size() * sizeof(value_type);
//   5. sizeof(T).
// 3 and 4 are shallow: a std::vector<std::string> counts the strings' headers, not their
// characters. Give such types a teardown_cost; teardown::deferred_cost(object) is steps 2-5, to
// build one on. A cost function that throws is counted in errors; that object is deleted inline.
//
// Blocks. Bytes are what a free gives back; what it costs the caller depends on the allocator:
// glibc and jemalloc return a big block's pages at its free (a munmap or a purge), tcmalloc and
// mimalloc keep them, and there a free costs per block freed whatever the size. So
// deferred_blocks(object) estimates the blocks the deletion frees: 1 + size() for a node
// container (4) and for a capacity container (3) of elements that are not trivially
// destructible (each may own a block), 1 for any other 3 or 5, 0 (unknown) for 1 and 2. A
// deferred_domain defers an object of at least min_blocks blocks whatever its bytes.
//
// Any thread; as thread-safe as the object's own const members. No ordering of its own.
// Design: docs/design.md, "deferred.hpp: what an object costs".
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace teardown {

namespace detail::cost_lookup {

// Hides every teardown_cost outside T's associated namespaces: only ADL finds candidates.
void teardown_cost() = delete;

template <class T>
concept adl_cost = requires(const T& object) {
  { teardown_cost(object) } -> std::convertible_to<std::uint64_t>;
};

template <class T>
std::uint64_t call(const T& object) {
  return static_cast<std::uint64_t>(teardown_cost(object));
}

}  // namespace detail::cost_lookup

/// T has a teardown_cost(const T&) that argument-dependent lookup finds.
template <class T>
concept has_teardown_cost = detail::cost_lookup::adl_cost<T>;

namespace detail {

template <class T>
concept capacity_container = requires(const T& container) {
  typename T::value_type;
  { container.capacity() } -> std::convertible_to<std::uint64_t>;
};

template <class T>
concept sized_container = requires(const T& container) {
  typename T::value_type;
  typename T::allocator_type;
  { container.size() } -> std::convertible_to<std::uint64_t>;
};

// sizeof(T) + count * element, saturating at the largest uint64_t instead of wrapping.
inline std::uint64_t container_bytes(std::uint64_t header, std::uint64_t count, std::uint64_t element) noexcept {
  constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  if (element != 0 && count > (most - header) / element) return most;
  return header + count * element;
}

}  // namespace detail

/// Steps 2-5 of the cost lookup (see the header comment): what a deferred_deleter without a
/// cost function charges for `object`, in bytes.
template <class T>
std::uint64_t deferred_cost(const T& object) {
  if constexpr (has_teardown_cost<T>) {
    return detail::cost_lookup::call(object);
  } else if constexpr (detail::capacity_container<T>) {
    return detail::container_bytes(sizeof(T), static_cast<std::uint64_t>(object.capacity()),
                                   sizeof(typename T::value_type));
  } else if constexpr (detail::sized_container<T>) {
    return detail::container_bytes(sizeof(T), static_cast<std::uint64_t>(object.size()),
                                   sizeof(typename T::value_type));
  } else {
    return sizeof(T);
  }
}

/// How many heap blocks deleting `object` frees, as far as its type says (see the header
/// comment): what a free costs under an allocator that caches freed memory is its count of
/// free() calls, not its bytes. 0: unknown (a type with its own teardown_cost: its bytes decide).
template <class T>
std::uint64_t deferred_blocks(const T& object) {
  if constexpr (has_teardown_cost<T>) {
    return 0;
  } else if constexpr (detail::capacity_container<T>) {
    // The buffer, and a block per element where elements own memory (an estimate: a short
    // std::string owns none).
    if constexpr (std::is_trivially_destructible_v<typename T::value_type>) {
      return 1;
    } else {
      return 1 + static_cast<std::uint64_t>(object.size());
    }
  } else if constexpr (detail::sized_container<T>) {
    return 1 + static_cast<std::uint64_t>(object.size());  // a node per element (a deque's are fewer)
  } else {
    return 1;
  }
}

}  // namespace teardown
