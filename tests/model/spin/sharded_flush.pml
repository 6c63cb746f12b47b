/*
 * sharded_flush.pml - Promela model of flush() over a sharded queue: the reaper's worker
 * (include/teardown/reaper.hpp, "The barrier") fed by a sharded_llist
 * (include/teardown/sharded_llist.hpp: add, flag, del_all, del_all_sweep, the summary word).
 * Checked by the SPIN model checker in CTest (label "model").
 *
 * WHAT IS MODELLED
 *
 *   Shared state:
 *     shard[s]  each shard's llist, as a bit set (bit i: item i is on shard s). A push is one
 *               atomic step that returns was_empty; taking a shard (its exchange) is one step.
 *     summary   the summary word, a bit per shard. flag() is one atomic step (its CAS loop
 *               succeeds in one RMW) that returns whether the word was zero: the kick.
 *     kicked    KICKED in the state word: set by an add that returned true, cleared by the
 *               worker before it looks at the queue (its exchange of the state word).
 *     the control plane (flush tickets), under the control mutex: atomic steps.
 *   Processes:
 *     producer(id)  NPROD of them; producer id adds to shard SHARD_OF(id): producers 0 and 1
 *                   share shard 0, producer 2 has shard 1. add = push, then (a separate step:
 *                   the producer may be preempted in between) flag if the push found the shard
 *                   empty; then kick if flag said so. Then, if id is in FLUSHERS, flush():
 *                   take a ticket and wait for it. Every interleaving is explored, among them
 *                   the one the sweep exists for: producer 0 pushes onto the empty shard 0 and
 *                   stops before its flag; producer 1 pushes behind it (not the empty ->
 *                   non-empty add, so it flags nothing) and flushes; producer 2's flag on
 *                   shard 1 makes the word non-zero, so a del_all that trusts the flags takes
 *                   shard 1 only.
 *     worker        the passes of worker_main: take_control_requests (the ticket),
 *                   take_from_queue (del_all_sweep when the pass holds a ticket, del_all
 *                   otherwise), run, complete the ticket; then sleep until kicked or a
 *                   request is pending (or the optional spin sees a non-empty shard).
 *   del_all: one step loads and clears the word (load, then exchange(0) if non-zero); then one
 *   step per shard it takes: the flagged ones, or, if the word was zero, each non-empty one
 *   (each shard's relaxed load and exchange as one step). del_all_sweep: one step clears the
 *   word, then one step per shard, last to first, taking it if non-empty.
 *
 * WHAT IS ABSTRACTED AWAY
 *   - reap_on_caller, put-backs, stop and the hand count (flush_barrier.pml models those over
 *     an llist); here only the worker takes from the queue, and no flush ticket is voided.
 *   - The futex: a kick sets kicked and the sleeping worker wakes on it (reaper_wakeup.pml
 *     proves the wake-up itself); item order; add_batch and add_to; more than two shards.
 *   - The memory model: sequential consistency. sharded_llist.hpp's argument for the summary
 *     word rests on every write to it being an RMW (so the model's single order is its
 *     modification order); a shard's push and exchange are RMWs on the shard's head. The
 *     sweep's relaxed load of an empty-looking head is exact here; in C++ it sees every push
 *     that happens before the flush (the ticket's mutex orders them).
 *
 * PROPERTIES (an assertion violation or an invalid end state is an error)
 *   1. The barrier: when a flush returns, every item whose enqueue had returned when flush()
 *      was called has been torn down (in particular the flusher's own, and the items pushed
 *      behind an unflagged head).
 *   2. Exactly once: no item torn down twice; at the end every item has been torn down once and
 *      every shard is empty.
 *   3. Termination: every producer and flush returns; only the worker may end asleep.
 *
 * MUTANTS
 *   -DMUTANT_FLUSH_PASS_TRUSTS_FLAGS  the pass that completes a ticket calls del_all, which
 *                              takes only the flagged shards: the flusher's item, queued
 *                              behind producer 0's unflagged push, is left on shard 0 and the
 *                              flush returns.
 *
 * RUNNING IT BY HAND (in a scratch directory, e.g. /tmp/m)
 *     spin -a [-DNPROD=3 -DFLUSHERS=2] [-DMUTANT_...] sharded_flush.pml
 *     cc -O2 -DSAFETY -o pan pan.c && ./pan -m100000
 *   "errors: 0" means the properties hold; replay a trail with spin -t -p [options] sharded_flush.pml.
 *   tests/model/spin/run_spin.sh does all of this; ctest -L model runs the registered checks.
 */

#ifndef NPROD
#define NPROD 3            /* producers, one item each */
#endif
#ifndef FLUSHERS
#define FLUSHERS 2         /* bit set: which producers flush after their enqueue */
#endif
#define NITEMS NPROD
#define NSHARDS 2
#define SHARD_OF(id) ((id) < 2 -> 0 : 1)

byte shard[NSHARDS];        /* bit i: item i is on that shard */
byte summary;               /* bit s: shard s flagged */
bool kicked;
byte ran[NITEMS];
byte enq_done;              /* bit i: enqueue(item i) has returned */
byte prod_done;

/* control_mutex_ */
bool control_requested;
byte flush_requested;
byte flush_completed;

bool worker_idle;

/* take shard s into batch (its exchange) */
inline take(s, batch) {
  d_step { batch = batch | shard[s]; shard[s] = 0 }
}

proctype producer(byte id) {
  byte snap, ticket, i;
  bool was_empty, kick;
  d_step {               /* the shard's llist add */
    was_empty = (shard[SHARD_OF(id)] == 0);
    shard[SHARD_OF(id)] = shard[SHARD_OF(id)] | (1 << id);
    printf("P%d: push onto shard %d, was_empty=%d\n", id, SHARD_OF(id), was_empty)
  };
  if
  :: was_empty ->        /* flag(): a CAS on the summary word, true if it was zero */
     d_step {
       kick = (summary == 0);
       summary = summary | (1 << SHARD_OF(id));
       printf("P%d: flag shard %d, kick=%d\n", id, SHARD_OF(id), kick)
     }
  :: else
  fi;
  if
  :: kick -> kicked = true    /* fetch_or(KICKED), and the futex wake */
  :: else
  fi;
  d_step { enq_done = enq_done | (1 << id); was_empty = false; kick = false };
  if
  :: (FLUSHERS & (1 << id)) != 0 ->
     d_step {            /* flush(): request_flush */
       snap = enq_done;
       flush_requested++; ticket = flush_requested; control_requested = true;
       printf("P%d: flush, ticket %d\n", id, ticket)
     };
     flush_completed >= ticket;    /* await_flush */
     printf("P%d: flush returns\n", id);
     d_step {
       i = 0;
       do
       :: i < NITEMS -> assert((snap & (1 << i)) == 0 || ran[i] == 1); i++
       :: else -> break
       od;
       i = 0; snap = 0; ticket = 0
     }
  :: else
  fi;
  prod_done++
}

proctype worker() {
  byte batch, target, flagged, s, i;
loop:
  atomic {               /* take_control_requests */
    if
    :: control_requested ->
       if
       :: flush_requested > flush_completed -> target = flush_requested
       :: else
       fi;
       control_requested = false
    :: else
    fi
  };
#ifndef MUTANT_FLUSH_PASS_TRUSTS_FLAGS
  if
  :: target != 0 ->      /* del_all_sweep: clear the word, then every non-empty shard */
     d_step { summary = 0 };
     s = NSHARDS;
     do
     :: s > 0 -> s--; take(s, batch)
     :: else -> break
     od
  :: else ->
#endif
     /* del_all: clear the word; the flagged shards, or every non-empty one if none */
     d_step { flagged = summary; summary = 0 };
     s = NSHARDS;
     do
     :: s > 0 ->
        s--;
        if
        :: flagged == 0 || (flagged & (1 << s)) != 0 -> take(s, batch)
        :: else
        fi
     :: else -> break
     od;
     flagged = 0
#ifndef MUTANT_FLUSH_PASS_TRUSTS_FLAGS
  fi
#endif
  ;
  atomic {               /* run_in_flight */
    i = 0;
    do
    :: i < NITEMS ->
       if
       :: (batch & (1 << i)) != 0 -> assert(ran[i] == 0); ran[i]++
       :: else
       fi;
       i++
    :: else -> break
    od;
    i = 0
  };
  if
  :: target != 0 ->      /* complete_flush */
     atomic {
       if
       :: flush_completed < target -> flush_completed = target
       :: else
       fi;
       target = 0
     }
  :: else
  fi;
  if
  :: batch != 0 -> batch = 0; goto loop
  :: else
  fi;
  worker_idle = true;
end_sleep:               /* the spin and the sleep: woken by a kick or a request */
  if
  :: kicked -> atomic { kicked = false; worker_idle = false }; goto loop
  :: control_requested -> worker_idle = false; goto loop
  :: shard[0] != 0 || shard[1] != 0 -> worker_idle = false; goto loop   /* the spin saw work */
  fi
}

init {
  byte i;
  atomic {
    i = 0;
    do
    :: i < NPROD -> run producer(i); i++
    :: else -> break
    od;
    run worker();
    i = 0
  };
  (prod_done == NPROD && worker_idle && !kicked && !control_requested &&
   shard[0] == 0 && shard[1] == 0);
  d_step {
    i = 0;
    do
    :: i < NITEMS -> assert(ran[i] == 1); i++
    :: else -> break
    od
  }
}
