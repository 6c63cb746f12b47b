// teardown/llist.hpp — an intrusive lock-free singly linked list (the kernel's llist, templated).
//
// An element type embeds an llist_node and names it as the hook:
//
//     struct job { llist_node hook; ... };
//     llist<job, &job::hook> queue;
//     if (queue.add(j)) wake_consumer();          // only the first adder wakes anyone
//     for (job& j : queue.del_all().reverse()) run(j);   // oldest first; run() may free j
//
// Who may call what at the same time on one llist ("-": no lock needed, "L": the callers must
// serialize among themselves, "x": never):
//
//                   add / add_batch   del_all   del_first   unsynchronized_*
//     add / batch          -             -          -              x
//     del_all              -             -          L              x
//     del_first            -             L          L              x
//     unsynchronized_*     x             x          x              L
//
// - add and add_batch race with anything, including each other: lock-free (a CAS loop that
//   retries only when another thread changed the head in between).
// - del_all races with adds and with other del_all callers; each node goes to exactly one of
//   them. Wait-free: one exchange (lock-free on ao_atomics, whose exchange is a CAS loop).
//   replace_all (take everything, leave a batch in its place: one exchange) counts as a del_all.
// - del_first must have one caller at a time, and no del_all may run beside it. Reason (ABA):
//   del_first reads head = A and A->next = B, then swaps head from A to B. If in between another
//   consumer took A and B and someone re-added A, the head is A again and the swap succeeds,
//   installing B, which is no longer on the list. Adds alone cannot cause this: they never
//   remove A. Lock-free against concurrent adds.
// - unsynchronized_add and unsynchronized_del_all are for a caller that owns the list outright
//   (no other thread touches it): they use plain relaxed loads and stores, no read-modify-write.
// - Signal handlers: every operation is async-signal-safe on std_atomics (std::atomic<void*> is
//   lock-free, asserted in atomics.hpp) and on ao_atomics where libatomic_ops' CAS is a CPU
//   instruction (x86-64, AArch64); a handler may add while its own thread is in the middle of an
//   add or a del_all. The checks' report is write(2), then abort (detail/fatal.hpp).
//
// Order: a list is a stack. del_all returns its nodes newest first; llist_batch::reverse()
// turns a batch oldest first in one walk. add_batch inserts a prepared chain in one step,
// keeping the chain's own order (its front becomes the newest node).
//
// Memory ordering: everything a thread wrote to an element before add(element) (or before
// add_batch of a chain holding it) is visible to the thread that takes that element with
// del_all or del_first. Nothing is promised between two elements' producers. empty() is a
// relaxed snapshot: it may be stale by the time the caller looks at it, and is meant for
// heuristics (should I sleep?) and for quiescent checks.
//
// Adding twice. A node that is on nothing links to itself (the kernel's llist_on_list
// convention); llist_node::on_list() is true from the add (or chain push) that links it until a
// pop takes it off: a batch's or chain's pop_front or range-for, or del_first. The pops mark the
// node off before handing it out, since the caller may free it or add it again. A node handed
// out by del_all is still "on" its batch until the batch yields it. add, unsynchronized_add and
// llist_chain's pushes refuse a node that is still on a list, chain or batch in every build:
// they write a message naming the element type to stderr (write(2), async-signal-safe) and
// abort, rather than link the node twice (a cycle a consumer would walk for ever). The check is
// one relaxed load of the node's own link; the pops pay one relaxed store to it.
//
// Debug checks (on unless NDEBUG; force with TEARDOWN_LLIST_CHECKS=0/1): destroying an llist,
// llist_batch or llist_chain that still holds nodes prints a message naming the element type
// and aborts. With the checks off none of that code exists. Copying an element gives the copy a
// fresh, unlinked hook.
// Design: docs/design.md, "llist: the list".
#pragma once

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>

#include "teardown/atomics.hpp"
#include "teardown/detail/fatal.hpp"

#ifndef TEARDOWN_LLIST_CHECKS
#ifdef NDEBUG
#define TEARDOWN_LLIST_CHECKS 0
#else
#define TEARDOWN_LLIST_CHECKS 1
#endif
#endif

namespace teardown {

struct llist_node;
template <class T, llist_node T::*Hook, class Atomics>
class llist;
template <class T, llist_node T::*Hook>
class llist_batch;
template <class T, llist_node T::*Hook>
class llist_chain;

namespace detail {

template <class T, llist_node T::*Hook>
struct hook_traits;

// "teardown: <what> (element type <type>[, <count> node(s)])" on stderr, then abort.
// Async-signal-safe: an add may run in a signal handler.
[[noreturn]] inline void llist_check_failed(std::string_view what, std::string_view type,
                                            std::size_t count = 0) noexcept {
  write_to_stderr("teardown: ");
  write_to_stderr(what);
  write_to_stderr(" (element type ");
  write_to_stderr(type);
  if (count != 0) {
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof digits, count).ptr;
    write_to_stderr(", ");
    write_to_stderr(std::string_view(digits, static_cast<std::size_t>(end - digits)));
    write_to_stderr(" node(s)");
  }
  write_to_stderr(")\n");
  std::abort();
}

}  // namespace detail

/// The hook an element embeds. Default-constructible; a copy is a fresh, unlinked hook, so
/// copying an element that is on a list never copies its place in the list.
struct llist_node {
  llist_node() noexcept : next_(this) {}
  llist_node(const llist_node&) noexcept : next_(this) {}
  llist_node& operator=(const llist_node&) noexcept { return *this; }  // keeps its own linkage

  /// True while the node is on a list, a chain or a batch: from the add or chain push that
  /// links it until a pop (a batch's or chain's pop_front or range-for, del_first) takes it
  /// off; see "Adding twice" in the header comment. A relaxed snapshot, for the node's owner
  /// (the thread that may add it): another thread's node may be taken off meanwhile. Wait-free.
  bool on_list() const noexcept { return next_.load(std::memory_order_relaxed) != this; }

 private:
  template <class T, llist_node T::*Hook, class Atomics>
  friend class llist;
  template <class T, llist_node T::*Hook>
  friend class llist_batch;
  template <class T, llist_node T::*Hook>
  friend class llist_chain;
  template <class T, llist_node T::*Hook>
  friend struct detail::hook_traits;

  // Atomic because del_first reads the link of a node that a concurrent add has just
  // published, and on_list() may be asked while a consumer takes the node; every access is
  // relaxed, ordering comes from the list head.
  std::atomic<llist_node*> next_;

  // "On nothing" means linked to itself. Every pop does this before handing the node out.
  void mark_off_list() noexcept { next_.store(this, std::memory_order_relaxed); }
  llist_node* next() const noexcept { return next_.load(std::memory_order_relaxed); }
  void set_next(llist_node* next) noexcept { next_.store(next, std::memory_order_relaxed); }
};

namespace detail {

template <class T, llist_node T::*Hook>
struct hook_traits {
  static llist_node& node(T& element) noexcept { return element.*Hook; }

  // The element that embeds `node` (the kernel's container_of). In the Itanium C++ ABI (GCC
  // and Clang on every platform we build for) a pointer to data member is the member's byte
  // offset; a hook cannot sit in a virtual base (such a member pointer does not convert), so
  // the offset is fixed. The copy folds to a constant.
  static T& element(llist_node& node) noexcept {
    static_assert(sizeof(Hook) == sizeof(std::ptrdiff_t),
                  "teardown::llist assumes the Itanium C++ ABI layout of member pointers");
    std::ptrdiff_t offset;
    constexpr auto hook = Hook;
    std::memcpy(&offset, &hook, sizeof offset);
    return *reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(&node) - offset);
  }

  // The number of nodes from `first` to the end of its run. O(n).
  static std::size_t count(const llist_node* first) noexcept {
    std::size_t nodes = 0;
    for (; first != nullptr; first = first->next()) ++nodes;
    return nodes;
  }

  // A list, batch or chain about to forget `first` would lose every node from there on.
  static void check_nothing_lost(const llist_node* first, std::string_view what) noexcept {
#if TEARDOWN_LLIST_CHECKS
    if (first != nullptr) llist_check_failed(what, type_name<T>(), count(first));
#else
    (void)first;
    (void)what;
#endif
  }

  // In every build (see "Adding twice"): linking a node that is still on something would
  // make a cycle or steal it from another list.
  static void check_off_list(const llist_node& node, std::string_view operation) noexcept {
    if (node.on_list()) [[unlikely]] {
      llist_check_failed(operation, type_name<T>());
    }
  }
};

}  // namespace detail

/// What del_all() returns: a private, move-only run of nodes that no other thread can see.
/// Not thread-safe (it is one thread's property). Range-for takes each element out of the batch
/// before yielding it, so the loop body may destroy the element or add it to a list again; a
/// loop left early leaves the rest in the batch.
template <class T, llist_node T::*Hook>
class llist_batch {
  using hooks = detail::hook_traits<T, Hook>;

 public:
  llist_batch() noexcept = default;
  llist_batch(llist_batch&& other) noexcept : first_(std::exchange(other.first_, nullptr)) {}
  llist_batch& operator=(llist_batch&& other) noexcept {
    if (this != &other) {
      hooks::check_nothing_lost(first_, "llist_batch assigned over while still holding nodes");
      first_ = std::exchange(other.first_, nullptr);
    }
    return *this;
  }
  llist_batch(const llist_batch&) = delete;
  llist_batch& operator=(const llist_batch&) = delete;
  ~llist_batch() {
    hooks::check_nothing_lost(first_, "llist_batch destroyed while still holding nodes; they would be lost");
  }

  bool empty() const noexcept { return first_ == nullptr; }

  /// O(n): walks the batch.
  std::size_t size() const noexcept { return hooks::count(first_); }

  /// Empties the batch without reading a node: its nodes belong to nobody here from then on.
  /// Only for the copy of another thread's work in progress (in a fork child, what a thread of
  /// the parent had taken), which must be neither walked nor torn down.
  void forget() && noexcept { first_ = nullptr; }

  /// Takes the first element out of the batch; nullptr when empty.
  T* pop_front() noexcept {
    llist_node* node = first_;
    if (node == nullptr) return nullptr;
    first_ = node->next();
    node->mark_off_list();
    return &hooks::element(*node);
  }

  /// The same nodes in the opposite order (oldest first, for a batch from del_all). O(n).
  llist_batch reverse() && noexcept {
    llist_batch reversed;
    reversed.prepend_reversed(std::move(*this));
    return reversed;
  }

  /// Moves every node of `run` in front of this batch's first node, in the opposite of run's
  /// order (run's last node comes first, run's first node links to this batch's first), and
  /// leaves `run` empty. One walk over `run`, none over this batch: the reversal ends on run's
  /// first node, which is the link to this batch. Joining batches oldest first costs one walk
  /// of each this way (sharded_llist::del_all_oldest_first does, last batch first).
  void prepend_reversed(llist_batch&& run) noexcept {
    llist_node* reversed = first_;
    llist_node* node = std::exchange(run.first_, nullptr);
    while (node != nullptr) {
      llist_node* next = node->next();
      node->set_next(reversed);
      reversed = node;
      node = next;
    }
    first_ = reversed;
  }

  /// Moves every node of `other` behind this batch's last node (this batch's order, then
  /// other's) and leaves `other` empty. O(size()) when both hold nodes: walks this batch to its
  /// end, not `other`, so joining several batches front to back is cheapest last batch first.
  /// O(1), no node read, when either is empty.
  void append(llist_batch&& other) noexcept {
    llist_node* rest = std::exchange(other.first_, nullptr);
    if (rest == nullptr) return;
    if (first_ == nullptr) {
      first_ = rest;
      return;
    }
    llist_node* last = first_;
    while (last->next() != nullptr) last = last->next();
    last->set_next(rest);
  }

  /// A single-pass iterator that pops each element before yielding it.
  class iterator {
   public:
    using value_type = T;
    using reference = T&;
    using difference_type = std::ptrdiff_t;

    T& operator*() const noexcept { return *current_; }
    T* operator->() const noexcept { return current_; }
    iterator& operator++() noexcept {
      current_ = batch_->pop_front();
      return *this;
    }
    void operator++(int) noexcept { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return it.current_ == nullptr;
    }

   private:
    friend class llist_batch;
    explicit iterator(llist_batch* batch) noexcept : batch_(batch), current_(batch->pop_front()) {}
    llist_batch* batch_;
    T* current_;
  };

  iterator begin() noexcept { return iterator(this); }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  template <class U, llist_node U::*H, class A>
  friend class llist;

  explicit llist_batch(llist_node* first) noexcept : first_(first) {}

  llist_node* first_ = nullptr;
};

/// A local, non-atomic chain of elements built by one thread and handed to llist::add_batch,
/// which publishes the whole chain with one successful CAS. Not thread-safe. push_front and
/// push_back are O(1). After add_batch the chain's front is the list's newest node, so
/// push_front(a), push_front(b), add_batch(...) leaves the list as add(a), add(b) would.
template <class T, llist_node T::*Hook>
class llist_chain {
  using hooks = detail::hook_traits<T, Hook>;

 public:
  llist_chain() noexcept = default;
  llist_chain(llist_chain&& other) noexcept
      : first_(std::exchange(other.first_, nullptr)), last_(std::exchange(other.last_, nullptr)) {}
  llist_chain& operator=(llist_chain&& other) noexcept {
    if (this != &other) {
      hooks::check_nothing_lost(first_, "llist_chain assigned over while still holding nodes");
      first_ = std::exchange(other.first_, nullptr);
      last_ = std::exchange(other.last_, nullptr);
    }
    return *this;
  }
  llist_chain(const llist_chain&) = delete;
  llist_chain& operator=(const llist_chain&) = delete;
  ~llist_chain() {
    hooks::check_nothing_lost(first_, "llist_chain destroyed while still holding nodes; they would be lost");
  }

  bool empty() const noexcept { return first_ == nullptr; }

  /// O(n): walks the chain.
  std::size_t size() const noexcept { return hooks::count(first_); }

  void push_front(T& element) noexcept {
    llist_node& node = hooks::node(element);
    hooks::check_off_list(node, "llist_chain::push_front: node is already on a list, chain or batch");
    node.set_next(first_);
    first_ = &node;
    if (last_ == nullptr) last_ = &node;
  }

  void push_back(T& element) noexcept {
    llist_node& node = hooks::node(element);
    hooks::check_off_list(node, "llist_chain::push_back: node is already on a list, chain or batch");
    node.set_next(nullptr);
    if (last_ == nullptr) {
      first_ = &node;
    } else {
      last_->set_next(&node);
    }
    last_ = &node;
  }

  /// Takes the front element out of the chain; nullptr when empty. O(1).
  T* pop_front() noexcept {
    llist_node* node = first_;
    if (node == nullptr) return nullptr;
    first_ = node->next();
    if (first_ == nullptr) last_ = nullptr;
    node->mark_off_list();
    return &hooks::element(*node);
  }

  /// Calls visit(element) for each element, front to back, leaving the chain as it is: visit
  /// must not unlink, re-add or free the element. O(n).
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (llist_node* node = first_; node != nullptr; node = node->next()) visit(hooks::element(*node));
  }

 private:
  template <class U, llist_node U::*H, class A>
  friend class llist;

  llist_node* first_ = nullptr;
  llist_node* last_ = nullptr;
};

/// The list. See the header comment for who may call what and the ordering guarantee.
template <class T, llist_node T::*Hook, class Atomics = std_atomics>
class llist {
  using hooks = detail::hook_traits<T, Hook>;

 public:
  using batch = llist_batch<T, Hook>;
  using chain = llist_chain<T, Hook>;
  using atomics_type = Atomics;

  constexpr llist() noexcept = default;
  llist(const llist&) = delete;
  llist& operator=(const llist&) = delete;
  ~llist() {
    hooks::check_nothing_lost(head_.load(std::memory_order_relaxed),
                              "llist destroyed while still holding nodes; they would be lost");
  }

  /// Thread-safe and lock-free. Returns true iff the list was empty just before, so that only
  /// the first of a run of adders wakes the consumer.
  bool add(T& element) noexcept {
    llist_node& node = hooks::node(element);
    hooks::check_off_list(node, "llist::add: node is already on a list, chain or batch");
    return link(&node, &node);
  }

  /// Thread-safe and lock-free. Publishes the whole chain with one successful CAS and leaves
  /// the chain empty. Returns true iff the list was empty just before; an empty chain is a
  /// no-op returning false.
  bool add_batch(chain&& nodes) noexcept {
    if (nodes.empty()) return false;
    llist_node* first = std::exchange(nodes.first_, nullptr);
    llist_node* last = std::exchange(nodes.last_, nullptr);
    return link(first, last);
  }

  /// Thread-safe; wait-free on std_atomics (one exchange), lock-free on ao_atomics. Takes every
  /// node; the batch yields them newest first.
  [[nodiscard]] batch del_all() noexcept {
    // No "is it empty?" load first: measured with a polling consumer, that load pulls the line
    // to the consumer just as the exchange would, and costs a second transfer when the list is
    // not empty. A consumer that wants to poll cheaply should sleep on was-empty wake-ups.
    // acquire: pairs with the release CAS in link(), so the taker sees each element's contents
    // and the links written before it was published (later adds continue the release sequence).
    return batch(head_.exchange(nullptr, std::memory_order_acquire));
  }

  /// Thread-safe; wait-free on std_atomics (one exchange), lock-free on ao_atomics. Takes every
  /// node, as del_all(), and leaves `nodes` on the list in their place, in the batch's order
  /// (its front becomes the newest node); `nodes` is left empty. O(1): for an owner that parks
  /// a run of nodes where other threads may take it (del_all) and takes it back.
  [[nodiscard]] batch replace_all(batch&& nodes) noexcept {
    // acq_rel: release publishes the batch's nodes (contents and links) to the next taker, as
    // link()'s CAS does; acquire pairs with the adds (or replace_all) of the nodes returned.
    return batch(head_.exchange(std::exchange(nodes.first_, nullptr), std::memory_order_acq_rel));
  }

  /// Lock-free against adds. One caller at a time, and never beside del_all (see the ABA note
  /// in the header comment). Pops the newest node; nullptr when empty.
  [[nodiscard]] T* del_first() noexcept {
    // acquire: pairs with the release CAS in link(); we are about to read first->next.
    llist_node* first = head_.load(std::memory_order_acquire);
    for (;;) {
      if (first == nullptr) return nullptr;
      detail::data_read<Atomics>(first);
      llist_node* next = first->next();
      // Failure is acquire for the same reason as the initial load: the loop goes on to read
      // the new head's link, so it must synchronize with that node's add (release CAS in
      // link()). Success needs no ordering of its own (the node swapped out is the one already
      // acquired), but a failure order stronger than the success order is rejected by GCC 12
      // (-Winvalid-memory-model), so success is acquire too; on x86 and AArch64 it costs nothing
      // extra.
      if (head_.compare_exchange_weak(first, next, std::memory_order_acquire,
                                      std::memory_order_acquire)) {
        break;
      }
    }
    first->mark_off_list();
    return &hooks::element(*first);
  }

  /// A relaxed snapshot; see "Memory ordering" in the header comment.
  bool empty() const noexcept { return head_.load(std::memory_order_relaxed) == nullptr; }

  /// Not thread-safe: for a caller that owns the list outright. Same result as add().
  bool unsynchronized_add(T& element) noexcept {
    llist_node& node = hooks::node(element);
    hooks::check_off_list(node, "llist::unsynchronized_add: node is already on a list, chain or batch");
    llist_node* first = head_.load(std::memory_order_relaxed);
    node.set_next(first);
    head_.store(&node, std::memory_order_relaxed);
    return first == nullptr;
  }

  /// Not thread-safe: for a caller that owns the list outright. Same result as del_all().
  [[nodiscard]] batch unsynchronized_del_all() noexcept {
    llist_node* first = head_.load(std::memory_order_relaxed);
    head_.store(nullptr, std::memory_order_relaxed);
    return batch(first);
  }

 private:
  // Links first..last (already chained together) in front of the current head.
  bool link(llist_node* first, llist_node* last) noexcept {
    llist_node* head = head_.load(std::memory_order_relaxed);
    do {
      // last is still private to this thread here: a relaxed store is enough, the release
      // CAS below publishes it.
      last->set_next(head);
      detail::data_written<Atomics>(last);
      // release: pairs with the acquire in del_all / del_first, publishing the elements.
      // Failure is relaxed: we only retry with the fresh head, reading nothing through it.
    } while (!head_.compare_exchange_weak(head, first, std::memory_order_release,
                                          std::memory_order_relaxed));
    return head == nullptr;
  }

  typename Atomics::template atomic<llist_node*> head_{nullptr};
};

}  // namespace teardown
