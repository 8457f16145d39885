#include "engine/executor.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

namespace wxe {

void set_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

namespace {

bool view_op(const std::string& op) {
  return op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten" ||
         op == "Identity";
}

// Free storages by size; a request takes the smallest one that fits without wasting more
// than half of it.
class BufferPool {
 public:
  std::shared_ptr<Storage> get(size_t bytes) {
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes + 4096) {
      auto s = it->second;
      free_.erase(it);
      return s;
    }
    return std::make_shared<Storage>(bytes);
  }
  void put(std::shared_ptr<Storage> s) { free_.emplace(s->nbytes, std::move(s)); }

 private:
  std::multimap<size_t, std::shared_ptr<Storage>> free_;
};

}  // namespace

Executor::Executor(const Graph& g, ExecOptions opt) : g_(g), opt_(opt) {
  std::vector<int> last(g.values.size(), -1);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    kernels_.push_back(kernel_for(n.op, opt.kernels));
    is_view_.push_back(view_op(n.op));
    for (int i : n.inputs)
      if (i >= 0) last[i] = (int)k;
    for (int o : n.outputs) {
      WXE_CHECK(g.values[o].shape_known, g.source, ": value '", g.values[o].name,
                "' has no static shape; run the passes first");
      if (last[o] < 0) last[o] = (int)k;  // never read: free right after it is made
    }
  }
  frees_.resize(g.nodes.size());
  for (int o : g.outputs) last[o] = -1;  // outputs stay alive
  std::vector<int> prod = g.producers();
  for (size_t v = 0; v < g.values.size(); ++v)
    if (last[v] >= 0 && (prod[v] >= 0 || !g.values[v].is_const())) frees_[last[v]].push_back((int)v);
}

std::vector<Tensor> Executor::run(const std::map<std::string, Tensor>& inputs) {
  set_threads(opt_.threads);
  std::vector<Tensor> vals(g_.values.size());
  for (size_t v = 0; v < g_.values.size(); ++v)
    if (g_.values[v].is_const()) vals[v] = *g_.values[v].constant;
  for (int id : g_.inputs) {
    const Value& v = g_.values[id];
    auto it = inputs.find(v.name);
    WXE_CHECK(it != inputs.end(), "no tensor given for input '", v.name, "'");
    WXE_CHECK(it->second.dtype == v.dtype && it->second.shape == v.shape, "input '", v.name,
              "' expects ", dtype_name(v.dtype), " ", shape_str(v.shape), ", got ",
              dtype_name(it->second.dtype), " ", shape_str(it->second.shape));
    vals[id] = it->second;
  }
  BufferPool pool;
  size_t live_bytes = 0;
  peak_bytes_ = 0;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  for (size_t k = 0; k < g_.nodes.size(); ++k) {
    const Node& n = g_.nodes[k];
    in.clear();
    out.clear();
    for (int i : n.inputs) in.push_back(i < 0 ? nullptr : &vals[i]);
    auto t0 = std::chrono::steady_clock::now();
    if (is_view_[k]) {
      const Value& o = g_.values[n.outputs[0]];
      vals[n.outputs[0]] = in[0]->reshaped(o.shape);
    } else {
      for (int o : n.outputs) {
        const Value& v = g_.values[o];
        Tensor t;
        t.dtype = v.dtype;
        t.shape = v.shape;
        t.storage = pool.get(t.nbytes());
        live_bytes += t.storage->nbytes;
        vals[o] = std::move(t);
        out.push_back(&vals[o]);
      }
      peak_bytes_ = std::max(peak_bytes_, live_bytes);
      try {
        kernels_[k](n, in, out);
      } catch (const Error& e) {
        throw Error(g_.source + ": node " + n.name + " (" + n.op + "): " + e.what());
      }
    }
    if (opt_.profile) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      auto& p = profile_[n.op];
      p.ms += ms;
      ++p.calls;
    }
    for (int v : frees_[k]) {
      std::shared_ptr<Storage> s = std::move(vals[v].storage);
      vals[v] = Tensor();
      // the last tensor on a storage gives it back (views share storage with their source)
      if (s && s.use_count() == 1 && !std::count(g_.inputs.begin(), g_.inputs.end(), v)) {
        live_bytes -= s->nbytes;
        pool.put(std::move(s));
      }
    }
  }
  std::vector<Tensor> result;
  for (int o : g_.outputs) result.push_back(vals[o]);
  return result;
}

}  // namespace wxe
