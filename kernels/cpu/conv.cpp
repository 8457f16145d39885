// Conv and ConvTranspose (1-D, 2-D, 3-D): geometry (ONNX attribute rules), shape rules and
// plain reference kernels (the oracle). Spatial axes are embedded right-aligned in 3-D (see
// ConvGeom), so one loop nest serves every spatial rank. Accumulation is in double; the
// loops are parallel over (batch, output channel) planes only.
#include <algorithm>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

namespace {

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

}  // namespace

std::vector<int64_t> ints_attr(const Node& n, const char* name, size_t len, int64_t def) {
  std::vector<int64_t> v = n.ints(name, std::vector<int64_t>(len, def));
  WXE_CHECK(v.size() == len, "node ", n.name, " (", n.op, "): attribute '", name, "' has ",
            v.size(), " values, expected ", len);
  return v;
}

std::string auto_pad_of(const Node& n) {
  std::string ap = n.s("auto_pad", "NOTSET");
  if (ap.empty()) ap = "NOTSET";
  WXE_CHECK(ap == "NOTSET" || ap == "VALID" || ap == "SAME_UPPER" || ap == "SAME_LOWER", "node ", n.name, " (",
            n.op, "): unknown auto_pad '", ap, "'");
  return ap;
}

void split_same_pads(int64_t total, bool upper, int64_t* begin, int64_t* end) {
  const int64_t small = floor_div(total, 2);
  *begin = upper ? small : total - small;
  *end = total - *begin;
}

void window_pads(const Node& n, const std::string& op, const std::string& auto_pad, int64_t begin, int64_t end,
                 int64_t in, int64_t stride, int64_t extent, int64_t* pb, int64_t* pe) {
  if (auto_pad == "NOTSET") {
    *pb = begin;
    *pe = end;
    WXE_CHECK(*pb >= 0 && *pe >= 0, "node ", n.name, " (", op, "): negative pads");
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t o = (in + stride - 1) / stride;
    split_same_pads(std::max<int64_t>(0, (o - 1) * stride + extent - in), auto_pad == "SAME_UPPER", pb, pe);
  }
}

ConvGeom conv_geometry(const Node& n, const Shape& x, const Shape& w, bool transpose) {
  const char* op = transpose ? "ConvTranspose" : "Conv";
  WXE_CHECK(x.size() >= 3 && x.size() <= 5, "node ", n.name, " (", op,
            "): input must be (N, C, spatial...) with 1 to 3 spatial dims, got ", shape_str(x));
  WXE_CHECK(w.size() == x.size(), "node ", n.name, " (", op, "): weight ", shape_str(w),
            " must have the rank of the input ", shape_str(x));
  ConvGeom g;
  g.transpose = transpose;
  g.nsp = (int)x.size() - 2;
  const size_t ns = (size_t)g.nsp;
  const int f = g.first();
  g.N = x[0];
  g.group = n.i("group", 1);
  WXE_CHECK(g.group >= 1, "node ", n.name, " (", op, "): group must be >= 1, got ", g.group);
  g.C_in = x[1];
  WXE_CHECK(g.group <= std::max<int64_t>(g.C_in, 1), "node ", n.name, " (", op, "): group ", g.group,
            " exceeds the input channels ", g.C_in);
  WXE_CHECK(g.C_in % g.group == 0, "node ", n.name, " (", op, "): input channels ", g.C_in,
            " not divisible by group ", g.group);
  if (!transpose) {
    WXE_CHECK(w[1] * g.group == g.C_in, "node ", n.name, " (Conv): weight ", shape_str(w),
              " expects ", w[1], " x group ", g.group, " input channels, input ", shape_str(x),
              " has ", g.C_in);
    g.C_out = w[0];
    WXE_CHECK(g.C_out % g.group == 0, "node ", n.name, " (Conv): output channels ", g.C_out,
              " not divisible by group ", g.group);
  } else {
    WXE_CHECK(w[0] == g.C_in, "node ", n.name, " (ConvTranspose): weight ", shape_str(w),
              " expects ", w[0], " input channels, input ", shape_str(x), " has ", g.C_in);
    g.C_out = w[1] * g.group;
  }
  std::vector<int64_t> ks(w.begin() + 2, w.end());
  if (n.has("kernel_shape"))
    WXE_CHECK(n.ints("kernel_shape") == ks, "node ", n.name, " (", op, "): kernel_shape attribute ",
              shape_str(n.ints("kernel_shape")), " disagrees with weight ", shape_str(w));
  auto strides = ints_attr(n, "strides", ns, 1);
  auto dil = ints_attr(n, "dilations", ns, 1);
  auto pads = ints_attr(n, "pads", 2 * ns, 0);
  const std::string ap = auto_pad_of(n);
  std::vector<int64_t> opad, oshape;
  if (transpose) {
    opad = ints_attr(n, "output_padding", ns, 0);
    oshape = n.ints("output_shape");
    WXE_CHECK(oshape.empty() || oshape.size() == ns || oshape.size() == ns + 2, "node ", n.name,
              " (ConvTranspose): output_shape has ", oshape.size(), " values, expected ", ns);
    if (oshape.size() == ns + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
  }
  // attributes come from the file: bounded, so the geometry below cannot overflow int64
  const int64_t kMaxAttr = int64_t(1) << 32;
  for (const std::vector<int64_t>* v : {&ks, &strides, &dil, &pads, &opad, &oshape})
    for (int64_t e : *v)
      WXE_CHECK(e >= -kMaxAttr && e <= kMaxAttr, "node ", n.name, " (", op, "): attribute value ", e, " out of range");
  auto mul = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    WXE_CHECK(!__builtin_mul_overflow(a, b, &r) && r < (int64_t(1) << 62), "node ", n.name, " (", op,
              "): output size overflows (input ", shape_str(x), ")");
    return r;
  };
  for (size_t i = 0; i < ns; ++i) {
    const int a = f + (int)i;
    g.in[a] = x[2 + i];
    g.k[a] = ks[i];
    g.s[a] = strides[i];
    g.d[a] = dil[i];
    WXE_CHECK(g.s[a] >= 1 && g.d[a] >= 1 && g.k[a] >= 1, "node ", n.name, " (", op,
              "): strides, dilations and kernel sizes must be >= 1");
    const int64_t ext = (g.k[a] - 1) * g.d[a] + 1;
    if (!transpose) {
      window_pads(n, op, ap, pads[i], pads[i + ns], g.in[a], g.s[a], ext, &g.pb[a], &g.pe[a]);
      const int64_t span = g.in[a] + g.pb[a] + g.pe[a] - ext;
      WXE_CHECK(span >= 0, "node ", n.name, " (Conv): kernel extent ", ext,
                " larger than the padded input ", g.in[a] + g.pb[a] + g.pe[a], " (input ",
                shape_str(x), ")");
      g.out[a] = span / g.s[a] + 1;
    } else {
      WXE_CHECK(opad[i] >= 0 && (opad[i] < g.s[a] || opad[i] < g.d[a]), "node ", n.name,
                " (ConvTranspose): output_padding ", opad[i], " must be >= 0 and smaller than the stride or dilation");
      const int64_t natural = mul(g.s[a], g.in[a] - 1) + opad[i] + ext;
      if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
        // ONNX spec: output = input * stride (or output_shape); odd total padding puts the
        // extra element at the end for SAME_UPPER and at the beginning for SAME_LOWER.
        g.out[a] = oshape.empty() ? mul(g.in[a], g.s[a]) : oshape[i];
        split_same_pads(natural - g.out[a], ap == "SAME_UPPER", &g.pb[a], &g.pe[a]);
      } else {
        if (ap == "NOTSET") {
          g.pb[a] = pads[i];
          g.pe[a] = pads[i + ns];
          WXE_CHECK(g.pb[a] >= 0 && g.pe[a] >= 0, "node ", n.name, " (ConvTranspose): negative pads");
        }
        if (!oshape.empty()) {  // explicit size: begin pads kept, the end adjusts
          g.out[a] = oshape[i];
          g.pe[a] = natural - g.pb[a] - g.out[a];
        } else {
          g.out[a] = natural - g.pb[a] - g.pe[a];
        }
      }
      WXE_CHECK(g.out[a] >= 1, "node ", n.name, " (ConvTranspose): output size ", g.out[a],
                " < 1 on spatial axis ", i, " (input ", shape_str(x), ")");
    }
  }
  return g;
}

namespace {

ConvGeom geometry_checked(const Node& n, const std::vector<const Value*>& in, bool transpose) {
  WXE_CHECK(in.size() >= 2 && in[0] && in[1], "node ", n.name, " (", n.op,
            "): needs inputs X and W");
  ConvGeom g = conv_geometry(n, in[0]->shape, in[1]->shape, transpose);
  WXE_CHECK(in[0]->dtype == in[1]->dtype, "node ", n.name, " (", n.op, "): X and W dtypes differ");
  if (in.size() > 2 && in[2])
    WXE_CHECK(in[2]->shape == Shape{g.C_out}, "node ", n.name, " (", n.op, "): bias ",
              shape_str(in[2]->shape), " must be (", g.C_out, ")");
  return g;
}

std::vector<TypeShape> conv_shape(const Node& n, const std::vector<const Value*>& in) {
  ConvGeom g = geometry_checked(n, in, false);
  return {{in[0]->dtype, g.out_shape()}};
}

std::vector<TypeShape> conv_transpose_shape(const Node& n, const std::vector<const Value*>& in) {
  ConvGeom g = geometry_checked(n, in, true);
  return {{in[0]->dtype, g.out_shape()}};
}

void conv_ref(const Node& n, const std::vector<const Tensor*>& in,
              const std::vector<Tensor*>& out) {
  require_f32(n, in);
  const ConvGeom g = conv_geometry(n, in[0]->shape, in[1]->shape, false);
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  float* Y = out[0]->data<float>();
  const int64_t Cig = g.C_in / g.group, Cog = g.C_out / g.group;
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const int64_t KD = g.k[0], KH = g.k[1], KW = g.k[2];
  const int64_t plane = OD * OH * OW, iplane = ID * IH * IW;
#pragma omp parallel
  {
    std::vector<double> acc((size_t)plane);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < g.N * g.C_out; ++t) {
      const int64_t nb = t / g.C_out, oc = t % g.C_out, grp = oc / Cog;
      std::fill(acc.begin(), acc.end(), bias ? (double)bias->data<float>()[oc] : 0.0);
      for (int64_t icg = 0; icg < Cig; ++icg) {
        const float* xc = X + (nb * g.C_in + grp * Cig + icg) * iplane;
        const float* wc = W + (oc * Cig + icg) * KD * KH * KW;
        for (int64_t kd = 0; kd < KD; ++kd)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const double wv = wc[(kd * KH + kh) * KW + kw];
              for (int64_t od = 0; od < OD; ++od) {
                const int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
                if (id < 0 || id >= ID) continue;
                for (int64_t oh = 0; oh < OH; ++oh) {
                  const int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
                  if (ih < 0 || ih >= IH) continue;
                  const float* xr = xc + (id * IH + ih) * IW;
                  double* ar = acc.data() + (od * OH + oh) * OW;
                  for (int64_t ow = 0; ow < OW; ++ow) {
                    const int64_t iw = ow * g.s[2] - g.pb[2] + kw * g.d[2];
                    if (iw >= 0 && iw < IW) ar[ow] += wv * xr[iw];
                  }
                }
              }
            }
      }
      float* y = Y + t * plane;
      for (int64_t p = 0; p < plane; ++p) y[p] = (float)acc[p];
    }
  }
}

// Gather form: output position o receives input position i through kernel tap k when
// o = i * s - pad_begin + k * d.
void conv_transpose_ref(const Node& n, const std::vector<const Tensor*>& in,
                        const std::vector<Tensor*>& out) {
  require_f32(n, in);
  const ConvGeom g = conv_geometry(n, in[0]->shape, in[1]->shape, true);
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  float* Y = out[0]->data<float>();
  const int64_t Cig = g.C_in / g.group, Cog = g.C_out / g.group;
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const int64_t KD = g.k[0], KH = g.k[1], KW = g.k[2];
  const int64_t plane = OD * OH * OW, iplane = ID * IH * IW;
  // input index for output o and tap k on axis a, or -1
  auto src = [&](int a, int64_t o, int64_t k, int64_t size) -> int64_t {
    const int64_t t = o + g.pb[a] - k * g.d[a];
    if (t < 0 || t % g.s[a] != 0) return -1;
    const int64_t i = t / g.s[a];
    return i < size ? i : -1;
  };
#pragma omp parallel
  {
    std::vector<double> acc((size_t)plane);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < g.N * g.C_out; ++t) {
      const int64_t nb = t / g.C_out, oc = t % g.C_out, grp = oc / Cog, ocg = oc % Cog;
      std::fill(acc.begin(), acc.end(), bias ? (double)bias->data<float>()[oc] : 0.0);
      for (int64_t icg = 0; icg < Cig; ++icg) {
        const int64_t ic = grp * Cig + icg;
        const float* xc = X + (nb * g.C_in + ic) * iplane;
        const float* wc = W + (ic * Cog + ocg) * KD * KH * KW;
        for (int64_t kd = 0; kd < KD; ++kd)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const double wv = wc[(kd * KH + kh) * KW + kw];
              for (int64_t od = 0; od < OD; ++od) {
                const int64_t id = src(0, od, kd, ID);
                if (id < 0) continue;
                for (int64_t oh = 0; oh < OH; ++oh) {
                  const int64_t ih = src(1, oh, kh, IH);
                  if (ih < 0) continue;
                  const float* xr = xc + (id * IH + ih) * IW;
                  double* ar = acc.data() + (od * OH + oh) * OW;
                  for (int64_t ow = 0; ow < OW; ++ow) {
                    const int64_t iw = src(2, ow, kw, IW);
                    if (iw >= 0) ar[ow] += wv * xr[iw];
                  }
                }
              }
            }
      }
      float* y = Y + t * plane;
      for (int64_t p = 0; p < plane; ++p) y[p] = (float)acc[p];
    }
  }
}

}  // namespace

void register_conv_ops() {
  register_op("Conv", conv_shape, conv_ref);
  register_op("ConvTranspose", conv_transpose_shape, conv_transpose_ref);
}

}  // namespace wxe::cpu
