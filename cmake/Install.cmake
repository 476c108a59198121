# Install.cmake — what `cmake --install build [--prefix P]` (and `make install`) puts under the
# prefix, besides libcorral and its headers and pkg-config file (clients/c/CMakeLists.txt):
#
#   bin/corrald, bin/corral                  the daemon and the command
#   share/man/man1/corrald.1, corral.1       made from their --help (cmake/HelpToMan.cmake)
#   etc/corral/corral.yaml                   the default configuration (config/installed.yaml);
#                                            /etc/corral for the prefix /usr
#   lib/systemd/user/corral.service          the systemd user unit, ExecStart = P/bin/corrald
#   <python site>/corral/                    the Python package with its generated corral_pb2.py
#   share/doc/corral/                        README, SECURITY, LICENSE, docs/, the annotated
#                                            config/corral.yaml, the C and Python examples
#
# The Python package goes where Debian's python3 looks, without pip: P/lib/python3/dist-packages,
# except for the prefix /usr/local, whose folder is lib/python3.X/dist-packages
# (CORRAL_INSTALL_PYTHONDIR, relative to the prefix, overrides both). The choice is made when
# installing, so `--prefix` at install time is honoured like the configured prefix; so is the
# unit's ExecStart.
include(GNUInstallDirs)

install(TARGETS corrald corral RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Man pages from --help, made after the programs are linked.
set(CORRAL_MAN_DIR ${PROJECT_BINARY_DIR}/man)
foreach(prog corrald corral)
    if(prog STREQUAL "corrald")
        set(kind daemon)
        set(summary "the corral model supervisor daemon")
    else()
        set(kind cli)
        set(summary "run, chat with and manage the models of corrald, and local model tools")
    endif()
    add_custom_command(
        OUTPUT ${CORRAL_MAN_DIR}/${prog}.1
        COMMAND ${CMAKE_COMMAND} -E make_directory ${CORRAL_MAN_DIR}
        COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:${prog}> -DNAME=${prog}
                "-DSUMMARY=${summary}" -DVERSION=${PROJECT_VERSION} -DKIND=${kind}
                -DOUT=${CORRAL_MAN_DIR}/${prog}.1 -P ${PROJECT_SOURCE_DIR}/cmake/HelpToMan.cmake
        DEPENDS ${prog} ${PROJECT_SOURCE_DIR}/cmake/HelpToMan.cmake
        COMMENT "man page ${prog}.1 from ${prog} --help"
        VERBATIM)
    list(APPEND CORRAL_MAN_PAGES ${CORRAL_MAN_DIR}/${prog}.1)
endforeach()
add_custom_target(corral_man ALL DEPENDS ${CORRAL_MAN_PAGES})
install(FILES ${CORRAL_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

set(CORRAL_DOC_DIR ${CMAKE_INSTALL_DATADIR}/doc/corral)
install(FILES README.md SECURITY.md LICENSE config/corral.yaml DESTINATION ${CORRAL_DOC_DIR})
install(DIRECTORY docs/ DESTINATION ${CORRAL_DOC_DIR}/docs FILES_MATCHING PATTERN "*.md")
install(FILES clients/c/examples/generate.c DESTINATION ${CORRAL_DOC_DIR}/examples/c)
install(DIRECTORY clients/python/examples/ DESTINATION ${CORRAL_DOC_DIR}/examples/python
        FILES_MATCHING PATTERN "*.py")

# At install time, with the prefix actually used: the configuration goes to that prefix's etc/
# (/etc for the prefix /usr, as GNUInstallDirs says; a relative SYSCONFDIR would give /usr/etc),
# the unit names that prefix's corrald, and the Python package goes to that prefix's site folder.
set(CORRAL_INSTALL_PYTHONDIR "" CACHE STRING
    "Python package folder relative to the prefix (default: Debian's for the prefix)")
execute_process(COMMAND ${CORRAL_PYTHON3} -c
                        "import sys; print('%d.%d' % sys.version_info[:2])"
                OUTPUT_VARIABLE CORRAL_PYTHON_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE)
install(CODE "
    set(etcdir \"\${CMAKE_INSTALL_PREFIX}/etc\")
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
        set(etcdir \"/etc\")
    endif()
    file(INSTALL \"${PROJECT_SOURCE_DIR}/config/installed.yaml\"
         DESTINATION \"\${etcdir}/corral\" RENAME corral.yaml)

    set(bindir \"${CMAKE_INSTALL_BINDIR}\")
    if(NOT IS_ABSOLUTE \"\${bindir}\")
        set(bindir \"\${CMAKE_INSTALL_PREFIX}/\${bindir}\")
    endif()
    file(READ \"${PROJECT_SOURCE_DIR}/clients/cli/corral.service.in\" unit)
    string(REPLACE \"@CORRALD@\" \"\${bindir}/corrald\" unit \"\${unit}\")
    file(WRITE \"${PROJECT_BINARY_DIR}/install/corral.service\" \"\${unit}\")
    file(INSTALL \"${PROJECT_BINARY_DIR}/install/corral.service\"
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/user\")

    set(pydir \"${CORRAL_INSTALL_PYTHONDIR}\")
    if(NOT pydir)
        if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr/local\")
            set(pydir \"lib/python${CORRAL_PYTHON_VERSION}/dist-packages\")
        else()
            set(pydir \"lib/python3/dist-packages\")
        endif()
    endif()
    file(GLOB sources \"${PROJECT_SOURCE_DIR}/clients/python/corral/*.py\")
    file(INSTALL \${sources} \"${PROJECT_SOURCE_DIR}/clients/python/corral/py.typed\"
                 \"${CORRAL_PYTHON_OUT}/corral_pb2.py\"
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/\${pydir}/corral\")
")
