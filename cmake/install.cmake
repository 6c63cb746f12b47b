# Install rules: headers, the exported target, the CMake package and teardown.pc.
include(CMakePackageConfigHelpers)

set(TEARDOWN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/teardown"
    CACHE STRING "Where teardownConfig.cmake is installed")
# A header-only package is architecture-independent, so its .pc goes under share/.
set(TEARDOWN_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig"
    CACHE STRING "Where teardown.pc is installed")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/teardown"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS teardown EXPORT teardownTargets)
install(EXPORT teardownTargets
        NAMESPACE teardown::
        FILE teardownTargets.cmake
        DESTINATION "${TEARDOWN_INSTALL_CMAKEDIR}")

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/teardownConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/teardownConfig.cmake"
  INSTALL_DESTINATION "${TEARDOWN_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/teardownConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
set(teardown_config_files
  "${PROJECT_BINARY_DIR}/teardownConfig.cmake"
  "${PROJECT_BINARY_DIR}/teardownConfigVersion.cmake")
if(TEARDOWN_WITH_ATOMIC_OPS)
  list(APPEND teardown_config_files "${PROJECT_SOURCE_DIR}/cmake/FindAtomic_ops.cmake")
endif()
install(FILES ${teardown_config_files} DESTINATION "${TEARDOWN_INSTALL_CMAKEDIR}")

# pkg-config: the same compile flags the CMake target carries.
set(TEARDOWN_PC_REQUIRES "")
set(TEARDOWN_PC_CFLAGS "")
if(TEARDOWN_WITH_ATOMIC_OPS)
  set(TEARDOWN_PC_REQUIRES "atomic_ops")
  set(TEARDOWN_PC_CFLAGS "-DTEARDOWN_HAVE_ATOMIC_OPS=1")
else()
  set(TEARDOWN_PC_CFLAGS "-DTEARDOWN_NO_ATOMIC_OPS=1")
endif()
if(NOT TEARDOWN_WITH_USDT)
  string(APPEND TEARDOWN_PC_CFLAGS " -DTEARDOWN_NO_SDT=1")
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/teardown.pc.in" "${PROJECT_BINARY_DIR}/teardown.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/teardown.pc" DESTINATION "${TEARDOWN_INSTALL_PKGCONFIGDIR}")
