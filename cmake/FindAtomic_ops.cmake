# FindAtomic_ops — libatomic_ops, for teardown's optional ao_atomics policy.
#
# Provides the imported target Atomic_ops::atomic_ops and Atomic_ops_FOUND.
# Upstream's CMake package (Atomic_opsConfig.cmake) is tried first; Debian 12 ships only the
# pkg-config file atomic_ops.pc, so that is the fallback, and a plain header search the last.
# Only headers are needed by teardown (the operations are inline); the library is linked when
# present because the package says to.

if(TARGET Atomic_ops::atomic_ops)
  set(Atomic_ops_FOUND TRUE)
  return()
endif()

find_package(Atomic_ops CONFIG QUIET)
if(Atomic_ops_FOUND AND TARGET Atomic_ops::atomic_ops)
  return()
endif()

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_ATOMIC_OPS QUIET atomic_ops)
endif()

find_path(Atomic_ops_INCLUDE_DIR atomic_ops.h HINTS ${PC_ATOMIC_OPS_INCLUDE_DIRS})
find_library(Atomic_ops_LIBRARY NAMES atomic_ops HINTS ${PC_ATOMIC_OPS_LIBRARY_DIRS})
set(Atomic_ops_VERSION "${PC_ATOMIC_OPS_VERSION}")

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Atomic_ops
  REQUIRED_VARS Atomic_ops_INCLUDE_DIR
  VERSION_VAR Atomic_ops_VERSION)

if(Atomic_ops_FOUND)
  add_library(Atomic_ops::atomic_ops INTERFACE IMPORTED)
  set_target_properties(Atomic_ops::atomic_ops PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Atomic_ops_INCLUDE_DIR}")
  if(Atomic_ops_LIBRARY)
    set_property(TARGET Atomic_ops::atomic_ops PROPERTY INTERFACE_LINK_LIBRARIES "${Atomic_ops_LIBRARY}")
  endif()
endif()
mark_as_advanced(Atomic_ops_INCLUDE_DIR Atomic_ops_LIBRARY)
