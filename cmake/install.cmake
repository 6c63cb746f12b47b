# Install rules: headers, the exported target, the CMake package and teardown.pc.
#
# Everything here is made at configure time (the target is INTERFACE, the package files are
# configured) or at install time (teardown.pc's prefix), so `cmake --install <build>` works
# without a build. Components: teardown_development (headers, CMake package, teardown.pc) and
# teardown_tools (tools/, installed only once built).
# Nothing installed depends on what the build machine had: libatomic_ops and <sys/sdt.h> are the
# consumer's choice (see the top-level CMakeLists.txt and teardownConfig.cmake.in).
include(CMakePackageConfigHelpers)

set(TEARDOWN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/teardown"
    CACHE STRING "Where teardownConfig.cmake is installed")
# A header-only package is architecture-independent, so its .pc goes under share/.
set(TEARDOWN_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig"
    CACHE STRING "Where teardown.pc is installed")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/teardown"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT teardown_development)
install(TARGETS teardown EXPORT teardownTargets COMPONENT teardown_development)
install(EXPORT teardownTargets
        NAMESPACE teardown::
        FILE teardownTargets.cmake
        DESTINATION "${TEARDOWN_INSTALL_CMAKEDIR}"
        COMPONENT teardown_development)

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/teardownConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/teardownConfig.cmake"
  INSTALL_DESTINATION "${TEARDOWN_INSTALL_CMAKEDIR}")
# Before 1.0 a minor version may break the API (0.2 is not a 0.1), from 1.0 a major one.
# ARCH_INDEPENDENT: the headers are the same for a 32-bit and a 64-bit consumer.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(teardown_compatibility SameMinorVersion)
else()
  set(teardown_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/teardownConfigVersion.cmake"
  COMPATIBILITY ${teardown_compatibility}
  ARCH_INDEPENDENT)
# FindAtomic_ops.cmake always: the atomic_ops component needs it on the consumer's machine,
# whatever this one had (Debian ships only atomic_ops.pc).
install(FILES
          "${PROJECT_BINARY_DIR}/teardownConfig.cmake"
          "${PROJECT_BINARY_DIR}/teardownConfigVersion.cmake"
          "${PROJECT_SOURCE_DIR}/cmake/FindAtomic_ops.cmake"
        DESTINATION "${TEARDOWN_INSTALL_CMAKEDIR}"
        COMPONENT teardown_development)

# pkg-config: what every consumer needs, and nothing more. A consumer that wants the libatomic_ops
# policy asks for it: `pkg-config --cflags teardown atomic_ops` (the header finds <atomic_ops.h>)
# and -DTEARDOWN_HAVE_ATOMIC_OPS=1 to insist.
#
# prefix= is the install prefix itself, written at install time (`cmake --install --prefix` may
# name another than CMAKE_INSTALL_PREFIX) and normalised: pkg-config compares -I paths as text,
# so only a plain `-I/usr/include` is recognised as the system directory and dropped (a
# ${pcfiledir}/../.. prefix gave -I/usr/share/pkgconfig/../../include). A prefix moved as a
# whole: `pkg-config --define-prefix`; an unpacked root (dpkg -x, DESTDIR): PKG_CONFIG_SYSROOT_DIR.
set(teardown_pc_template "${PROJECT_BINARY_DIR}/teardown.pc.in")
set(TEARDOWN_PC_PREFIX "@TEARDOWN_PC_PREFIX@")  # kept for the install-time step
set(TEARDOWN_PC_INCLUDEDIR "@TEARDOWN_PC_INCLUDEDIR@")
configure_file("${PROJECT_SOURCE_DIR}/cmake/teardown.pc.in" "${teardown_pc_template}" @ONLY)
string(CONFIGURE [[
  # teardown.pc: the template with its prefix (normalised, without DESTDIR) and includedir.
  cmake_path(ABSOLUTE_PATH CMAKE_INSTALL_PREFIX NORMALIZE OUTPUT_VARIABLE teardown_pc_prefix)
  string(REGEX REPLACE "/+$" "" teardown_pc_prefix "${teardown_pc_prefix}")
  set(teardown_pc_includedir [==[@CMAKE_INSTALL_INCLUDEDIR@]==])
  if(IS_ABSOLUTE "${teardown_pc_includedir}")
    cmake_path(NORMAL_PATH teardown_pc_includedir)
  else()
    set(teardown_pc_includedir "\${prefix}/${teardown_pc_includedir}")
  endif()
  set(teardown_pc_dir [==[@TEARDOWN_INSTALL_PKGCONFIGDIR@]==])
  if(NOT IS_ABSOLUTE "${teardown_pc_dir}")
    set(teardown_pc_dir "${CMAKE_INSTALL_PREFIX}/${teardown_pc_dir}")
  endif()
  file(INSTALL DESTINATION "${teardown_pc_dir}" TYPE FILE RENAME teardown.pc
       FILES [==[@teardown_pc_template@]==])
  # file(INSTALL) put it under DESTDIR (as it does every file); the placeholders are filled there.
  set(teardown_pc_file "$ENV{DESTDIR}${teardown_pc_dir}/teardown.pc")
  file(READ "${teardown_pc_file}" teardown_pc)
  string(REPLACE "@TEARDOWN_PC_PREFIX@" "${teardown_pc_prefix}" teardown_pc "${teardown_pc}")
  string(REPLACE "@TEARDOWN_PC_INCLUDEDIR@" "${teardown_pc_includedir}" teardown_pc "${teardown_pc}")
  file(WRITE "${teardown_pc_file}" "${teardown_pc}")
]] teardown_pc_code @ONLY)
install(CODE "${teardown_pc_code}" COMPONENT teardown_development)

# tools/ installs teardown-run and libteardown_shadow.so with install(TARGETS ... OPTIONAL), so
# that an install without a build (the header-only install) skips them. CMake's file(INSTALL)
# creates each destination directory before it finds that there is nothing to copy, which left an
# empty bin/ and lib/ (lib/<multiarch>/teardown/ in the Debian build) behind. The two install
# rules below bracket tools/'s (the top-level CMakeLists.txt calls them around add_subdirectory):
# BEGIN notes which of those directories do not exist yet, END removes those of them that are
# still empty, deepest first. A directory that existed before the install is never touched.
function(teardown_tools_install_dirs step)
  if(step STREQUAL "BEGIN")
    string(CONFIGURE [[
      set(teardown_tools_new_dirs "")
      foreach(teardown_dir IN ITEMS [==[@CMAKE_INSTALL_BINDIR@]==] [==[@CMAKE_INSTALL_LIBDIR@]==])
        if(NOT IS_ABSOLUTE "${teardown_dir}")
          set(teardown_dir "${CMAKE_INSTALL_PREFIX}/${teardown_dir}")
        endif()
        cmake_path(ABSOLUTE_PATH teardown_dir NORMALIZE)
        string(REGEX REPLACE "/+$" "" teardown_dir "$ENV{DESTDIR}${teardown_dir}")
        while(NOT teardown_dir STREQUAL "" AND NOT EXISTS "${teardown_dir}")
          list(APPEND teardown_tools_new_dirs "${teardown_dir}")
          get_filename_component(teardown_dir "${teardown_dir}" DIRECTORY)
        endwhile()
      endforeach()
    ]] code @ONLY)
  else()
    set(code [[
      foreach(teardown_dir IN LISTS teardown_tools_new_dirs)
        file(GLOB teardown_entries LIST_DIRECTORIES true "${teardown_dir}/*" "${teardown_dir}/.*")
        if(IS_DIRECTORY "${teardown_dir}" AND NOT teardown_entries)
          file(REMOVE_RECURSE "${teardown_dir}")
        endif()
      endforeach()
    ]])
  endif()
  install(CODE "${code}" COMPONENT teardown_tools)
endfunction()
