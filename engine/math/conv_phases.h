// A stride-2 convolution with few output channels as a stride-4 one whose output channels are
// the original output's 2 x 2 phases (y[o, 2i + py, 2j + px] = phase o*4 + py*2 + px at (i, j)):
// oneDNN blocks output channels by 16 and has a direct kernel for the phase conv, none for the
// original. Shared by the inference pass (engine/passes/fuse.h split_conv_output_phases, on
// constant weights) and the training forward (kernels/cpu/dnnl.cpp, weights expanded per call).
#pragma once
#include <cstdint>
#include <cstring>

namespace wxe {

// End pad of one axis that gives out/2 outputs at stride 4 with the kernel k + 2 (taps past the
// original end pad have weight 0); negative: the split does not apply.
inline int64_t phase_conv_end_pad(int64_t in, int64_t out, int64_t k, int64_t begin_pad) {
  return (out / 2 - 1) * 4 + k + 2 - in - begin_pad;
}

// W2 (4 OC, C, KH + 2, KW + 2), zero-filled by the caller: W2[o*4 + py*2 + px, c, a + 2 py, b + 2 px]
// = W[o, c, a, b].
inline void expand_phase_weights(const float* W, int64_t OC, int64_t C, int64_t KH, int64_t KW, float* W2) {
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t ph = 0; ph < 4; ++ph)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t a = 0; a < KH; ++a)
          std::memcpy(W2 + (((o * 4 + ph) * C + c) * (KH + 2) + a + 2 * (ph / 2)) * (KW + 2) + 2 * (ph % 2),
                      W + ((o * C + c) * KH + a) * KW, sizeof(float) * (size_t)KW);
}

}  // namespace wxe
