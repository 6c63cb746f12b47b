/*
 * reaper_wakeup.pml - Promela model of the reaper worker's wake-up and stop protocol
 * (include/teardown/reaper.hpp), checked by the SPIN model checker in CTest (label "model").
 *
 * WHAT IS MODELLED
 *
 *   Shared state, exactly as in the protocol:
 *     list   the intrusive lock-free LIFO (teardown::llist). Only which items are on it matters
 *            to the protocol, not their order, so it is a bit set: add() is one atomic step that
 *            returns was_empty, del_all() is one atomic step that takes everything.
 *     state  the 32-bit word with SLEEPING=1, KICKED=2, STOPPED=4; every change is one atomic
 *            read-modify-write (fetch_or / exchange).
 *     the futex on `state`, holding at most the one waiter there is (the worker): fw_queued.
 *       futex_wait(state, SLEEPING): in one atomic step, if state == SLEEPING the worker joins
 *         the wait queue, otherwise it returns at once (EAGAIN). Queued, it blocks until a
 *         futex_wake dequeues it, or until a spurious wake-up (EINTR and the like), of which
 *         there are at most MAX_SPURIOUS in a run, so that a worker that is really stuck does
 *         block and SPIN can see it.
 *       futex_wake(state): dequeues the waiter if one is queued; a wake with nobody queued is
 *         lost, as in Linux.
 *
 *   Processes:
 *     producer(id)  NPROD of them, each enqueueing IPP distinct items, with enqueue() as in the
 *                   protocol. The "state & STOPPED" fast-path test is a plain load in C++ and may
 *                   return a stale "not stopped"; the model therefore lets it take the normal
 *                   path even when STOPPED is set (STOPPED is never cleared once set, so a load
 *                   that does see it cannot be stale in the other direction).
 *     worker        the worker loop, including the optional bounded spin (a nondeterministic
 *                   "list nonempty? goto loop") and, with STOPPER, the final drain.
 *     stopper       (only with -DSTOPPER) stop(), at an arbitrary point: before, between or
 *                   after the producers' enqueues (they are separate processes and every
 *                   interleaving is explored, so producers also enqueue after stop() returned).
 *     init          starts everything, waits for the end and checks the final state.
 *   run(item) is modelled as "ran[item]++", done in the same atomic step as the del_all that
 *   took the batch: running is thread-local work that touches no protocol state, and every
 *   check below looks at ran[] only after the thread that ran the batch has moved on.
 *
 * PROPERTIES (an assertion violation or an invalid end state is an error)
 *   1. Exactly once: run() asserts the item has not run before; at the end every item has
 *      run exactly once and the list is empty.
 *   2. No lost wake-up (configuration without STOPPER): init waits until every producer has
 *      returned and the worker is queued in futex_wait, and then asserts that the list is
 *      empty and every item has run. A worker asleep with work on the list and nobody left to
 *      wake it fails this assertion.
 *      With STOPPER: stop() returns (a stopper blocked in join is an invalid end state), every
 *      item whose enqueue() returned before stop() was called has run by the time stop()
 *      returns, and once the producers are done too every item has run exactly once.
 *   3. Deadlock: every process must finish, except the worker without STOPPER, which may end
 *      blocked in futex_wait (label end_sleep) - and property 2 says when that is allowed.
 *   4. (run with -DNP and pan -l, see run_spin.sh) No cycles at all: every execution is finite,
 *      so with 3 nothing can spin forever either; in particular stop() terminates.
 *
 * MUTANTS (each must make SPIN report an error; registered as CTest tests that expect one)
 *   -DMUTANT_NO_KICK_CHECK   the worker drops "if (prev & KICKED)" after exchange(SLEEPING) and
 *                            goes to futex_wait; a kick that came before the exchange is lost.
 *   -DMUTANT_WAKE_FROM_LOAD  a producer decides whether to make the futex_wake syscall from a
 *                            plain load of `state` taken before its fetch_or, instead of from
 *                            the value the fetch_or returned (a syscall elision done wrong).
 *   -DMUTANT_STORE_KICK      a producer sets KICKED with a load and a plain store instead of
 *                            fetch_or; the store clobbers STOPPED (and SLEEPING).
 *   -DMUTANT_NO_FINAL_DRAIN  the worker exits right after exchange(state, STOPPED), without the
 *                            drain.
 *   -DMUTANT_UNBOUNDED_SPURIOUS  not a protocol change: futex_wait may return spuriously without
 *                            bound, so the worker can loop forever; shows that the cycle check
 *                            (property 4) does report cycles.
 *
 * MEMORY MODEL
 *   Promela is sequentially consistent: each step reads the latest value. The C++ code uses
 *   acq_rel read-modify-writes on `state`, a release CAS in llist add() and an acquire exchange
 *   in del_all(). Modelling this as SC is sound here because every access to `state` that the
 *   protocol relies on is an RMW: RMWs on one location are totally ordered (its modification
 *   order), each reads the value immediately before it in that order - the latest one, as in the
 *   model - and, every later write being an RMW too, each acquire RMW synchronizes with every
 *   release RMW earlier in the order (release sequences). The same holds for the list head: a
 *   successful add CAS and del_all's exchange are RMWs, so was_empty and the batch taken are
 *   exact, and the taker sees the items. The one plain load of `state` (the producer's STOPPED
 *   fast path) is modelled as possibly stale, above. stop_requested is a plain store/load: the
 *   stopper stores it before its fetch_or(KICKED) and the worker reads it only after an acquire
 *   RMW on `state`, so once the worker's RMW reads the kick (or a later value) it must see true;
 *   a worker read that misses the store is ordered before the kick, as in some SC interleaving.
 *   The futex compare-and-block and the wake are serialized by the kernel (hash-bucket lock and
 *   full barriers), which the atomic steps above express.
 *
 * RUNNING IT BY HAND (in a scratch directory, e.g. /tmp/m)
 *     spin -a [-DSTOPPER] [-DNPROD=3 -DIPP=2] [-DMUTANT_...] /path/to/reaper_wakeup.pml
 *     cc -O2 -DSAFETY -o pan pan.c && ./pan -m100000     # assertions + invalid end states
 *     cc -O2 -DNP -o pan pan.c && ./pan -l -m100000      # cycles (property 4)
 *   "errors: 0" means the property holds for this configuration. On an error pan writes
 *   reaper_wakeup.pml.trail; replay it with
 *     spin -t -p [the same -D options] /path/to/reaper_wakeup.pml
 *   tests/model/spin/run_spin.sh does all of this; ctest -L model runs the registered checks.
 */

#ifndef NPROD
#define NPROD 2          /* producers */
#endif
#ifndef IPP
#define IPP 2            /* items each producer enqueues */
#endif
#define NITEMS (NPROD * IPP)   /* at most 8: list and enq_done are byte bit sets */
#if NPROD * IPP > 8
#error "NPROD * IPP must be at most 8"
#endif
#ifndef MAX_SPURIOUS
#define MAX_SPURIOUS 1   /* spurious futex_wait returns per run */
#endif

#define SLEEPING 1
#define KICKED   2
#define STOPPED  4

byte state;                 /* the state word */
byte list;                  /* bit i: item i is on the list */
byte ran[NITEMS];           /* how often item i has run */
bool fw_queued;             /* the worker is on the futex wait queue */
byte spurious = MAX_SPURIOUS;
bool stop_requested;
bool worker_exited;
bool stop_done;             /* stop() has returned */
byte enq_done;              /* bit i: enqueue(item i) has returned */
byte prod_done;             /* producers that have returned */

/* run every item in bit set b; needs locals i (byte) */
inline run_all(b) {
  i = 0;
  do
  :: i < NITEMS ->
     if
     :: (b & (1 << i)) != 0 ->
        assert(ran[i] == 0);       /* property 1: never run twice */
        ran[i]++
     :: else
     fi;
     i++
  :: else -> break
  od;
  i = 0
}

/* for x in list.del_all(): run(x) - batch becomes the set taken (0: the list was empty) */
inline drain(batch) {
  d_step {
    batch = list; list = 0; run_all(batch);
    if
    :: batch != 0 -> printf("[pid %d] del_all took item set %d\n", _pid, batch)
    :: else
    fi
  }
}

/* the producer's was_empty branch: prev = fetch_or(state, KICKED), then drain or wake */
inline kick(id, prev, batch) {
#ifdef MUTANT_WAKE_FROM_LOAD
  seen = state;
#endif
#ifdef MUTANT_STORE_KICK
  prev = state;          /* load ... */
  state = KICKED;        /* ... and plain store: not atomic, and clobbers the other bits */
#else
  d_step { prev = state; state = state | KICKED }
#endif
  printf("P%d: kick, prev=%d\n", id, prev);
  if
  :: (prev & STOPPED) != 0 -> drain(batch)          /* worker gone: drain inline */
#ifdef MUTANT_WAKE_FROM_LOAD
  :: else -> if
             :: (seen & SLEEPING) != 0 -> fw_queued = false; printf("P%d: futex_wake\n", id)
             :: else
             fi
#else
  :: else -> if
             :: (prev & SLEEPING) != 0 -> fw_queued = false; printf("P%d: futex_wake\n", id)
             :: else
             fi
#endif
  fi
}

proctype producer(byte id) {
  byte k, item, prev, batch, i;
  bool was_empty;
#ifdef MUTANT_WAKE_FROM_LOAD
  byte seen;
#endif
  do
  :: k < IPP ->
     item = id * IPP + k;
     if
     :: (state & STOPPED) != 0 ->
        /* worker gone: run the item here, and anything left on the list */
        d_step { assert(ran[item] == 0); ran[item]++; printf("P%d: STOPPED, ran %d inline\n", id, item) };
        drain(batch)
     :: true ->   /* not stopped, or a stale load that missed STOPPED */
        d_step {  /* was_empty = list.add(item) */
          was_empty = (list == 0); list = list | (1 << item);
          printf("P%d: add %d, was_empty=%d\n", id, item, was_empty)
        };
        if
        :: was_empty -> kick(id, prev, batch)
        :: else
        fi
     fi;
     d_step {
       enq_done = enq_done | (1 << item); k++;
       item = 0; prev = 0; batch = 0; was_empty = false
#ifdef MUTANT_WAKE_FROM_LOAD
       ; seen = 0
#endif
     }
  :: else -> break
  od;
  prod_done++
}

proctype worker() {
  byte prev, batch, i;
loop:
  if
  :: stop_requested -> printf("W: stop_requested seen\n"); goto final
  :: else
  fi;
  drain(batch);
  if
  :: batch != 0 -> batch = 0; goto loop
  :: else
  fi;
  if
  :: list != 0 -> goto loop     /* optional bounded spin saw work */
  :: true
  fi;
  d_step { prev = state; state = SLEEPING; printf("W: sleeping, prev=%d\n", prev) }
#ifndef MUTANT_NO_KICK_CHECK
  if
  :: (prev & KICKED) != 0 -> d_step { state = 0; prev = 0 }; goto loop
  :: else
  fi;
#endif
  d_step {               /* futex_wait(state, SLEEPING): compare and enqueue atomically */
    prev = 0;
    if
    :: state == SLEEPING -> fw_queued = true; printf("W: futex_wait blocks\n")
    :: else -> printf("W: futex_wait EAGAIN\n")
    fi
  };
end_sleep:               /* a valid place to end: property 2 says when */
  if
  :: !fw_queued
#ifdef MUTANT_UNBOUNDED_SPURIOUS
  :: fw_queued -> d_step { fw_queued = false; printf("W: spurious wake\n") }
#else
  :: fw_queued && spurious > 0 -> d_step { spurious--; fw_queued = false; printf("W: spurious wake\n") }
#endif
  fi;
  state = 0;             /* exchange(state, 0) */
  goto loop;

final:
  state = STOPPED;       /* exchange(state, STOPPED); the old value is not used */
  printf("W: STOPPED\n");
#ifndef MUTANT_NO_FINAL_DRAIN
  do                     /* for x in list.del_all(): run(x), until empty: items whose */
  :: drain(batch);       /* producer kicked before the exchange (later ones drain inline) */
     if
     :: batch == 0 -> break
     :: else -> batch = 0
     fi
  od;
#endif
  worker_exited = true
}

#ifdef STOPPER
proctype stopper() {
  byte prev, snap, i;
  d_step { stop_requested = true; snap = enq_done; printf("S: stop\n") };
  d_step {               /* prev = fetch_or(state, KICKED) */
    prev = state; state = state | KICKED; printf("S: kick, prev=%d\n", prev)
  };
  if
  :: (prev & SLEEPING) != 0 -> fw_queued = false; printf("S: futex_wake\n")
  :: else
  fi;
  worker_exited;         /* join */
  d_step {
    /* every enqueue that had returned when stop() was called has run by now */
    i = 0;
    do
    :: i < NITEMS ->
       assert((snap & (1 << i)) == 0 || ran[i] == 1);
       i++
    :: else -> break
    od;
    i = 0; prev = 0; snap = 0
  };
  stop_done = true
}
#endif

init {
  byte i;
  atomic {
    i = 0;
    do
    :: i < NPROD -> run producer(i); i++
    :: else -> break
    od;
    run worker();
#ifdef STOPPER
    run stopper();
#endif
    i = 0
  };
#ifdef STOPPER
  (prod_done == NPROD && stop_done);
#else
  (prod_done == NPROD && fw_queued);   /* all enqueued, worker asleep */
#endif
  d_step {
    assert(list == 0);
    i = 0;
    do
    :: i < NITEMS -> assert(ran[i] == 1); i++
    :: else -> break
    od
  }
}
