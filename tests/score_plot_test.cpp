// wxe score and wxe plot (forecast/score.h, forecast/plot.h): the scores against the ones
// models/make_score_fixture.py computes with numpy from WeatherBench 2's definitions
// (tests/data/score/expected_scores.csv), the PNGs read back with libpng, bad input.
#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "engine/ir/error.h"
#include "forecast/plot.h"
#include "forecast/score.h"

namespace fs = std::filesystem;
using namespace wxe;

namespace {

const std::string kSrc = WXE_SOURCE_DIR;
const std::string kDir = kSrc + "/tests/data/score/";
const std::string kConfig = kSrc + "/tests/data/era5_tiny/config.yml";

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

// rows of a CSV as maps column -> value
std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  const std::vector<std::string> head = split(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(f, line)) {
    const std::vector<std::string> cells = split(line);
    std::map<std::string, std::string> r;
    for (size_t i = 0; i < head.size() && i < cells.size(); ++i) r[head[i]] = cells[i];
    rows.push_back(r);
  }
  return rows;
}

struct Png {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
};

Png read_png(const std::string& path) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  Png p;
  if (!png_image_begin_read_from_file(&img, path.c_str())) return p;
  img.format = PNG_FORMAT_RGB;
  p.rgb.resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, p.rgb.data(), 0, nullptr)) return {};
  p.width = (int)img.width;
  p.height = (int)img.height;
  return p;
}

// distinct colours in a box of fractions of the image
size_t colours(const Png& p, double x0, double x1, double y0, double y1) {
  std::set<uint32_t> s;
  for (int y = (int)(y0 * p.height); y < (int)(y1 * p.height); ++y)
    for (int x = (int)(x0 * p.width); x < (int)(x1 * p.width); ++x) {
      const uint8_t* c = &p.rgb[3 * ((size_t)y * p.width + x)];
      s.insert((uint32_t)c[0] << 16 | (uint32_t)c[1] << 8 | c[2]);
    }
  return s.size();
}

std::string tmpdir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("wxe_score_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void expect_scores_match(const std::string& csv, const std::string& clim) {
  std::map<std::string, std::map<std::string, std::string>> want;
  for (auto& r : read_csv(kDir + "expected_scores.csv"))
    if (r["climatology"] == clim && r["model"] == "a_1")
      want[r["variable"] + " " + r["level"] + " " + r["lead_hours"]] = r;
  const auto got = read_csv(csv);
  ASSERT_EQ(got.size(), want.size());
  for (auto& g : got) {
    const std::string key = g.at("variable") + " " + g.at("level") + " " + g.at("lead_hours");
    ASSERT_TRUE(want.count(key)) << key;
    EXPECT_EQ(g.at("n_init"), "2") << key;
    for (const char* m : {"rmse", "bias", "acc"}) {
      const double a = std::stod(g.at(m)), b = std::stod(want[key].at(m));
      EXPECT_NEAR(a, b, 1e-6 * std::max(1.0, std::fabs(b))) << key << " " << m;
    }
  }
}

}  // namespace

TEST(Score, LatitudeWeightsAreWb2CellAreasOfMeanOne) {
  // 3 rows at -60, 0, 60: bounds -90, -30, 30, 90 -> areas 0.5, 1, 0.5 (x 2/... normalised to mean 1)
  const std::vector<double> w = wb2_lat_weights({60, 0, -60});
  ASSERT_EQ(w.size(), 3u);
  EXPECT_NEAR(w[0], 0.75, 1e-12);
  EXPECT_NEAR(w[1], 1.5, 1e-12);
  EXPECT_NEAR(w[2], 0.75, 1e-12);
}

TEST(Score, FieldStatsFollowTheFormulas) {
  const std::vector<double> w = {0.5, 1.5};  // 2 x 2 grid
  const std::vector<double> f = {1, 2, 3, 4}, t = {0, 2, 5, 4}, c = {1, 1, 1, 1};
  const FieldStats s = field_stats(f, t, c, w);
  // weights per cell 0.5 0.5 1.5 1.5, sum 4; errors 1 0 -2 0
  EXPECT_NEAR(s.mse, (0.5 * 1 + 1.5 * 4) / 4, 1e-12);
  EXPECT_NEAR(s.bias, (0.5 * 1 - 1.5 * 2) / 4, 1e-12);
  // anomalies f' 0 1 2 3, t' -1 1 4 3
  const double ft = (0.5 * 1 + 1.5 * 8 + 1.5 * 9) / 4, ff = (0.5 * 1 + 1.5 * 4 + 1.5 * 9) / 4,
               tt = (0.5 * 1 + 0.5 * 1 + 1.5 * 16 + 1.5 * 9) / 4;
  EXPECT_NEAR(s.acc, ft / std::sqrt(ff * tt), 1e-12);
}

TEST(Score, PairedTTest) {
  EXPECT_FALSE(paired_t_significant({1.0}));
  double t = 0;
  EXPECT_TRUE(paired_t_significant({1.0, 1.1, 0.9, 1.05}, &t));
  EXPECT_GT(t, 10);
  EXPECT_FALSE(paired_t_significant({1.0, -1.0, 0.5, -0.4}, &t));
}

TEST(Score, EqualsTheFixtureWithAClimatologyFile) {
  const std::string d = tmpdir("file");
  ScoreArgs a;
  a.models = {{kDir + "a_1.nc", kDir + "a_2.nc"}};
  a.truth = kConfig;
  a.climatology = kDir + "clim.nc";
  a.output = d + "/scores.csv";
  ASSERT_EQ(run_score(a), 0);
  expect_scores_match(a.output, "file");
  const auto rows = read_csv(a.output);
  EXPECT_EQ(rows.at(0).at("climatology"), "file:" + kDir + "clim.nc");
  // a line plot per field, drawn
  for (const char* f : {"T_500", "T_850", "SP"}) {
    const Png p = read_png(d + "/scores_" + f + ".png");
    EXPECT_EQ(p.width, 1350) << f;
    EXPECT_EQ(p.height, 420) << f;
    EXPECT_GT(colours(p, 0, 1, 0, 1), 8u) << f;
  }
  fs::remove_all(d);
}

TEST(Score, EqualsTheFixtureWithTheTrainingMean) {
  const std::string d = tmpdir("train");
  ScoreArgs a;
  a.models = {{kDir + "a_2.nc", kDir + "a_1.nc"}};  // the order of the files does not matter
  a.truth = kConfig;
  a.output = d + "/scores.csv";
  ASSERT_EQ(run_score(a), 0);
  expect_scores_match(a.output, "training");
  EXPECT_EQ(read_csv(a.output).at(0).at("climatology"), "training-mean:2020-12-31T00:00:00..2021-01-01T12:00:00");
  fs::remove_all(d);
}

TEST(Score, CompareWritesTheScorecard) {
  const std::string d = tmpdir("compare");
  ScoreArgs a;
  a.models = {{kDir + "a_1.nc", kDir + "a_2.nc"}, {kDir + "b_1.nc", kDir + "b_2.nc"}};
  a.truth = kConfig;
  a.climatology = kDir + "clim.nc";
  a.output = d + "/card.csv";
  a.compare = true;
  ASSERT_EQ(run_score(a), 0);
  std::map<std::string, std::map<std::string, std::string>> want;
  for (auto& r : read_csv(kDir + "expected_scores.csv"))
    if (r["climatology"] == "file") want[r["model"] + " " + r["variable"] + " " + r["level"] + " " + r["lead_hours"]] = r;
  const auto rows = read_csv(a.output);
  ASSERT_EQ(rows.size(), 6u);  // T@500, T@850, SP x 2 lead times
  for (auto& r : rows) {
    const std::string k = r.at("variable") + " " + r.at("level") + " " + r.at("lead_hours");
    const double ra = std::stod(want["a_1 " + k]["rmse"]), rb = std::stod(want["b_1 " + k]["rmse"]);
    EXPECT_NEAR(std::stod(r.at("rmse_rel_diff")), (rb - ra) / ra, 1e-6) << k;
    // the paired t statistic of the per-init MSE differences
    const double d1 = std::stod(want["b_1 " + k]["mse_1"]) - std::stod(want["a_1 " + k]["mse_1"]);
    const double d2 = std::stod(want["b_1 " + k]["mse_2"]) - std::stod(want["a_1 " + k]["mse_2"]);
    const double mean = (d1 + d2) / 2, sd = std::fabs(d1 - d2) / std::sqrt(2.0);
    EXPECT_NEAR(std::stod(r.at("t_stat")), mean / (sd / std::sqrt(2.0)), 1e-4 * std::fabs(mean / (sd / std::sqrt(2.0))))
        << k;
    EXPECT_EQ(r.at("significant"), std::fabs(mean / (sd / std::sqrt(2.0))) > 12.706 ? "yes" : "no") << k;
  }
  const Png p = read_png(d + "/card.png");
  ASSERT_GT(p.width, 0);
  EXPECT_GT(colours(p, 0.22, 0.95, 0.2, 0.8), 6u);  // cells of several colours
  fs::remove_all(d);
}

TEST(Plot, MapIsDrawnWithColourBar) {
  const std::string d = tmpdir("map");
  PlotArgs a;
  a.forecast = kDir + "a_1.nc";
  a.vars = {"T@500", "SP"};
  a.step = 2;
  a.output = d + "/map.png";
  ASSERT_EQ(run_plot(a), 0);
  const Png p = read_png(a.output);
  EXPECT_EQ(p.width, 900);
  EXPECT_EQ(p.height, 940);  // two panels
  // inside each map frame: the field's many colours (not blank)
  EXPECT_GT(colours(p, 0.15, 0.75, 0.1, 0.4), 50u);
  EXPECT_GT(colours(p, 0.15, 0.75, 0.6, 0.9), 50u);
  a.all_steps = true;
  a.vars = {"T@850"};
  a.minus = kDir + "b_1.nc";
  ASSERT_EQ(run_plot(a), 0);
  for (int k : {1, 2}) {
    const Png q = read_png(d + "/map_step" + std::to_string(k) + ".png");
    EXPECT_EQ(q.height, 470) << k;
    EXPECT_GT(colours(q, 0.15, 0.75, 0.2, 0.8), 50u) << k;
  }
  a.all_steps = false;
  a.minus.clear();
  a.minus_truth = kConfig;
  a.output = d + "/err.png";
  ASSERT_EQ(run_plot(a), 0);
  EXPECT_GT(colours(read_png(a.output), 0.15, 0.75, 0.2, 0.8), 50u);
  fs::remove_all(d);
}

TEST(Plot, BadInputIsNamed) {
  const std::string d = tmpdir("bad");
  PlotArgs a;
  a.forecast = kDir + "a_1.nc";
  a.output = d + "/x.png";
  a.vars = {"Q@500"};
  EXPECT_NE(error_of([&] { run_plot(a); }).find("a_1.nc: no variable 'Q' (the file has T, SP)"), std::string::npos)
      << error_of([&] { run_plot(a); });
  a.vars = {"T@700"};
  EXPECT_NE(error_of([&] { run_plot(a); }).find("a_1.nc: variable 'T' has no level 700 (levels: 500, 850)"),
            std::string::npos)
      << error_of([&] { run_plot(a); });
  a.vars = {"T"};
  EXPECT_NE(error_of([&] { run_plot(a); }).find("give T@LEVEL"), std::string::npos);
  a.vars = {"SP"};
  a.step = 3;
  EXPECT_NE(error_of([&] { run_plot(a); }).find("a_1.nc: --step 3: the file has 2 steps"), std::string::npos)
      << error_of([&] { run_plot(a); });
  EXPECT_FALSE(fs::exists(a.output));
  ScoreArgs s;
  s.models = {{kDir + "nope.nc"}};
  s.truth = kConfig;
  s.output = d + "/s.csv";
  EXPECT_NE(error_of([&] { run_score(s); }).find("nope.nc"), std::string::npos);
  s.models = {{kDir + "a_1.nc"}};
  s.climatology = kDir + "a_2.nc";  // a file without the climatology's layout
  EXPECT_NE(error_of([&] { run_score(s); }).find("a_2.nc: variable 'T' must be (level, latitude, longitude)"),
            std::string::npos)
      << error_of([&] { run_score(s); });
  fs::remove_all(d);
}
