// When a 2-D convolution is cheaper by FFT, and with which transform size: shared by the CPU
// kernel (kernels/cpu/conv_fft.h) and the inference pass that would otherwise rewrite such a
// conv (engine/passes/fuse.h split_conv_output_phases), so both take the same decision.
//
// The conv (group 1, dilation 1, stride s on both axes) is split into its s x s input phases:
// a stride-1 correlation of C s^2 channels with kernels of ceil(K / s) taps. The output is cut
// into tiles of T x T; each tile's input patch of F x F (F = T + ceil(K / s) - 1, a power of 2)
// is transformed, multiplied by the kernels' spectra and summed over channels, and transformed
// back. Pairs of real channels share one complex transform.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace wxe {

struct FftConvPlan {
  int64_t F = 0;           // transform size (0: direct convolution is cheaper)
  int64_t s = 1;           // stride
  int64_t Ka = 0, Kb = 0;  // taps per phase kernel, rows and columns
  int64_t Th = 0, Tw = 0;  // output tile
  int64_t tiles_h = 0, tiles_w = 0;
  bool cached = false;  // the kernels' spectra are kept between calls (constant weights)
  double flops = 0, direct_flops = 0;
};

// The most the kept spectra of one conv's kernels may take (the 640 x 1280 grid's first layer
// would need 320 MB at F = 64): beyond, they are made per call, a chunk of channels at a time.
constexpr double kFftSpectraCacheBytes = 64.0 * 1024 * 1024;

// Floats of the kernels' conjugate half spectra: OC x Cp of them, (F / 2 + 1) x F complex each.
inline double fft_spectra_floats(int64_t OC, int64_t Cp, int64_t F) { return double(OC) * Cp * 2 * (F / 2 + 1) * F; }

// N images of C channels to OC x OH x OW by an OC x C x KH x KW kernel at stride s. The choice is
// by modelled time, not arithmetic alone: the transforms run at about 40 GFLOP/s on 2 cores, the
// per-frequency products over channels at about 23 (they stream the accumulators; measured on
// CREDIT's cross-embeddings, 4 and 16 outputs), oneDNN's direct kernels at about 150 with 16
// outputs or more and in proportion below (its kernels compute blocks of 16 output channels:
// measured 73-75 GFLOP/s with 8); the FFT is taken when it is 1.25 x faster by that model.
// weights_known: constant weights, whose spectra are kept between calls (and not counted) when
// they fit kFftSpectraCacheBytes.
inline FftConvPlan plan_fft_conv(int64_t N, int64_t C, int64_t OC, int64_t OH, int64_t OW, int64_t KH, int64_t KW,
                                 int64_t s, bool weights_known) {
  constexpr double kTransforms = 40e9, kProducts = 23e9, kDirect = 150e9;  // FLOP/s
  FftConvPlan best;
  if (N < 1 || C < 1 || OC < 1 || OH < 1 || OW < 1 || KH < 1 || KW < 1 || s < 1 || s > 8) return best;
  const int64_t Ka = (KH + s - 1) / s, Kb = (KW + s - 1) / s, Cp = C * s * s;
  best.direct_flops = 2.0 * N * OH * OW * OC * C * KH * KW;
  double best_time = 0;
  for (int64_t F = 16; F <= 64; F *= 2) {
    const int64_t Th = F - Ka + 1, Tw = F - Kb + 1;
    if (Th < F / 2 || Tw < F / 2) continue;  // most of each transform would be halo
    const int64_t th = (OH + Th - 1) / Th, tw = (OW + Tw - 1) / Tw;
    const double tiles = double(N) * th * tw;
    const double fft2 = 5.0 * F * F * std::log2(double(F));  // one complex 2-D transform
    const double spectrum = double(F / 2 + 1) * F;           // half of it, complex
    double transforms = tiles * ((Cp + 1) / 2 + (OC + 1) / 2) * fft2;
    const double products = tiles * OC * Cp * spectrum * 8;
    const bool cached = weights_known && 4.0 * fft_spectra_floats(OC, Cp, F) <= kFftSpectraCacheBytes;
    if (!cached) transforms += double(OC) * ((Cp + 1) / 2) * fft2;
    const double time = transforms / kTransforms + products / kProducts;
    if (best.F == 0 || time < best_time) {
      best.F = F;
      best.cached = cached;
      best.flops = transforms + products;
      best_time = time;
      best.Th = Th;
      best.Tw = Tw;
      best.tiles_h = th;
      best.tiles_w = tw;
    }
  }
  const double direct_rate = kDirect * (double)std::min<int64_t>(OC, 16) / 16;
  if (best.F == 0 || 1.25 * best_time > best.direct_flops / direct_rate) {
    best.F = 0;
    return best;
  }
  best.s = s;
  best.Ka = Ka;
  best.Kb = Kb;
  return best;
}

}  // namespace wxe
