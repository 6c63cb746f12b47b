# Install rules: headers, the exported target, the CMake package and teardown.pc.
#
# Everything here is made at configure time (the target is INTERFACE, the package files are
# configured), so `cmake --install <build>` works without a build. Components: teardown_development
# (headers, CMake package, teardown.pc) and teardown_tools (tools/, installed only once built).
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
# or -DTEARDOWN_HAVE_ATOMIC_OPS=1 to insist.
configure_file("${PROJECT_SOURCE_DIR}/cmake/teardown.pc.in" "${PROJECT_BINARY_DIR}/teardown.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/teardown.pc" DESTINATION "${TEARDOWN_INSTALL_PKGCONFIGDIR}"
        COMPONENT teardown_development)
