# CorralTesting.cmake — helpers that register corral's tests with ctest.
#
# corral_add_check_suite(<module> SOURCES <files...> LIBS <targets...>)
#   Builds tests/unit/test_<module> as a Check suite and registers it as ctest test unit.<module>.
#   Tests find the shared models through CORRAL_SHARED_DIR. Check's per-test timeout is raised to
#   300 s: the sanitizer build on a busy 2-core CI machine is slow, and performance is measured by
#   benchmarks, never by test timeouts.

function(corral_add_check_suite module)
    cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
    set(target test_${module})
    add_executable(${target} ${ARG_SOURCES})
    target_link_libraries(${target} PRIVATE ${ARG_LIBS} PkgConfig::CHECK)
    add_test(NAME unit.${module} COMMAND ${target})
    set_tests_properties(unit.${module} PROPERTIES
        ENVIRONMENT "CORRAL_SHARED_DIR=${CORRAL_SHARED_DIR};CK_VERBOSITY=normal;CK_DEFAULT_TIMEOUT=300"
        LABELS unit)
endfunction()
