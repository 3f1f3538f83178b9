# cmake -P wrapper that runs tools/oracle/tokenizer_oracle.py for the tokenizer differential test.
# Variables: PYTHON, SCRIPT, OUT, and TOKENIZERS (a |-separated list of NAME=DIR).
# A missing interpreter is not an error here: the oracle JSON then says {"skip": ...}, and
# test_tokenizer_diff skips (or fails, with KVBOOST_REQUIRE_ORACLES=1) with that message.
file(REMOVE "${OUT}")
get_filename_component(_dir "${OUT}" DIRECTORY)
file(MAKE_DIRECTORY "${_dir}")
if(NOT EXISTS "${PYTHON}")
  file(WRITE "${OUT}" "{\"skip\": \"Python interpreter ${PYTHON} not found (run scripts/install-deps.sh)\"}")
  message(STATUS "tokenizer oracle: ${PYTHON} not found, differential test will skip")
  return()
endif()
string(REPLACE "|" ";" _toks "${TOKENIZERS}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --out "${OUT}" ${_toks} RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "tokenizer_oracle.py failed with exit code ${_rc}")
endif()
