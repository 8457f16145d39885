#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "tests/test_util.h"
#include "train/loss_plot.h"

namespace wxe::test {
namespace {

uint32_t be32(const std::string& b, size_t at) {
  return (uint32_t)(uint8_t)b[at] << 24 | (uint32_t)(uint8_t)b[at + 1] << 16 | (uint32_t)(uint8_t)b[at + 2] << 8 |
         (uint8_t)b[at + 3];
}

// An 8-bit RGB or RGBA, non-interlaced PNG (what cairo writes) decoded to RGB triples: the
// IDAT stream inflated with zlib and the five PNG row filters undone.
struct Image {
  uint32_t w = 0, h = 0;
  std::vector<uint8_t> rgb;
};

Image decode_png(const std::string& b) {
  Image im;
  int channels = 0;
  std::string idat;
  for (size_t at = 8; at + 12 <= b.size();) {
    const uint32_t n = be32(b, at);
    const std::string type = b.substr(at + 4, 4);
    if (type == "IHDR") {
      im.w = be32(b, at + 8);
      im.h = be32(b, at + 12);
      EXPECT_EQ((int)(uint8_t)b[at + 16], 8) << "bit depth";
      const int color = (uint8_t)b[at + 17];
      EXPECT_TRUE(color == 2 || color == 6) << "color type " << color;
      channels = color == 6 ? 4 : 3;
      EXPECT_EQ((int)(uint8_t)b[at + 20], 0) << "interlaced";
    }
    if (type == "IDAT") idat += b.substr(at + 8, n);
    at += 12 + n;
  }
  const size_t stride = (size_t)im.w * channels;
  std::vector<uint8_t> raw(im.h * (stride + 1));
  uLongf len = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &len, (const Bytef*)idat.data(), idat.size()), Z_OK);
  EXPECT_EQ(len, raw.size());
  std::vector<uint8_t> px(im.h * stride), zero(stride, 0);
  for (uint32_t y = 0; y < im.h; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* row = &px[y * stride];
    const uint8_t* up = y ? &px[(y - 1) * stride] : zero.data();
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= (size_t)channels ? row[i - channels] : 0, c = i >= (size_t)channels ? up[i - channels] : 0;
      const int u = up[i];
      int pred = 0;
      if (filter == 1) pred = a;
      else if (filter == 2) pred = u;
      else if (filter == 3) pred = (a + u) / 2;
      else if (filter == 4) {
        const int p = a + u - c, pa = std::abs(p - a), pb = std::abs(p - u), pc = std::abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? u : c;
      }
      row[i] = (uint8_t)(in[i] + pred);
    }
  }
  for (size_t i = 0; i < (size_t)im.w * im.h; ++i)
    for (int k = 0; k < 3; ++k) im.rgb.push_back(px[i * channels + k]);
  return im;
}

struct Colours {
  size_t white = 0, blue = 0, red = 0, dark = 0, total = 0;
};

// training loss is drawn blue (31, 119, 180), validation red (214, 39, 40), axes and text black
Colours count_colours(const Image& im) {
  Colours c;
  for (size_t i = 0; i + 2 < im.rgb.size(); i += 3) {
    const int r = im.rgb[i], g = im.rgb[i + 1], b = im.rgb[i + 2];
    ++c.total;
    if (r == 255 && g == 255 && b == 255) ++c.white;
    else if (b > r + 80 && b > g + 30) ++c.blue;
    else if (r > b + 80 && r > g + 80) ++c.red;
    else if (r < 80 && g < 80 && b < 80) ++c.dark;
  }
  return c;
}

TEST(LossPlot, WritesAPng) {
  std::vector<double> steps, loss, vs, vl;
  for (int i = 1; i <= 200; ++i) {
    steps.push_back(i);
    loss.push_back(2.0 * std::exp(-i / 30.0) + 0.01);  // spans > 20x: log axis
    if (i % 20 == 0) {
      vs.push_back(i);
      vl.push_back(loss.back() * 1.2);
    }
  }
  const std::string png = tmp_path("curve.png");
  plot_loss_curve(png, "test", steps, loss, vs, vl);
  std::string b = slurp(png);
  ASSERT_GT(b.size(), 24u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(b.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(b, 16), 900u);
  EXPECT_EQ(be32(b, 20), 560u);
  // a curve, axes and text compress to far more than a blank page of that size (~2 KB)
  EXPECT_GT(b.size(), 10000u);
  // on a white page: black axes and text, a blue training curve, red validation points and line
  Image im = decode_png(b);
  ASSERT_EQ(im.rgb.size(), 900u * 560u * 3u);
  Colours c = count_colours(im);
  EXPECT_GT(c.white, c.total * 8 / 10);
  EXPECT_GT(c.dark, 2000u);
  EXPECT_GT(c.blue, 500u);
  EXPECT_GT(c.red, 300u);
  // a second call works (a fresh PLplot stream per plot) and has no validation series
  plot_loss_curve(png, "again", steps, loss);
  Colours again = count_colours(decode_png(slurp(png)));
  EXPECT_GT(again.blue, 500u);
  EXPECT_EQ(again.red, 0u);
  EXPECT_FALSE(std::filesystem::exists(png + ".tmp" + std::to_string(getpid()) + ".png"));
}

TEST(LossPlot, NothingFiniteIsAnError) {
  EXPECT_NE(error_of([] { plot_loss_curve(tmp_path("nan.png"), "t", {1, 2}, {NAN, INFINITY}); }).find("no finite loss"),
            std::string::npos);
}

}  // namespace
}  // namespace wxe::test
