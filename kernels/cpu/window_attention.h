// WindowAttention, the fused attention block of CREDIT's CrossFormer (engine/passes/fuse.h makes it):
// geometry shared by the reference kernel (fused.cpp) and the oneDNN kernel (dnnl.cpp).
//
//   WindowAttention(x, Wq, Wk?, Wv?, Wo, bo?, bias, residual?)
//     x (B, D, H, W); Wq, Wk, Wv (I, D); Wo (D, I); bo (D); bias (heads, T, T);
//     residual (B, D, H, W); attributes heads, scale, window = [th, tw], strided (0 or 1).
//   With Wk and Wv omitted, Wq is the fused projection (3I, D), rows [q | k | v] (CREDIT's
//   to_qkv, as the training graph keeps it: fuse_for_training). A weight may carry the
//   trailing (1, 1) of a 1x1 convolution's ((I, D, 1, 1)); bias may be any shape of
//   heads * T * T elements in that order ((1, heads, T, T)), or (T, T): one bias every head
//   adds (CREDIT's DynamicPositionBias, live in the training graph).
//
// The image is cut into windows of T = th * tw tokens. Contiguous windows (strided 0) are
// th x tw blocks: token (ty, tx) of window (wy, wx) is pixel (wy th + ty, wx tw + tx).
// Strided windows (1, CREDIT's long-range attention) take every (H/th)-th row and (W/tw)-th
// column: token (ty, tx) of window (wy, wx) is pixel (ty H/th + wy, tx W/tw + wx).
// Windows are numbered (b, wy, wx) row-major, tokens (ty, tx). Per window, with the I
// channels of q, k, v split into `heads` consecutive groups of I/heads:
//   q, k, v = tokens x W^T;  per head: P = softmax(scale q k^T + bias[head]);  o = P v
//   y = o Wo^T + bo (+ residual), written back to the tokens' pixels.
#pragma once
#include "engine/ir/ops.h"
#include "engine/math/host_device.h"

namespace wxe::cpu {

struct WindowGeom {
  int64_t B = 0, D = 0, H = 0, W = 0, I = 0, heads = 1;
  int64_t th = 1, tw = 1, T = 1;  // tokens per window
  int64_t nwy = 1, nwx = 1, nW = 1;  // windows per image: H/th x W/tw
  bool strided = false;
  // offset of token t of window (wy, wx) in an (H, W) plane (also in CUDA kernels)
  WXE_HD int64_t pixel(int64_t wy, int64_t wx, int64_t t) const {
    const int64_t ty = t / tw, tx = t % tw;
    return strided ? (ty * nwy + wy) * W + tx * nwx + wx : (wy * th + ty) * W + wx * tw + tx;
  }
};

// A projection weight as a matrix: (rows, cols), or a 1x1 convolution's (rows, cols, 1, 1).
inline bool weight_matrix(const Shape& w, int64_t* rows, int64_t* cols) {
  if (w.size() != 2 && !(w.size() == 4 && w[2] == 1 && w[3] == 1)) return false;
  *rows = w[0];
  *cols = w[1];
  return true;
}

// fused_qkv: Wq is the fused (3I, D) projection (Wk and Wv omitted).
inline WindowGeom window_geometry(const Node& n, const Shape& x, const Shape& wq, bool fused_qkv = false) {
  WindowGeom g;
  WXE_CHECK(x.size() == 4, "node ", n.name, " (", n.op, "): x must be (B, D, H, W), got ", shape_str(x));
  int64_t rows = 0, cols = 0;
  WXE_CHECK(weight_matrix(wq, &rows, &cols), "node ", n.name, " (", n.op, "): Wq must be 2-D (or a 1x1 conv's), got ",
            shape_str(wq));
  WXE_CHECK(!fused_qkv || rows % 3 == 0, "node ", n.name, " (", n.op, "): fused Wq ", shape_str(wq),
            " does not split into q, k and v");
  g.B = x[0];
  g.D = x[1];
  g.H = x[2];
  g.W = x[3];
  g.I = fused_qkv ? rows / 3 : rows;
  g.heads = n.i("heads", 1);
  const std::vector<int64_t> win = n.ints("window");
  g.strided = n.i("strided", 0) != 0;
  WXE_CHECK(win.size() == 2 && win[0] >= 1 && win[1] >= 1 && g.H % win[0] == 0 && g.W % win[1] == 0, "node ",
            n.name, " (", n.op, "): window ", shape_str(win), " does not tile ", g.H, " x ", g.W);
  WXE_CHECK(g.heads >= 1 && g.I % g.heads == 0, "node ", n.name, " (", n.op, "): ", g.I,
            " channels do not split into ", g.heads, " heads");
  g.th = win[0];
  g.tw = win[1];
  g.T = g.th * g.tw;
  g.nwy = g.H / g.th;
  g.nwx = g.W / g.tw;
  g.nW = g.nwy * g.nwx;
  return g;
}

// Floats between two heads' position biases: 0 when every head adds the same (T, T) bias.
inline int64_t bias_head_stride(const WindowGeom& g, int64_t bias_numel) {
  return bias_numel == g.T * g.T ? 0 : g.T * g.T;
}

}  // namespace wxe::cpu
