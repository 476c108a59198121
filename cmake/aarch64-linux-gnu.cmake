# aarch64-linux-gnu.cmake — CMake toolchain file for cross-building corral for 64-bit ARM Linux
# on a Debian x86-64 host (scripts/test-arm64 uses it; README "ARM64").
#
# The compiler is Debian's gcc-aarch64-linux-gnu; the libraries are the :arm64 packages of the
# dependencies installed beside the host ones (multiarch: dpkg --add-architecture arm64, then
# apt-get install libzmq3-dev:arm64 ...; scripts/bootstrap --arm64 does both). pkg-config is
# pointed at the arm64 .pc files only, so that no host library can end up in an arm64 link.
# Tools that run during the build (protoc-c, protoc) stay the host's.
#
# CORRAL_ARM64_PKGCONFIG (environment, optional): extra .pc directories searched first;
# scripts/test-arm64 puts its jemalloc shim there (libjemalloc-dev is not co-installable across
# architectures, so only the arm64 runtime library libjemalloc2:arm64 is installed).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)

set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
# Kept in the cache, so that a re-configure started by the build itself finds it too.
if(DEFINED ENV{CORRAL_ARM64_PKGCONFIG})
    set(CORRAL_ARM64_PKGCONFIG "$ENV{CORRAL_ARM64_PKGCONFIG}" CACHE PATH "extra arm64 .pc dirs")
endif()
set(ENV{PKG_CONFIG_PATH} "${CORRAL_ARM64_PKGCONFIG}")

# Libraries and headers only from the arm64 multiarch directories (and the shared /usr/include);
# programs from the host.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
