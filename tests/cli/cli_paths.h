// Where test_cli finds the programs and data it runs: the build's kvboost and kvboost-fixture,
// the oracle Python, the test corpus. Compiled into cli_paths.cpp alone, so that the other test_cli
// sources' compile commands do not depend on where the clone lies (the compiler cache, .ci/run).
#pragma once
#include <string>

namespace kvboost::test {
std::string cli_binary();
std::string fixture_tool();
std::string python_bin();
std::string test_corpus();
}  // namespace kvboost::test
