# HelpToMan.cmake — a man page from a program's own --help, so the page never disagrees with the
# program. Run as a script at build time (cmake/Install.cmake):
#
#   cmake -DPROGRAM=path/to/corrald -DNAME=corrald -DSUMMARY="..." -DVERSION=0.1.0
#         -DKIND=daemon|cli -DOUT=corrald.1 -P HelpToMan.cmake
#
# KIND daemon: DESCRIPTION is `PROGRAM --help`, CONFIGURATION is `PROGRAM --help-config`.
# KIND cli:    DESCRIPTION is `PROGRAM --help`, then one subsection per command listed under its
#              "commands:" heading, each `PROGRAM COMMAND --help`.
# The text goes in no-fill blocks (.nf/.fi), as printed; only roff's own characters are escaped.
cmake_minimum_required(VERSION 3.25)

foreach(var PROGRAM NAME SUMMARY VERSION KIND OUT)
    if(NOT DEFINED ${var})
        message(FATAL_ERROR "HelpToMan: -D${var}= is required")
    endif()
endforeach()

# Run PROGRAM with the given arguments; its stdout in `out_var`, failing the build otherwise.
function(help_text out_var)
    execute_process(COMMAND ${PROGRAM} ${ARGN} OUTPUT_VARIABLE text ERROR_VARIABLE err
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "HelpToMan: ${PROGRAM} ${ARGN} failed (${rc}): ${err}")
    endif()
    set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# Text as a no-fill roff block: backslashes doubled, lines that start with . or ' made literal.
function(roff_block out_var text)
    string(REPLACE "\\" "\\e" text "${text}")
    string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
    string(REGEX REPLACE "\n+$" "" text "${text}")
    set(${out_var} ".nf\n${text}\n.fi\n" PARENT_SCOPE)
endfunction()

string(TOUPPER "${NAME}" upper)
set(page ".\\\" Generated from `${NAME} --help` by cmake/HelpToMan.cmake: do not edit.\n")
string(APPEND page ".TH ${upper} 1 \"\" \"corral ${VERSION}\" \"corral\"\n")
string(APPEND page ".SH NAME\n${NAME} \\- ${SUMMARY}\n")
help_text(help --help)
roff_block(block "${help}")
string(APPEND page ".SH DESCRIPTION\n${block}")

if(KIND STREQUAL "daemon")
    help_text(config --help-config)
    roff_block(block "${config}")
    string(APPEND page ".SH CONFIGURATION\n${block}")
    string(APPEND page ".SH SEE ALSO\n.BR corral (1)\n")
elseif(KIND STREQUAL "cli")
    # The command names: indented words in the lines after "commands:", up to a blank line.
    string(REGEX MATCH "commands:\n(  [^\n]+\n)+" listing "${help}")
    string(REGEX MATCHALL "\n  [a-z][a-z0-9-]*" names "${listing}")
    string(APPEND page ".SH COMMANDS\n")
    foreach(name IN LISTS names)
        string(STRIP "${name}" name)
        help_text(sub ${name} --help)
        roff_block(block "${sub}")
        string(APPEND page ".SS ${name}\n${block}")
    endforeach()
    string(APPEND page ".SH SEE ALSO\n.BR corrald (1)\n")
else()
    message(FATAL_ERROR "HelpToMan: KIND must be daemon or cli, not '${KIND}'")
endif()

file(WRITE "${OUT}" "${page}")
