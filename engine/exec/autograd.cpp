#include "engine/exec/autograd.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <set>

#include "engine/passes/passes.h"

namespace wxe {

namespace {

bool is_float(DType t) { return t == DType::F32; }

// dst += src (same shape)
void accumulate(Tensor& dst, const Tensor& src) {
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

// A value's gradient += src, where gradients may share storage (gradient_passthrough,
// engine/ir/ops.h): a shared sum is not written in place; the sum goes into src's storage when
// src alone holds it, else into a new tensor, and dst takes it.
// plan_only (ExecOptions): the same tensors, no arithmetic.
void accumulate_grad(Tensor& dst, Tensor src, bool plan_only) {
  if (dst.storage.use_count() == 1) {
    if (!plan_only) accumulate(dst, src);
    return;
  }
  const bool reuse = src.storage.use_count() == 1;
  Tensor sum = reuse ? src : plan_only ? Tensor::counted(DType::F32, dst.shape) : Tensor(DType::F32, dst.shape);
  if (plan_only) {
    dst = std::move(sum);
    return;
  }
  const float* a = dst.data<float>();
  const float* b = src.data<float>();
  float* d = sum.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
  dst = std::move(sum);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GradExecutor::GradExecutor(const Graph& g, std::vector<int> trainable, ExecOptions opt)
    : g_(g), trainable_(std::move(trainable)), opt_(opt) {
  needs_grad_.assign(g.values.size(), false);
  for (int p : trainable_) {
    WXE_CHECK(p >= 0 && p < (int)g.values.size() && g.values[p].is_const() && is_float(g.values[p].dtype),
              g.source, ": trainable value ", p, " is not a float32 parameter");
    needs_grad_[p] = true;
  }
  if (opt.device != "cpu") dev_ = &backend_for(opt.device);
  WXE_CHECK(!opt.plan_only || (!dev_ && !opt.keep_forward), "the plan-only executor plans the CPU's step");
  for (const Node& n : g.nodes) {
    kernels_.push_back(kernel_for(n.op, opt.kernels));
    if (dev_) {
      const BackendKernel* k = is_view_op(n.op) ? nullptr : dev_->kernel(n.op);
      dk_.push_back(k);
      bw_on_host_.push_back(false);
      if (!k && !is_view_op(n.op)) host_nodes_.push_back(n.name + " (" + n.op + ", forward)");
    }
    // a random op's output depends on no input's value: no gradient through it
    bool any = !op_is_random(n.op) &&
               std::any_of(n.inputs.begin(), n.inputs.end(), [&](int i) { return i >= 0 && needs_grad_[i]; });
    backward_.push_back(any ? backward_kernel(n.op) : nullptr);
    passthrough_.push_back(any ? gradient_passthrough(n.op) : 0u);
    accumulation_.push_back(any ? gradient_accumulation(n.op) : 0u);
    if (!any) continue;
    WXE_CHECK(backward_.back(), g.source, ": node ", n.name, " (", n.op,
              ") lies between trainable parameters and the loss, and op ", n.op, " has no backward kernel");
    for (int o : n.outputs) needs_grad_[o] = is_float(g.values[o].dtype);
    for (int o : n.outputs)
      WXE_CHECK(g.values[o].shape_known, g.source, ": value '", g.values[o].name, "' has no static shape");
    if (dev_ && !is_view_op(n.op) && !(dk_.back() && dk_.back()->backward))
      host_nodes_.push_back(n.name + " (" + n.op + ", backward)");
  }
  if (dev_) {
    tk_ = dev_->train_kernels();
    WXE_CHECK(tk_ && dev_->kernel("Add"), "device '", opt.device,
              "' cannot train: it lacks the training kernels or Add (engine/exec/backend.h)");
    dconst_.assign(g.values.size(), Tensor());
    dev_owned_.assign(g.values.size(), false);
    for (int p : trainable_) dev_owned_[p] = true;
    for (size_t k = 0; k < g.nodes.size(); ++k)  // buffers a device kernel updates (SpectralNorm's u, v)
      if (dk_[k] && op_updates_inputs(g.nodes[k].op))
        for (int i : g.nodes[k].inputs)
          if (i >= 0 && g.values[i].is_const()) dev_owned_[i] = true;
  }
  if (!opt.keep_forward) {  // the memory plan (autograd.h): what the backward reads, and when
    const size_t nv = g.values.size();
    bw_reads_.assign(nv, false);
    last_fwd_use_.assign(nv, -1);
    first_bw_use_.assign(nv, (int)g.nodes.size());
    for (int o : g.outputs) bw_reads_[o] = true;  // returned to the caller
    // inputs: dropped after their last use as any value (the caller's own handle, if it kept
    // one, keeps it; forward(std::map&&) hands one over)
    for (size_t k = 0; k < g.nodes.size(); ++k) {
      const Node& n = g.nodes[k];
      const BackwardReads r = backward_reads(n.op);
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const int v = n.inputs[i];
        if (v < 0) continue;
        last_fwd_use_[v] = (int)k;
        if (backward_[k] && r.input(i)) {
          bw_reads_[v] = true;
          first_bw_use_[v] = std::min(first_bw_use_[v], (int)k);
        }
      }
      for (int o : n.outputs)
        if (backward_[k] && r.outputs) {
          bw_reads_[o] = true;
          first_bw_use_[o] = std::min(first_bw_use_[o], (int)k);
        }
    }
    if (!opt.segments.empty()) {  // activation checkpointing
      WXE_CHECK(opt.segments.size() == g.nodes.size(), g.source, ": ", opt.segments.size(), " segment ids for ",
                g.nodes.size(), " nodes");
      int nseg = 0;
      for (int s : opt.segments) nseg = std::max(nseg, s + 1);
      seg_last_.assign(nseg, -1);
      seg_dropped_.assign(nseg, false);
      std::vector<int> seg_first(nseg, (int)g.nodes.size()), producer_seg(nv, -2);  // -2: not produced by a node
      for (size_t k = 0; k < g.nodes.size(); ++k) {
        const int s = opt.segments[k];
        for (int o : g.nodes[k].outputs) producer_seg[o] = s;
        if (s < 0) continue;
        WXE_CHECK(!op_updates_inputs(g.nodes[k].op), g.source, ": node ", g.nodes[k].name, " (", g.nodes[k].op,
                  ") updates its inputs and cannot be recomputed");
        seg_first[s] = std::min(seg_first[s], (int)k);
        seg_last_[s] = (int)k;
      }
      inner_of_.assign(nv, -1);
      for (size_t v = 0; v < nv; ++v)
        if (producer_seg[v] >= 0) inner_of_[v] = producer_seg[v];
      for (int o : g.outputs) inner_of_[o] = -1;
      for (size_t k = 0; k < g.nodes.size(); ++k)
        for (int v : g.nodes[k].inputs) {
          if (v < 0) continue;
          const int s = opt.segments[k];
          if (inner_of_[v] >= 0 && inner_of_[v] != s) inner_of_[v] = -1;  // read outside its segment
        }
      seg_inner_.assign(nseg, {});
      for (size_t v = 0; v < nv; ++v)
        if (inner_of_[v] >= 0) seg_inner_[inner_of_[v]].push_back((int)v);
      // a segment's inputs from outside stay until its recompute and its backward have run
      for (size_t k = 0; k < g.nodes.size(); ++k) {
        const int s = opt.segments[k];
        if (s < 0) continue;
        for (int v : g.nodes[k].inputs)
          if (v >= 0 && inner_of_[v] != s) {
            bw_reads_[v] = true;
            first_bw_use_[v] = std::min(first_bw_use_[v], seg_first[s]);
          }
      }
    }
  }
  for (int p : trainable_) {
    if (!dev_) {
      grads_.push_back(opt.plan_only ? Tensor::counted(DType::F32, g.values[p].shape)
                                     : Tensor::zeros(DType::F32, g.values[p].shape));
      continue;
    }
    grads_.push_back(dev_->empty(DType::F32, g.values[p].shape));
    tk_->fill(grads_.back().data<float>(), grads_.back().numel(), 0.f);
  }
}

bool GradExecutor::backward_reads_output(size_t k) const {
  return bw_reads_.empty() || first_bw_use_[g_.outputs.at(k)] < (int)g_.nodes.size();
}

void GradExecutor::zero_grad() {
  for (Tensor& t : grads_) {
    if (!t.defined()) continue;  // ZeRO-3: gradients are handed over, not kept
    if (dev_)
      tk_->fill(t.data<float>(), t.numel(), 0.f);
    else if (!opt_.plan_only)
      std::memset(t.raw(), 0, t.nbytes());
  }
}

Tensor& GradExecutor::device_param(size_t i) { return dev_param(trainable_.at(i)); }

Tensor& GradExecutor::dev_param(int v) {
  WXE_ASSERT(dev_);
  if (!dconst_[v].defined()) dconst_[v] = dev_->upload(*g_.values[v].constant);
  return dconst_[v];
}

void GradExecutor::params_to_host() {
  if (!dev_) return;
  for (size_t v = 0; v < dconst_.size(); ++v)
    if (dev_owned_[v] && dconst_[v].defined() && dconst_[v].nbytes())
      dev_->copy_to_host(g_.values[v].constant->raw(), dconst_[v].raw(), dconst_[v].nbytes());
}

void GradExecutor::reload_constants() {
  if (dev_) dconst_.assign(g_.values.size(), Tensor());
}

void GradExecutor::backward(const std::vector<Tensor>& grad_outputs) {
  std::vector<Tensor> copies;
  for (const Tensor& t : grad_outputs) copies.push_back(t.defined() ? t.clone() : Tensor());
  backward(std::move(copies));
}

void GradExecutor::backward(std::vector<Tensor>&& grad_outputs) {
  if (dev_) return backward_device(grad_outputs);
  WXE_CHECK(grad_outputs.size() == g_.outputs.size(), "backward: ", grad_outputs.size(), " output gradients for ",
            g_.outputs.size(), " outputs");
  WXE_CHECK(!vals_.empty(), "backward without a forward");
  // outputs no backward kernel reads: the caller has them (the trainer drops its copy, or wrote
  // the loss gradient over it); released first, so such a gradient is taken without a copy
  if (!bw_reads_.empty())
    for (int o : g_.outputs)
      if (first_bw_use_[o] == (int)g_.nodes.size()) release(o, true);
  std::vector<Tensor> grad(g_.values.size());  // dL/dv, defined once something flowed into v
  auto add_grad = [&](int v, Tensor t) {
    if (!grad[v].defined()) {
      grad[v] = std::move(t);
    } else {
      accumulate_grad(grad[v], std::move(t), opt_.plan_only);
    }
  };
  for (size_t k = 0; k < g_.outputs.size(); ++k) {
    const Tensor& go = grad_outputs[k];
    if (!go.defined() || !needs_grad_[g_.outputs[k]]) continue;
    const Value& v = g_.values[g_.outputs[k]];
    WXE_CHECK(go.shape == v.shape && go.dtype == DType::F32, "backward: gradient of output '", v.name, "' is ",
              shape_str(go.shape), ", expected float32 ", shape_str(v.shape));
    // the backward accumulates into it: a tensor someone else still holds is copied
    add_grad(g_.outputs[k], go.storage.use_count() == 1 ? std::move(grad_outputs[k]) : go.clone());
  }
  // ZeRO-3: the gradients complete after position `pos` handed over, the modules read last there evicted
  auto settle = [&](size_t pos) {
    if (grads_at_.empty()) return;
    for (size_t p : grads_at_[pos]) res_.grad_done(p, std::move(grad[trainable_[p]]));
    for (int m : evict_at_[pos])
      if (whole_[m]) evict_module(m);
  };
  std::vector<const Tensor*> in, out, gout;
  std::vector<Tensor*> gin;
  in_backward_ = true;
  struct Phase {
    bool& b;
    ~Phase() { b = false; }
  } phase{in_backward_};
  for (size_t k = g_.nodes.size(); k-- > 0;) {
    if (k + 1 < g_.nodes.size()) settle(k + 1);
    if (!seg_last_.empty() && opt_.segments[k] >= 0 && seg_dropped_[opt_.segments[k]]) recompute(opt_.segments[k]);
    if (!backward_[k]) continue;
    const Node& n = g_.nodes[k];
    need_params(k, true);
    bool any_out = std::any_of(n.outputs.begin(), n.outputs.end(), [&](int o) { return grad[o].defined(); });
    if (!any_out) continue;
    auto t0 = std::chrono::steady_clock::now();
    if (is_view_op(n.op)) {  // the gradient, reshaped (its storage moves on: nothing else holds it)
      const int x = n.inputs[0], o = n.outputs[0];
      Tensor t = grad[o].reshaped(g_.values[x].shape);
      grad[o] = Tensor();
      if (needs_grad_[x]) add_grad(x, std::move(t));
      release_read_by(k);
      continue;
    }
    in.clear();
    out.clear();
    gout.clear();
    gin.clear();
    std::vector<Tensor> gi(n.inputs.size());
    const uint32_t pass = grad[n.outputs[0]].defined() ? passthrough_[k] : 0u;
    uint32_t acc = 0;  // inputs whose gradient so far the kernel adds to (ops.h gradient_accumulation)
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      in.push_back(v < 0 ? nullptr : &vals_[v]);
      bool want = v >= 0 && needs_grad_[v];
      if (want && i < 32 && (pass >> i & 1u) && g_.values[v].shape == g_.values[n.outputs[0]].shape) {
        gi[i] = grad[n.outputs[0]];  // the output's gradient itself (ops.h gradient_passthrough)
        want = false;
      } else if (want && i < 32 && (accumulation_[k] >> i & 1u) && grad[v].defined() &&
                 grad[v].storage.use_count() == 1 && std::count(n.inputs.begin(), n.inputs.end(), v) == 1 &&
                 std::find(n.outputs.begin(), n.outputs.end(), v) == n.outputs.end()) {
        acc |= 1u << i;  // held by nothing else: the kernel adds into it
        gin.push_back(&grad[v]);
        continue;
      } else if (want) {
        gi[i] = opt_.plan_only ? Tensor::counted(DType::F32, g_.values[v].shape) : Tensor(DType::F32, g_.values[v].shape);
      }
      gin.push_back(want ? &gi[i] : nullptr);
    }
    for (int o : n.outputs) {
      out.push_back(&vals_[o]);
      gout.push_back(grad[o].defined() ? &grad[o] : nullptr);
    }
    try {
      set_backward_accumulates(acc);
      if (!opt_.plan_only) backward_[k](n, in, out, gout, gin);
      set_backward_accumulates(0);
    } catch (const Error& e) {
      set_backward_accumulates(0);
      throw Error(g_.source + ": backward of node " + n.name + " (" + n.op + "): " + e.what());
    }
    for (int o : n.outputs) grad[o] = Tensor();  // consumed (a passed-through gradient lives on in gi)
    release_read_by(k);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (gi[i].defined()) add_grad(n.inputs[i], std::move(gi[i]));
    if (opt_.profile) {
      auto& p = profile_[n.op + " (backward)"];
      const double ms = ms_since(t0);
      p.ms += ms;
      ++p.calls;
      add_node_ms(g_.nodes.size() + k, ms);
    }
  }
  settle(0);
  settle(g_.nodes.size());
  evict_params();
  for (size_t p = 0; p < trainable_.size(); ++p)
    if (grad[trainable_[p]].defined() && !opt_.plan_only) accumulate(grads_[p], grad[trainable_[p]]);
  vals_.clear();
}

void GradExecutor::set_param_residency(ParamResidency r) {
  WXE_CHECK(!dev_ && !opt_.plan_only && !bw_reads_.empty(), "sharded parameters: on the CPU's training executor only");
  res_ = std::move(r);
  const size_t nv = g_.values.size(), nn = g_.nodes.size(), nm = res_.modules.size();
  mod_of_.assign(nv, -1);
  std::vector<int> index(nv, -1);  // per value: its trainable index
  for (size_t m = 0; m < nm; ++m)
    for (size_t p : res_.modules[m]) mod_of_[trainable_[p]] = (int)m;
  for (size_t p = 0; p < trainable_.size(); ++p) index[trainable_[p]] = (int)p;
  whole_.assign(nm, false);
  mod_fwd_last_.assign(nm, -1);
  mod_bw_last_.assign(nm, (int)nn);
  std::vector<int> grad_pos(trainable_.size(), (int)nn);
  for (size_t k = 0; k < nn; ++k) {
    const Node& n = g_.nodes[k];
    const BackwardReads reads = backward_reads(n.op);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int v = n.inputs[i];
      if (v < 0 || index[v] < 0) continue;
      if (backward_[k]) grad_pos[index[v]] = std::min(grad_pos[index[v]], (int)k);
      const int m = mod_of_[v];
      if (m < 0) continue;
      mod_fwd_last_[m] = (int)k;
      if (backward_[k] && reads.input(i)) mod_bw_last_[m] = std::min(mod_bw_last_[m], (int)k);
      if (!seg_last_.empty() && opt_.segments[k] >= 0)  // read again by the segment's recompute
        mod_bw_last_[m] = std::min(mod_bw_last_[m], seg_last_[opt_.segments[k]]);
    }
  }
  keep_mod_ = -1;
  for (size_t m = 0; m < nm; ++m)
    if (mod_bw_last_[m] < (int)nn && (keep_mod_ < 0 || mod_fwd_last_[m] > mod_fwd_last_[keep_mod_])) keep_mod_ = (int)m;
  // fetch orders: by first forward reader; by the first backward position that needs the module
  std::vector<int> fwd_first(nm, (int)nn), bw_first(nm, -1);
  for (size_t k = 0; k < nn; ++k) {
    const BackwardReads reads = backward_reads(g_.nodes[k].op);
    for (size_t i = 0; i < g_.nodes[k].inputs.size(); ++i) {
      const int v = g_.nodes[k].inputs[i];
      if (v < 0 || mod_of_[v] < 0) continue;
      const int m = mod_of_[v];
      fwd_first[m] = std::min(fwd_first[m], (int)k);
      if (backward_[k] && reads.input(i)) bw_first[m] = std::max(bw_first[m], (int)k);
      if (!seg_last_.empty() && opt_.segments[k] >= 0) bw_first[m] = std::max(bw_first[m], seg_last_[opt_.segments[k]]);
    }
  }
  fwd_order_.resize(nm);
  std::iota(fwd_order_.begin(), fwd_order_.end(), 0);
  bw_order_ = fwd_order_;
  std::stable_sort(fwd_order_.begin(), fwd_order_.end(), [&](int a, int b) { return fwd_first[a] < fwd_first[b]; });
  std::stable_sort(bw_order_.begin(), bw_order_.end(), [&](int a, int b) { return bw_first[a] > bw_first[b]; });
  while (!bw_order_.empty() && bw_first[bw_order_.back()] < 0) bw_order_.pop_back();
  grads_at_.assign(nn + 1, {});
  evict_at_.assign(nn + 1, {});
  for (size_t p = 0; p < trainable_.size(); ++p) grads_at_[grad_pos[p]].push_back(p);
  for (size_t m = 0; m < nm; ++m) evict_at_[mod_bw_last_[m]].push_back((int)m);
  for (Tensor& t : grads_) t = t.shape_only();
}

void GradExecutor::need_params(size_t k, bool backward) {
  if (mod_of_.empty()) return;
  const Node& n = g_.nodes[k];
  const BackwardReads reads = backward_reads(n.op);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const int v = n.inputs[i];
    if (v < 0 || mod_of_[v] < 0 || whole_[mod_of_[v]] || (backward && !reads.input(i))) continue;
    const int m = mod_of_[v];
    res_.fetch(m);
    for (size_t p : res_.modules[m]) vals_[trainable_[p]] = *g_.values[trainable_[p]].constant;
    whole_[m] = true;
    if (!res_.prefetch) continue;
    const std::vector<int>& order = in_backward_ ? bw_order_ : fwd_order_;
    auto it = std::find(order.begin(), order.end(), m);
    while (it != order.end() && (*it == m || whole_[*it])) ++it;
    if (it != order.end()) res_.prefetch(*it);
  }
}

void GradExecutor::evict_module(int m) {
  for (size_t p : res_.modules[m])
    if ((size_t)trainable_[p] < vals_.size()) vals_[trainable_[p]] = vals_[trainable_[p]].shape_only();
  res_.evict(m);
  whole_[m] = false;
}

void GradExecutor::evict_params() {
  for (size_t m = 0; m < whole_.size(); ++m)
    if (whole_[m]) evict_module((int)m);
}

// Activation checkpointing: segment s's nodes run again, in order, restoring its inner values
// (its other outputs are still kept); what no backward reads is released again at its last use.
void GradExecutor::recompute(int s) {
  std::vector<Tensor> discard;
  for (int k = 0; k <= seg_last_[s]; ++k) {
    if (opt_.segments[k] != s) continue;
    const Node& n = g_.nodes[k];
    bool needed = false;
    for (int o : n.outputs) needed = needed || (inner_of_[o] == s && !held(o));
    if (!needed) continue;
    auto t0 = std::chrono::steady_clock::now();
    discard.assign(n.outputs.size(), Tensor());
    need_params(k, false);
    if (is_view_op(n.op))
      alias_view(k);
    else
      run_forward_node(k, &discard);
    if (opt_.profile) {
      auto& p = profile_[n.op + " (recompute)"];
      const double ms = ms_since(t0);
      p.ms += ms;
      ++p.calls;
      add_node_ms(k, ms);
    }
    for (int v : n.inputs)
      if (v >= 0 && inner_of_[v] == s && last_fwd_use_[v] == k) release(v, false);
  }
  seg_dropped_[s] = false;
}

void GradExecutor::add_node_ms(size_t i, double ms) {
  if (node_ms_.empty()) node_ms_.assign(2 * g_.nodes.size(), 0.0);
  node_ms_[i] += ms;
}

// The kept values whose last backward reader node k was.
void GradExecutor::release_read_by(size_t k) {
  if (bw_reads_.empty()) return;
  const Node& n = g_.nodes[k];
  for (int v : n.inputs)
    if (v >= 0 && first_bw_use_[v] == (int)k) release(v, true);
  for (int o : n.outputs)
    if (first_bw_use_[o] == (int)k) release(o, true);
}

// A forward value nothing reads any more (in_backward: no backward kernel still to run; else:
// no forward node still to run, and no backward kernel reads it): its storage goes, its type and
// shape stay (backward kernels read shapes).
void GradExecutor::release(int v, bool in_backward) {
  if ((!in_backward && bw_reads_[v]) || g_.values[v].is_const() || !held(v)) return;
  drop(v);
}

// v's storage goes, on the host and on the device; its dtype and shape stay.
void GradExecutor::drop(int v) {
  const Tensor shape = (vals_[v].defined() ? vals_[v] : dvals_[v]).shape_only();
  vals_[v] = shape;
  if (dev_) dvals_[v] = shape;
}

bool GradExecutor::held(int v) const { return vals_[v].defined() || (dev_ && dvals_[v].defined()); }

// ---------------------------------------------------------------- on a device

namespace {

bool host_input(const BackendKernel* k, size_t i) { return i < 32 && (k->host_inputs >> i & 1); }

}  // namespace

// The value's device copy, made on first use (constants: once per construction/reload); a
// value the memory plan released is its shape only, as on the host.
Tensor& GradExecutor::dev_value(int v) {
  if (!dvals_[v].defined()) {
    const Value& val = g_.values[v];
    if (!val.is_const() && !vals_[v].defined()) return dvals_[v];  // released
    if (val.is_const()) {
      dvals_[v] = dev_param(v);
    } else {
      WXE_ASSERT(vals_[v].defined());
      dvals_[v] = dev_->upload(vals_[v]);
    }
  }
  return dvals_[v];
}

// The value's host copy, made on first use (constants are the graph's own tensors).
Tensor& GradExecutor::host_value(int v) {
  if (!vals_[v].defined()) {
    if (!dev_ || !dvals_[v].defined()) return vals_[v];  // released: its shape only
    vals_[v] = dev_->download(dvals_[v]);
  }
  return vals_[v];
}

// One loop for the CPU and a device backend (dev_): on a device, a node whose kernel the
// backend has runs there (its inputs uploaded on first use), any other on the host (its
// inputs downloaded); view ops alias their input wherever it is.
std::vector<Tensor> GradExecutor::forward(const std::map<std::string, Tensor>& inputs) {
  return forward(std::map<std::string, Tensor>(inputs));
}

std::vector<Tensor> GradExecutor::forward(std::map<std::string, Tensor>&& inputs) {
  set_threads(opt_.threads);
  check_inputs(g_, inputs);
  const size_t nv = g_.values.size();
  vals_.assign(nv, Tensor());
  if (dev_) dvals_.assign(nv, Tensor());
  for (size_t v = 0; v < nv; ++v)
    if (g_.values[v].is_const()) {
      if (dev_ && dev_owned_[v])  // the device copy is the value; host nodes download it
        dvals_[v] = dev_param((int)v);
      else
        vals_[v] = *g_.values[v].constant;  // shares the parameter's storage
    }
  // the caller's inputs, which the kept bytes leave out (views of them too, once they are released)
  std::vector<std::weak_ptr<Storage>> callers;
  for (int id : g_.inputs) {
    vals_[id] = std::move(inputs.at(g_.values[id].name));
    callers.push_back(vals_[id].storage);
  }
  inputs.clear();
  for (size_t k = 0; k < g_.nodes.size(); ++k) {
    const Node& n = g_.nodes[k];
    auto t0 = std::chrono::steady_clock::now();
    need_params(k, false);
    if (is_view_op(n.op)) {
      alias_view(k);
    } else {
      run_forward_node(k);
      if (opt_.profile) {
        auto& p = profile_[n.op];
        const double ms = ms_since(t0);
        p.ms += ms;
        ++p.calls;
        add_node_ms(k, ms);
      }
    }
    if (!bw_reads_.empty()) {  // values no backward reads, at their last forward use (or unread)
      for (int v : n.inputs)
        if (v >= 0 && last_fwd_use_[v] == (int)k) release(v, false);
      for (int o : n.outputs)
        if (last_fwd_use_[o] < 0) release(o, false);
    }
    for (size_t m = 0; m < mod_fwd_last_.size(); ++m)
      if (mod_fwd_last_[m] == (int)k && whole_[m] && (int)m != keep_mod_) evict_module((int)m);
    const int s = seg_last_.empty() ? -1 : opt_.segments[k];
    if (s >= 0 && seg_last_[s] == (int)k) {  // the segment's forward is done: its inner values go
      for (int v : seg_inner_[s])
        if (held(v)) drop(v);
      seg_dropped_[s] = true;
    }
  }
  kept_bytes_ = 0;
  {
    std::set<const void*> seen;  // views share their input's storage
    for (const auto& c : callers)
      if (auto s = c.lock()) seen.insert(s.get());
    for (size_t v = 0; v < nv; ++v)  // values that share a constant's storage (a CopyToTP of a weight)
      if (g_.values[v].is_const() && vals_[v].defined()) seen.insert(vals_[v].storage.get());
    for (size_t v = 0; v < nv; ++v)  // on a device, a value a host kernel made or read can be in both memories
      for (const Tensor* t : {&vals_[v], dev_ ? &dvals_[v] : nullptr})
        if (t && t->defined() && !g_.values[v].is_const() && seen.insert(t->storage.get()).second)
          kept_bytes_ += t->storage->nbytes;
  }
  std::vector<Tensor> result;
  for (int o : g_.outputs) result.push_back(host_value(o));
  if (dev_) dev_->synchronize();
  return result;
}

// A view op's output: an alias of its input, wherever that is.
void GradExecutor::alias_view(size_t k) {
  const int x = g_.nodes[k].inputs[0], o = g_.nodes[k].outputs[0];
  if (dev_ && dvals_[x].defined())
    dvals_[o] = dvals_[x].reshaped(g_.values[o].shape);
  else
    vals_[o] = vals_[x].reshaped(g_.values[o].shape);
}

// Node k's kernel on fresh outputs: the device's where it has one, else the host's. Recomputing
// (discard given): an output still held is made again into discard[j] (same bits) and dropped.
void GradExecutor::run_forward_node(size_t k, std::vector<Tensor>* discard) {
  const Node& n = g_.nodes[k];
  const BackendKernel* dk = dev_ ? dk_[k] : nullptr;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const int v = n.inputs[i];
    in.push_back(v < 0 ? nullptr : dk && !host_input(dk, i) ? &dev_value(v) : &host_value(v));
  }
  for (size_t j = 0; j < n.outputs.size(); ++j) {
    const int o = n.outputs[j];
    const Value& v = g_.values[o];
    Tensor& dst = discard && held(o) ? (*discard)[j] : dk ? dvals_[o] : vals_[o];
    dst = dk ? dev_->empty(v.dtype, v.shape) : opt_.plan_only ? Tensor::counted(v.dtype, v.shape) : Tensor(v.dtype, v.shape);
    out.push_back(&dst);
  }
  if (opt_.plan_only) return;  // the plan: the outputs' sizes, no kernel
  try {
    (dk ? dk->forward : kernels_[k])(n, in, out);
    if (opt_.profile && dk) dev_->synchronize();
  } catch (const Error& e) {
    throw Error(g_.source + (discard ? ": recomputing node " : ": node ") + n.name + " (" + n.op + "): " + e.what());
  }
}

void GradExecutor::backward_device(const std::vector<Tensor>& grad_outputs) {
  WXE_CHECK(grad_outputs.size() == g_.outputs.size(), "backward: ", grad_outputs.size(), " output gradients for ",
            g_.outputs.size(), " outputs");
  WXE_CHECK(!vals_.empty(), "backward without a forward");
  const size_t nv = g_.values.size();
  std::vector<Tensor> hg(nv), dg(nv);  // dL/dv on the host or on the device (at most one defined)
  const BackendKernel* add = dev_->kernel("Add");
  Node add_node;
  add_node.op = "Add";
  add_node.name = "gradient accumulation";
  auto on_dev = [&](int v) -> Tensor& {
    if (!dg[v].defined()) {
      dg[v] = dev_->upload(hg[v]);
      hg[v] = Tensor();
    }
    return dg[v];
  };
  auto on_host = [&](int v) -> Tensor& {
    if (!hg[v].defined()) {
      hg[v] = dev_->download(dg[v]);
      dg[v] = Tensor();
    }
    return hg[v];
  };
  auto add_grad = [&](int v, Tensor t, bool t_on_dev) {
    if (!hg[v].defined() && !dg[v].defined()) {
      (t_on_dev ? dg[v] : hg[v]) = std::move(t);
    } else if (dg[v].defined() && add) {
      Tensor s = dev_->empty(DType::F32, dg[v].shape);
      Tensor td = t_on_dev ? t : dev_->upload(t);
      add->forward(add_node, {&dg[v], &td}, {&s});
      dg[v] = std::move(s);
    } else {
      accumulate(on_host(v), t_on_dev ? dev_->download(t) : t);
    }
  };
  for (size_t k = 0; k < g_.outputs.size(); ++k) {
    const Tensor& go = grad_outputs[k];
    if (!go.defined() || !needs_grad_[g_.outputs[k]]) continue;
    const Value& v = g_.values[g_.outputs[k]];
    WXE_CHECK(go.shape == v.shape && go.dtype == DType::F32, "backward: gradient of output '", v.name, "' is ",
              shape_str(go.shape), ", expected float32 ", shape_str(v.shape));
    add_grad(g_.outputs[k], go.clone(), false);
  }
  if (!bw_reads_.empty())  // outputs no backward kernel reads: the caller has them
    for (int o : g_.outputs)
      if (first_bw_use_[o] == (int)g_.nodes.size()) release(o, true);
  std::vector<const Tensor*> in, out, gout;
  std::vector<Tensor*> gin;
  for (size_t k = g_.nodes.size(); k-- > 0;) {
    if (!seg_last_.empty() && opt_.segments[k] >= 0 && seg_dropped_[opt_.segments[k]]) recompute(opt_.segments[k]);
    if (!backward_[k]) continue;
    const Node& n = g_.nodes[k];
    bool any_out = std::any_of(n.outputs.begin(), n.outputs.end(),
                               [&](int o) { return hg[o].defined() || dg[o].defined(); });
    if (!any_out) continue;
    auto t0 = std::chrono::steady_clock::now();
    if (is_view_op(n.op)) {  // the gradient, reshaped, wherever it is
      const int x = n.inputs[0], o = n.outputs[0];
      const bool d = dg[o].defined();
      Tensor t = (d ? dg[o] : hg[o]).reshaped(g_.values[x].shape);
      dg[o] = hg[o] = Tensor();
      if (needs_grad_[x]) add_grad(x, std::move(t), d);
      release_read_by(k);
      continue;
    }
    // A device backward kernel that refuses a case ("no <device> backward for ...") hands the
    // node to the host for the rest of the run.
    const BackendKernel* dk = nullptr;
    std::vector<Tensor> gi(n.inputs.size());
    for (bool retry = true; retry;) {
      retry = false;
      dk = dk_[k] && dk_[k]->backward && !bw_on_host_[k] ? dk_[k] : nullptr;
      in.clear();
      out.clear();
      gout.clear();
      gin.clear();
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const int v = n.inputs[i];
        const bool host = !dk || host_input(dk, i);
        in.push_back(v < 0 ? nullptr : host ? &host_value(v) : &dev_value(v));
        const bool want = v >= 0 && needs_grad_[v];
        gi[i] = !want ? Tensor()
                : dk  ? dev_->empty(DType::F32, g_.values[v].shape)
                      : Tensor(DType::F32, g_.values[v].shape);
        gin.push_back(want ? &gi[i] : nullptr);
      }
      for (int o : n.outputs) {
        out.push_back(dk ? &dev_value(o) : &host_value(o));
        const bool has = hg[o].defined() || dg[o].defined();
        gout.push_back(!has ? nullptr : dk ? &on_dev(o) : &on_host(o));
      }
      try {
        (dk ? dk->backward : backward_[k])(n, in, out, gout, gin);
        if (opt_.profile && dk) dev_->synchronize();
      } catch (const Error& e) {
        const std::string what = e.what();
        if (dk && what.find(std::string("no ") + dev_->name() + " backward") != std::string::npos) {
          bw_on_host_[k] = true;
          host_nodes_.push_back(n.name + " (" + n.op + ", backward: " + what + ")");
          retry = true;
          continue;
        }
        throw Error(g_.source + ": backward of node " + n.name + " (" + n.op + "): " + what);
      }
    }
    for (int o : n.outputs) hg[o] = dg[o] = Tensor();  // consumed
    release_read_by(k);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (gin[i]) add_grad(n.inputs[i], std::move(gi[i]), dk != nullptr);
    if (opt_.profile) {
      auto& p = profile_[n.op + " (backward)"];
      const double ms = ms_since(t0);
      p.ms += ms;
      ++p.calls;
      add_node_ms(g_.nodes.size() + k, ms);
    }
  }
  for (size_t p = 0; p < trainable_.size(); ++p) {
    const int v = trainable_[p];
    if (!hg[v].defined() && !dg[v].defined()) continue;
    Tensor s = dev_->empty(DType::F32, grads_[p].shape);
    add->forward(add_node, {&grads_[p], &on_dev(v)}, {&s});
    grads_[p] = std::move(s);
  }
  dev_->synchronize();
  vals_.clear();
  dvals_.clear();
}

}  // namespace wxe
