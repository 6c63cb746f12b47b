// tests/unit/schedule/memory_model.hpp — weak memory for the scheduler's atomics.
//
// Under the scheduler threads run one at a time, so every load would read the latest store:
// sequential consistency, under which a weakened memory order changes nothing. This model gives
// each scheduled atomic the part of the C++ memory model that orders matter to, as loom and
// CDSChecker do:
//   - each thread has a vector clock; thread start and join, and a load with acquire (or
//     stronger) that reads a store with release (or a release sequence: RMWs after it) join
//     the storer's clock into the loader's;
//   - each atomic keeps its last stores in modification order; a load may read any of them that
//     coherence and happens-before allow: not older than the newest store or load of that atomic
//     which happens before it (its own included). Which one is the schedule's choice:
//     stale_per_mille / 1000 of the loads that have a choice read an older store, picked
//     uniformly (pct and random; exhaustive stays sequentially consistent);
//   - an RMW (exchange, fetch_*, a successful compare-exchange) reads the latest store, unless
//     it may be placed earlier in the modification order: right after an older store S it may
//     read, when its own write leaves S's value unchanged (an exchange of null on an empty
//     list, a fetch_or of a bit already set, a fetch_add(0)) and it does not release (so no
//     later acquirer would have synchronised with it). Then every later read stays consistent,
//     and the RMW simply reads S and writes nothing new: this is how a consumer's exchange
//     misses a push it is not ordered after. A failed compare-exchange is a load and may read
//     any allowed store whose value differs from the one expected;
//   - the run's order of seq_cst operations is their single total order S: a seq_cst load reads
//     the last seq_cst store to its atomic before it in S, or a later (non-seq_cst) one.
// The model is never weaker than C++ (its simplifications: a bounded window of stores and of
// accesses per thread, RMWs placed early only where their write changes nothing, a seq_cst load
// never reading a store older than the last seq_cst one), so a failure it finds is a real
// execution. Non-atomic data is checked where a scenario asks:
// publish() stamps the thread's clock, ordered_here(stamp) says whether the stamp happens before
// the calling thread's now (a teardown that reads an item published without a release/acquire
// chain would be a data race).
//
// Who may call what: primitives.hpp's atomic<W> and scheduler.hpp's scheduler; scenarios call
// publish() and ordered_here() through schedule.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace teardown::schedule::detail {

constexpr int max_threads = 32;

using vclock = std::array<std::uint32_t, max_threads>;

inline void join_into(vclock& into, const vclock& from) {
  for (std::size_t t = 0; t < into.size(); ++t) into[t] = std::max(into[t], from[t]);
}

constexpr bool acquires(std::memory_order order) {
  return order == std::memory_order_acquire || order == std::memory_order_acq_rel ||
         order == std::memory_order_seq_cst || order == std::memory_order_consume;
}
constexpr bool releases(std::memory_order order) {
  return order == std::memory_order_release || order == std::memory_order_acq_rel ||
         order == std::memory_order_seq_cst;
}
// A compare-exchange's failure order may not be release; its load part is what fails.
constexpr std::memory_order load_part(std::memory_order order) {
  if (order == std::memory_order_acq_rel) return std::memory_order_acquire;
  if (order == std::memory_order_release) return std::memory_order_relaxed;
  return order;
}

/// What a thread under the scheduler brings to an atomic operation: its index, its clock, and
/// the schedule's choice of the store a load reads (an index in [oldest, latest]).
struct memory_thread {
  int self;
  vclock& clock;
  std::uint64_t run;
  std::uint64_t (*choose_store)(void* scheduler, std::uint64_t oldest, std::uint64_t latest);
  void* scheduler;
};

/// One atomic's recent stores and accesses, for the run that made them.
template <class W>
class store_history {
 public:
  static constexpr std::size_t store_window = 8;   // stores a load may still read
  static constexpr std::size_t access_window = 4;  // per thread: its last accesses

  // A load: returns the value of the store the schedule picked among those allowed.
  W load(const memory_thread& t, W latest_value, std::memory_order order) {
    renew(t.run, latest_value);
    ++t.clock[static_cast<std::size_t>(t.self)];
    const std::uint64_t latest = first_ + count_ - 1;
    std::uint64_t oldest = std::max(first_, floor_for(t.clock));
    if (order == std::memory_order_seq_cst) oldest = std::max(oldest, last_seq_cst_);
    const std::uint64_t read = oldest == latest ? latest : t.choose_store(t.scheduler, oldest, latest);
    const store& s = at(read);
    if (acquires(order) && s.releases) join_into(t.clock, s.release);
    note_access(t, read);
    return s.value;
  }

  // A store (or an RMW's write, with `rmw`): appended as the latest. An RMW first reads the
  // latest store, acquiring with `order`, and continues its release sequence.
  void write(const memory_thread& t, W previous_value, W value, std::memory_order order, bool rmw) {
    renew(t.run, previous_value);
    const store& last = at(first_ + count_ - 1);
    const bool carries = rmw && last.releases;
    vclock carried{};
    if (carries) carried = last.release;
    if (rmw && acquires(order) && last.releases) join_into(t.clock, last.release);
    const std::uint32_t epoch = ++t.clock[static_cast<std::size_t>(t.self)];
    store made{value, t.self, epoch, releases(order) || carries, {}};
    if (releases(order)) made.release = t.clock;
    if (carries) join_into(made.release, carried);
    append(made);
    note_access(t, first_ + count_ - 1);
    if (order == std::memory_order_seq_cst) last_seq_cst_ = first_ + count_ - 1;
  }

  // An RMW placed early (see the header): the value of an older store it may read and leave
  // unchanged, if the schedule picks one, else nothing (the RMW then reads the latest). `next`
  // is the value it would write after reading a value; `differs`, for a compare-exchange's
  // failure, the values it may read instead (those unequal to the expected one).
  template <class Next>
  std::optional<W> early_rmw(const memory_thread& t, W latest_value, std::memory_order order, Next next,
                             bool fails_on_differs = false, W expected = W{}) {
    if (releases(order) && !fails_on_differs) return std::nullopt;
    renew(t.run, latest_value);
    const std::uint64_t latest = first_ + count_ - 1;
    std::uint64_t oldest = std::max(first_, floor_for(t.clock));
    if (order == std::memory_order_seq_cst) oldest = std::max(oldest, last_seq_cst_);
    std::uint64_t candidates[store_window];
    std::uint64_t n = 0;
    for (std::uint64_t i = oldest; i < latest; ++i) {
      const W value = at(i).value;
      if (fails_on_differs ? !(value == expected) : next(value) == value) candidates[n++] = i;
    }
    if (n == 0) return std::nullopt;
    // The schedule's choice among the candidates and the latest (index n: read the latest).
    const std::uint64_t pick = t.choose_store(t.scheduler, 0, n);
    if (pick == n) return std::nullopt;
    ++t.clock[static_cast<std::size_t>(t.self)];
    const store& s = at(candidates[pick]);
    if (acquires(order) && s.releases) join_into(t.clock, s.release);
    note_access(t, candidates[pick]);
    return s.value;
  }

  // A failed compare-exchange that read the latest store.
  void failed_rmw(const memory_thread& t, W latest_value, std::memory_order failure) {
    renew(t.run, latest_value);
    ++t.clock[static_cast<std::size_t>(t.self)];
    const std::uint64_t latest = first_ + count_ - 1;
    const store& s = at(latest);
    if (acquires(failure) && s.releases) join_into(t.clock, s.release);
    note_access(t, latest);
  }

  // Something outside the model wrote the word (a free run, a thread not under the scheduler):
  // the next scheduled access starts over from the word's value.
  void forget() { run_ = 0; }

 private:
  struct store {
    W value;
    int thread;  // -1: the value the history started from (happens before every access)
    std::uint32_t epoch;
    bool releases;  // a release store, or an RMW in a release sequence: acquiring it joins `release`
    vclock release;
  };
  struct access {
    std::uint32_t epoch;
    std::uint64_t index;
  };
  struct thread_accesses {
    std::array<access, access_window> last{};
    std::size_t count = 0;
    bool dropped = false;  // older accesses fell out of the window
  };

  // A new run (or a word written outside the model) starts from the word's value.
  void renew(std::uint64_t run, W word_value) {
    if (run_ == run && at(first_ + count_ - 1).value == word_value) return;
    run_ = run;
    first_ = 0;
    count_ = 1;
    last_seq_cst_ = 0;
    stores_[0] = store{word_value, -1, 0, false, {}};
    for (thread_accesses& a : accesses_) a = thread_accesses{};
  }

  const store& at(std::uint64_t index) const { return stores_[index % store_window]; }

  void append(const store& s) {
    stores_[(first_ + count_) % store_window] = s;
    if (count_ == store_window) {
      ++first_;
    } else {
      ++count_;
    }
  }

  // The newest index any access that happens before `clock`'s owner made: a load may not read
  // an older store (coherence through happens-before). Where a thread's older accesses fell out
  // of the window, its oldest kept one stands in: a higher floor, a stronger model.
  std::uint64_t floor_for(const vclock& clock) const {
    std::uint64_t floor = 0;
    for (std::size_t k = 0; k < accesses_.size(); ++k) {
      const thread_accesses& a = accesses_[k];
      if (a.count == 0) continue;
      bool found = false;
      for (std::size_t i = a.count; i-- > 0;) {
        if (a.last[i].epoch <= clock[k]) {
          floor = std::max(floor, a.last[i].index);
          found = true;
          break;
        }
      }
      if (!found && a.dropped) floor = std::max(floor, a.last[0].index);
    }
    return floor;
  }

  void note_access(const memory_thread& t, std::uint64_t index) {
    thread_accesses& a = accesses_[static_cast<std::size_t>(t.self)];
    const access made{t.clock[static_cast<std::size_t>(t.self)], index};
    if (a.count == access_window) {
      std::copy(a.last.begin() + 1, a.last.end(), a.last.begin());
      a.last[access_window - 1] = made;
      a.dropped = true;
    } else {
      a.last[a.count++] = made;
    }
  }

  std::uint64_t run_ = 0;
  std::uint64_t first_ = 0;  // the absolute index of the oldest store kept
  std::uint64_t count_ = 0;  // stores kept (the latest is first_ + count_ - 1)
  std::uint64_t last_seq_cst_ = 0;  // the index of the last seq_cst store (0: the first value)
  std::array<store, store_window> stores_{};
  std::array<thread_accesses, max_threads> accesses_{};
};

}  // namespace teardown::schedule::detail
