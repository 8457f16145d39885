#include "engine/exec/executor.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "engine/passes/fuse.h"

namespace wxe {

void set_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

bool is_view_op(const std::string& op) {
  return op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten" ||
         op == "Identity";
}

namespace {

bool view_op(const std::string& op) { return is_view_op(op); }

}  // namespace

std::map<std::string, int> ops_without_kernels(const Graph& g, Backend& b, Precision precision) {
  Graph prepared = g;
  b.prepare(prepared, precision);
  std::map<std::string, int> missing;
  for (const Node& n : prepared.nodes)
    if (!view_op(n.op) && !b.kernel(n.op)) ++missing[n.op];
  return missing;
}

Executor::Executor(const Graph& graph, ExecOptions opt) : g_(&graph), opt_(opt) {
  if (opt.device != "cpu") {
    dev_ = &backend_for(opt.device);
    own_ = graph;
    if (opt.optimize) dev_->prepare(own_, opt.precision);
    g_ = &own_;
    const Graph& g = *g_;
    dev_const_.resize(g.values.size());
    for (const Node& n : g.nodes) {
      const bool view = view_op(n.op);
      const BackendKernel* k = view ? nullptr : dev_->kernel(n.op);
      WXE_CHECK(view || k, g.source, ": node ", n.name, " (", n.op, "): no ", dev_->name(),
                " kernel for op ", n.op);
      kernels_.push_back(k ? k->forward : nullptr);
      host_inputs_.push_back(k ? k->host_inputs : 0);
      is_view_.push_back(view);
      for (int o : n.outputs)
        WXE_CHECK(g.values[o].shape_known, g.source, ": value '", g.values[o].name,
                  "' has no static shape; run the passes first");
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const int v = n.inputs[i];
        const bool host = i < 32 && (host_inputs_.back() >> i & 1);
        if (v >= 0 && !host && g.values[v].is_const() && !dev_const_[v].defined())
          dev_const_[v] = dev_->upload(*g.values[v].constant);
      }
    }
    plan_memory();
    return;
  }
  if (opt.optimize && opt.kernels == KernelKind::Fast) {
    own_ = graph;
    optimize_for_cpu(own_, opt.precision);
    g_ = &own_;
  }
  const Graph& g = *g_;
  for (const Node& n : g.nodes) {
    kernels_.push_back(kernel_for(n.op, opt.kernels));
    is_view_.push_back(view_op(n.op));
    for (int o : n.outputs)
      WXE_CHECK(g.values[o].shape_known, g.source, ": value '", g.values[o].name,
                "' has no static shape; run the passes first");
  }
  plan_memory();
}

void Executor::plan_memory() {
  const Graph& g = *g_;
  const size_t nv = g.values.size();
  // root of each value's storage: view outputs share their input's
  std::vector<int> root(nv), def(nv, -1), end(nv, -1);
  for (size_t v = 0; v < nv; ++v) root[v] = (int)v;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    for (int o : n.outputs) {
      if (is_view_[k]) root[o] = root[n.inputs[0]];
      def[o] = (int)k;
      end[root[o]] = std::max(end[root[o]], (int)k);  // a value nobody reads lives at its node
    }
    for (int i : n.inputs)
      if (i >= 0) end[root[i]] = std::max(end[root[i]], (int)k);
  }
  std::vector<bool> fresh(nv, false);  // graph outputs and their roots: new storage every run
  for (int o : g.outputs) fresh[root[o]] = true;
  std::vector<int> order;  // planned roots
  for (size_t v = 0; v < nv; ++v)
    if (root[v] == (int)v && def[v] >= 0 && !is_view_[def[v]] && !fresh[v]) order.push_back((int)v);
  std::vector<Lifetime> life;  // pack_lifetimes rounds each to 64 bytes
  for (int v : order) life.push_back({tensor_bytes(g.values[v].dtype, g.values[v].shape), def[v], end[v]});
  const std::vector<size_t> at = pack_lifetimes(life, &arena_bytes_);
  offset_.assign(nv, -1);
  for (size_t i = 0; i < order.size(); ++i) offset_[order[i]] = (int64_t)at[i];
  for (size_t v = 0; v < nv; ++v)
    if (root[v] != (int)v && offset_[root[v]] >= 0) offset_[v] = offset_[root[v]];
}

Executor::~Executor() = default;

void check_inputs(const Graph& g, const std::map<std::string, Tensor>& inputs) {
  for (int id : g.inputs) {
    const Value& v = g.values[id];
    auto it = inputs.find(v.name);
    WXE_CHECK(it != inputs.end(), "no tensor given for input '", v.name, "'");
    WXE_CHECK(it->second.dtype == v.dtype && it->second.shape == v.shape, "input '", v.name, "' expects ",
              dtype_name(v.dtype), " ", shape_str(v.shape), ", got ", dtype_name(it->second.dtype), " ",
              shape_str(it->second.shape));
  }
}

std::vector<Tensor> Executor::run(const std::map<std::string, Tensor>& inputs) {
  // one loop for the CPU and for a device backend (dev_): on a device, constants and inputs
  // live in device memory, kernels that read an input on the host get a downloaded copy
  set_threads(opt_.threads);
  const Graph& g = *g_;
  std::vector<Tensor> vals(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].is_const()) vals[v] = dev_ && dev_const_[v].defined() ? dev_const_[v] : *g.values[v].constant;
  check_inputs(g, inputs);
  for (int id : g.inputs) {
    const Tensor& t = inputs.at(g.values[id].name);
    vals[id] = dev_ ? dev_->upload(t) : t;
  }
  auto allocate = [&](size_t nbytes) { return dev_ ? dev_->allocate(nbytes) : std::make_shared<Storage>(nbytes); };
  if (!arena_ && arena_bytes_) arena_ = allocate(arena_bytes_);
  peak_bytes_ = arena_bytes_;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  std::vector<Tensor> host_in;  // inputs a device kernel reads on the host, for the current node
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    in.clear();
    out.clear();
    host_in.assign(n.inputs.size(), Tensor());
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int v = n.inputs[i];
      if (v < 0) {
        in.push_back(nullptr);
      } else if (dev_ && i < 32 && (host_inputs_[k] >> i & 1)) {
        host_in[i] = g.values[v].is_const() ? *g.values[v].constant : dev_->download(vals[v]);
        in.push_back(&host_in[i]);
      } else {
        in.push_back(&vals[v]);
      }
    }
    auto t0 = std::chrono::steady_clock::now();
    if (is_view_[k]) {
      vals[n.outputs[0]] = in[0]->reshaped(g.values[n.outputs[0]].shape);
    } else {
      for (int o : n.outputs) {
        const Value& v = g.values[o];
        Tensor t;
        t.dtype = v.dtype;
        t.shape = v.shape;
        if (offset_[o] >= 0) {
          t.storage = arena_;
          t.offset = (size_t)offset_[o];
        } else {  // a graph output: the caller keeps it
          t.storage = allocate(t.nbytes());
          peak_bytes_ += t.nbytes();
        }
        vals[o] = std::move(t);
        out.push_back(&vals[o]);
      }
      try {
        kernels_[k](n, in, out);
        if (opt_.profile && dev_) dev_->synchronize();
      } catch (const Error& e) {
        throw Error(g.source + ": node " + n.name + " (" + n.op + "): " + e.what());
      }
    }
    if (opt_.profile) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (node_ms_.size() != g.nodes.size()) node_ms_.assign(g.nodes.size(), 0.0);
      node_ms_[k] += ms;
      auto& p = profile_[n.op];
      p.ms += ms;
      ++p.calls;
    }
  }
  std::vector<Tensor> result;
  for (int o : g.outputs) result.push_back(dev_ ? dev_->download(vals[o]) : vals[o]);
  if (dev_) dev_->synchronize();
  return result;
}

std::string slowest_nodes(const Graph& g, const std::vector<double>& ms, const std::vector<double>& warm, int runs,
                          int top) {
  const size_t n = g.nodes.size();
  std::vector<std::pair<double, size_t>> t;
  for (size_t i = 0; i < ms.size(); ++i) t.push_back({(ms[i] - (i < warm.size() ? warm[i] : 0.0)) / std::max(runs, 1), i});
  std::sort(t.rbegin(), t.rend());
  std::string r = str("the ", std::min<size_t>(top, t.size()), " slowest nodes (ms per run)\n");
  for (size_t i = 0; i < t.size() && (int)i < top; ++i) {
    char head[48];
    std::snprintf(head, sizeof head, "%9.2f  %s", t[i].first, t[i].second >= n ? "(backward) " : "");
    r += head + node_signature(g, g.nodes[t[i].second % n]) + "\n";
  }
  return r;
}

std::string cpu_paths_report(const Graph& g) {
  const CpuKernelInfo& cpu = cpu_kernel_info();
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::string r = str("cpu: oneDNN ISA ", cpu.isa, cap ? str(" (ONEDNN_MAX_CPU_ISA=", cap, ")") : std::string(), "\n");
  for (const std::string& line : cpu.paths) r += "  " + line + "\n";
  if (!cpu.path_of) return r;
  std::vector<std::pair<std::string, int>> classes;  // "op class: path", count; in graph order
  for (const Node& n : g.nodes) {
    if (n.op != "Conv" && n.op != "ConvTranspose" && n.op != "ConvChannelsLast" && n.op != "Linear") continue;
    std::vector<Shape> in;
    bool known = true;
    for (int v : n.inputs) {
      in.push_back(v >= 0 ? g.values[v].shape : Shape{});
      for (int64_t d : in.back()) known = known && d > 0;
    }
    if (!known || in.size() < 2) continue;
    std::string cls = n.op;
    if (n.op != "Linear") {
      cls += " k" + shape_str(Shape(in[1].begin() + 2, in[1].end()));
      if (n.attrs.count("strides")) cls += " s" + shape_str(n.ints("strides"));
      if (n.i("group", 1) != 1) cls += str(" g", n.i("group", 1));
    }
    std::string path;
    try {
      path = cpu.path_of(n, in);
    } catch (const Error&) {
      continue;
    }
    const std::string key = cls + ": " + path;
    auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) { return c.first == key; });
    if (it == classes.end())
      classes.push_back({key, 1});
    else
      ++it->second;
  }
  if (!classes.empty()) r += "kernel paths (nodes: op, kernel, strides: path)\n";
  for (const auto& [key, count] : classes) {
    char c[16];
    std::snprintf(c, sizeof c, "%5d  ", count);
    r += c + key + "\n";
  }
  return r;
}

Precision cpu_precision(Precision asked, std::string* why) {
  if (asked != Precision::BF16 || cpu_kernel_info().native_bf16) return asked;
  *why = str("precision bf16: this CPU has no native bfloat16 products (oneDNN ISA ", cpu_kernel_info().isa,
             "; they need avx512_bf16 or AMX): running float32");
  return Precision::F32;
}

}  // namespace wxe
