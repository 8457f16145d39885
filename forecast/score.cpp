#include "forecast/score.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <set>

#include "engine/ir/error.h"
#include "engine/io/file_util.h"
#include "forecast/plot.h"
#include "load/model.h"

namespace fs = std::filesystem;

namespace wxe {

std::vector<double> wb2_lat_weights(const std::vector<double>& lat) {
  const size_t n = lat.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lat[a] < lat[b]; });
  const double deg = M_PI / 180.0;
  std::vector<double> w(n);
  double sum = 0;
  for (size_t k = 0; k < n; ++k) {
    const double lo = k == 0 ? -M_PI / 2 : (lat[order[k - 1]] + lat[order[k]]) / 2 * deg;
    const double hi = k + 1 == n ? M_PI / 2 : (lat[order[k]] + lat[order[k + 1]]) / 2 * deg;
    w[order[k]] = std::sin(hi) - std::sin(lo);
    sum += w[order[k]];
  }
  for (double& x : w) x *= (double)n / sum;
  return w;
}

FieldStats field_stats(const std::vector<double>& f, const std::vector<double>& t, const std::vector<double>& c,
                       const std::vector<double>& w) {
  const size_t h = w.size(), nx = f.size() / h;
  WXE_ASSERT(f.size() == h * nx && t.size() == f.size() && c.size() == f.size());
  double sw = 0, se2 = 0, se = 0, sft = 0, sff = 0, stt = 0;
  for (size_t i = 0; i < h; ++i)
    for (size_t j = 0; j < nx; ++j) {
      const size_t k = i * nx + j;
      const double e = f[k] - t[k], fa = f[k] - c[k], ta = t[k] - c[k];
      sw += w[i];
      se2 += w[i] * e * e;
      se += w[i] * e;
      sft += w[i] * fa * ta;
      sff += w[i] * fa * fa;
      stt += w[i] * ta * ta;
    }
  FieldStats s;
  s.mse = se2 / sw;
  s.bias = se / sw;
  s.acc = (sft / sw) / std::sqrt((sff / sw) * (stt / sw));
  return s;
}

bool paired_t_significant(const std::vector<double>& d, double* t_stat) {
  const size_t n = d.size();
  if (t_stat) *t_stat = NAN;
  if (n < 2) return false;
  double mean = 0, var = 0;
  for (double x : d) mean += x / (double)n;
  for (double x : d) var += (x - mean) * (x - mean) / (double)(n - 1);
  const double se = std::sqrt(var / (double)n);
  const double t = se > 0 ? mean / se : (mean != 0 ? INFINITY : 0);
  if (t_stat) *t_stat = t;
  // Student's t, 97.5th percentile, df = n - 1 (1..30; beyond: the normal's 1.96 and a df correction)
  static const double crit[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                  2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  const size_t df = n - 1;
  const double z = 1.959964;
  const double c = df <= 30 ? crit[df - 1] : z + (z * z * z + z) / (4.0 * (double)df);
  return std::fabs(t) > c;
}

Truth::Truth(const std::string& config, const std::string& climatology) : config_path(config), clim_path_(climatology) {
  CreditConfig cfg = read_credit_config(config, /*training=*/false);
  data_ = std::make_shared<Era5Data>(cfg);
  if (!climatology.empty()) {
    check_regular_file(climatology);
    clim_source = "file:" + climatology;
  } else {
    clim_source = "training-mean:" + format_datetime(cfg.start) + ".." + format_datetime(cfg.end);
  }
}

int Truth::channel(const FieldRef& f) const {
  const CreditConfig& cfg = data_->config();
  const auto& chans = data_->target_channels();
  for (size_t k = 0; k < chans.size(); ++k) {
    const ChannelInfo& c = chans[k];
    if (c.var != f.var && cfg.sources[c.src].name + "_" + c.var != f.var) continue;
    if (c.is3d != (f.level >= 0)) continue;
    if (c.is3d && std::fabs(cfg.sources[c.src].levels[c.level_index] - f.level_value) > 1e-6) continue;
    return (int)k;
  }
  return -1;
}

std::vector<double> Truth::field(const Tensor& y, int channel) const {
  const size_t hw = data_->lat().size() * data_->lon().size();
  const float* p = y.data<float>() + (size_t)channel * hw;
  return std::vector<double>(p, p + hw);
}

const std::vector<double>& Truth::clim(int channel, const FieldRef& f) {
  auto it = clim_.find(channel);
  if (it != clim_.end()) return it->second;
  const size_t h = data_->lat().size(), w = data_->lon().size();
  std::vector<double> c(h * w, 0.0);
  if (!clim_path_.empty()) {
    NcFile nc(clim_path_);
    WXE_CHECK(nc.has(f.var), clim_path_, ": no variable '", f.var, "' (the climatology of ", f.label(), ")");
    const std::vector<std::string> d = nc.dims(f.var);
    const std::vector<int64_t> s = nc.shape(f.var);
    const bool ok = d.size() == (f.level >= 0 ? 3u : 2u) && d[d.size() - 2] == "latitude" && d.back() == "longitude" &&
                    s[s.size() - 2] == (int64_t)h && s.back() == (int64_t)w;
    WXE_CHECK(ok, clim_path_, ": variable '", f.var, "' must be (", f.level >= 0 ? "level, " : "", "latitude, longitude) on the ",
              h, "x", w, " grid of ", config_path);
    std::vector<size_t> start, count;
    if (f.level >= 0) {
      WXE_CHECK(nc.has(d[0]), clim_path_, ": no coordinate '", d[0], "'");
      const std::vector<double> ls = nc.read(d[0]);
      size_t li = ls.size();
      for (size_t i = 0; i < ls.size(); ++i)
        if (std::fabs(ls[i] - f.level_value) < 1e-6) li = i;
      WXE_CHECK(li < ls.size(), clim_path_, ": variable '", f.var, "' has no level ", f.level_value);
      start.push_back(li);
      count.push_back(1);
    }
    start.insert(start.end(), {0, 0});
    count.insert(count.end(), {h, w});
    const std::vector<float> v = nc.read_f32(f.var, start, count);
    c.assign(v.begin(), v.end());
  } else {
    if (mean_.empty()) {  // every channel in one pass over the period: each time read once
      const CreditConfig& cfg = data_->config();
      int64_t n = 0;
      for (int64_t t = cfg.start; t <= cfg.end; t += cfg.timestep, ++n) {
        const Tensor y = at(t);
        const size_t nc = data_->target_channels().size();
        if (mean_.empty()) mean_.assign(nc, std::vector<double>(h * w, 0.0));
        const float* p = y.data<float>();
        for (size_t k = 0; k < nc; ++k)
          for (size_t i = 0; i < h * w; ++i) mean_[k][i] += p[k * h * w + i];
      }
      WXE_CHECK(n > 0, config_path, ": no training period (data.start_datetime..end_datetime) to take a climatology from");
      for (auto& m : mean_)
        for (double& x : m) x /= (double)n;
    }
    c = mean_[(size_t)channel];
  }
  return clim_[channel] = std::move(c);
}

double Score::rmse() const {
  double s = 0;
  for (auto& [t, st] : per_init) s += st.mse;
  return std::sqrt(s / (double)per_init.size());
}
double Score::bias() const {
  double s = 0;
  for (auto& [t, st] : per_init) s += st.bias;
  return s / (double)per_init.size();
}
double Score::acc() const {
  double s = 0;
  for (auto& [t, st] : per_init) s += st.acc;
  return s / (double)per_init.size();
}

namespace {

// each model's name: its first file's stem, numbered where two models would share one
std::vector<std::string> model_names(const std::vector<std::vector<std::string>>& models) {
  std::vector<std::string> names;
  for (size_t m = 0; m < models.size(); ++m) {
    std::string n = fs::path(models[m].at(0)).stem().string();
    if (std::count(names.begin(), names.end(), n)) n += "#" + std::to_string(m + 1);
    names.push_back(n);
  }
  return names;
}

void check_grid(const ForecastFile& f, const Era5Data& d, const std::string& config) {
  bool same = f.lat.size() == d.lat().size() && f.lon.size() == d.lon().size();
  for (size_t i = 0; same && i < f.lat.size(); ++i) same = std::fabs(f.lat[i] - d.lat()[i]) < 1e-4;
  for (size_t i = 0; same && i < f.lon.size(); ++i) same = std::fabs(f.lon[i] - d.lon()[i]) < 1e-4;
  WXE_CHECK(same, f.path(), ": its grid (", f.lat.size(), "x", f.lon.size(), ") is not the data's of ", config, " (",
            d.lat().size(), "x", d.lon().size(), ")");
}

std::string num(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.10g", x);
  return b;
}

}  // namespace

std::vector<Score> score_models(const ScoreArgs& a, Truth& truth) {
  std::vector<Score> out;
  std::set<std::string> told;
  const std::vector<std::string> names = model_names(a.models);
  for (size_t m = 0; m < a.models.size(); ++m) {
    const std::vector<std::string>& files = a.models[m];
    std::map<std::pair<std::string, int64_t>, Score> by;  // (field, lead in seconds)
    std::vector<std::string> order;                        // fields in the first file's order
    for (const std::string& path : files) {
      ForecastFile ff(path);
      Tensor y = truth.at(ff.valid_time(0));  // reads the grid (an error names the data file and the time)
      check_grid(ff, truth.data(), truth.config_path);
      const std::vector<double> w = wb2_lat_weights(ff.lat);
      std::vector<std::pair<FieldRef, int>> scored;  // the fields with a target channel
      for (const FieldRef& f : ff.fields()) {
        const int ch = truth.channel(f);
        if (ch < 0) {
          if (told.insert(f.label()).second)
            note("wxe: %s: %s is no target of %s: not scored\n", path.c_str(), f.label().c_str(), truth.config_path.c_str());
          continue;
        }
        if (std::find(order.begin(), order.end(), f.label()) == order.end()) order.push_back(f.label());
        scored.push_back({f, ch});
      }
      for (int k = 0; k < ff.steps(); ++k) {
        if (k > 0) y = truth.at(ff.valid_time(k));
        const int64_t lead = ff.valid_time(k) - ff.init;
        for (const auto& [f, ch] : scored) {
          Score& s = by[{f.label(), lead}];
          if (s.per_init.count(ff.init))
            fail(path, ": a second forecast from ", format_datetime(ff.init), " for model ", names[m]);
          s.model = names[m];
          s.field = f.label();
          s.var = f.var;
          s.level = f.level_value;
          s.is3d = f.level >= 0;
          s.lead_h = (double)lead / 3600.0;
          s.units = ff.units(f.var);
          s.per_init[ff.init] = field_stats(ff.read(f, k), truth.field(y, ch), truth.clim(ch, f), w);
        }
      }
    }
    for (const std::string& field : order)
      for (auto& [key, s] : by)
        if (key.first == field) out.push_back(s);
  }
  return out;
}

int run_score(const ScoreArgs& a) {
  WXE_CHECK(!a.models.empty(), "score: no forecast file given");
  WXE_CHECK(!a.compare || a.models.size() >= 2, "score --compare needs two models or more (A.nc B.nc)");
  WXE_CHECK(!a.output.empty(), "score: -o OUT.csv is required");
  const fs::path out(a.output);
  WXE_CHECK(out.parent_path().empty() || fs::is_directory(out.parent_path()), a.output, ": no folder ",
            out.parent_path().string());
  Truth truth(a.truth, a.climatology);
  const std::vector<Score> scores = score_models(a, truth);
  WXE_CHECK(!scores.empty(), a.models[0][0], ": no field to score (none is a target of ", a.truth, ")");
  const std::string stem = (out.parent_path() / out.stem()).string();
  const std::vector<std::string> models = model_names(a.models);
  std::vector<std::string> fields;
  std::vector<double> leads;
  for (const Score& s : scores) {
    if (std::find(fields.begin(), fields.end(), s.field) == fields.end()) fields.push_back(s.field);
    if (std::find(leads.begin(), leads.end(), s.lead_h) == leads.end()) leads.push_back(s.lead_h);
  }
  std::sort(leads.begin(), leads.end());
  auto find = [&](const std::string& m, const std::string& f, double lead) -> const Score* {
    for (const Score& s : scores)
      if (s.model == m && s.field == f && s.lead_h == lead) return &s;
    return nullptr;
  };
  std::string csv;
  if (!a.compare) {
    csv = "model,variable,level,lead_hours,n_init,rmse,bias,acc,units,climatology\n";
    for (const Score& s : scores)
      csv += s.model + "," + s.var + "," + (s.is3d ? num(s.level) : "") + "," + num(s.lead_h) + "," +
             std::to_string(s.per_init.size()) + "," + num(s.rmse()) + "," + num(s.bias()) + "," + num(s.acc()) + "," +
             s.units + "," + truth.clim_source + "\n";
    for (const std::string& f : fields) {
      std::vector<ScoreSeries> series;
      std::string units;
      for (const std::string& m : models) {
        ScoreSeries ser;
        ser.name = m;
        for (double l : leads)
          if (const Score* s = find(m, f, l)) {
            ser.lead_h.push_back(l);
            ser.rmse.push_back(s->rmse());
            ser.bias.push_back(s->bias());
            ser.acc.push_back(s->acc());
            units = s->units;
          }
        if (!ser.lead_h.empty()) series.push_back(ser);
      }
      std::string name = f;
      std::replace(name.begin(), name.end(), '@', '_');
      plot_score_lines(stem + "_" + name + ".png", f, units, series);
    }
  } else {
    csv = "variable,level,lead_hours,reference,model,n_init,rmse_reference,rmse,rmse_rel_diff,t_stat,significant\n";
    Scorecard card;
    card.fields = fields;
    card.lead_h = leads;
    card.reference = models[0];
    for (size_t m = 1; m < models.size(); ++m) {
      card.models.push_back(models[m]);
      std::vector<std::vector<double>> rel(fields.size(), std::vector<double>(leads.size(), NAN));
      std::vector<std::vector<int>> sig(fields.size(), std::vector<int>(leads.size(), 0));
      for (size_t i = 0; i < fields.size(); ++i)
        for (size_t j = 0; j < leads.size(); ++j) {
          const Score* r = find(models[0], fields[i], leads[j]);
          const Score* s = find(models[m], fields[i], leads[j]);
          if (!r || !s) continue;
          // paired over the init times both have
          std::vector<double> d;
          Score rp = *r, sp = *s;
          rp.per_init.clear();
          sp.per_init.clear();
          for (auto& [t, st] : s->per_init)
            if (r->per_init.count(t)) {
              d.push_back(st.mse - r->per_init.at(t).mse);
              rp.per_init[t] = r->per_init.at(t);
              sp.per_init[t] = st;
            }
          if (d.empty()) continue;
          double tstat = NAN;
          const bool significant = paired_t_significant(d, &tstat);
          rel[i][j] = (sp.rmse() - rp.rmse()) / rp.rmse();
          sig[i][j] = significant;
          csv += s->var + "," + (s->is3d ? num(s->level) : "") + "," + num(leads[j]) + "," + models[0] + "," + models[m] +
                 "," + std::to_string(d.size()) + "," + num(rp.rmse()) + "," + num(sp.rmse()) + "," + num(rel[i][j]) + "," +
                 (std::isfinite(tstat) ? num(tstat) : "") + "," + (d.size() >= 2 ? (significant ? "yes" : "no") : "") + "\n";
        }
      card.rel.push_back(rel);
      card.significant.push_back(sig);
    }
    plot_scorecard(stem + ".png", card);
  }
  TempFile f(a.output, ".csv");
  f.write(csv);
  f.commit();
  std::printf("score: %zu models, %zu fields, %zu lead times against %s (climatology: %s) written to %s%s\n", models.size(),
              fields.size(), leads.size(), a.truth.c_str(), truth.clim_source.c_str(), a.output.c_str(),
              a.compare ? (" and " + stem + ".png").c_str() : (" and " + stem + "_<field>.png").c_str());
  return 0;
}

}  // namespace wxe
