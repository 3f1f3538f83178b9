#include "cli_paths.h"

namespace kvboost::test {
std::string cli_binary() { return KVBOOST_CLI; }
std::string fixture_tool() { return KVBOOST_FIXTURE_TOOL; }
std::string python_bin() { return KVBOOST_PYTHON_BIN; }
std::string test_corpus() { return KVBOOST_TEST_CORPUS; }
}  // namespace kvboost::test
