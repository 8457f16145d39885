// A direct 2-D convolution for few output channels and large kernels: CREDIT's stage-0
// cross-embedding (80 -> 4 channels with 32x32, 16x16 and 8x8 kernels of stride 2), where
// cuDNN's deterministic float32 algorithms take 6 of v2026's 21 ms forward on an H200. Each
// block stages one input channel's patch under a tile of outputs, and that channel's weights, in
// shared memory; each thread accumulates its output pixel for every output channel, summing
// over input channels and taps in a fixed order (deterministic, float32 FMA, no TF32).
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

constexpr int kTileX = 32, kTileY = 8;  // outputs per block: kTileY rows x kTileX columns
constexpr int kMaxShared = 6144;        // floats for the patch, and again for the weights

// x (N, C, H, W), w (Co, C, KH, KW), y (N, Co, HO, WO); CO >= Co output channels per thread
template <int CO>
__global__ void conv_direct_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                   int C, int H, int W, int Co, int KH, int KW, int sh, int sw, int HO, int WO) {
  extern __shared__ float smem[];
  const int pr = (kTileY - 1) * sh + KH, pc = (kTileX - 1) * sw + KW;  // the patch's rows and columns
  float* patch = smem;
  float* ws = smem + kMaxShared;  // [ky][kx][o], CO per tap (zeros past Co)
  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * kTileX + tx, nt = kTileX * kTileY;
  const int ox = blockIdx.x * kTileX + tx, oy = blockIdx.y * kTileY + ty, n = blockIdx.z;
  const int x0 = blockIdx.x * kTileX * sw, y0 = blockIdx.y * kTileY * sh;  // the patch's corner in x
  float acc[CO];
#pragma unroll
  for (int o = 0; o < CO; ++o) acc[o] = 0.f;
  for (int c = 0; c < C; ++c) {
    __syncthreads();  // the previous channel's patch and weights are read
    const float* xc = x + ((int64_t)n * C + c) * H * W;
    for (int i = t; i < pr * pc; i += nt) {
      const int r = y0 + i / pc, q = x0 + i % pc;
      patch[i] = r < H && q < W ? xc[(int64_t)r * W + q] : 0.f;
    }
    for (int i = t; i < KH * KW * CO; i += nt) {
      const int o = i % CO, k = i / CO;
      ws[i] = o < Co ? w[((int64_t)o * C + c) * KH * KW + k] : 0.f;
    }
    __syncthreads();
    const float* p = patch + ty * sh * pc + tx * sw;
    for (int ky = 0; ky < KH; ++ky)
      for (int kx = 0; kx < KW; ++kx) {
        const float v = p[ky * pc + kx];
        const float4* wk = reinterpret_cast<const float4*>(ws + (ky * KW + kx) * CO);
#pragma unroll
        for (int o4 = 0; o4 < CO / 4; ++o4) {
          const float4 g = wk[o4];
          acc[4 * o4] = fmaf(v, g.x, acc[4 * o4]);
          acc[4 * o4 + 1] = fmaf(v, g.y, acc[4 * o4 + 1]);
          acc[4 * o4 + 2] = fmaf(v, g.z, acc[4 * o4 + 2]);
          acc[4 * o4 + 3] = fmaf(v, g.w, acc[4 * o4 + 3]);
        }
      }
  }
  if (ox >= WO || oy >= HO) return;
#pragma unroll
  for (int o = 0; o < CO; ++o)  // unrolled, so acc stays in registers
    if (o < Co) y[(((int64_t)n * Co + o) * HO + oy) * WO + ox] = acc[o];
}

template <int CO>
void launch(const float* x, const float* w, float* y, int N, int C, int H, int W, int Co, int KH, int KW, int sh, int sw,
            int HO, int WO) {
  const dim3 block(kTileX, kTileY), grid((WO + kTileX - 1) / kTileX, (HO + kTileY - 1) / kTileY, N);
  const size_t bytes = 2 * kMaxShared * sizeof(float);  // 48 KiB: no opt-in needed
  conv_direct_kernel<CO><<<grid, block, bytes, ctx().stream>>>(x, w, y, C, H, W, Co, KH, KW, sh, sw, HO, WO);
  CUDA_LAUNCHED();
}

}  // namespace

bool conv_direct_fits(int Co, int KH, int KW, int sh, int sw) {
  const int co = Co <= 4 ? 4 : Co <= 8 ? 8 : 16;
  return Co >= 1 && Co <= 16 && KH * KW >= 16 && co * KH * KW <= kMaxShared && sh >= 1 && sw >= 1 &&
         ((kTileY - 1) * sh + KH) * ((kTileX - 1) * sw + KW) <= kMaxShared;
}

void launch_conv_direct(const float* x, const float* w, float* y, int N, int C, int H, int W, int Co, int KH, int KW,
                        int sh, int sw, int HO, int WO) {
  if (Co <= 4)
    launch<4>(x, w, y, N, C, H, W, Co, KH, KW, sh, sw, HO, WO);
  else if (Co <= 8)
    launch<8>(x, w, y, N, C, H, W, Co, KH, KW, sh, sw, HO, WO);
  else
    launch<16>(x, w, y, N, C, H, W, Co, KH, KW, sh, sw, HO, WO);
}

}  // namespace wxe::cuda
