# CorralTesting.cmake — helpers that register corral's tests with ctest.
#
# corral_add_check_suite(<module> SOURCES <files...> LIBS <targets...> [ENV <VAR=value>...])
#   Builds tests/unit/test_<module> as a Check suite and registers it as ctest test unit.<module>.
#   Tests find the shared models through CORRAL_SHARED_DIR. Check's per-test timeout is raised to
#   300 s: the sanitizer build on a busy 2-core CI machine is slow, and performance is measured by
#   benchmarks, never by test timeouts. ENV adds variables to the test's environment.
#
# corral_add_check_suite(<module> VARIANT <name> [LAUNCHER <command...>] [ENV <VAR=value>...])
#   Registers the already built test_<module> once more, as unit.<module>.<name>, with the same
#   environment plus ENV (e.g. CORRAL_CPU=avx2 to run a suite on one kernel path), started through
#   LAUNCHER when one is given. A test that exits with 77 is reported as skipped.

function(corral_add_check_suite module)
    cmake_parse_arguments(ARG "" "VARIANT" "SOURCES;LIBS;ENV;LAUNCHER" ${ARGN})
    set(target test_${module})
    if(ARG_VARIANT)
        set(name unit.${module}.${ARG_VARIANT})
    else()
        set(name unit.${module})
        add_executable(${target} ${ARG_SOURCES})
        target_link_libraries(${target} PRIVATE ${ARG_LIBS} PkgConfig::CHECK)
    endif()
    add_test(NAME ${name} COMMAND ${ARG_LAUNCHER} $<TARGET_FILE:${target}>)
    set(env CORRAL_SHARED_DIR=${CORRAL_SHARED_DIR} CK_VERBOSITY=normal CK_DEFAULT_TIMEOUT=300
            ${ARG_ENV})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}" LABELS unit SKIP_RETURN_CODE 77)
endfunction()
