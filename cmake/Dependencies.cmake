# Dependencies.cmake — find corral's fixed dependencies, all from Debian packages.
#
# Every library is looked up through pkg-config and every tool with find_program. Nothing stops at
# the first miss: all misses are collected and reported together, each with the Debian package that
# provides it, so that one apt-get line fixes a machine (scripts/bootstrap does exactly that).

find_package(PkgConfig QUIET)
if(NOT PKG_CONFIG_FOUND)
    message(FATAL_ERROR "corral: pkg-config not found. Install the Debian package: pkg-config\n"
                        "    apt-get install -y pkg-config   (or run scripts/bootstrap as root)")
endif()

set(CORRAL_MISSING_PACKAGES "")
set(CORRAL_MISSING_DETAILS "")

# corral_require_module(<prefix> <pkg-config module> <Debian package>)
# On success defines the imported target PkgConfig::<prefix>.
function(corral_require_module prefix module debian_package)
    pkg_check_modules(${prefix} QUIET IMPORTED_TARGET GLOBAL ${module})
    if(NOT ${prefix}_FOUND)
        set(CORRAL_MISSING_PACKAGES "${CORRAL_MISSING_PACKAGES} ${debian_package}" PARENT_SCOPE)
        set(CORRAL_MISSING_DETAILS
            "${CORRAL_MISSING_DETAILS}\n    pkg-config module '${module}' not found -> Debian package ${debian_package}"
            PARENT_SCOPE)
    endif()
endfunction()

# corral_require_program(<variable> <program> <Debian package>)
function(corral_require_program variable program debian_package)
    find_program(${variable} ${program})
    if(NOT ${variable})
        set(CORRAL_MISSING_PACKAGES "${CORRAL_MISSING_PACKAGES} ${debian_package}" PARENT_SCOPE)
        set(CORRAL_MISSING_DETAILS
            "${CORRAL_MISSING_DETAILS}\n    program '${program}' not found -> Debian package ${debian_package}"
            PARENT_SCOPE)
    endif()
endfunction()

corral_require_module(ZMQ libzmq libzmq3-dev)
corral_require_module(PROTOBUF_C libprotobuf-c libprotobuf-c-dev)
corral_require_module(YAML yaml-0.1 libyaml-dev)
corral_require_module(JEMALLOC jemalloc libjemalloc-dev)
corral_require_module(CHECK check check)
# XXH3, the checksums and fingerprints of corral images (engine/src/image.c).
corral_require_module(XXHASH libxxhash libxxhash-dev)
# The HTTP front end of corrald (daemon/front_http*.c).
corral_require_module(MHD libmicrohttpd libmicrohttpd-dev)
# JSON: the HTTP front end's bodies, schemas for structured output (policies/), PEFT configs and
# safetensors headers (adapters/), the CLI's --json output.
corral_require_module(JANSSON jansson libjansson-dev)
# Test-only: PCRE2 is the independent regex oracle of the constraint tests (tests/unit/
# test_constraint.c); nothing that corral ships links it.
corral_require_module(PCRE2 libpcre2-8 libpcre2-dev)
corral_require_program(CORRAL_PROTOC_C protoc-c protobuf-c-compiler)
corral_require_program(CORRAL_PROTOC protoc protobuf-compiler)
# Test-only: node and npm run the official HTTP clients of tests/http/.
corral_require_program(CORRAL_NODE node nodejs)
corral_require_program(CORRAL_NPM npm npm)

if(CORRAL_MISSING_PACKAGES)
    message(FATAL_ERROR "corral: missing dependencies:${CORRAL_MISSING_DETAILS}\n"
                        "Install them with:\n"
                        "    apt-get install -y${CORRAL_MISSING_PACKAGES}\n"
                        "(or run scripts/bootstrap as root, which does this for you)")
endif()
