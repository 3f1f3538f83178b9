// kvboost bench ... --json: every bench subcommand prints markdown tables; with --json its
// standard output is captured and printed instead as one JSON document of the same tables, so
// that scripts (scripts/plot_bench.py) read the numbers without scraping markdown. One code
// path prints the numbers: the JSON cannot drift from the table a person reads.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace kvboost::cli {

namespace {
int g_saved_stdout = -1;
std::FILE* g_capture = nullptr;
std::string g_command;

std::string trim(std::string s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {  // line[0] == '|'
    if (line[i] == '|') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  return out;
}

// A cell that is one number ("1,205", "**44.3**", "-0.02") becomes a JSON number; anything else
// ("2.09x", "476 ms vs 2,102 ms") stays text.
nlohmann::ordered_json cell_value(std::string c) {
  std::string s;
  for (char ch : c)
    if (ch != '*' && ch != ',') s += ch;
  static const std::regex num(R"(^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$)");
  if (std::regex_match(s, num)) return std::strtod(s.c_str(), nullptr);
  return c;
}
}  // namespace

nlohmann::ordered_json markdown_tables_to_json(const std::string& text) {
  nlohmann::ordered_json tables = nlohmann::ordered_json::array();
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::string title;
  nlohmann::ordered_json notes = nlohmann::ordered_json::array();
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string l = trim(lines[i]);
    if (l.rfind('#', 0) == 0) {
      title = trim(l.substr(l.find_first_not_of('#')));
      notes = nlohmann::ordered_json::array();
    } else if (l.rfind('|', 0) == 0 && i + 1 < lines.size() && trim(lines[i + 1]).rfind("|---", 0) == 0) {
      const std::vector<std::string> cols = cells(l);
      nlohmann::ordered_json rows = nlohmann::ordered_json::array();
      for (i += 2; i < lines.size() && trim(lines[i]).rfind('|', 0) == 0; ++i) {
        const std::vector<std::string> cs = cells(trim(lines[i]));
        nlohmann::ordered_json row = nlohmann::ordered_json::object();
        for (size_t k = 0; k < cols.size() && k < cs.size(); ++k) row[cols[k]] = cell_value(cs[k]);
        rows.push_back(std::move(row));
      }
      --i;
      tables.push_back({{"title", title}, {"notes", notes}, {"columns", cols}, {"rows", std::move(rows)}});
      notes = nlohmann::ordered_json::array();
    } else if (l.rfind('|', 0) == 0 && !tables.empty()) {
      // Rows printed after a note (bench reuse prints each scenario's rows as it finishes):
      // they continue the last table.
      nlohmann::ordered_json& t = tables.back();
      const std::vector<std::string> cs = cells(l);
      nlohmann::ordered_json row = nlohmann::ordered_json::object();
      for (size_t k = 0; k < t["columns"].size() && k < cs.size(); ++k)
        row[t["columns"][k].get<std::string>()] = cell_value(cs[k]);
      t["rows"].push_back(std::move(row));
    } else if (!l.empty()) {
      notes.push_back(l);
      if (!tables.empty() && tables.back()["title"] == title) tables.back()["notes"].push_back(l);
    }
  }
  return tables;
}

void add_json_output(CLI::App* bench) {
  for (CLI::App* sub : bench->get_subcommands([](CLI::App*) { return true; })) {
    auto on = std::make_shared<bool>(false);
    sub->add_flag("--json", *on, "Print the results as one JSON document (the tables' columns and rows) instead of markdown");
    const std::string name = "bench " + sub->get_name();
    sub->parse_complete_callback([on, name] {
      if (!*on || g_capture) return;
      std::fflush(stdout);
      g_capture = std::tmpfile();
      if (!g_capture) fail("--json: cannot create a temporary file");
      g_saved_stdout = dup(STDOUT_FILENO);
      dup2(fileno(g_capture), STDOUT_FILENO);
      g_command = name;
    });
  }
}

void finish_json_output(bool ok) {
  if (!g_capture) return;
  std::fflush(stdout);
  dup2(g_saved_stdout, STDOUT_FILENO);
  close(g_saved_stdout);
  std::string text;
  std::rewind(g_capture);
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, g_capture)) > 0;) text.append(buf, n);
  std::fclose(g_capture);
  g_capture = nullptr;
  if (!ok) return;
  nlohmann::ordered_json out;
  out["command"] = g_command;
  out["tables"] = markdown_tables_to_json(text);
  const std::string s = out.dump(2);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace kvboost::cli
