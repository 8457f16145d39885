// wxe command line: inspect and run CREDIT wxformer-style ONNX models.
// Layer: the top (tools/): options, progress and exit codes; the work is the library's (load/,
// train/, forecast/) over parallel/, importers/, data/ and engine/.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "engine/exec/executor.h"
#include "engine/passes/layout_rules.h"
#include "engine/io/safetensors.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "importers/torch/torch_checkpoint.h"
#include "models/credit_modules.h"
#include "parallel/mesh.h"
#include "parallel/mesh_session.h"
#include "parallel/shard.h"
#include "parallel/sharded_checkpoint.h"
#include "train/credit_checkpoint.h"
#include "train/finetune.h"
#include "forecast/forecast.h"
#include "forecast/plot.h"
#include "forecast/score.h"
#include "train/from_config.h"
#include "train/loss_plot.h"
#include "train/plan.h"
#include "load/model.h"

using namespace wxe;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "NAME=path" or "path" (the graph's only input).
std::map<std::string, Tensor> read_inputs(const Graph& g, const std::vector<std::string>& args) {
  std::map<std::string, Tensor> r;
  for (const std::string& a : args) {
    size_t eq = a.find('=');
    std::string name, path = a;
    // NAME=path when NAME is an input of the model, or when the whole argument is no file
    // (then NAME is a typo, reported below); a path that merely contains '=' is a path
    if (eq != std::string::npos && (g.find_value(a.substr(0, eq)) >= 0 || !std::filesystem::exists(a))) {
      name = a.substr(0, eq);
      path = a.substr(eq + 1);
    } else {
      WXE_CHECK(g.inputs.size() == 1, g.source, ": the model has ", g.inputs.size(),
                " inputs; name each one: --input NAME=FILE.npy");
      name = g.values[g.inputs[0]].name;
    }
    int id = g.find_value(name);
    WXE_CHECK(id >= 0 && std::count(g.inputs.begin(), g.inputs.end(), id), g.source,
              ": the model has no input named '", name, "'");
    Tensor t = read_npy(path);
    const Value& v = g.values[id];
    WXE_CHECK(t.dtype == v.dtype, path, ": dtype ", dtype_name(t.dtype), ", but input '", name,
              "' expects ", dtype_name(v.dtype));
    r[name] = std::move(t);
  }
  for (int id : g.inputs)
    WXE_CHECK(r.count(g.values[id].name), "no tensor given for input '", g.values[id].name,
              "' (--input ", g.values[id].name, "=FILE.npy)");
  return r;
}

std::map<std::string, InputSpec> specs_of(const std::map<std::string, Tensor>& in) {
  std::map<std::string, InputSpec> s;
  for (auto& kv : in) s[kv.first] = {kv.second.dtype, kv.second.shape};
  return s;
}

Graph import_model(const std::string& model) {
  auto t0 = std::chrono::steady_clock::now();
  Graph g = import_onnx(model);
  note("wxe: imported %s: %zu nodes (%.2f s)\n", model.c_str(), g.nodes.size(), seconds_since(t0));
  return g;
}

// Binds the inputs and runs the passes (load/model.h), loading `weights_path` if given;
// `slices_of`, given the prepared graph, says which parts of each weight this rank reads.
// A static-batch export given another batch is prepared at its own batch (returned; 0 when the
// inputs fit as they are) and run with run_any_batch.
int64_t simplify_model(Graph& g, const std::map<std::string, Tensor>& inputs, const std::string& weights_path,
                       const SlicesOf& slices_of = nullptr) {
  auto t1 = std::chrono::steady_clock::now();
  LoadOptions opt;
  opt.weights = weights_path;
  opt.slices_of = slices_of;
  const int64_t batch = traced_batch(g, inputs);
  if (batch)
    note("wxe: %s was exported with batch %lld; running the %lld rows in runs of %lld\n", g.source.c_str(),
         (long long)batch, (long long)inputs.begin()->second.shape[0], (long long)batch);
  prepare_model(g, specs_at_batch(inputs, batch), opt);
  note("wxe: simplified to %zu nodes (%.2f s)\n", g.nodes.size(), seconds_since(t1));
  return batch;
}

struct Stats {
  double min = INFINITY, max = -INFINITY, mean = 0, std = 0;
  int64_t nonfinite = 0;
};

Stats stats_of(const Tensor& t) {
  Tensor f = t.to_f32();
  Stats s;
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < f.numel(); ++i) {
    double v = f.data<float>()[i];
    if (!std::isfinite(v)) {
      ++s.nonfinite;
      continue;
    }
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    sum += v;
    sq += v * v;
    ++n;
  }
  if (n) {
    s.mean = sum / n;
    s.std = std::sqrt(std::max(0.0, sq / n - s.mean * s.mean));
  }
  return s;
}


void count_params(const Graph& g, int64_t& count, size_t& bytes, bool only_params) {
  count = 0;
  bytes = 0;
  std::vector<int> uses = g.use_counts();
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    if (!x.is_const() || !uses[v] || (only_params && !x.is_param)) continue;
    if (x.dtype != DType::F32 && x.dtype != DType::F16 && x.dtype != DType::BF16) continue;
    count += x.constant->numel();
    bytes += x.constant->nbytes();
  }
}


void print_plan(const Graph& full, const std::string& plan_file, int tp) {
  TpPlan plan = plan_for(full, plan_file, tp);
  Graph g = full;
  ShardStats st = shard_graph(g, plan, tp, 0);
  std::map<std::string, Shape> shapes;
  for (auto& [name, t] : graph_parameters(g)) shapes[name] = t.shape;
  std::printf("\ntensor-parallel plan, tp %d (%d column-parallel, %d row-parallel, %d all-reduces per forward):\n",
              tp, st.column, st.row, st.all_reduces);
  for (auto& [name, t] : graph_parameters(full)) {
    auto it = plan.by_weight.find(name);
    if (it == plan.by_weight.end() || it->second == TpSplit::Replicate) continue;
    std::printf("  %-9s %-52s %s -> %s per rank\n", split_name(it->second), name.c_str(), shape_str(t.shape).c_str(),
                shape_str(shapes[name]).c_str());
  }
  std::printf("parameters per rank: %s of %s unsharded (%.1f%%); everything else replicated\n",
              human_bytes(st.param_bytes_rank).c_str(), human_bytes(st.param_bytes_full).c_str(),
              100.0 * st.param_bytes_rank / std::max<size_t>(st.param_bytes_full, 1));
}

struct PlanArgs {
  std::string model, config, input;
  int ranks = 1, accum = 0;
  double memory = 0;  // GB per rank
  bool train = false, json = false, shard_weights = false;
  std::string plan;
};

// `wxe plan`: the table of train/plan.h, the input shape from --input's header or the config's
// first sample.
int cmd_plan(const PlanArgs& a) {
  WXE_CHECK(a.ranks >= 1, "plan: --ranks must be at least 1 (got ", a.ranks, ")");
  WXE_CHECK(a.memory >= 0 && std::isfinite(a.memory), "plan: --memory must be a positive number of GB (got ", a.memory, ")");
  WXE_CHECK(a.accum >= 0, "plan: --accum must be positive (got ", a.accum, ")");
  WXE_CHECK(std::filesystem::is_regular_file(a.model), a.model, ": no such model file");
  PlanRequest r;
  r.model = a.model;
  r.ranks = a.ranks;
  r.memory = a.memory * 1e9;
  r.train = a.train;
  r.accum = a.accum;
  if (!a.config.empty()) {  // the config's training options and its data's first sample
    WXE_CHECK(a.input.empty(), "plan: give --input or a CONFIG.yml, not both");
    finetune_from_config(a.config, r.cfg, [](const std::string&) { return false; }, false);
    WXE_CHECK(r.cfg.open_data, a.config, ": no data to read the input shape from");
    const Sample s = r.cfg.open_data()->get(0);
    r.dtype = s.input.dtype;
    r.input = s.input.shape;
    if (!a.accum) r.accum = r.cfg.accum > 1 ? r.cfg.accum : 0;
  } else if (!a.input.empty()) {
    const NpyHeader h = read_npy_header(a.input);
    r.dtype = h.dtype;
    r.input = h.shape;
  }
  r.cfg.plan = a.plan;
  if (a.shard_weights) r.cfg.shard_weights = true;  // else the config's trainer.mode
  const Plan p = plan_run(r);
  std::printf("%s", a.json ? plan_json(p, r).c_str() : plan_table(p, r).c_str());
  return 0;
}

int cmd_inspect(const std::string& model, const std::vector<std::string>& inputs, bool dump_graph, int tp, int domain,
                const std::string& plan_file, const std::string& device) {
  Graph g = import_onnx(model);
  std::printf("model %s (opset %d)\n", model.c_str(), g.opset);
  for (int id : g.inputs)
    std::printf("  input  %-10s %s %s\n", g.values[id].name.c_str(), dtype_name(g.values[id].dtype),
                shape_str(g.values[id].shape).c_str());
  std::map<std::string, int> before = op_counts(g);
  int64_t init_count;
  size_t init_bytes;
  count_params(g, init_count, init_bytes, false);
  std::map<std::string, InputSpec> given;
  if (!inputs.empty()) given = specs_of(read_inputs(g, inputs));
  size_t nodes_before = g.nodes.size();
  simplify(g, given);
  for (int id : g.outputs)
    std::printf("  output %-10s %s %s\n", g.values[id].name.c_str(), dtype_name(g.values[id].dtype),
                shape_str(g.values[id].shape).c_str());
  int64_t pc;
  size_t pb;
  count_params(g, pc, pb, true);
  std::printf("initializers: %lld floats (%s)\n", (long long)init_count, human_bytes(init_bytes).c_str());
  std::printf("parameters after passes: %lld (%s); spectral norm folded, constant subgraphs folded\n",
              (long long)pc, human_bytes(pb).c_str());
  std::map<std::string, int> after = op_counts(g);
  std::set<std::string> ops;
  for (auto& kv : before) ops.insert(kv.first);
  for (auto& kv : after) ops.insert(kv.first);
  std::printf("%-24s %8s %8s\n", "op type", "before", "after");
  for (auto& op : ops)
    std::printf("%-24s %8d %8d\n", op.c_str(), before.count(op) ? before[op] : 0,
                after.count(op) ? after[op] : 0);
  std::printf("%-24s %8zu %8zu\n", "total", nodes_before, g.nodes.size());
  {  // the paths the CPU kernels take on the graph prepared for them
    Graph c = g;
    optimize_for_cpu(c);
    std::printf("%s", cpu_paths_report(c).c_str());
  }
  if (tp > 1) print_plan(g, plan_file, tp);
  if (domain > 1) {
    Graph d = g;
    const BandStats st = domain_parallel(d, domain, false);
    if (st.scatters == 0)
      std::printf("\n--domain %d splits nothing: no convolution's rows divide into %d bands\n", domain, domain);
    else
      std::printf("\n%s\n", domain_summary(st, domain, false).c_str());
  }
  if (!device.empty()) {  // the backend's tables, without its device
    Backend* b = find_backend(device);
    WXE_CHECK(b, "this build has no '", device, "' backend (built without it)");
    std::map<std::string, int> missing = ops_without_kernels(g, *b);
    std::string list;
    for (auto& [op, n] : missing) list += str(list.empty() ? "" : ", ", op, " x", n);
    if (missing.empty())
      std::printf("device %s: a kernel for every op\n", device.c_str());
    else
      std::printf("device %s: no kernel for %s (infer --device %s stops at the first)\n", device.c_str(), list.c_str(),
                  device.c_str());
  }
  if (dump_graph) std::printf("\n%s", dump(g).c_str());
  return 0;
}

struct InferArgs {
  std::string model;
  std::vector<std::string> inputs, outputs;
  std::string compare;
  double tolerance = -1;
  int threads = 0, tp = 1, domain = 1;
  bool reference = false;
  std::string weights, plan;
  std::string precision = "fp32";
  std::string device = "cpu";
};

// This dp group's share of dim 0 of every input.
std::map<std::string, Tensor> batch_slice(const std::map<std::string, Tensor>& in, int dp, int dp_rank) {
  std::map<std::string, Tensor> r;
  for (auto& [name, t] : in) {
    WXE_CHECK(t.rank() >= 1 && t.shape[0] % dp == 0, "input '", name, "' has batch ", t.rank() ? t.shape[0] : 0,
              ", which the ", dp, " data-parallel groups cannot split evenly");
    Shape s = t.shape;
    s[0] /= dp;
    Tensor part(t.dtype, s);
    std::memcpy(part.raw(), (const uint8_t*)t.raw() + dp_rank * part.nbytes(), part.nbytes());
    r[name] = std::move(part);
  }
  return r;
}

// "path" for the first output, or NAME=path when NAME is an output of the model (or the
// model has several outputs: then an unknown NAME is an error, not a file name with '=').
std::pair<size_t, std::string> output_target(const Graph& g, const std::string& model, const std::string& o) {
  size_t eq = o.find('=');
  if (eq == std::string::npos) return {0, o};
  std::string name = o.substr(0, eq);
  for (size_t k = 0; k < g.outputs.size(); ++k)
    if (g.values[g.outputs[k]].name == name) return {k, o.substr(eq + 1)};
  WXE_CHECK(g.outputs.size() == 1, model, ": the model has no output named '", name, "'");
  return {0, o};
}

// Before the forward pass: the output folders can be written, the reference can be read.
void check_outputs_writable(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    std::filesystem::path dir = std::filesystem::path(p).parent_path();
    std::string d = dir.empty() ? "." : dir.string();
    WXE_CHECK(!std::filesystem::is_directory(p), p, ": is a directory, not an output file");
    WXE_CHECK(std::filesystem::is_directory(d) && ::access(d.c_str(), W_OK | X_OK) == 0, p,
              ": cannot write here (folder ", d, " is missing or not writable)");
  }
}

// --precision as the kernels will run it: on the cpu, bf16 only where it multiplies bfloat16
// natively (otherwise float32, said in one line).
Precision cpu_or_device_precision(const std::string& precision, const std::string& device) {
  const Precision asked = precision == "bf16" ? Precision::BF16 : Precision::F32;
  if (device != "cpu") return asked;
  std::string why;
  const Precision p = cpu_precision(asked, &why);
  if (!why.empty()) note("wxe: %s\n", why.c_str());
  return p;
}

int cmd_infer(const InferArgs& a, Mesh& mesh) {
  Graph g = import_model(a.model);
  if (mesh.rank == 0) {
    std::vector<std::string> paths;
    for (const std::string& o : a.outputs) paths.push_back(output_target(g, a.model, o).second);
    check_outputs_writable(paths);
    if (!a.compare.empty()) read_npy_header(a.compare);  // exists and is a .npy
  }
  std::map<std::string, Tensor> all_inputs = read_inputs(g, a.inputs);
  std::map<std::string, Tensor> inputs = mesh.dp > 1 ? batch_slice(all_inputs, mesh.dp, mesh.dp_rank) : all_inputs;
  TpSharding sharding(&mesh, a.plan);
  const int64_t batch = simplify_model(g, inputs, a.weights, sharding.slices_of(a.weights));
  if (mesh.tp > 1) {
    ShardStats st = sharding.shard(g);
    note("wxe: tp %d: %d column- and %d row-parallel layers, %d all-reduces per forward\n", mesh.tp, st.column,
         st.row, st.all_reduces);
    // per-rank memory: parameters held and peak RSS, gathered to rank 0
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    Tensor mine = Tensor::from_f32({1, 3}, {(float)st.param_bytes_rank, (float)st.param_bytes_full, ru.ru_maxrss / 1024.f});
    Tensor every(DType::F32, {mesh.world, 3});
    mesh.world_comm->all_gather(mine, every);
    for (int r = 0; r < mesh.world; ++r) {
      const float* e = every.data<float>() + 3 * r;
      note("wxe: rank %d: parameters %s of %s unsharded, peak RSS %.0f MB (after load)\n", r,
           human_bytes(e[0]).c_str(), human_bytes(e[1]).c_str(), e[2]);
    }
  }
  shard_domain(g, &mesh, false);
  ExecOptions opt;
  opt.threads = a.threads;
  opt.kernels = a.reference ? KernelKind::Reference : KernelKind::Fast;
  opt.precision = cpu_or_device_precision(a.precision, a.device);
  opt.device = a.device;
  WXE_CHECK(a.device == "cpu" || !a.reference, "--device ", a.device, " runs without --reference");
  Executor ex(g, opt);
  auto t2 = std::chrono::steady_clock::now();
  std::vector<Tensor> outs = run_any_batch(ex, inputs, batch);
  double run_s = seconds_since(t2);
  if (mesh.dp > 1)  // every dp group's rows, in dp order, to each group's ranks
    for (Tensor& o : outs) {
      Shape s = o.shape;
      s[0] *= mesh.dp;
      Tensor full(o.dtype, s);
      mesh.dp_comm->all_gather(o, full);
      o = std::move(full);
    }
  if (mesh.rank != 0) return 0;
  std::printf("forward: %.1f ms, %s activations at peak%s\n", run_s * 1e3,
              human_bytes(ex.peak_activation_bytes()).c_str(),
              mesh.world > 1 ? str(" (rank 0; dp ", mesh.dp, " x tp ", mesh.tp, " x domain ", mesh.domain, ")").c_str() : "");
  for (const std::string& o : a.outputs) {
    auto [idx, path] = output_target(g, a.model, o);
    write_npy(path, outs[idx]);
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    Stats s = stats_of(outs[k]);
    std::printf("output %s %s: min %.6g max %.6g mean %.6g std %.6g", g.values[g.outputs[k]].name.c_str(),
                shape_str(outs[k].shape).c_str(), s.min, s.max, s.mean, s.std);
    if (s.nonfinite) std::printf(" NON-FINITE %lld", (long long)s.nonfinite);
    std::printf("\n");
  }
  if (!a.compare.empty()) {
    Tensor ref = read_npy(a.compare);
    WXE_CHECK(ref.shape == outs[0].shape, a.compare, ": shape ", shape_str(ref.shape),
              " differs from the output's ", shape_str(outs[0].shape));
    Tensor r = ref.to_f32(), y = outs[0].to_f32();
    double maxd = 0, num = 0, den = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      double d = (double)y.data<float>()[i] - r.data<float>()[i];
      if (!(std::fabs(d) <= maxd)) maxd = std::fabs(d);  // NaN propagates as inf-like
      num += d * d;
      den += (double)r.data<float>()[i] * r.data<float>()[i];
    }
    double rel = std::sqrt(num / std::max(den, 1e-300));
    std::printf("vs %s: max abs diff %.3g, relative L2 %.3g\n", a.compare.c_str(), maxd, rel);
    if (a.tolerance >= 0 && !(maxd <= a.tolerance)) {
      std::fprintf(stderr, "wxe: error: max abs diff %.3g exceeds tolerance %.3g\n", maxd, a.tolerance);
      return 3;
    }
  }
  return 0;
}

struct BenchArgs {
  std::string model;
  std::vector<std::string> inputs;
  int threads = 0, runs = 5;
  bool json = false;
  std::string weights;
  std::string precision = "fp32";
  std::string device = "cpu";
  int nodes = 0;
};

struct ConvertArgs {
  std::string checkpoint, output, onnx, to = "safetensors", like;
  std::vector<std::string> inputs;
  int shard = 0;  // --shard N: a sharded checkpoint of N files
};

int cmd_convert(const ConvertArgs& a) {
  if (a.shard > 0 || (a.to == "safetensors" && is_sharded_checkpoint(a.checkpoint))) {  // parallel/sharded_checkpoint.h
    WXE_CHECK(a.to == "safetensors" && a.onnx.empty() && a.like.empty(),
              "--shard and sharded checkpoints convert between safetensors layouts only (no --to credit, --onnx, --like)");
    std::printf("%s\n", (a.shard > 0 ? safetensors_to_sharded(a.checkpoint, a.output, a.shard)
                                     : sharded_to_safetensors(a.checkpoint, a.output)).c_str());
    return 0;
  }
  if (a.to == "credit") {
    WXE_CHECK(a.onnx.empty(), "--onnx checks a conversion to safetensors; with --to credit use --like");
    std::printf("%s\n", export_credit_checkpoint(a.checkpoint, a.output, a.like).c_str());
    return 0;
  }
  WXE_CHECK(a.like.empty(), "--like is for --to credit");
  layout::ConvertReport rep;
  NamedTensors w = read_weights(a.checkpoint, &rep);
  if (!a.onnx.empty()) {  // check names and shapes against the rewritten graph's parameters
    Graph g = import_onnx(a.onnx);
    std::map<std::string, InputSpec> given;
    if (!a.inputs.empty()) given = specs_of(read_inputs(g, a.inputs));
    prepare_graph(g, given);
    // the same matching as --weights (passes.h match_weights): names the export lost are
    // recovered from the graph's structure
    WeightMatch m = match_weights(g, w);
    const int restored = restore_dropped_biases(g, m);
    int bad = 0, matched = (int)m.matched.size() + restored;
    for (const std::string& d : m.missing) std::printf("mismatch: %s is in the graph, not in the checkpoint\n", d.c_str()), ++bad;
    for (const std::string& d : m.mismatched) std::printf("mismatch: %s (checkpoint vs graph)\n", d.c_str()), ++bad;
    for (const std::string& d : m.ambiguous) std::printf("mismatch: %s\n", d.c_str()), ++bad;
    std::string unused;  // modules the exported graph does not use (e.g. CREDIT's cube_embedding)
    for (const std::string& n : m.unused) unused += (unused.empty() ? "" : ", ") + n;
    std::printf("checked against %s: %d parameters match (%d by graph structure), %d mismatch, %zu checkpoint tensors "
                "not in the graph%s\n",
                a.onnx.c_str(), matched, m.by_structure, bad, m.unused.size(),
                unused.empty() ? "" : (" (" + unused + ")").c_str());
    if (bad) {
      std::fprintf(stderr, "wxe: error: %s: %d tensors do not fit %s; nothing written\n", a.checkpoint.c_str(), bad,
                   a.onnx.c_str());
      return 1;
    }
  }
  write_safetensors(a.output, w, {{"format", "pt"}, {"source", a.checkpoint}, {"converted_by", "wxe convert"}});
  std::printf("wrote %s: %d tensors (%d read), %d spectral-norm layers folded, %d qkv splits, %d 1x1 convs to Linear, %s\n",
              a.output.c_str(), rep.tensors_out, rep.tensors_in, rep.spectral_norm_folded, rep.qkv_split,
              rep.reshaped, human_bytes(rep.bytes_out).c_str());
  return 0;
}

double peak_rss_mb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}

int cmd_bench(const BenchArgs& a) {
  WXE_CHECK(a.runs >= 1, "--runs must be at least 1");
  Graph g = import_model(a.model);
  std::map<std::string, Tensor> inputs = read_inputs(g, a.inputs);
  const int64_t batch = simplify_model(g, inputs, a.weights);
  ExecOptions opt;
  opt.threads = a.threads;
  opt.profile = true;
  opt.precision = cpu_or_device_precision(a.precision, a.device);
  opt.device = a.device;
  // On a device, timing per op waits for each kernel: the timed runs go without it and one
  // more run with it gives the table (per-op times then include the waits).
  const bool device = a.device != "cpu";
  if (device) opt.profile = false;
  Executor ex(g, opt);
  run_any_batch(ex, inputs, batch);  // warm-up: primitive creation, weight reorders, page faults
  std::map<std::string, OpProfile> warm = ex.profile();
  std::vector<double> warm_nodes = ex.node_profile();
  std::vector<double> ms;
  for (int r = 0; r < a.runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run_any_batch(ex, inputs, batch);
    ms.push_back(seconds_since(t0) * 1e3);
    std::fprintf(stderr, "wxe: run %d/%d: %.1f ms\n", r + 1, a.runs, ms.back());
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                    : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  // per op type over the timed runs only (on a device: one synchronized run of its own)
  int prof_runs = a.runs;
  std::unique_ptr<Executor> prof;
  if (device) {
    opt.profile = true;
    prof = std::make_unique<Executor>(g, opt);
    prof->run(inputs);  // its own warm-up (algorithm searches, workspaces), not counted
    warm = prof->profile();
    warm_nodes = prof->node_profile();
    prof->run(inputs);
    prof_runs = 1;
  }
  const Executor& pe = device ? *prof : ex;
  std::vector<std::pair<double, std::string>> by_op;
  double total = 0;
  for (auto& kv : pe.profile()) {
    double t = (kv.second.ms - warm[kv.first].ms) / prof_runs;
    by_op.push_back({t, kv.first});
    total += t;
  }
  std::sort(by_op.rbegin(), by_op.rend());
  std::printf("%-24s %10s %6s %8s\n", "op type", "ms/run", "%", "calls");
  for (auto& [t, op] : by_op)
    std::printf("%-24s %10.2f %6.1f %8d\n", op.c_str(), t, 100 * t / std::max(total, 1e-9),
                (pe.profile().at(op).calls - warm[op].calls) / prof_runs);
  if (device) std::printf("(per-op times from one run that waits for every kernel)\n");
  if (!device) std::printf("%s", cpu_paths_report(pe.graph()).c_str());
  if (a.nodes > 0)
    std::printf("%s", slowest_nodes(pe.graph(), pe.node_profile(), warm_nodes, prof_runs, a.nodes).c_str());
  std::printf("forward over %d runs: min %.1f ms, median %.1f ms, max %.1f ms; peak RSS %.1f MB; %s\n",
              a.runs, sorted.front(), median, sorted.back(), peak_rss_mb(),
              device ? ("device " + a.device).c_str() : str("threads ", a.threads).c_str());
  if (a.json)
    std::printf("{\"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"runs\": %d, \"median_ms\": %.3f, "
                "\"min_ms\": %.3f, \"max_ms\": %.3f, \"peak_rss_mb\": %.1f}\n",
                a.model.c_str(), a.device.c_str(), a.threads, a.runs, median, sorted.front(), sorted.back(),
                peak_rss_mb());
  return 0;
}

// What stands for an option's value when the ranks' options are compared: a file it names
// (or the FILE of NAME=FILE) by its size and its first and last MiB, so that node-local copies
// at other paths agree and other files at one path do not; anything else by its text.
std::string file_identity(const std::string& v) {
  std::error_code ec;  // (no exceptions: a value may be no path at all, or one too long)
  const size_t eq = v.find('=');
  const std::string path = std::filesystem::is_regular_file(v, ec) || eq == std::string::npos ? v : v.substr(eq + 1);
  if (!std::filesystem::is_regular_file(path, ec)) return v;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return v;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  std::string head(1 << 20, '\0'), tail(1 << 20, '\0');
  head.resize(std::fread(&head[0], 1, head.size(), f));
  if (size > head.size() && std::fseek(f, -(long)std::min<uintmax_t>(size - head.size(), tail.size()), SEEK_END) == 0)
    tail.resize(std::fread(&tail[0], 1, tail.size(), f));
  else
    tail.clear();
  std::fclose(f);
  return str(path == v ? "" : v.substr(0, eq + 1), "file ", size, " ", fingerprint(head), " ", fingerprint(tail));
}

// An error's text as its one line shows it: a hostile value quoted in it (a 64 MiB YAML scalar,
// a 100 kB --init) is cut, not echoed whole.
std::string one_line(const std::string& m) {
  constexpr size_t kMax = 2000;
  return m.size() <= kMax ? m : m.substr(0, kMax) + str("... (", m.size() - kMax, " more bytes)");
}

constexpr const char* kVersion = "0.3.0";
constexpr int kMaxThreads = 1024;

}  // namespace

// On a machine other work keeps busy, OpenMP threads waiting at a barrier sleep instead of
// spinning (OMP_WAIT_POLICY=PASSIVE): spinning threads take the cores that the threads they
// wait for need. wxformer_tiny's training step at 2 threads beside other work (load 5 on 2
// cores, 2026-11-26): median 250-540 ms spinning, 82-118 ms passive. Busy means: at least
// half the cores run other threads now (/proc/stat's procs_running, the least of a few
// samples, less this process). The 1-minute load average is not used: it still counts work
// that ended a minute ago (a benchmark's previous run), and passive waits cost a quiet
// machine's small models up to 2x. A policy the environment sets (OMP_WAIT_POLICY,
// GOMP_SPINCOUNT) is kept. libgomp reads it when it loads, before main, so the process starts
// itself again with it set (same pid: mpirun does not notice).
static int other_running_threads() {
  int least = -1;
  for (int i = 0; i < 5; ++i) {
    if (i) usleep(2000);
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return 0;
    char line[256];
    int running = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "procs_running %d", &running) == 1) break;
    std::fclose(f);
    if (running < 0) return 0;
    least = least < 0 ? running : std::min(least, running);
  }
  return std::max(least - 1, 0);
}

void wait_passively_when_busy(char** argv) {
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (2 * other_running_threads() < std::max(cores, 1L)) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);  // if that fails, go on spinning
}

// Exit codes: 0 success; 1 bad input or a usage error (one line "wxe: error: ..." on stderr);
// 3 infer --compare difference above --tolerance; 4 finetune stopped on a non-finite loss or
// gradient. A rank's error under mpirun ends the job through MPI_Abort (mpirun's exit code).
int main(int argc, char** argv) {
  wait_passively_when_busy(argv);
  CLI::App app{"wxe: run and fine-tune CREDIT wxformer-style weather models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("wxe ") + kVersion);

  std::string inspect_model;
  std::vector<std::string> inspect_inputs;
  bool dump_graph = false;
  auto* inspect = app.add_subcommand("inspect", "inputs, outputs, parameters and op counts before/after the passes");
  inspect->add_option("model", inspect_model, "model .onnx")->required();
  inspect->add_option("--input,-i", inspect_inputs, "bind input shapes from tensors: [NAME=]X.npy")->allow_extra_args(false);
  inspect->add_flag("--dump", dump_graph, "print the simplified graph");
  int inspect_tp = 1, inspect_domain = 1;
  std::string inspect_plan;
  inspect->add_option("--tp", inspect_tp, "print the tensor-parallel plan for this many ranks");
  inspect->add_option("--domain", inspect_domain, "print what runs on latitude bands over this many domain ranks "
                      "(the input shapes: --input, or the model's own)");
  inspect->add_option("--plan", inspect_plan, "plan file (JSON: weight-name pattern -> colwise|rowwise|replicate)");
  std::string inspect_device;
  inspect->add_option("--device", inspect_device, "cuda: list the ops that backend has no kernel for (no GPU needed)")
      ->check(CLI::IsMember({"cpu", "cuda"}));

  InferArgs ia;
  auto* infer = app.add_subcommand("infer", "run the model on .npy inputs");
  infer->add_option("model", ia.model, "model .onnx")->required();
  infer->add_option("--input,-i", ia.inputs, "[NAME=]X.npy (repeat for several inputs)")->required()->allow_extra_args(false);
  infer->add_option("--output,-o", ia.outputs, "[NAME=]Y.npy (first output without NAME)")->allow_extra_args(false);
  infer->add_option("--threads,-t", ia.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, kMaxThreads));
  auto* compare_opt = infer->add_option("--compare", ia.compare, "reference output .npy: print max abs and relative L2 difference");
  infer->add_option("--tolerance", ia.tolerance, "with --compare: exit 3 if max abs difference exceeds it")->needs(compare_opt);
  infer->add_flag("--reference", ia.reference, "run the plain reference kernels only (slow; the oracle)");
  infer->add_option("--tp", ia.tp, "tensor-parallel ranks (world = dp x tp x domain; run under mpirun)");
  infer->add_option("--domain", ia.domain, "domain-parallel ranks: each holds a band of latitudes of the activations "
                    "(world = dp x tp x domain; run under mpirun)");
  infer->add_option("--plan", ia.plan, "plan file (JSON: weight-name pattern -> colwise|rowwise|replicate)");
  infer->add_option("--weights,-w", ia.weights, "load parameters by name: .safetensors, or a legacy CREDIT .pt (converted on the fly)");
  infer->add_option("--device", ia.device, "cpu (default) or cuda: run on the first GPU (float32)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  infer->add_option("--precision", ia.precision, "fp32 (default) or bf16: convolutions and linear layers on bfloat16, float32 accumulation (cuda: convolutions on TF32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));

  BenchArgs ba;
  auto* bench = app.add_subcommand("bench", "time the forward pass: min/median/max, peak memory, time per op type");
  bench->add_option("model", ba.model, "model .onnx")->required();
  bench->add_option("--input,-i", ba.inputs, "[NAME=]X.npy (repeat for several inputs)")->required()->allow_extra_args(false);
  bench->add_option("--threads,-t", ba.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, kMaxThreads));
  bench->add_option("--runs,-r", ba.runs, "timed runs after one warm-up (default 5)");
  bench->add_flag("--json", ba.json, "print one JSON object as the last line");
  bench->add_option("--weights,-w", ba.weights, "load parameters by name (.safetensors or legacy .pt)");
  bench->add_option("--nodes", ba.nodes, "also list the N slowest nodes with their shapes (with --train: forward and backward)")
      ->check(CLI::NonNegativeNumber);
  bool bench_train = false;
  std::string bench_checkpoint = "none";
  CLI::Option* train_flag = bench->add_flag(
      "--train", bench_train, "time a training step (forward, backward, clipping, AdamW) instead of the forward pass");
  bench->add_option("--activation-checkpoint", bench_checkpoint, "with --train: none or blocks (see finetune)")
      ->check(CLI::IsMember({"none", "blocks"}))
      ->needs(train_flag);
  bench->add_option("--device", ba.device, "cpu (default) or cuda: run on the first GPU (float32)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  bench->add_option("--precision", ba.precision, "fp32 (default) or bf16: convolutions and linear layers on bfloat16, float32 accumulation (cuda: convolutions on TF32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));

  ConvertArgs ca;
  PlanArgs plan_a;
  auto* plan = app.add_subcommand("plan", "predict the peak memory per rank of each mesh (dp x tp x domain) and "
                                  "--activation-checkpoint setting from shapes, and name the fastest that fits");
  plan->add_option("model", plan_a.model, "model .onnx")->required();
  plan->add_option("config", plan_a.config, "CREDIT gen2 CONFIG.yml: the input shape from its data, its training options");
  plan->add_option("--ranks,-n", plan_a.ranks, "MPI ranks (default 1): every dp x tp x domain mesh of this many");
  plan->add_option("--memory", plan_a.memory, "GB each rank may use (default: no limit; every row fits)");
  plan->add_flag("--train", plan_a.train, "plan fine-tuning (gradients, AdamW state, ZeRO-1, checkpointing); "
                 "default: inference");
  plan->add_option("--input,-i", plan_a.input, "X.npy: the input shape of one micro-batch (its header only is read; "
                   "default: the model's declared shape)");
  plan->add_option("--accum", plan_a.accum, "micro-batches per optimizer step (finetune --accum): dp must divide it "
                   "(default: any dp)");
  plan->add_option("--plan", plan_a.plan, "tensor-parallel plan file");
  plan->add_flag("--json", plan_a.json, "one JSON object instead of the table");
  plan->add_flag("--shard-weights", plan_a.shard_weights, "with --train: ZeRO-3 (finetune --shard-weights): parameters "
                 "and gradients sharded over dp x domain too");

  auto* convert = app.add_subcommand("convert", "convert a legacy CREDIT checkpoint to the Linear layout (safetensors), or a fine-tuned one back to CREDIT");
  convert->add_option("checkpoint", ca.checkpoint, "legacy .pt, .safetensors, or a finetune checkpoint directory (with --to credit)")->required();
  convert->add_option("--output,-o", ca.output, "output .safetensors, or .pt with --to credit")->required();
  convert->add_option("--to", ca.to, "safetensors (default: Linear layout) or credit (a CREDIT trainer checkpoint .pt)")
      ->check(CLI::IsMember({"safetensors", "credit"}));
  convert->add_option("--like", ca.like, "with --to credit: the CREDIT checkpoint fine-tuning started from (order, shapes, untrained tensors, optimizer indices)");
  convert->add_option("--onnx", ca.onnx, "check every tensor against this model's rewritten parameters");
  convert->add_option("--input", ca.inputs, "with --onnx: bind input shapes [NAME=]X.npy (for dynamic inputs)")->allow_extra_args(false);
  convert->add_option("--shard", ca.shard, "write --output as a sharded checkpoint directory of N files, tensors of 2+ dims split along "
                      "axis 0 (input: .safetensors or a sharded checkpoint; a sharded checkpoint without --shard becomes one .safetensors)")
      ->check(CLI::PositiveNumber);

  FinetuneConfig fc;
  auto* finetune = app.add_subcommand("finetune", "fine-tune the model on .npy samples: AdamW, schedule, clipping, checkpoints");
  finetune->add_option("model", fc.model, "model .onnx, or a CREDIT gen2 CONFIG.yml (data, trainer, loss keys; flags override) with --model")->required();
  std::string finetune_model;
  finetune->add_option("--model,-m", finetune_model, "model .onnx (with a CONFIG.yml)");
  finetune->add_option("--data", fc.data, "directory of x_NNNN.npy / y_NNNN.npy (consecutive times); optional lat.npy, channel_weights.npy");
  finetune->add_option("--save", fc.save, "checkpoint directory (step_NNNNNN/, latest, training_log.csv, loss_curve.png)");
  finetune->add_option("--weights,-w", fc.weights, "start from: a legacy CREDIT .pt, a .safetensors, or a finetune checkpoint's model.safetensors");
  finetune->add_option("--steps", fc.steps, "optimizer steps in total (default 100)");
  finetune->add_flag("--resume", fc.resume, "continue from SAVE/latest (bit for bit)");
  std::string schedule = "constant";
  finetune->add_option("--lr", fc.schedule.lr, "learning rate (default 1e-3; the schedule's peak)");
  finetune->add_option("--schedule", schedule, "constant (default) or linear-warmup-cosine")
      ->check(CLI::IsMember({"constant", "linear-warmup-cosine"}));
  finetune->add_option("--warmup-steps", fc.schedule.warmup_steps, "linear warm-up from lr 0, in optimizer steps (default 0; a CONFIG.yml's "
                       "trainer.scheduler counts batches, as CREDIT steps it once per batch)");
  int64_t total_steps = -1;
  finetune->add_option("--total-steps", total_steps, "length of the cosine, in optimizer steps (default: --steps)");
  finetune->add_option("--min-lr", fc.schedule.min_lr, "learning rate at the end of the cosine (default 0)");
  finetune->add_option("--weight-decay", fc.adam.weight_decay, "AdamW weight decay on every parameter (default 0.01)");
  finetune->add_option("--beta1", fc.adam.beta1, "AdamW beta1 (default 0.9)");
  finetune->add_option("--beta2", fc.adam.beta2, "AdamW beta2 (default 0.95, CREDIT's)");
  finetune->add_option("--eps", fc.adam.eps, "AdamW epsilon (default 1e-8)");
  finetune->add_option("--grad-max-norm", fc.grad_max_norm, "clip gradients to this global L2 norm (default 1; 0: off)");
  finetune->add_option("--accum", fc.accum, "micro-batches per optimizer step (gradient accumulation; default 1)");
  finetune->add_option("--prefetch", fc.prefetch,
                       "samples read ahead on a background thread while the steps run (default 2; 0: read in the step)")
      ->check(CLI::Range(0, 64));
  finetune->add_option("--forecast-len", fc.forecast_len, "rollout steps per sample, prediction fed back (default 1)");
  finetune->add_option("--prognostic", fc.prognostic, "output channels fed back into the input in rollouts (default: min of input and output channels)");
  finetune->add_flag("--shard-weights", fc.shard_weights, "ZeRO-3: parameters and gradients, like the AdamW state, "
                     "held as 1/(dp x domain) per rank; each module's weights gathered just before the nodes that read "
                     "them (cpu only; default from a CREDIT config's trainer.mode fsdp)");
  finetune->add_flag("--ema", fc.ema, "keep an exponential moving average of the weights (saved as ema.safetensors)");
  finetune->add_option("--activation-checkpoint", fc.activation_checkpoint,
                       "none (keep every activation) or blocks (recompute each attention and feed-forward block's "
                       "activations in the backward: less memory, about one more forward; same gradients); "
                       "a CREDIT config's trainer.activation_checkpoint (default true) sets blocks")
      ->check(CLI::IsMember({"none", "blocks"}));
  std::string sequence_parallel = "on";
  finetune->add_option("--sequence-parallel", sequence_parallel,
                       "on (default) or off: with --tp on the CPU, each rank keeps its band of latitudes of the "
                       "residual stream and norms between the tp-sharded layers (reduce-scatter / all-gather "
                       "instead of all-reduce); off: those activations whole on every rank")
      ->check(CLI::IsMember({"on", "off"}));
  finetune->add_option("--ema-decay", fc.ema_decay,
                       "EMA maximum decay (default 0.999); update n uses min(decay, (1+n)/(10+n)), as CREDIT's EMATracker");
  finetune->add_flag("--shuffle", fc.shuffle, "a new sample order every epoch (seeded)");
  finetune->add_option("--seed", fc.seed, "seed of the sample order (default 0)");
  std::string loss = "lat-mse";
  finetune->add_option("--loss", loss, "lat-mse (default: CREDIT's latitude- and channel-weighted MSE) or mse")
      ->check(CLI::IsMember({"lat-mse", "mse"}));
  finetune->add_option("--freeze", fc.freeze, "freeze parameters whose name matches this glob (repeatable)")->allow_extra_args(false);
  finetune->add_option("--threads,-t", fc.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, kMaxThreads));
  finetune->add_flag("--reference", fc.reference, "reference kernels only (slow; the oracle)");
  finetune->add_option("--precision", fc.precision, "fp32 (default) or bf16: convolutions and linear layers forward and "
                       "backward on bfloat16 with float32 accumulation; parameters, gradients and AdamW state float32 "
                       "(cpu only)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  finetune->add_option("--device", fc.device, "cpu (default) or cuda: forward and backward on the GPU (float32; "
                       "ops without a GPU kernel run on the host); under mpirun one GPU per rank")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  finetune->add_option("--save-every", fc.save_every, "also write a checkpoint every N steps (default: only at the end)");
  finetune->add_option("--keep", fc.keep, "checkpoints kept (default 2)");
  int finetune_tp = 1, finetune_domain = 1;
  finetune->add_option("--tp", finetune_tp, "tensor-parallel ranks per model copy (world = dp x tp x domain; run under mpirun)");
  finetune->add_option("--domain", finetune_domain, "domain-parallel ranks per model copy: each holds a band of "
                       "latitudes of the activations (world = dp x tp x domain; run under mpirun)");
  finetune->add_option("--plan", fc.plan, "tensor-parallel plan file (JSON: weight-name glob -> colwise/rowwise/replicate)");
  double finetune_memory = 0;
  finetune->add_option("--memory", finetune_memory, "GB each rank may use: a run whose planned peak (wxe plan) is "
                       "larger stops before step 1 (default: the machine's available memory over the ranks on it)");

  ForecastArgs fa;
  int forecast_tp = 1, forecast_domain = 1;
  auto* forecast = app.add_subcommand("forecast", "autoregressive forecast from a CREDIT config's data, written as netCDF");
  forecast->add_option("config", fa.config, "CREDIT gen2 config .yml (data.source, scaler)")->required();
  forecast->add_option("--model,-m", fa.model, "model .onnx")->required();
  forecast->add_option("--weights,-w", fa.weights, "parameters: .safetensors or a legacy CREDIT .pt");
  std::vector<std::string> forecast_inits;
  forecast->add_option("--init", forecast_inits, "initial time, e.g. 2020-01-01T00 (read from the data files); "
                       "repeat it for one forecast per init time, each written to OUT_<init>.nc")->required();
  forecast->add_option("--steps", fa.steps, "rollout steps of data.timestep (default 1)")->check(CLI::PositiveNumber);
  forecast->add_option("--output,-o", fa.output, "forecast netCDF file")->required();
  forecast->add_option("--threads,-t", fa.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, kMaxThreads));
  forecast->add_flag("--reference", fa.reference, "reference kernels only (slow; the oracle)");
  forecast->add_option("--device", fa.device, "cpu (default) or cuda: run the model on the GPU (float32; under mpirun "
                       "one GPU per rank)")->check(CLI::IsMember({"cpu", "cuda"}));
  forecast->add_option("--tp", forecast_tp, "tensor-parallel ranks (run under mpirun -n TP x DOMAIN)");
  forecast->add_option("--domain", forecast_domain, "domain-parallel ranks: each holds a band of latitudes of the "
                       "activations (run under mpirun -n TP x DOMAIN)");
  forecast->add_option("--plan", fa.plan, "tensor-parallel plan file");

  PlotArgs pa;
  auto* plot = app.add_subcommand("plot", "maps of a forecast file's fields (PNG: coastlines, colour bar, valid and lead time)");
  plot->add_option("forecast", pa.forecast, "forecast netCDF file (wxe forecast)")->required();
  plot->add_option("--var", pa.vars, "NAME or NAME@LEVEL, e.g. T@500 (repeatable: one map each, in one PNG)")
      ->required()
      ->allow_extra_args(false);
  auto* plot_step = plot->add_option("--step", pa.step, "lead step K (1-based: K x timestep after init; default 1)");
  plot->add_flag("--all-steps", pa.all_steps, "one PNG per step: OUT_stepK.png")->excludes(plot_step);
  plot->add_option("--output,-o", pa.output, "output PNG")->required();
  plot->add_option("--minus", pa.minus, "draw the difference from this forecast file at the same valid time (diverging palette)");
  plot->add_option("--minus-truth", pa.minus_truth, "draw the difference from this CREDIT config's data at the valid time");

  ScoreArgs sa;
  std::vector<std::string> score_files;
  auto* score = app.add_subcommand("score", "RMSE, bias and ACC of forecast files against a CREDIT config's data "
                                   "(WeatherBench 2's definitions), as CSV and plots");
  score->add_option("forecasts", score_files, "forecast files (one per init time; A1.nc,A2.nc: one model's files, "
                    "for --compare)")->required();
  score->add_option("--truth", sa.truth, "CREDIT config .yml whose data are the truth")->required();
  score->add_option("--climatology", sa.climatology, "netCDF of each variable on ([level,] latitude, longitude) for ACC "
                    "(default: the mean of the config's training period per grid point)");
  score->add_option("--output,-o", sa.output, "CSV (default scores.csv); plots beside it: OUT_<field>.png, or OUT.png "
                    "with --compare");
  score->add_flag("--compare", sa.compare, "a scorecard of each model (argument) against the first: relative RMSE "
                  "difference, paired t-test over init times");

  // `wxe help [COMMAND]`: the same as --help
  if (argc >= 2 && std::string(argv[1]) == "help") {
    CLI::App* sub = nullptr;
    for (CLI::App* c : app.get_subcommands([](CLI::App*) { return true; }))
      if (argc >= 3 && c->get_name() == argv[2]) sub = c;
    std::printf("%s", sub ? sub->help().c_str() : app.help().c_str());
    return 0;
  }
  auto usage_error = [](const std::string& msg) {
    std::fprintf(stderr, "wxe: error: %s (see wxe --help)\n", one_line(msg).c_str());
    return 1;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return usage_error(e.what());
  }
  // options that would do nothing here are refused rather than silently ignored
  if (*infer && !ia.plan.empty() && ia.tp <= 1) return usage_error("--plan needs --tp 2 or more");
  if (*inspect && !inspect_plan.empty() && inspect_tp <= 1) return usage_error("--plan needs --tp 2 or more");
  if (*inspect && (inspect_tp < 1 || inspect_domain < 1))
    return usage_error(str("inspect: --", inspect_tp < 1 ? "tp" : "domain", " must be at least 1 (got ",
                           inspect_tp < 1 ? inspect_tp : inspect_domain, ")"));
  if (*finetune && fc.reference && fc.device != "cpu")
    return usage_error("--reference runs the CPU reference kernels; --device " + fc.device + " does not apply");
  if (*forecast && fa.reference && fa.device != "cpu")
    return usage_error("--reference runs the CPU reference kernels; --device " + fa.device + " does not apply");
  if (*infer && ia.reference && ia.precision == "bf16")
    return usage_error("--reference runs the float32 reference kernels; --precision bf16 does not apply");
  if (*finetune && fc.reference && fc.precision == "bf16")
    return usage_error("--reference runs the float32 reference kernels; --precision bf16 does not apply");
  if ((*finetune && fc.precision == "bf16" && fc.device != "cpu") ||
      (*bench && bench_train && ba.precision == "bf16" && ba.device != "cpu"))
    return usage_error("--precision bf16 trains on the cpu only for now (no bfloat16 backward kernels on --device " +
                       (*finetune ? fc.device : ba.device) + " yet); use --precision fp32");
  bool finetune_config = false;
  std::string finetune_config_path;
  if (*finetune) {
    fc.schedule.kind = schedule == "constant" ? ScheduleKind::Constant : ScheduleKind::LinearWarmupCosine;
    fc.schedule.total_steps = total_steps > 0 ? total_steps : fc.steps;
    fc.plain_mse = loss == "mse";
    if (finetune_memory < 0 || !std::isfinite(finetune_memory))
      return usage_error(str("finetune: --memory must be a positive number of GB (got ", finetune_memory, ")"));
    fc.memory = finetune_memory * 1e9;
    fc.sequence_parallel = sequence_parallel == "on";
    fc.plot = [](const std::string& png, const std::string& title, const std::vector<double>& x,
                 const std::vector<double>& y) { plot_loss_curve(png, title, x, y); };
    finetune_config = ends_with(fc.model, ".yml") || ends_with(fc.model, ".yaml");
    if (finetune_config) {
      if (finetune_model.empty()) return usage_error("finetune CONFIG.yml needs --model MODEL.onnx");
      if (!fc.data.empty()) return usage_error("--data: the data come from the config");
      finetune_config_path = fc.model;
      fc.model = finetune_model;
    } else {
      if (!finetune_model.empty()) return usage_error("--model goes with a CONFIG.yml (the model is the first argument)");
      if (fc.data.empty()) return usage_error("finetune: --data is required");
      if (fc.save.empty()) return usage_error("finetune: --save is required");
    }
  }
  register_credit_modules();
  MeshSession session;
  session.mesh = *infer || *finetune || *forecast;
  session.tp = *infer ? ia.tp : *forecast ? forecast_tp : finetune_tp;
  session.domain = *infer ? ia.domain : *forecast ? forecast_domain : finetune_domain;
  session.device = *infer      ? ia.device
                   : *finetune ? fc.device
                   : *bench    ? ba.device
                   : *forecast ? fa.device
                               : "cpu";
  session.dp_nccl = finetune->parsed();
  // every option of the command as given, but those a rank may set for itself: ranks started
  // with another --tp, --steps, --init, --input or --weights would hang or mix their results.
  // Files by their contents (node-local copies at other paths agree); --data by its samples,
  // later (train/trainer.cpp).
  for (CLI::App* cmd : {infer, finetune, forecast})
    if (cmd->parsed()) {
      session.same_options.push_back({"command", cmd->get_name(), cmd->get_name()});  // first: the lists' lengths follow
      for (const CLI::Option* o : cmd->get_options()) {
        const std::string name = o->get_name();
        if (name == "--help" || name == "--threads" || name == "--output" || name == "--data") continue;
        std::string value, compared;
        for (const std::string& r : o->results()) {
          value += (value.empty() ? "" : " ") + r;
          compared += file_identity(r) + '\n';
        }
        session.same_options.push_back({name, value, compared});
      }
    }
  Mesh mesh;
  try {  // every rank raises the same error for a bad --tp, so no hang (parallel/mesh_session.h)
    mesh = start_mesh(session);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wxe: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
  g_quiet = mesh.rank != 0;
  try {
    if (*inspect)
      return cmd_inspect(inspect_model, inspect_inputs, dump_graph, inspect_tp, inspect_domain, inspect_plan,
                         inspect_device);
    if (*infer) return cmd_infer(ia, mesh);
    if (*bench && bench_train)
      return run_train_bench(ba.model, ba.inputs.at(0), ba.weights, ba.threads, ba.runs, ba.json, ba.device,
                             bench_checkpoint, ba.precision, ba.nodes);
    if (*bench) return cmd_bench(ba);
    if (*plan) return cmd_plan(plan_a);
    if (*finetune && finetune_config) {
      finetune_from_config(finetune_config_path, fc, [&](const std::string& flag) { return finetune->get_option(flag)->count() > 0; },
                           mesh.rank == 0);
      if (schedule != "constant" && total_steps <= 0) fc.schedule.total_steps = fc.steps;
    }
    if (*finetune) return run_finetune(fc, &mesh);
    if (*forecast) {  // one forecast per --init (several: OUT_<init>.nc each, for wxe score)
      for (const std::string& init : forecast_inits) {
        ForecastArgs one = fa;
        one.init = init;
        if (forecast_inits.size() > 1) {
          const std::filesystem::path out(fa.output);
          one.output = (out.parent_path() / (out.stem().string() + "_" + init + out.extension().string())).string();
        }
        if (const int rc = run_forecast(one, &mesh)) return rc;
      }
      return 0;
    }
    if (*plot) return run_plot(pa);
    if (*score) {
      // each argument a model (with --compare), its files separated by commas; else one model
      for (const std::string& arg : score_files) {
        std::vector<std::string> files;
        for (size_t p = 0, q; p <= arg.size(); p = q + 1) {
          q = std::min(arg.find(',', p), arg.size());
          if (q > p) files.push_back(arg.substr(p, q - p));
        }
        if (sa.compare || sa.models.empty()) sa.models.push_back(files);
        else sa.models[0].insert(sa.models[0].end(), files.begin(), files.end());
      }
      return run_score(sa);
    }
    if (*convert) return cmd_convert(ca);
  } catch (const std::exception& e) {
    // with other ranks waiting in collectives, one rank's error ends the whole job
    if (mesh.world > 1) abort_job(one_line(e.what()));
    std::fprintf(stderr, "wxe: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
  return 0;
}
