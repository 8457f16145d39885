// The shared oneDNN plumbing declared in dnnl_util.h.
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu::onednn {

dnnl::engine& eng() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& strm() {
  static dnnl::stream s(eng());
  return s;
}

void execute(const Node& n, const dnnl::primitive& p, const Args& args) {
  try {
    p.execute(strm(), args);
    strm().wait();
  } catch (const dnnl::error& e) {
    fail("node ", n.name, " (", n.op, "): oneDNN execution failed: ", e.what());
  }
}

MatMulPrim make_matmul(const memory::desc& src, const memory::desc& wei, const memory::desc* bias,
                       const memory::desc& dst, const dnnl::primitive_attr& attr) {
  MatMulPrim r;
  try {
    auto d = bias ? dnnl::matmul::desc(src, wei, *bias, dst) : dnnl::matmul::desc(src, wei, dst);
    dnnl::matmul::primitive_desc pd(d, attr, eng());
    r.prim = dnnl::matmul(pd);
    r.src = src;
    r.wei = wei;
    if (bias) r.bias = *bias;
    r.dst = dst;
    r.impl = pd.impl_info_str();
  } catch (const dnnl::error&) {
    r.use_ref = true;
  }
  return r;
}

void to_bf16(const float* src, int64_t count, uint16_t* dst) {
#pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t i = 0; i < count; ++i) dst[i] = bf16_bits(src[i]);
}

void softmax_lines(const Node& n, const float* src, float* dst, int64_t outer, int64_t len, int64_t inner) {
  static PrimCache<dnnl::softmax_forward> cache;
  const memory::desc md = plain_md({outer, len, inner});
  auto p = cache.get(str("softmax", outer, "x", len, "x", inner), [&] {
    dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_inference, md, 1);
    return dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(d, eng()));
  });
  execute(n, *p, {{DNNL_ARG_SRC, mem(md, const_cast<float*>(src))}, {DNNL_ARG_DST, mem(md, dst)}});
}

Scratch& scratch_slot(int i) {
  thread_local Scratch pool[kScratchSlots];
  WXE_ASSERT(i >= 0 && i < kScratchSlots);
  return pool[i];
}

}  // namespace wxe::cpu::onednn
