/*
 * flush_barrier.pml - Promela model of the reaper's flush barrier (include/teardown/reaper.hpp,
 * "The barrier"): flush tickets, reap_on_caller's put-back, and, with -DSTOPPER, the hand count
 * after stop. Checked by the SPIN model checker in CTest (label "model").
 *
 * WHAT IS MODELLED
 *
 *   Shared state:
 *     queue  the llist, as a bit set (bit i: item i is queued). add is one atomic step that
 *            returns was_empty; del_all is one atomic step that takes everything; add_batch of
 *            a put-back is one atomic step.
 *     the control plane, under control_mutex_: control_requested, flush_requested,
 *            flush_completed, caller_reaps, put_backs, pass_put_backs, stop_requested,
 *            worker_done. Each critical section is one atomic step; a condition-variable wait
 *            is a blocking guard on the same variables (a notify_all after every change is
 *            what makes that exact).
 *     with STOPPER: stopped (STOPPED in the state word; every read the protocol relies on is
 *            an RMW, see reaper_wakeup.pml), the hand count (hands[side], the side bit), and
 *            settle_mutex_ (settle_busy).
 *
 *   Processes:
 *     producer(id)  NPROD of them, IPP items each: enqueue(). With STOPPER, the "state &
 *                   STOPPED" fast path is a plain load that may be stale (it may take the add
 *                   path although STOPPED is set); an add that found the queue empty kicks, and
 *                   a kick that reads STOPPED drains inline, counted as a hand
 *                   (drain_inline_counted). An enqueue that reads STOPPED tears its own item
 *                   down, then drains counted.
 *     worker        worker_main's passes: take_control_requests (a ticket, and pass_put_backs),
 *                   take_from_queue, run the batch, complete_flush (refused, and the pass run
 *                   again, if put_backs changed since the ticket was taken); with STOPPER, the
 *                   STOPPED exchange and the final drain, then worker_done.
 *     caller        NREAP calls of reap_on_caller: caller_reaps++ and completed_before, open a
 *                   hand (STOPPER), take the queue, tear down any subset of it here and decline
 *                   the rest (every subset is explored), finish_caller_reap: put the declined
 *                   items back, kick (with STOPPER: a kick that reads STOPPED drains inline),
 *                   then under the mutex caller_reaps--, put_backs++, roll flush_completed back
 *                   to completed_before, request a pass if a flush waits; close the hand. With
 *                   NREAP=0 there is no caller.
 *     flusher(id)   NFLUSH of them: flush() = request_flush + await_flush, and with STOPPER
 *                   settle_after_stop when the worker ended first.
 *     stopper       (STOPPER) stop() = request_stop + await_stop + settle_after_stop.
 *     With LIVENESS (implies STOPPER) the worker has already ended, and NPROD producers loop
 *     for ever, each enqueue draining inline as a hand, until the flusher's flush returns.
 *
 * WHAT IS ABSTRACTED AWAY
 *   - The wake-up protocol: the worker sleeps until the queue is non-empty or a control request
 *     is pending. reaper_wakeup.pml proves that a kick is never lost, which is what this
 *     abstraction assumes; every kick in the code (a first add, request_flush, request_stop,
 *     the put-back) is then implied by the change it follows.
 *   - Item order, the batch's order, reverse(): only which items are where matters here.
 *   - The worker's batch runs in one step after the take (items do not run one by one); the
 *     callers' teardowns are one step each: the barrier looks at ran[] only when a flush
 *     returns, after every step that could matter has happened or not.
 *   - freeze/thaw and the hand-back (handed_back_), a pool's stealing and held_, fork, the
 *     deadlines of flush_for/stop_for, errors thrown by fn or take, enqueue_chain, the join
 *     itself (await_stop's wait for worker_done stands for it).
 *   - The memory model: sequential consistency. The argument for the state word and the list
 *     head is in reaper_wakeup.pml; the hand count's open_hand is an acq_rel CAS, close_hand a
 *     release RMW, the flip an acq_rel fetch_xor and the wait an acquire load, all on one word,
 *     so they are totally ordered (its modification order) and the model's single order of
 *     steps is that one. The control plane is under a mutex.
 *
 * PROPERTIES (an assertion violation or an invalid end state is an error)
 *   1. The barrier: when flush() (or stop()) returns, every item whose enqueue had returned when
 *      it was called has been torn down.
 *   2. Exactly once: no item is torn down twice; at the end every item has been torn down once
 *      and the queue is empty.
 *   3. Termination: every flush, stop and reap_on_caller returns (a process blocked for ever is
 *      an invalid end state); only the worker may end asleep (label end_sleep), without STOPPER.
 *   4. With LIVENESS, as a cycle check under weak fairness (pan -l -f): the flusher that waits
 *      for the old side of the hand count returns even though the producers never stop
 *      draining. Without fairness any process could simply never be scheduled; weak fairness
 *      says a process that stays enabled runs, and a fair cycle here is a flush that never
 *      returns.
 *
 * MUTANTS (each must make SPIN report an error; registered as CTest tests that expect one)
 *   -DMUTANT_IGNORE_PUT_BACKS  complete_flush ignores put_backs: a put-back between the pass's
 *                              take and its completion is missed, and flush returns early.
 *   -DMUTANT_NO_ROLLBACK       finish_caller_reap does not roll flush_completed back.
 *   -DMUTANT_NO_CALLER_WAIT    await_flush does not wait for caller_reaps == 0.
 *   -DMUTANT_NO_HANDS          (STOPPER) no hand count: inline drains are not counted and the
 *                              flusher neither flips nor waits; a flush returns while an inline
 *                              drain still holds an item it took.
 *   -DMUTANT_SETTLE_NO_CALLER_WAIT  (STOPPER) once the worker ended, a flush does not wait for
 *                              the reap_on_caller calls in progress (settle_after_stop skips
 *                              caller_reaps == 0): a call that read "not stopped" puts an item
 *                              back after the flip, and a producer's new-side hand takes it.
 *   -DMUTANT_REAP_NO_HAND      (STOPPER) reap_on_caller opens no hand.
 *   -DMUTANT_WAIT_BOTH_SIDES   (LIVENESS) the flusher waits for the whole hand count to be zero,
 *                              not only the old side: producers that keep draining starve it.
 *
 * EXPERIMENT (not registered)
 *   -DEXPERIMENT_STOP_COVERS_UNTIL_RETURN  stop() asserts the barrier for every enqueue that
 *                              returned before stop() returned, not before it was called. SPIN
 *                              rejects it: an enqueue whose STOPPED load was stale adds behind
 *                              an item whose producer has not kicked yet and returns; stop()
 *                              returns before that kick's drain.
 *
 * TWO RULES AFTER STOP THAT THE CHECKS FOUND (STOPPER)
 *   An earlier version of reaper.hpp let a flush (or stop) return before an item enqueued
 *   before it was torn down; SPIN found both schedules, and the code now has both rules:
 *   - settle_after_stop takes its turn (settle_mutex_) before it drains, since that drain is
 *     not a hand. -DMUTANT_DRAIN_BEFORE_TURN drains first: a stop and a flush settling side by
 *     side, the first has taken an item and not yet torn it down; the second drains nothing,
 *     flips, finds the old side empty and returns.
 *   - finish_caller_reap reads the state word with an RMW first and, when it says STOPPED,
 *     tears the declined items down itself instead of putting them back (a put-back that reads
 *     "not stopped" is older than the worker's end, so a flush after stop waits for it in
 *     caller_reaps). -DMUTANT_PUT_BACK_AFTER_STOP puts them back and learns from its kick that
 *     the worker stopped: a reap_on_caller that began after the flusher's caller_reaps wait
 *     counted its hand on the old side, took an item enqueued before the flush, and puts it
 *     back after the flip; a producer whose hand is on the new side takes it and the flusher
 *     returns.
 *   (-DFIX_SETTLE_DRAIN_COUNTED, counting the settler's drain as a hand instead of taking the
 *   turn first, is another way out of the first schedule.)

 * RUNNING IT BY HAND (in a scratch directory, e.g. /tmp/m)
 *     spin -a [-DSTOPPER] [-DNPROD=2 -DIPP=1 -DNFLUSH=1 -DNREAP=1] [-DMUTANT_...] flush_barrier.pml
 *     cc -O2 -DSAFETY -o pan pan.c && ./pan -m100000     # assertions + invalid end states
 *     spin -a -DLIVENESS flush_barrier.pml
 *     cc -O2 -DNP -o pan pan.c && ./pan -l -f -m100000   # property 4
 *   "errors: 0" means the property holds for this configuration. Replay a trail with
 *     spin -t -p [the same -D options] flush_barrier.pml
 *   tests/model/spin/run_spin.sh does all of this; ctest -L model runs the registered checks.
 */

#ifdef LIVENESS
#define STOPPER
#endif

#ifndef NPROD
#define NPROD 2          /* producers */
#endif
#ifndef IPP
#define IPP 1            /* items each producer enqueues */
#endif
#ifndef NFLUSH
#define NFLUSH 1         /* flush() callers */
#endif
#ifndef NREAP
#define NREAP 1          /* reap_on_caller calls (one thread) */
#endif
#define NITEMS (NPROD * IPP)
#if NPROD * IPP > 8
#error "NPROD * IPP must be at most 8: the queue is a byte bit set"
#endif

byte queue;                 /* bit i: item i is queued */
byte ran[NITEMS];           /* how often item i has been torn down */
byte enq_done;              /* bit i: enqueue(item i) has returned */
byte prod_done;             /* producers that have returned */
byte flush_done;            /* flushes that have returned */
bool reap_done;             /* the caller's reap_on_caller calls have all returned */

/* control_mutex_: every access is inside one atomic step */
bool control_requested;
byte flush_requested;
byte flush_completed;
byte caller_reaps;
byte put_backs;
byte pass_put_backs;
bool stop_requested;
bool worker_done;

bool worker_idle;           /* the worker is asleep (end_sleep) */

#ifdef STOPPER
bool stopped;               /* STOPPED in the state word */
byte hands[2];              /* inline_hands_: the count on each side */
bit side;                   /* inline_hands_'s side bit: the side new hands count on */
bool settle_busy;           /* settle_mutex_ */
bool stop_done;
#endif

/* tear down every item in bit set b; needs a local i (byte) */
inline tear_down(b) {
  i = 0;
  do
  :: i < NITEMS ->
     if
     :: (b & (1 << i)) != 0 ->
        assert(ran[i] == 0);       /* property 2: never twice */
        ran[i]++
     :: else
     fi;
     i++
  :: else -> break
  od;
  i = 0
}

/* property 1: every item in snap has been torn down; needs a local i */
inline check_barrier(snap) {
  d_step {
    i = 0;
    do
    :: i < NITEMS ->
       assert((snap & (1 << i)) == 0 || ran[i] == 1);
       i++
    :: else -> break
    od;
    i = 0
  }
}

#ifdef STOPPER
/* open_hand: count this caller on the side the side bit names (a CAS on inline_hands_) */
inline open_hand(my_side) {
#ifdef MUTANT_NO_HANDS
  skip
#else
  d_step { my_side = side; hands[my_side]++ }
#endif
}

inline close_hand(my_side) {
#ifdef MUTANT_NO_HANDS
  skip
#else
  atomic { hands[my_side]--; my_side = 0 }
#endif
}

/* drain_inline: del_all until it comes back empty, tearing each batch down here. The batch is
   torn down one step after it was taken: in between, this caller holds it. */
inline drain_inline(batch) {
  do
  :: d_step { batch = queue; queue = 0 };
     if
     :: batch == 0 -> break
     :: else -> d_step { tear_down(batch); batch = 0 }
     fi
  od
}

inline drain_inline_counted(my_side, batch) {
  open_hand(my_side);
  drain_inline(batch);
  close_hand(my_side)
}

/* settle_after_stop: wait for the reap_on_callers in progress, drain, then (one flusher at a
   time) flip the side and wait for the old side to empty */
inline settle(batch, old, my_side) {
#ifndef MUTANT_SETTLE_NO_CALLER_WAIT
  caller_reaps == 0;
#endif
#if !defined(MUTANT_DRAIN_BEFORE_TURN) && !defined(FIX_SETTLE_DRAIN_COUNTED)
  atomic { !settle_busy -> settle_busy = true };
  drain_inline(batch);
  skip;
#elif defined(FIX_SETTLE_DRAIN_COUNTED)
  drain_inline_counted(my_side, batch);
  atomic { !settle_busy -> settle_busy = true };
#else
  drain_inline(batch);
  atomic { !settle_busy -> settle_busy = true };
#endif
#ifndef MUTANT_NO_HANDS
  atomic { old = side; side = 1 - side };
#ifdef MUTANT_WAIT_BOTH_SIDES
  hands[0] == 0 && hands[1] == 0;
#else
  hands[old] == 0;
#endif
#endif
  atomic { settle_busy = false; old = 0 }
}
#endif /* STOPPER */

#ifndef LIVENESS
proctype producer(byte id) {
  byte k, item, i;
  bool was_empty;
#ifdef STOPPER
  byte batch;
  bit my_side;
#endif
  do
  :: k < IPP ->
     item = id * IPP + k;
#ifdef STOPPER
     if
     :: stopped ->   /* the worker is gone: tear the item down here, then what is queued */
        d_step { tear_down(1 << item) };
        drain_inline_counted(my_side, batch)
     :: true ->      /* not stopped, or a stale load that missed STOPPED */
#endif
        d_step { was_empty = (queue == 0); queue = queue | (1 << item) }
#ifdef STOPPER
        ;
        if
        :: was_empty && stopped ->   /* the kick's fetch_or read STOPPED */
           drain_inline_counted(my_side, batch)
        :: else
        fi
     fi
#endif
     ;
     atomic { enq_done = enq_done | (1 << item); k++; item = 0; was_empty = false }
  :: else -> break
  od;
  atomic { prod_done++; k = 0 }
}
#endif

#ifndef LIVENESS
proctype worker() {
  byte batch, target, i;
loop:
  atomic {               /* take_control_requests, when control_requested is set */
    if
    :: control_requested && stop_requested -> goto final
    :: control_requested && !stop_requested ->
       if
       :: flush_requested > flush_completed ->
          target = flush_requested;
          pass_put_backs = put_backs   /* a put-back after this voids the pass */
       :: else
       fi;
       control_requested = false
    :: else
    fi
  };
  d_step { batch = queue; queue = 0 };          /* take_from_queue */
  d_step {                                      /* run_in_flight */
    tear_down(batch);
    if
    :: batch != 0 -> printf("W: ran item set %d\n", batch)
    :: else
    fi
  };
  if
  :: target != 0 ->
     atomic {            /* complete_flush */
#ifndef MUTANT_IGNORE_PUT_BACKS
       if
       :: put_backs != pass_put_backs ->   /* the pass may have missed a put-back */
          pass_put_backs = put_backs;
          control_requested = true;
          batch = 0;
          goto loop
       :: else
       fi;
#endif
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
end_sleep:               /* asleep until a kick: the queue or a request changed */
  (queue != 0 || control_requested) -> worker_idle = false; goto loop;

final:
#ifdef STOPPER
  atomic { stopped = true; target = 0 };       /* exchange(state, STOPPED) */
  do                                           /* drain_on_worker */
  :: d_step { batch = queue; queue = 0 };
     if
     :: batch == 0 -> break
     :: else -> d_step { tear_down(batch); batch = 0 }
     fi
  od;
  worker_done = true
#else
  skip
#endif
}
#endif

proctype caller() {
  byte n, completed_before, offered, declined, i;
  bool requeued;
#ifdef STOPPER
  byte batch;
  bit my_side;
#endif
  do
  :: n < NREAP ->
     d_step { caller_reaps++; completed_before = flush_completed };
#if defined(STOPPER) && !defined(MUTANT_REAP_NO_HAND)
     open_hand(my_side);
#endif
     d_step { offered = queue; queue = 0 };     /* queue_.del_all() */
     atomic {            /* take(item) for each: torn down here, or declined */
       i = 0;
       do
       :: i < NITEMS ->
          if
          :: (offered & (1 << i)) != 0 ->
             if
             :: assert(ran[i] == 0); ran[i]++
             :: declined = declined | (1 << i)
             fi
          :: else
          fi;
          i++
       :: else -> break
       od;
       i = 0; offered = 0
     };
     /* finish_caller_reap */
     if
#if defined(STOPPER) && !defined(MUTANT_PUT_BACK_AFTER_STOP)
     :: declined != 0 && stopped ->   /* an RMW read STOPPED first: tear down, put nothing back */
        d_step { tear_down(declined); declined = 0 }
     :: declined != 0 && !stopped ->
#else
     :: declined != 0 ->
#endif
        d_step { queue = queue | declined; requeued = true; printf("C: put back item set %d\n", declined) }
#ifdef STOPPER
        ;
        if
        :: stopped -> drain_inline(batch)        /* the kick read STOPPED */
        :: else
        fi
#endif
     :: else
     fi;
     atomic {
       caller_reaps--;
       if
       :: requeued ->
          put_backs++;
#ifndef MUTANT_NO_ROLLBACK
          if
          :: flush_completed > completed_before -> flush_completed = completed_before
          :: else
          fi
#endif
       :: else
       fi;
       if
       :: flush_requested > flush_completed -> control_requested = true
       :: else
       fi;
       declined = 0; completed_before = 0; requeued = false
     };
#if defined(STOPPER) && !defined(MUTANT_REAP_NO_HAND)
     close_hand(my_side);
#endif
     n++
  :: else -> break
  od;
  atomic { reap_done = true; n = 0 }
}

proctype flusher(byte id) {
  byte snap, ticket, i;
#ifdef STOPPER
  byte batch, old;
  bit my_side;
#endif
  d_step {               /* flush() is called: request_flush */
    snap = enq_done;
    if
    :: stop_requested -> ticket = 0     /* stopped or stopping: the stop drains everything */
    :: else ->
       flush_requested++; ticket = flush_requested; control_requested = true
    fi;
    printf("F%d: flush, ticket %d\n", id, ticket)
  };
  atomic {               /* await_flush */
#ifdef MUTANT_NO_CALLER_WAIT
    (ticket != 0 && flush_completed >= ticket) || worker_done;
    if
    :: ticket != 0 && flush_completed >= ticket -> goto returned
    :: else
    fi
#else
    (ticket != 0 && flush_completed >= ticket && caller_reaps == 0) || worker_done;
    if
    :: ticket != 0 && flush_completed >= ticket && caller_reaps == 0 -> goto returned
    :: else
    fi
#endif
  };
#ifdef STOPPER
  settle(batch, old, my_side);
#endif
returned:
  printf("F%d: flush returns\n", id);
  check_barrier(snap);
  d_step { flush_done++; snap = 0; ticket = 0 }
}

#if defined(STOPPER) && !defined(LIVENESS)
proctype stopper() {
  byte snap, batch, old, i;
  bit my_side;
  d_step {               /* stop() is called: request_stop */
    snap = enq_done;
    stop_requested = true; control_requested = true;
    printf("S: stop\n")
  };
  worker_done;           /* await_stop: the worker ended (and is joined) */
  settle(batch, old, my_side);
  printf("S: stop returns\n");
#ifdef EXPERIMENT_STOP_COVERS_UNTIL_RETURN
  snap = enq_done;
#endif
  check_barrier(snap);
  stop_done = true
}
#endif

#ifdef LIVENESS
/* After stop: an enqueue tears its own item down (not modelled: it touches nothing shared)
   and drains what is queued as a hand, for ever, until the flush returns. */
proctype looping_producer() {
  byte batch, i;
  bit my_side;
  do
  :: flush_done != 0 -> break
  :: else -> drain_inline_counted(my_side, batch)
  od
}
#endif

init {
  byte i;
  atomic {
#ifdef LIVENESS
    stop_requested = true; stopped = true; worker_done = true;   /* the worker has ended */
    i = 0;
    do
    :: i < NPROD -> run looping_producer(); i++
    :: else -> break
    od;
    run flusher(0);
    i = 0
#else
    i = 0;
    do
    :: i < NPROD -> run producer(i); i++
    :: else -> break
    od;
    run worker();
    if
    :: NREAP > 0 -> run caller()
    :: else -> reap_done = true
    fi;
    i = 0;
    do
    :: i < NFLUSH -> run flusher(i); i++
    :: else -> break
    od;
#ifdef STOPPER
    run stopper();
#endif
    i = 0
#endif
  };
#ifndef LIVENESS
#ifdef STOPPER
  (prod_done == NPROD && flush_done == NFLUSH && reap_done && stop_done);
#else
  /* everything returned and the worker asleep with nothing to do */
  (prod_done == NPROD && flush_done == NFLUSH && reap_done &&
   worker_idle && queue == 0 && !control_requested);
#endif
  d_step {
    assert(queue == 0);
    i = 0;
    do
    :: i < NITEMS -> assert(ran[i] == 1); i++
    :: else -> break
    od
  }
#endif
}
