// The adaptive guard's calibration on disk (reuse::Guard::save / load; the engine's
// save_guard_calibration / load_guard_calibration):
// what a restarted engine would otherwise relearn prompt by prompt, each sample having cost a
// full recompute. A small text file beside the chunk store, keyed by the model identity:
//
//   kvboost-guard-calibration 1
//   model kvb1-<32 hex>
//   mode <prefix|none|selective|cacheblend> checked <n> tripped <n> errors <k> <e1> ... <ek>   (x4)
//   end 4
//
// The "end" line makes a truncated file detectable; every field is checked, and a file that
// does not parse is an Error naming the file and the line (the calibration is left unchanged).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <unistd.h>

#include "kvboost/common.h"
#include "kvboost/reuse.h"

namespace kvboost::reuse {

namespace {
constexpr const char* kMagic = "kvboost-guard-calibration";
constexpr ReuseMode kModes[] = {ReuseMode::kPrefixOnly, ReuseMode::kNone, ReuseMode::kSelective, ReuseMode::kCacheBlend};
}  // namespace

void Guard::save(const std::string& path, const std::string& model_id) const {
  const GuardCalibration g = calibration();
  std::ostringstream o;
  o << kMagic << " 1\nmodel " << model_id << '\n';
  for (ReuseMode m : kModes) {
    const size_t i = size_t(m);
    o << "mode " << reuse_mode_name(m) << " checked " << g.n_checked[i] << " tripped " << g.n_tripped[i] << " errors "
      << g.errors[i].size();
    char b[32];
    for (float e : g.errors[i]) std::snprintf(b, sizeof b, " %.9g", double(e)), o << b;
    o << '\n';
  }
  o << "end " << std::size(kModes) << '\n';
  const std::string text = o.str();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("guard calibration ", tmp, ": cannot open for writing: ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("guard calibration ", path, ": cannot write: ", std::strerror(errno));
  }
}

void Guard::load(const std::string& path, const std::string& model_id) {
  const std::string text = read_file(path);  // (Error naming the path when unreadable)
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto bad = [&](const std::string& why) { fail("guard calibration ", path, " line ", lineno, ": ", why); };
  auto next = [&]() {
    if (!std::getline(in, line)) {
      ++lineno;
      bad("truncated (the file ends before its \"end\" line)");
    }
    ++lineno;
    return std::istringstream(line);
  };
  {
    auto l = next();
    std::string magic;
    int version = 0;
    if (!(l >> magic >> version) || magic != kMagic) bad("not a guard calibration file (expected \"" + std::string(kMagic) + " 1\")");
    if (version != 1) bad("version " + std::to_string(version) + " (this build reads 1)");
  }
  {
    auto l = next();
    std::string key, id;
    if (!(l >> key >> id) || key != "model") bad("expected \"model <id>\"");
    if (id != model_id) bad("calibration of model " + id + ", but this engine's model is " + model_id);
  }
  GuardCalibration g;
  for (ReuseMode m : kModes) {
    auto l = next();
    std::string k0, name, k1, k2, k3;
    long long checked = -1, tripped = -1, count = -1;
    if (!(l >> k0 >> name >> k1 >> checked >> k2 >> tripped >> k3 >> count) || k0 != "mode" || k1 != "checked" ||
        k2 != "tripped" || k3 != "errors")
      bad("expected \"mode <name> checked <n> tripped <n> errors <k> ...\"");
    if (name != reuse_mode_name(m)) bad("mode " + name + " where " + reuse_mode_name(m) + " was expected");
    if (checked < 0 || tripped < 0 || tripped > checked) bad("counts checked " + std::to_string(checked) + ", tripped " + std::to_string(tripped));
    if (count < 0 || count > (long long)kGuardWindow) bad("errors " + std::to_string(count) + " (0.." + std::to_string(kGuardWindow) + ")");
    const size_t i = size_t(m);
    for (long long j = 0; j < count; ++j) {
      float e = 0;
      if (!(l >> e) || !std::isfinite(e) || std::fabs(e) > 1e4f)
        bad("error sample " + std::to_string(j + 1) + " of " + std::to_string(count) + " missing or not a finite logit difference");
      g.errors[i].push_back(e);
    }
    std::string extra;
    if (l >> extra) bad("more than " + std::to_string(count) + " error samples");
    g.n_checked[i] = checked, g.n_tripped[i] = tripped;
  }
  {
    auto l = next();
    std::string key;
    size_t n = 0;
    if (!(l >> key >> n) || key != "end" || n != std::size(kModes)) bad("expected \"end 4\"");
  }
  std::lock_guard<std::mutex> lock(mu_);
  cal_ = std::move(g);
}

}  // namespace kvboost::reuse
