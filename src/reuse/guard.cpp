// The adaptive guard's statistics (Student's t prediction threshold over observed lead errors),
// its per-mode state (reuse::Guard) and the escalation ladder's cost model.
#include <algorithm>
#include <cmath>

#include "kvboost/common.h"
#include "kvboost/reuse.h"

namespace kvboost {

namespace {
// Regularized incomplete beta I_x(a, b) by its continued fraction (modified Lentz), the form
// of Numerical Recipes' betai: the series for x < (a + 1) / (a + b + 2), the symmetry otherwise.
double beta_cf(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
  double h = d;
  auto step = [&](double aa) {  // one term of the fraction; returns the factor it applied
    d = 1 + aa * d;
    d = 1 / (std::fabs(d) < kTiny ? kTiny : d);
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    h *= d * c;
    return d * c;
  };
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    step(m * (b - m) * x / ((qam + m2) * (a + m2)));
    if (std::fabs(step(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))) - 1) < kEps) break;
  }
  return h;
}
// y = 1 - x, passed separately so that x near 1 keeps its precision.
double beta_inc(double a, double b, double x, double y) {
  if (x <= 0) return 0;
  if (y <= 0) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log(y));
  return x < (a + 1) / (a + b + 2) ? front * beta_cf(a, b, x) / a : 1 - front * beta_cf(b, a, y) / b;
}
// P(T <= t) for Student's t with nu degrees of freedom.
double student_t_cdf(double t, double nu) {
  const double tail = 0.5 * beta_inc(nu / 2, 0.5, nu / (nu + t * t), t * t / (nu + t * t));
  return t > 0 ? 1 - tail : tail;
}

void remember(std::vector<float>& v, float x) {
  if (v.size() >= kGuardWindow) v.erase(v.begin());
  v.push_back(x);
}

size_t mode_index(ReuseMode m) {
  if (m == ReuseMode::kAuto) fail("the adaptive guard: auto is a ladder, not one repair (expected prefix, none, selective or cacheblend)");
  return size_t(m);
}
}  // namespace

double student_t_quantile(double p, double nu) {
  if (!(p > 0 && p < 1) || !(nu > 0)) fail("student_t_quantile: p ", p, " must be in (0, 1) and nu ", nu, " positive");
  double lo = -1, hi = 1;  // bracket, then bisect: the CDF is monotone
  while (student_t_cdf(lo, nu) > p) lo *= 2;
  while (student_t_cdf(hi, nu) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, nu) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

float guard_threshold(std::span<const float> errors, float risk, float fallback) {
  const size_t n = errors.size();
  if (n < kGuardMinErrors) return fallback;
  if (risk >= 1) return 0;
  std::vector<float> e(errors.begin(), errors.end());
  std::nth_element(e.begin(), e.begin() + ptrdiff_t(n / 2), e.end());
  const double m = n % 2 ? e[n / 2] : 0.5 * (double(e[n / 2]) + double(*std::max_element(e.begin(), e.begin() + ptrdiff_t(n / 2))));
  double ss = 0;
  for (float x : errors) ss += (double(x) - m) * (double(x) - m);
  const double spread = std::sqrt(ss / double(n - 1)) * std::sqrt(1 + 1.0 / double(n));
  const double L = m + spread * student_t_quantile(1 - double(risk), double(n - 1));
  return float(std::clamp(L, 0.0, double(kGuardMaxLead)));
}

namespace reuse {

float Guard::threshold(ReuseMode rung, const ReusePolicy& p) const {
  float limit = p.guard_lead;
  if (limit > 0 && p.guard_risk > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    limit = guard_threshold(cal_.errors[mode_index(rung)], p.guard_risk, limit);
  }
  return limit;
}

void Guard::record_check(ReuseMode rung, bool tripped) {
  const size_t i = mode_index(rung);
  std::lock_guard<std::mutex> lock(mu_);
  ++cal_.n_checked[i];
  cal_.n_tripped[i] += tripped;
}

void Guard::record_late_trip(ReuseMode rung) {
  const size_t i = mode_index(rung);
  std::lock_guard<std::mutex> lock(mu_);
  ++cal_.n_tripped[i];
}

double Guard::trip_rate(ReuseMode rung) const {
  const size_t i = mode_index(rung);
  std::lock_guard<std::mutex> lock(mu_);
  return double(cal_.n_tripped[i] + 1) / double(cal_.n_checked[i] + 2);
}

void Guard::observe(ReuseMode rung, float error) {
  if (rung == ReuseMode::kAuto) fail("guard_observe: an error sample belongs to one repair (not auto)");
  const size_t i = mode_index(rung);
  std::lock_guard<std::mutex> lock(mu_);
  remember(cal_.errors[i], error);
}

GuardCalibration Guard::calibration() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cal_;
}

double blend_cost(int64_t n_layers, int64_t span, int64_t n_new, int64_t n_approx) {
  const ReusePolicy def;
  const double L = double(std::max<int64_t>(1, n_layers)), check = double(std::min<int64_t>(def.blend_check_layer, n_layers));
  return (double(span) * check + double(n_new) * (L - check) +
          std::max(def.blend_first_ratio, def.blend_ratio) * double(n_approx) * double(def.blend_taper_layers) +
          def.blend_ratio * double(n_approx) * std::max(0.0, L - check - double(def.blend_taper_layers))) / L;
}

ReuseMode first_rung(int64_t n_layers, int64_t sel_rows, int64_t span, int64_t n_new, int64_t n_approx, double p_sel,
                     double p_blend) {
  const double c_blend = blend_cost(n_layers, span, n_new, n_approx);
  const double c_full = double(span);
  const double e_sel = double(sel_rows) + p_sel * (c_blend + p_blend * c_full);
  const double e_blend = c_blend + p_blend * c_full;
  return e_sel <= e_blend ? ReuseMode::kSelective : ReuseMode::kCacheBlend;
}

bool blend_step_pays(int64_t n_layers, int64_t span, int64_t n_new, int64_t n_approx, double p_blend) {
  const double c_full = double(span);
  return blend_cost(n_layers, span, n_new, n_approx) + p_blend * c_full < c_full;
}

}  // namespace reuse
}  // namespace kvboost
