// const_key_codegen — not a benchmark: a translation unit whose object code docs/benchmarks.md
// quotes, to show what each gate costs in instructions. CMake builds it at -O2 as an object
// library so that it keeps compiling; nothing links it. To read it:
//   objdump -dr --no-show-raw-insn -C
//   <build>/benchmarks/CMakeFiles/const_key_codegen.dir/micro/const_key_codegen.cpp.o
//
// The two paths are out-of-line functions defined elsewhere, as in a real caller, so the object
// code shows only the gate: gated_by_const_key should be a lone jump to tear_down_inline (the
// same as ungated), gated_by_static_key one load of the key, a test and a branch.
#include "teardown/static_key.hpp"

struct widget;

extern "C" void tear_down_inline(widget& w);
extern "C" void defer_teardown(widget& w);

// Another translation unit may enable it: the compiler must read it at every call.
teardown::static_key deferred_teardown_key;

extern "C" void ungated(widget& w) { tear_down_inline(w); }

extern "C" void gated_by_const_key(widget& w) {
  if (teardown::const_key<false>::enabled()) {
    defer_teardown(w);
  } else {
    tear_down_inline(w);
  }
}

extern "C" void gated_by_static_key(widget& w) {
  if (deferred_teardown_key.enabled()) {
    defer_teardown(w);
  } else {
    tear_down_inline(w);
  }
}
