// Every op on every available backend against the CPU reference kernels (ggml's
// test-backend-ops): each op with a kernel on a non-CPU backend runs its cases (the gradient
// cases of tests/grad_check.h plus the extra ones below) as a one-node graph through the
// Executor on that device, and the outputs are compared with the reference kernel's. Without
// the device those tests skip. The coverage tests read only the kernel tables and run
// everywhere: every op a backend has needs a case, and every op in the CREDIT model graphs
// (as the backend's prepare() leaves them) needs a kernel.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "engine/exec/autograd.h"
#include "engine/exec/backend.h"
#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "tests/fixtures.h"
#include "tests/grad_check.h"
#include "tests/host_backend.h"
#include "tests/test_util.h"
#include "load/model.h"

using namespace wxe;
using namespace wxe::test;

namespace {

// Cases for ops that have no gradient case (fusion products, ops without a backward) and
// for shapes the CREDIT graphs use.
std::vector<GradCase> extra_cases() {
  std::vector<GradCase> r;
  r.push_back(grad_case("ChannelLayerNorm", "ChannelLayerNorm",
                        {randn({2, 5, 3, 4}, 1), randn({1, 5, 1, 1}, 2), randn({1, 5, 1, 1}, 3)},
                        {{"epsilon", attr_f(1e-5f)}}));
  r.push_back(grad_case("ReduceL1", "ReduceL1", {randn({3, 4, 5}, 4)}, {{"axes", attr_ints({1})}}));
  r.push_back(grad_case("ReduceL2", "ReduceL2", {randn({3, 4, 5}, 5)}, {{"axes", attr_ints({0, 2})}}));
  r.push_back(grad_case("ReduceMean channel", "ReduceMean", {randn({1, 16, 8, 16}, 6)},
                        {{"axes", attr_ints({1})}, {"keepdims", attr_i(1)}}));
  r.push_back(grad_case("Softmax attention row", "Softmax", {randn({2, 3, 49, 49}, 7, 3.f)}, {{"axis", attr_i(-1)}}));
  r.push_back(grad_case("Softmax axis 1", "Softmax", {randn({2, 7, 5}, 8)}, {{"axis", attr_i(1)}}));
  r.push_back(grad_case("Einsum q k^T", "Einsum", {randn({2, 3, 16, 8}, 9), randn({2, 3, 16, 8}, 10)},
                        {{"equation", attr_s("bhid,bhjd->bhij")}}));
  r.push_back(grad_case("Einsum attn v", "Einsum", {randn({2, 3, 16, 16}, 11), randn({2, 3, 16, 8}, 12)},
                        {{"equation", attr_s("bhij,bhjd->bhid")}}));
  r.push_back(grad_case("Einsum permuted output", "Einsum", {randn({4, 3, 5}, 13), randn({3, 6}, 14)},
                        {{"equation", attr_s("ikj,kl->lji")}}));
  r.push_back(grad_case("Einsum trace", "Einsum", {randn({5, 5}, 15)}, {{"equation", attr_s("ii->i")}}));
  r.push_back(grad_case("Linear axis 1 bias gelu", "Linear", {randn({2, 8, 4, 5}, 16), randn({6, 8}, 17), randn({6}, 18)},
                        {{"axis", attr_i(1)}, {"activation", attr_s("gelu")}}));
  r.push_back(grad_case("Linear last axis", "Linear", {randn({7, 3, 8}, 19), randn({5, 8}, 20), randn({5}, 21)}));
  r.push_back(grad_case("Conv strided crossembed", "Conv", {randn({1, 7, 32, 64}, 22), randn({8, 7, 4, 4}, 23), randn({8}, 24)},
                        {{"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 1, 1, 1})}}));
  // few output channels and a large kernel without padding (the stage-0 cross-embedding's shape
  // at small size), and 3 channels with a batch of 2
  r.push_back(grad_case("Conv direct large kernel stride 2", "Conv",
                        {randn({1, 5, 38, 70}, 37), randn({4, 5, 12, 12}, 38), randn({4}, 39)},
                        {{"strides", attr_ints({2, 2})}}));
  r.push_back(grad_case("Conv direct 3 channels batch 2", "Conv", {randn({2, 3, 11, 13}, 40), randn({3, 3, 5, 5}, 41)}));
  r.push_back(grad_case("Conv asymmetric pads groups", "Conv", {randn({2, 4, 9, 10}, 25), randn({6, 2, 3, 2}, 26)},
                        {{"group", attr_i(2)}, {"pads", attr_ints({0, 1, 2, 0})}}));
  r.push_back(grad_case("Conv 1-D dilated", "Conv", {randn({2, 3, 17}, 27), randn({4, 3, 3}, 28)},
                        {{"dilations", attr_ints({2})}, {"pads", attr_ints({2, 2})}}));
  r.push_back(grad_case("ConvTranspose stride 2", "ConvTranspose",
                        {randn({1, 8, 8, 16}, 29), randn({8, 4, 2, 2}, 30), randn({4}, 31)},
                        {{"strides", attr_ints({2, 2})}}));
  r.push_back(grad_case("ConvTranspose asymmetric output_padding", "ConvTranspose",
                        {randn({2, 4, 5, 6}, 32), randn({4, 3, 3, 3}, 33)},
                        {{"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 0, 0, 1})},
                         {"output_padding", attr_ints({1, 1})}}));
  r.push_back(grad_case("Gelu", "Gelu", {randn({3, 70}, 34, 2.f)}));
  r.push_back(grad_case("DepthToSpace CRD", "DepthToSpace", {randn({1, 8, 3, 5}, 35)},
                        {{"blocksize", attr_i(2)}, {"mode", attr_s("CRD")}}));
  r.push_back(grad_case("Transpose window", "Transpose", {randn({1, 4, 2, 3, 2, 5}, 36)},
                        {{"perm", attr_ints({0, 2, 4, 1, 3, 5})}}));
  // WindowAttention(x, Wq, Wk, Wv, Wo, bo?, bias, residual?): CREDIT's 10 x 10 windows,
  // strided (long-range) windows without bo or residual, and one-token windows
  auto attention = [&](const char* label, Shape x, int64_t I, int64_t heads, int64_t th, int64_t tw, bool strided,
                       bool opt, uint64_t seed) {
    const int64_t D = x[1], T = th * tw;
    r.push_back(grad_case(label, "WindowAttention",
                          {randn(x, seed), randn({I, D}, seed + 1, 0.5f), randn({I, D}, seed + 2, 0.5f),
                           randn({I, D}, seed + 3, 0.5f), randn({D, I}, seed + 4, 0.5f),
                           opt ? randn({D}, seed + 5) : Tensor(), randn({heads, T, T}, seed + 6),
                           opt ? randn(x, seed + 7) : Tensor()},
                          {{"heads", attr_i(heads)}, {"scale", attr_f(0.25f)}, {"window", attr_ints({th, tw})},
                           {"strided", attr_i(strided)}}));
  };
  // SpectralNorm with the power iteration (the gradient cases run none): u and v move
  r.push_back(grad_case("SpectralNorm 2 power iterations dim 0", "SpectralNorm",
                        {randn({8, 4, 3, 3}, 61), randn({8}, 62), randn({36}, 63)},
                        {{"dim", attr_i(0)}, {"power_iterations", attr_i(2)}}));
  r.push_back(grad_case("SpectralNorm 1 power iteration dim 1", "SpectralNorm",
                        {randn({4, 6, 2, 2}, 64), randn({6}, 65), randn({16}, 66)},
                        {{"dim", attr_i(1)}, {"power_iterations", attr_i(1)}}));
  attention("WindowAttention 10x10 windows", {1, 16, 20, 30}, 32, 2, 10, 10, false, true, 37);
  attention("WindowAttention strided", {2, 6, 8, 6}, 12, 3, 4, 3, true, false, 45);
  attention("WindowAttention one-token windows", {1, 4, 3, 5}, 8, 2, 1, 1, true, true, 53);
  return r;
}

// Every case for `op`: the registered gradient cases and the extras.
std::vector<GradCase> cases_for(const std::string& op) {
  std::vector<GradCase> r;
  auto range = grad_case_registry().equal_range(op);
  for (auto it = range.first; it != range.second; ++it)
    for (auto& c : it->second()) r.push_back(c);
  for (auto& c : extra_cases())
    if (c.node.op == op) r.push_back(c);
  return r;
}

// The case as a one-node graph whose inputs are constants (shape-carrying inputs must be).
Graph one_node_graph(const GradCase& c) {
  register_cpu_kernels();
  Graph g;
  g.source = "case '" + c.label + "'";
  Node n = c.node;
  n.name = c.label;
  n.inputs.clear();
  std::vector<const Value*> vin;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    n.inputs.push_back(c.inputs[i].defined() ? g.add_constant("in" + std::to_string(i), c.inputs[i]) : -1);
  for (int v : n.inputs) vin.push_back(v < 0 ? nullptr : &g.values[v]);
  std::vector<TypeShape> ts = shape_rule(n.op)(n, vin);
  n.outputs.clear();
  for (size_t k = 0; k < ts.size(); ++k) {
    Value v;
    v.name = "out" + std::to_string(k);
    v.dtype = ts[k].dtype;
    v.shape = ts[k].shape;
    v.shape_known = true;
    n.outputs.push_back(g.add_value(v));
    g.outputs.push_back(n.outputs.back());
  }
  g.nodes.push_back(n);
  return g;
}

// The non-CPU backends this build has, with a device present.
std::vector<std::string> device_backends(std::string* why) {
  register_gpu_backends();
  std::vector<std::string> r;
  for (const std::string& name : backend_names()) {
    if (find_backend(name)->device() == DeviceKind::CPU) continue;  // cpu, host test backends
    std::string w;
    if (find_backend(name)->available(&w))
      r.push_back(name);
    else
      *why += name + ": " + w + "; ";
  }
  if (r.empty() && why->empty()) *why = "this build has no GPU backend";
  return r;
}

// Compares every output; "" when all are within tolerance.
std::string compare_case(const GradCase& c, const std::string& device, double* worst) {
  // the reference on copies: ops that update inputs in place (SpectralNorm's u and v) must
  // find the same inputs on the device
  std::vector<Tensor> copies;
  for (auto& t : c.inputs) copies.push_back(t.defined() ? t.clone() : Tensor());
  std::vector<const Tensor*> p;
  for (auto& t : copies) p.push_back(t.defined() ? &t : nullptr);
  Node rn = c.node;
  std::vector<Tensor> ref = run_node(rn, p, KernelKind::Reference);
  Graph g = one_node_graph(c);
  ExecOptions opt;
  opt.device = device;
  opt.optimize = false;
  std::vector<Tensor> got;
  try {
    Executor ex(g, opt);
    got = ex.run({});
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
  std::string bad;
  for (size_t k = 0; k < ref.size(); ++k) {
    if (shape_str(got[k].shape) != shape_str(ref[k].shape) || got[k].dtype != ref[k].dtype) {
      bad += str(" output ", k, " is ", dtype_name(got[k].dtype), " ", shape_str(got[k].shape), ", expected ",
                 dtype_name(ref[k].dtype), " ", shape_str(ref[k].shape), ";");
      continue;
    }
    if (ref[k].numel() == 0) continue;
    double scale = 0;
    Tensor rf = ref[k].to_f32();
    for (int64_t i = 0; i < rf.numel(); ++i) scale = std::max(scale, (double)std::fabs(rf.data<float>()[i]));
    const double err = max_abs_diff(got[k], ref[k]), tol = 1e-5 * (1 + scale);
    *worst = std::max(*worst, err / (1 + scale));
    if (!(err <= tol)) bad += str(" output ", k, ": max abs diff ", err, " > ", tol, ";");
  }
  return bad;
}


// The gradient harness: the case's node runs forward and backward on `device` (its own
// kernels, inputs uploaded, output gradients fixed random tensors) and every input gradient is
// compared with the CPU backward kernel's (itself checked against finite differences by
// grad_test.cpp). "" when all are within tolerance; "unsupported: ..." when the device kernel
// refuses the case with a "no <device> backward" error (reported, not failed).
std::string compare_grad_case(const GradCase& c, const std::string& device, double* worst) {
  register_cpu_kernels();
  Backend& b = *find_backend(device);
  const BackendKernel* k = b.kernel(c.node.op);
  if (!k || !k->backward) return "no backward kernel";
  std::vector<Tensor> copies;  // the CPU's inputs (an op may update them in place, as the device's will)
  for (auto& t : c.inputs) copies.push_back(t.defined() ? t.clone() : Tensor());
  std::vector<const Tensor*> hin;
  for (auto& t : copies) hin.push_back(t.defined() ? &t : nullptr);
  Node n = c.node;
  std::vector<Tensor> ref_out = run_node(n, hin, KernelKind::Reference);
  std::vector<Tensor> gout_h(ref_out.size());  // sized first: gout_p points into it
  std::vector<const Tensor*> gout_p;
  for (size_t o = 0; o < ref_out.size(); ++o) {
    const bool f = ref_out[o].dtype == DType::F32;
    if (f) gout_h[o] = randn(ref_out[o].shape, 900 + (unsigned)o);
    gout_p.push_back(f ? &gout_h[o] : nullptr);
  }
  auto wants = [&](size_t i) {
    return c.inputs[i].defined() && c.inputs[i].dtype == DType::F32 &&
           std::find(c.fixed.begin(), c.fixed.end(), (int)i) == c.fixed.end();
  };
  // CPU reference backward
  std::vector<const Tensor*> rout;
  for (auto& t : ref_out) rout.push_back(&t);
  std::vector<Tensor> ref_g(c.inputs.size());
  std::vector<Tensor*> ref_gp;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (wants(i)) ref_g[i] = Tensor(DType::F32, c.inputs[i].shape);
    ref_gp.push_back(wants(i) ? &ref_g[i] : nullptr);
  }
  BackwardFn cpu_bw = backward_kernel(n.op);
  if (!cpu_bw) return "no cpu backward kernel";
  cpu_bw(n, hin, rout, gout_p, ref_gp);
  // the device: forward, then backward
  std::vector<Tensor> din(c.inputs.size()), dout, dgout(gout_h.size()), dg(c.inputs.size());
  std::vector<const Tensor*> dinp, doutp, dgoutp;
  std::vector<Tensor*> doutw, dgp;
  auto on_device = [&](size_t i) { return !(i < 32 && (k->host_inputs >> i & 1)); };
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].defined() && on_device(i)) din[i] = b.upload(c.inputs[i]);
    dinp.push_back(!c.inputs[i].defined() ? nullptr : on_device(i) ? &din[i] : &c.inputs[i]);
  }
  for (auto& t : ref_out) dout.push_back(b.empty(t.dtype, t.shape));
  for (auto& t : dout) {
    doutw.push_back(&t);
    doutp.push_back(&t);
  }
  for (size_t o = 0; o < gout_h.size(); ++o) {
    if (gout_h[o].defined()) dgout[o] = b.upload(gout_h[o]);
    dgoutp.push_back(gout_h[o].defined() ? &dgout[o] : nullptr);
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (wants(i)) dg[i] = b.empty(DType::F32, c.inputs[i].shape);
    dgp.push_back(wants(i) ? &dg[i] : nullptr);
  }
  // as the training executor passes them: what the op's backward does not read (engine/ir/ops.h
  // BackwardReads) as shape-only tensors, which the memory plan has freed by then
  const BackwardReads reads = backward_reads(n.op);
  std::vector<Tensor> freed_in(dinp.size()), freed_out(doutp.size());
  std::vector<const Tensor*> bin = dinp, bout = doutp;
  for (size_t i = 0; i < bin.size(); ++i)
    if (bin[i] && !reads.input(i)) bin[i] = &(freed_in[i] = bin[i]->shape_only());
  for (size_t o = 0; o < bout.size() && !reads.outputs; ++o) bout[o] = &(freed_out[o] = bout[o]->shape_only());
  try {
    k->forward(n, dinp, doutw);
    k->backward(n, bin, bout, dgoutp, dgp);
    b.synchronize();
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find(std::string("no ") + device + " backward") != std::string::npos) return "unsupported: " + m;
    return "error: " + m;
  }
  std::string bad;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!wants(i)) continue;
    Tensor got = b.download(dg[i]);
    double scale = 0;
    for (int64_t e = 0; e < ref_g[i].numel(); ++e) scale = std::max(scale, (double)std::fabs(ref_g[i].data<float>()[e]));
    const double err = max_abs_diff(got, ref_g[i]), tol = 1e-4 * (1 + scale);
    *worst = std::max(*worst, err / (1 + scale));
    if (!(err <= tol)) bad += str(" gradient of input ", i, ": max abs diff ", err, " > ", tol, ";");
  }
  return bad;
}

}  // namespace

TEST(Backends, EveryDeviceOpMatchesTheCpuReference) {
  std::string why;
  auto devices = device_backends(&why);
  if (devices.empty()) GTEST_SKIP() << why;
  for (const std::string& dev : devices) {
    int ran = 0;
    double worst = 0;
    for (const std::string& op : find_backend(dev)->ops()) {
      for (const GradCase& c : cases_for(op)) {
        std::string bad = compare_case(c, dev, &worst);
        EXPECT_EQ(bad, "") << dev << ": " << op << " case '" << c.label << "'";
        ++ran;
      }
    }
    std::printf("%s: %d cases, worst max abs diff / (1 + max |ref|) %.3g\n", dev.c_str(), ran, worst);
    EXPECT_GT(ran, 50);
  }
}

// Every op with a device backward kernel, every case, forward and gradient against the CPU.
TEST(Backends, EveryDeviceBackwardMatchesTheCpuReference) {
  std::string why;
  auto devices = device_backends(&why);
  if (devices.empty()) GTEST_SKIP() << why;
  for (const std::string& dev : devices) {
    int ran = 0, unsupported = 0;
    double worst = 0;
    for (const std::string& op : find_backend(dev)->ops()) {
      if (!find_backend(dev)->kernel(op)->backward) continue;
      for (const GradCase& c : cases_for(op)) {
        if (std::getenv("WXE_TRACE_CASES")) std::fprintf(stderr, "%s: %s case '%s'\n", dev.c_str(), op.c_str(), c.label.c_str());
        std::string bad = compare_grad_case(c, dev, &worst);
        if (bad.rfind("unsupported: ", 0) == 0) {
          std::printf("%s: %s case '%s': %s\n", dev.c_str(), op.c_str(), c.label.c_str(), bad.c_str());
          ++unsupported;
          continue;
        }
        EXPECT_EQ(bad, "") << dev << ": " << op << " case '" << c.label << "' (backward)";
        ++ran;
      }
    }
    std::printf("%s: %d backward cases (%d unsupported), worst max abs diff / (1 + max |ref|) %.3g\n", dev.c_str(), ran,
                unsupported, worst);
    EXPECT_GT(ran, 50);
  }
}

// The ops of the training graphs (the CPU backward table is the list) that have no device
// backward kernel yet: printed, so the gap is visible; run without a GPU (tables only).
TEST(Backends, DeviceBackwardCoverage) {
  register_gpu_backends();
  register_cpu_kernels();
  for (const std::string& name : backend_names()) {
    Backend* b = find_backend(name);
    if (b->device() == DeviceKind::CPU) continue;
    std::string missing;
    int have = 0;
    for (const std::string& op : known_ops()) {
      if (!backward_kernel(op) || is_view_op(op)) continue;
      const BackendKernel* k = b->kernel(op);
      if (k && k->backward) {
        ++have;
        EXPECT_TRUE(k->forward) << op;
      } else {
        missing += " " + op;
      }
    }
    std::printf("%s: %d ops with a backward kernel; on the host (fallback) in training:%s\n", name.c_str(), have,
                missing.c_str());
    EXPECT_GE(have, 30) << name;
  }
}

TEST(Backends, EveryDeviceOpHasACase) {
  register_gpu_backends();
  register_cpu_kernels();
  for (const std::string& name : backend_names()) {
    if (find_backend(name)->device() == DeviceKind::CPU) continue;
    for (const std::string& op : find_backend(name)->ops()) {
      EXPECT_TRUE(op_known(op)) << name << " has a kernel for " << op << ", which has no CPU reference";
      EXPECT_FALSE(cases_for(op).empty()) << name << " has a kernel for " << op << " but no test case";
    }
  }
}

namespace {

struct ModelCase {
  std::string model, x, y;
};

std::vector<ModelCase> credit_models() {
  std::vector<ModelCase> r = {
      {"models/wxformer_tiny/model.onnx", "models/wxformer_tiny/x.npy", "models/wxformer_tiny/y.npy"},
      {"tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_x.npy", "tests/data/crossformer_tiny_y.npy"},
      {"tests/data/crossformer_tiny_snbaked_opset17.onnx", "tests/data/crossformer_tiny_x.npy",
       "tests/data/crossformer_tiny_y.npy"},
      {"tests/data/torch2_crossformer_tiny_dynamo.onnx", "tests/data/torch2_crossformer_tiny_x.npy",
       "tests/data/torch2_crossformer_tiny_y.npy"},
      {"tests/data/torch2_wxformer_tiny_dynamo.onnx", "tests/data/torch2_wxformer_tiny_x.npy",
       "tests/data/torch2_wxformer_tiny_y.npy"}};
  for (auto& m : r) {
    m.model = data_path(m.model);
    m.x = data_path(m.x);
    m.y = data_path(m.y);
  }
  // the benchmark-size model where the CREDIT fixtures outside the repository are ($WXE_FIXTURES)
  if (credit_fixtures_present({"wxformer_v2026_snbaked_opset17.onnx", "wxformer_v2026_x.npy", "wxformer_v2026_y.npy"})) {
    const std::string d = credit_fixtures_dir();
    r.push_back({d + "wxformer_v2026_snbaked_opset17.onnx", d + "wxformer_v2026_x.npy", d + "wxformer_v2026_y.npy"});
  }
  return r;
}

Graph simplified(const ModelCase& m, Tensor* x) {
  Graph g = import_onnx(m.model);
  *x = read_npy(m.x);
  simplify(g, {{g.values[g.inputs[0]].name, {x->dtype, x->shape}}});
  return g;
}

// The GPU backends this build has (their kernel tables exist without a device).
std::vector<Backend*> gpu_backends_built() {
  register_gpu_backends();
  std::vector<Backend*> r;
  for (const std::string& name : backend_names())
    if (find_backend(name)->device() != DeviceKind::CPU) r.push_back(find_backend(name));
  return r;
}

}  // namespace

// Reads the tables only: runs without a GPU.
TEST(Backends, CreditModelOpsHaveDeviceKernels) {
  const std::vector<Backend*> backends = gpu_backends_built();
  if (backends.empty()) GTEST_SKIP() << "this build has no GPU backend";
  for (Backend* b : backends)
    for (const ModelCase& m : credit_models()) {
      if (!std::filesystem::exists(m.model)) continue;
      SCOPED_TRACE(m.model);
      Tensor x;
      for (auto& [op, count] : ops_without_kernels(simplified(m, &x), *b))
        ADD_FAILURE() << b->name() << " has no kernel for " << op << " (" << count << " nodes)";
    }
}

// Reads the tables only: the CREDIT training graphs (spectral norm traced, as finetune builds
// them) run wholly on every GPU backend, forward and backward, with nothing left on the host.
TEST(Backends, CreditTrainingOpsHaveDeviceKernels) {
  const std::vector<Backend*> backends = gpu_backends_built();
  if (backends.empty()) GTEST_SKIP() << "this build has no GPU backend";
  for (Backend* b : backends)
    for (const char* model : {"crossformer_tiny", "wxformer_tiny"}) {
      SCOPED_TRACE(model);
      Graph g = import_onnx(data_path(std::string("tests/data/") + model + "_opset17.onnx"));
      LoadOptions lo;
      lo.weights = data_path(std::string("tests/data/") + model + "_checkpoint.pt");
      lo.training = true;
      prepare_model(g, {}, lo);
      std::vector<bool> needs(g.values.size(), false);  // depends on a trainable parameter
      for (int p : trainable_parameters(g)) needs[p] = true;
      std::map<std::string, int> forward, backward;
      for (const Node& n : g.nodes) {
        if (is_view_op(n.op)) continue;
        const bool grad = std::any_of(n.inputs.begin(), n.inputs.end(), [&](int i) { return i >= 0 && needs[i]; });
        for (int o : n.outputs) needs[o] = needs[o] || grad;
        const BackendKernel* k = b->kernel(n.op);
        if (!k) ++forward[n.op];
        if (grad && (!k || !k->backward)) ++backward[n.op];
      }
      for (auto& [op, c] : forward)
        ADD_FAILURE() << b->name() << " has no forward kernel for " << op << " (" << c << " nodes)";
      for (auto& [op, c] : backward)
        ADD_FAILURE() << b->name() << " has no backward kernel for " << op << " (" << c << " nodes)";
    }
}

// Whole models on each device against the stored PyTorch outputs, with the CPU e2e tolerances.
// With --precision bf16: no further from PyTorch's float32 output than the CPU's bf16 run
// (oneDNN bf16 products) is, give or take a factor of 2.
TEST(Backends, CreditModelsMatchPyTorchOnDevice) {
  std::string why;
  auto devices = device_backends(&why);
  if (devices.empty()) GTEST_SKIP() << why;
  for (const std::string& dev : devices)
    for (const ModelCase& m : credit_models()) {
      SCOPED_TRACE(dev + ": " + m.model);
      if (!std::filesystem::exists(m.model) || !std::filesystem::exists(m.y)) continue;
      Tensor x;
      Graph g = simplified(m, &x);
      ExecOptions opt;
      opt.device = dev;
      Executor ex(g, opt);
      const std::string in = g.values[g.inputs[0]].name;
      Tensor y = ex.run({{in, x}})[0];
      Tensor y2 = ex.run({{in, x}})[0];  // the arena and cached plans again
      Tensor ref = read_npy(m.y);
      ASSERT_EQ(shape_str(y.shape), shape_str(ref.shape));
      const bool big = m.model.find("v2026") != std::string::npos;  // its CPU test checks rel L2 only
      if (!big) {
        EXPECT_LE(max_abs_diff(y, ref), 1e-4);
      }
      EXPECT_LE(rel_l2(y, ref), 1e-5);
      EXPECT_EQ(max_abs_diff(y, y2), 0.0) << "two runs differ";
      std::printf("%s %s: max abs %.3g, rel L2 %.3g\n", dev.c_str(), m.model.c_str(), max_abs_diff(y, ref),
                  rel_l2(y, ref));
      opt.precision = Precision::BF16;
      Tensor yb = Executor(g, opt).run({{in, x}})[0];
      opt.device = "cpu";
      Tensor cpu = Executor(g, opt).run({{in, x}})[0];
      EXPECT_LE(rel_l2(yb, ref), 2 * rel_l2(cpu, ref) + 1e-5) << "bf16";
      std::printf("%s %s bf16: rel L2 %.3g (cpu bf16 %.3g)\n", dev.c_str(), m.model.c_str(), rel_l2(yb, ref),
                  rel_l2(cpu, ref));
    }
}

// Without the device or the build: one clear line.
TEST(Backends, UnavailableDeviceIsAClearError) {
  register_gpu_backends();
  std::string why;
  if (!device_backends(&why).empty()) GTEST_SKIP() << "a device is present";
  GraphBuilder b;
  int x = b.input("x", {2});
  b.g.outputs.push_back(b.node("Relu", {x}));
  b.g.values[x].shape_known = true;
  for (int v = 0; v < (int)b.g.values.size(); ++v) {
    b.g.values[v].shape = {2};
    b.g.values[v].shape_known = true;
  }
  ExecOptions opt;
  opt.device = "cuda";
  const std::string msg = error_of([&] { Executor ex(b.g, opt); });
  EXPECT_NE(msg.find("device 'cuda' is not available"), std::string::npos) << msg;
  opt.device = "tpu";
  EXPECT_NE(error_of([&] { Executor ex(b.g, opt); }).find("unknown device 'tpu'"), std::string::npos);
}

namespace {

// A backend on host memory whose table has only Add (the CPU reference kernel) and Transpose:
// runs the executor's device path (uploads, device arena, host outputs, the missing-kernel
// error) without a GPU.
HostMemoryBackend& host_test_backend() {
  static HostMemoryBackend* b = [] {
    register_cpu_kernels();
    auto p = std::make_unique<HostMemoryBackend>("hosttest");
    p->register_kernel("Add", kernel_for("Add", KernelKind::Reference));
    p->register_backward("Add", backward_kernel("Add"));
    // Transpose: forward here, a backward that refuses every case (the GradExecutor then runs
    // that node's backward on the host)
    p->register_kernel("Transpose", kernel_for("Transpose", KernelKind::Reference));
    p->register_backward("Transpose", [](const Node&, const std::vector<const Tensor*>&,
                                         const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                                         const std::vector<Tensor*>&) { fail("no hosttest backward for this case"); });
    HostMemoryBackend* raw = p.get();
    register_backend(std::move(p));
    return raw;
  }();
  return *b;
}

}  // namespace

TEST(Backends, ExecutorDevicePathOnAHostBackend) {
  HostMemoryBackend& dev = host_test_backend();
  GraphBuilder b;
  int x = b.input("x", {2, 3});
  int c = b.constant("c", randn({3}, 40));
  int r = b.node("Reshape", {b.node("Add", {b.node("Add", {x, c}), c}), b.constant("s", Tensor::from_i64({3, 2}))});
  b.g.outputs.push_back(r);
  simplify(b.g, {{"x", {DType::F32, {2, 3}}}});
  Tensor xin = randn({2, 3}, 41);
  Executor cpu(b.g);
  ExecOptions opt;
  opt.device = "hosttest";
  const int uploads0 = dev.uploads;
  Executor ex(b.g, opt);
  EXPECT_GE(dev.uploads - uploads0, 1);  // the constant, once
  const int after_build = dev.uploads;
  for (int run = 0; run < 2; ++run) {
    Tensor y = ex.run({{"x", xin}})[0];
    expect_close(y, cpu.run({{"x", xin}})[0], 0, 0);
    EXPECT_EQ(y.device(), DeviceKind::CPU);
  }
  EXPECT_EQ(dev.uploads - after_build, 2);  // only the input, at each run
}

TEST(Backends, MissingDeviceKernelNamesTheNode) {
  host_test_backend();
  GraphBuilder b;
  int x = b.input("x", {4});
  b.g.outputs.push_back(b.node("Relu", {x}));
  simplify(b.g, {{"x", {DType::F32, {4}}}});
  ExecOptions opt;
  opt.device = "hosttest";
  const std::string msg = error_of([&] { Executor ex(b.g, opt); });
  EXPECT_NE(msg.find("node /Relu_0 (Relu): no hosttest kernel for op Relu"), std::string::npos) << msg;
}

// ops_without_kernels (wxe inspect --device) reads the tables: Relu is missing on the host test
// backend (Add and Transpose only), the view op is not; a graph of Adds is covered.
TEST(Backends, OpsWithoutKernelsListsTheMissingOnes) {
  HostMemoryBackend& dev = host_test_backend();
  GraphBuilder b;
  int x = b.input("x", {4});
  int r = b.node("Relu", {b.node("Add", {x, x})});
  b.g.outputs.push_back(b.node("Reshape", {b.node("Relu", {r}), b.constant("s", Tensor::from_i64({2, 2}))}));
  simplify(b.g, {{"x", {DType::F32, {4}}}});
  EXPECT_EQ(ops_without_kernels(b.g, dev), (std::map<std::string, int>{{"Relu", 2}}));
  GraphBuilder a;
  int y = a.input("y", {4});
  a.g.outputs.push_back(a.node("Add", {a.node("Add", {y, y}), y}));
  simplify(a.g, {{"y", {DType::F32, {4}}}});
  EXPECT_TRUE(ops_without_kernels(a.g, dev).empty());
}

// The GradExecutor's device path on the host test backend (Add forward and backward there,
// Transpose forward there and its backward refused at run time, Mul and Relu on the host by
// fallback, Reshape as an alias): outputs and parameter gradients equal the CPU
// GradExecutor's over two steps with a parameter update in between, and the fallback nodes are
// listed.
TEST(Backends, GradExecutorDevicePathOnAHostBackend) {
  HostMemoryBackend& hb = host_test_backend();
  auto build = [] {
    GraphBuilder b;
    int x = b.input("x", {2, 3});
    int w1 = b.constant("w1", randn({3}, 50), true);
    int w2 = b.constant("w2", randn({2, 3}, 51), true);
    int w3 = b.constant("w3", randn({3, 2}, 52), true);
    int h = b.node("Relu", {b.node("Mul", {b.node("Add", {x, w1}), w2})});
    int r = b.node("Reshape", {h, b.constant("s", Tensor::from_i64({3, 2}))});
    int t = b.node("Transpose", {b.node("Mul", {x, w2})}, {{"perm", attr_ints({1, 0})}});  // (3, 2)
    b.g.outputs.push_back(b.node("Add", {b.node("Add", {r, w3}), t}));
    b.g.outputs.push_back(h);
    simplify(b.g, {{"x", {DType::F32, {2, 3}}}});
    return b.g;
  };
  Graph gc = build(), gd = build();  // each with its own parameters
  std::vector<int> pc = trainable_parameters(gc), pd = trainable_parameters(gd);
  ASSERT_EQ(pc.size(), 3u);
  ExecOptions opt;
  opt.kernels = KernelKind::Reference;
  GradExecutor cpu(gc, pc, opt);
  opt.device = "hosttest";
  GradExecutor dev(gd, pd, opt);
  std::string listed;
  for (auto& s : dev.host_nodes()) listed += s + ";";
  EXPECT_NE(listed.find("(Mul, forward)"), std::string::npos) << listed;
  EXPECT_NE(listed.find("(Relu, backward)"), std::string::npos) << listed;
  EXPECT_EQ(listed.find("(Add,"), std::string::npos) << listed;
  EXPECT_EQ(listed.find("Reshape"), std::string::npos) << listed;
  EXPECT_TRUE(cpu.host_nodes().empty());
  EXPECT_EQ(listed.find("Transpose"), std::string::npos) << listed;
  for (int step = 0; step < 2; ++step) {
    Tensor x = randn({2, 3}, 60 + step);
    auto yc = cpu.forward({{"x", x}});
    auto yd = dev.forward({{"x", x}});
    ASSERT_EQ(yd.size(), 2u);
    expect_close(yd[0], yc[0], 0, 0);
    expect_close(yd[1], yc[1], 0, 0);
    std::vector<Tensor> go = {randn({3, 2}, 70 + step), randn({2, 3}, 80 + step)};
    cpu.backward(go);
    dev.backward(go);
    for (size_t p = 0; p < pc.size(); ++p) expect_close(hb.download(dev.grads()[p]), cpu.grads()[p], 1e-6, 1e-6);
    for (size_t p = 0; p < pc.size(); ++p) {  // an optimizer step: the CPU's on its graph, the device's on its copy
      float* a = gc.values[pc[p]].constant->data<float>();
      Tensor gdev = hb.download(dev.grads()[p]), b = hb.download(dev.device_param(p));
      for (int64_t i = 0; i < b.numel(); ++i) {
        a[i] -= 0.1f * cpu.grads()[p].data<float>()[i];
        b.data<float>()[i] -= 0.1f * gdev.data<float>()[i];
      }
      hb.copy_to_device(dev.device_param(p).raw(), b.raw(), b.nbytes());
    }
    cpu.zero_grad();
    dev.zero_grad();
  }
  Tensor x = randn({2, 3}, 99);
  expect_close(dev.forward({{"x", x}})[0], cpu.forward({{"x", x}})[0], 1e-6, 1e-6);  // the update reached the device
  listed.clear();
  for (auto& s : dev.host_nodes()) listed += s + ";";
  EXPECT_NE(listed.find("(Transpose, backward: "), std::string::npos) << listed;  // once, at the first backward
  const std::string tag = "(Transpose, backward: ";
  EXPECT_EQ(listed.find(tag), listed.rfind(tag)) << listed;
}

namespace {

// Twice the true gradient: the harness must catch it.
void doubled_add_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& out,
                          const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  backward_kernel("Add")(n, in, out, gout, gin);
  for (Tensor* g : gin)
    if (g)
      for (int64_t e = 0; e < g->numel(); ++e) g->data<float>()[e] *= 2;
}

}  // namespace

// The gradient harness on host backends: the right Add backward passes every Add case, a
// doubled one fails them.
TEST(Backends, GradientHarnessCanFail) {
  host_test_backend();
  static bool once = [] {
    auto p = std::make_unique<HostMemoryBackend>("hostbad");
    p->register_kernel("Add", kernel_for("Add", KernelKind::Reference));
    p->register_backward("Add", doubled_add_backward);
    register_backend(std::move(p));
    return true;
  }();
  (void)once;
  auto cases = cases_for("Add");
  ASSERT_FALSE(cases.empty());
  for (const GradCase& c : cases) {
    double worst = 0;
    EXPECT_EQ(compare_grad_case(c, "hosttest", &worst), "") << c.label;
    EXPECT_NE(compare_grad_case(c, "hostbad", &worst), "") << c.label;
  }
}
