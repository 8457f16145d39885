// `wxe plan` (train/plan.h): each candidate mesh's training graph, planned by a plan-only step.
#include "train/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include "engine/exec/autograd.h"
#include "engine/exec/executor.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "parallel/bands.h"

namespace wxe {

namespace {

// What no plan sees, measured (docs/internals/memory-plan.md#predicting-the-peak-wxe-plan): on
// top of the resident size of the process before it plans (the program and libraries as loaded),
// the library code and kernels' scratch a step touches and the allocator's slack, fitted as a
// constant and a share of the host tensors at the peak, the line through two measured points
// (finetune, 1 rank, 2 threads: wxformer_tiny 36 MB on 35 MB of tensors; wxformer_v2026 126 MB
// on 693 MB, the same with --activation-checkpoint blocks 135 MB on 444 MB); under mpirun, MPI's
// buffers touched in the run, and its libraries when the plan is made outside mpirun.
constexpr double kSlackBytes = 30e6;
constexpr double kSlackShare = 0.14;
constexpr double kMpiRunBytes = 8e6;
constexpr double kMpiLoadBytes = 7e6;

double resident_bytes() {
  long pages = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

// Quiet while planning: the passes note what they do for each candidate.
struct Quiet {
  bool was = g_quiet;
  Quiet() { g_quiet = true; }
  ~Quiet() { g_quiet = was; }
};

// Bytes this rank sends for the collectives of one forward and backward of g (ring algorithms:
// an all-reduce of b bytes over n ranks sends 2 b (n-1)/n, a gather or reduce-scatter of the
// whole b bytes sends b (n-1)/n).
double collective_bytes(const Graph& g, int tp, int domain) {
  double sent = 0;
  for (const Node& n : g.nodes) {
    const bool all_reduce = n.op == "AllReduceTP" || n.op == "CopyToTP";
    const bool band = n.op == "ReduceScatterTP" || n.op == "AllGatherTP";
    if (!all_reduce && !band && n.op != "HaloTP") continue;
    const int parts = (int)n.i("parts", n.s("group", "tp") == "domain" ? domain : tp);
    if (parts <= 1) continue;
    const double share = (parts - 1.0) / parts;
    auto bytes = [&](int v) { return (double)tensor_bytes(g.values[v].dtype, g.values[v].shape); };
    if (all_reduce)  // the forward's all-reduce, or the backward's (CopyToTP)
      sent += 2 * share * bytes(n.outputs[0]);
    else if (band)  // forward and backward, the whole (gathered or summed) tensor each
      sent += 2 * share * std::max(bytes(n.inputs[0]), bytes(n.outputs[0]));
    else  // a halo: the rows beyond the band, there and back
      sent += 2 * std::max(0.0, bytes(n.outputs[0]) - bytes(n.inputs[0]));
  }
  return sent;
}

struct StepBytes {
  double kept = 0, peak = 0;
};

// One training step (forward, loss gradient, backward) as the Trainer makes it, planned: the
// sample's input and target, the executor's values, gradients and recomputes.
StepBytes plan_step(const Graph& g, const std::vector<int>& trainable, const std::vector<int>& segments) {
  ExecOptions opt;
  opt.optimize = false;
  opt.plan_only = true;
  opt.segments = segments;
  GradExecutor ex(g, trainable, opt);
  const double live = (double)host_bytes_live();
  reset_host_peak();
  {
    const Value& in = g.values[g.inputs[0]];
    const Value& out = g.values[g.outputs[0]];
    Tensor target = Tensor::counted(DType::F32, out.shape);
    std::map<std::string, Tensor> feed;
    feed[in.name] = Tensor::counted(in.dtype, in.shape);
    std::vector<Tensor> outs = ex.forward(std::move(feed));
    std::vector<Tensor> gout(outs.size());
    gout[0] = ex.backward_reads_output(0) ? Tensor::counted(DType::F32, outs[0].shape) : outs[0];
    target = Tensor();
    outs.clear();
    ex.backward(std::move(gout));
  }
  return {(double)ex.kept_bytes(), (double)host_bytes_peak() - live};
}

// Bytes of the graph's constants that are not in `skip`, each storage once.
double constant_bytes(const Graph& g, const std::set<int>& skip) {
  std::set<const Storage*> seen;
  double b = 0;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].is_const() && !skip.count((int)v) && seen.insert(g.values[v].constant->storage.get()).second)
      b += (double)g.values[v].constant->storage->nbytes;
  return b;
}

// The recommendation: among the rows that fit, no checkpointing before blocks (blocks costs about
// one more forward), then the most data parallelism (dp ranks repeat no work; tp and domain
// ranks repeat the replicated ops), then the fewest bytes sent per step, then the smaller tp.
int rank_rows(const std::vector<PlanRow>& rows) {
  int best = -1;
  auto key = [](const PlanRow& r) { return std::make_tuple(r.checkpoint == "blocks", -r.dp, r.comm, r.tp); };
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].fits && (best < 0 || key(rows[i]) < key(rows[best]))) best = (int)i;
  return best;
}

std::string mesh_name(int dp, int tp, int domain) { return str("dp ", dp, " x tp ", tp, " x domain ", domain); }

double mb(double b) { return b / 1e6; }

}  // namespace

Plan plan_run(const PlanRequest& r) {
  WXE_CHECK(r.ranks >= 1, "--ranks must be at least 1 (got ", r.ranks, ")");
  WXE_CHECK(std::isfinite(r.memory) && r.memory >= 0, "--memory must be a positive number of GB");
  const double base = r.resident > 0 ? r.resident : resident_bytes();
  Quiet quiet;
  Graph full = import_onnx(r.model);
  WXE_CHECK(full.inputs.size() == 1, r.model, ": planning needs a model with one input, it has ", full.inputs.size());
  const Value& in = full.values[full.inputs[0]];
  Shape shape = r.input.empty() ? in.shape : r.input;
  for (int64_t d : shape)
    WXE_CHECK(d > 0, r.model, ": input '", in.name, "' has no static shape ", shape_str(in.shape),
              "; give one: --input X.npy");
  Plan p;
  p.resident = base;
  std::vector<int> tps;
  for (int tp = 1; tp <= r.ranks; ++tp)
    if (r.ranks % tp == 0 && (!r.only_tp || tp == r.only_tp)) tps.push_back(tp);
  const std::vector<std::string> modes =
      !r.train ? std::vector<std::string>{"-"}
      : r.only_tp ? std::vector<std::string>{r.cfg.activation_checkpoint}
                  : std::vector<std::string>{"none", "blocks"};
  std::map<int64_t, Graph> prepared;  // by the batch one rank runs (inference: the input's over dp)
  auto prepared_at = [&](int64_t batch) -> const Graph& {
    auto it = prepared.find(batch);
    if (it != prepared.end()) return it->second;
    Graph g = full;
    Shape s = shape;
    s[0] = batch;
    LoadOptions lo;
    lo.training = r.train;
    prepare_model(g, {{in.name, {r.dtype, s}}}, lo);
    if (r.train) check_training_parameters(g, nullptr, r.model);
    return prepared[batch] = std::move(g);
  };
  for (int tp : tps)
    for (int domain = 1; domain <= r.ranks / tp; ++domain) {
      if ((r.ranks / tp) % domain || (r.only_domain && domain != r.only_domain)) continue;
      const int dp = r.ranks / tp / domain;
      const std::string name = mesh_name(dp, tp, domain);
      if (r.train && r.accum > 0 && r.accum % dp) {
        p.refused.push_back(str(name, ": --accum ", r.accum, " micro-batches do not divide over ", dp, " dp groups"));
        continue;
      }
      if (!r.train && shape[0] % dp) {
        p.refused.push_back(str(name, ": the batch of ", shape[0], " does not divide over ", dp, " dp groups"));
        continue;
      }
      for (const std::string& mode : modes) {
        PlanRow row;
        row.dp = dp;
        row.tp = tp;
        row.domain = domain;
        row.checkpoint = mode;
        Mesh shape_only;  // the sizes of rank 0's mesh, no communicators
        shape_only.world = r.ranks;
        shape_only.dp = dp;
        shape_only.tp = tp;
        shape_only.domain = domain;
        double persistent = 0, step = 0;
        try {
          Graph g = prepared_at(r.train ? shape[0] : shape[0] / dp);
          if (r.train) {
            FinetuneConfig cfg = r.cfg;
            cfg.activation_checkpoint = mode;
            cfg.device = "cpu";
            RankGraph rg = rank_training_graph(g, cfg, &shape_only);
            std::vector<int> trainable;
            for (int v : trainable_parameters(g)) {
              bool frozen = false;
              for (const std::string& f : cfg.freeze) frozen = frozen || glob_match(f, g.values[v].name);
              if (!frozen) trainable.push_back(v);
            }
            // ZeRO-1 (train/trainer.h): each parameter cut into Z = dp x domain blocks
            const int z = dp * domain;
            double n = 0, zs = 0, largest = 0;
            for (int v : trainable) {
              const int64_t e = g.values[v].constant->numel();
              n += (double)e;
              zs += (double)((e + z - 1) / z);
              largest = std::max(largest, 4.0 * e);
            }
            // ZeRO-3 (--shard-weights): parameters and gradients are blocks as well, plus two
            // modules gathered whole (the one computing, the next)
            const bool z3 = cfg.shard_weights && z > 1;
            row.params = row.grads = z3 ? 4 * zs : 4 * n;
            if (z3) row.params += std::min(4 * n, 2 * std::max(largest, (double)zero3_module_bytes((int64_t)(4 * n))));
            row.adamw = 2 * 4 * zs;
            const int micro = r.accum > 0 ? r.accum / dp : 1;
            // ZeRO-3 gathers the parameters twice (forward and backward) and reduce-scatters per backward
            const double zero_comm = z3  ? 4 * zs * (z - 1) * 2 + micro * 4 * zs * z * (dp - 1.0) / dp
                                     : dp > 1 ? 2 * 4 * zs * z * (dp - 1.0) / dp : 0;
            row.comm = micro * collective_bytes(g, tp, domain) + zero_comm +
                       (domain > 1 ? 4 * zs * (domain - 1) : 0);
            // On the CPU a CopyToTP's output is its input's storage (parallel/collective_ops.cpp),
            // as a view's: planned as one (no kernel runs to share it)
            for (Node& n : g.nodes)
              if (n.op == "CopyToTP") n.op = "Identity";
            const StepBytes sb = plan_step(g, trainable, rg.segments);
            row.kept = sb.kept;
            // the optimizer's buffers under ZeRO (train/zero.cpp): the packed gradients for the
            // reduce-scatter with its result, then this rank's parameter block and the gathers
            double zero = 0;
            if (z > 1 && !z3) {  // (ZeRO-3's are one module's: small)
              const double b = 4 * zs;
              const double scatter = dp > 1 ? (z + domain + 1) * b : b;
              const double gather = 2 * b + (domain > 1 ? domain * b : 0) + (dp > 1 ? z * b : 0);
              zero = std::max(scatter, gather);
            }
            step = std::max(sb.peak, zero);
            const std::set<int> skip(trainable.begin(), trainable.end());
            const double sample = (double)tensor_bytes(r.dtype, g.values[g.inputs[0]].shape) +
                                  (double)tensor_bytes(DType::F32, g.values[g.outputs[0]].shape);
            row.other = constant_bytes(g, skip) + std::max(0, cfg.prefetch) * sample;
            persistent = row.params + row.grads + row.adamw + row.other;
          } else {
            if (tp > 1) shard_graph(g, plan_for(g, r.cfg.plan, tp), tp, 0);
            if (domain > 1) {
              const BandStats st = domain_parallel(g, domain, false);
              WXE_CHECK(st.scatters > 0, r.model, ": --domain ", domain, " splits nothing");
            }
            ExecOptions opt;
            Executor ex(g, opt);
            double outs = 0;
            for (int o : ex.graph().outputs) outs += (double)tensor_bytes(ex.graph().values[o].dtype, ex.graph().values[o].shape);
            row.other = constant_bytes(ex.graph(), {}) + (double)tensor_bytes(r.dtype, g.values[g.inputs[0]].shape);
            persistent = row.other;
            step = (double)ex.planned_arena_bytes() + outs;
            row.comm = collective_bytes(g, tp, domain) / 2;  // the forward's half
          }
        } catch (const Error& e) {
          if (mode == modes.front()) p.refused.push_back(str(name, ": ", e.what()));
          break;
        }
        row.activations = step;
        const double tensors = persistent + step;
        row.overhead = base + kSlackBytes + kSlackShare * tensors + (r.ranks > 1 ? kMpiRunBytes : 0) +
                     (r.ranks > 1 && !r.in_mpi ? kMpiLoadBytes : 0);
        row.peak = tensors + row.overhead;
        row.fits = r.memory <= 0 || row.peak <= r.memory;
        p.rows.push_back(row);
      }
    }
  p.best = rank_rows(p.rows);
  return p;
}

std::string fitting_options(const Plan& p, int n) {
  std::vector<int> order;
  for (size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].fits) order.push_back((int)i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const PlanRow &x = p.rows[a], &y = p.rows[b];
    return std::make_tuple(x.checkpoint == "blocks", -x.dp, x.comm, x.tp) <
           std::make_tuple(y.checkpoint == "blocks", -y.dp, y.comm, y.tp);
  });
  std::string s;
  for (int k = 0; k < (int)order.size() && k < n; ++k) {
    const PlanRow& r = p.rows[order[k]];
    std::string o;
    const int world = r.dp * r.tp * r.domain;
    if (world > 1) o += str("mpirun -n ", world);
    if (r.tp > 1) o += str(o.empty() ? "" : " ", "--tp ", r.tp);
    if (r.domain > 1) o += str(o.empty() ? "" : " ", "--domain ", r.domain);
    if (r.checkpoint == "blocks") o += str(o.empty() ? "" : " ", "--activation-checkpoint blocks");
    if (o.empty()) o = "--activation-checkpoint none";
    char gb[32];
    std::snprintf(gb, sizeof gb, " (%.3g GB)", r.peak / 1e9);
    s += (s.empty() ? "" : " or ") + o + gb;
  }
  return s;
}

std::string plan_table(const Plan& p, const PlanRequest& r) {
  std::string s = str("plan for ", r.model, " on ", r.ranks, r.ranks == 1 ? " rank" : " ranks", ", ",
                      r.train ? (r.cfg.shard_weights ? "training (ZeRO-3: --shard-weights)" : "training") : "inference");
  if (r.memory > 0) {
    char m[48];
    std::snprintf(m, sizeof m, ", %.2f GB per rank", r.memory / 1e9);
    s += m;
  }
  s += ":\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-26s %-13s %10s %10s %10s %10s %5s %14s\n", "mesh", "checkpointing", "state MB",
                "kept MB", "step MB", "peak MB", "fits", "comm MB/step");
  s += line;
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& x = p.rows[i];
    std::snprintf(line, sizeof line, "%-26s %-13s %10.1f %10.1f %10.1f %10.1f %5s %14.2f%s\n",
                  mesh_name(x.dp, x.tp, x.domain).c_str(), x.checkpoint.c_str(), mb(x.params + x.grads + x.adamw),
                  mb(x.kept), mb(x.activations), mb(x.peak), x.fits ? "yes" : "no", mb(x.comm),
                  (int)i == p.best ? "  <- recommended" : "");
    s += line;
  }
  for (const std::string& why : p.refused) s += "not offered: " + why + "\n";
  if (p.best >= 0) {
    const PlanRow& b = p.rows[p.best];
    std::snprintf(line, sizeof line, "recommended: %s, --activation-checkpoint %s: %.1f MB per rank (%s)\n",
                  mesh_name(b.dp, b.tp, b.domain).c_str(), b.checkpoint == "-" ? "none" : b.checkpoint.c_str(),
                  mb(b.peak), fitting_options({{b}, {}, 0}, 1).c_str());
    s += line;
  } else {
    s += "recommended: none fits; give more ranks or memory\n";
  }
  return s;
}

std::string plan_json(const Plan& p, const PlanRequest& r) {
  std::string s = str("{\"model\": \"", r.model, "\", \"ranks\": ", r.ranks, ", \"train\": ", r.train ? "true" : "false",
                      ", \"memory_mb\": ", mb(r.memory), ", \"rows\": [");
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& x = p.rows[i];
    char b[512];
    std::snprintf(b, sizeof b,
                  "%s{\"dp\": %d, \"tp\": %d, \"domain\": %d, \"checkpoint\": \"%s\", \"params_mb\": %.3f, "
                  "\"grads_mb\": %.3f, \"adamw_mb\": %.3f, \"kept_mb\": %.3f, \"activations_mb\": %.3f, "
                  "\"other_mb\": %.3f, \"overhead_mb\": %.3f, \"peak_mb\": %.3f, \"fits\": %s, \"comm_mb\": %.4f}",
                  i ? ", " : "", x.dp, x.tp, x.domain, x.checkpoint.c_str(), mb(x.params), mb(x.grads), mb(x.adamw),
                  mb(x.kept), mb(x.activations), mb(x.other), mb(x.overhead), mb(x.peak), x.fits ? "true" : "false",
                  mb(x.comm));
    s += b;
  }
  s += "], \"not_offered\": [";
  for (size_t i = 0; i < p.refused.size(); ++i) {
    std::string q;
    for (char c : p.refused[i]) q += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    s += str(i ? ", " : "", "\"", q, "\"");
  }
  s += str("], \"recommended\": ", p.best, "}\n");
  return s;
}

double available_per_rank(int world) {
  double avail = 0;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (mi >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  for (const char* limit_file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(limit_file);
    double limit = 0;
    if (!(f >> limit) || limit <= 0 || limit > 1e18) continue;  // "max": none
    double used = 0;
    std::ifstream u(std::string(limit_file).find("memory.max") != std::string::npos
                        ? "/sys/fs/cgroup/memory.current" : "/sys/fs/cgroup/memory/memory.usage_in_bytes");
    u >> used;
    avail = avail > 0 ? std::min(avail, limit - used) : limit - used;
    break;
  }
  int local = world;
  for (const char* env : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(env)) {
      if (std::atoi(v) > 0) local = std::atoi(v);
      break;
    }
  return std::max(0.0, avail) / std::max(1, local);
}

}  // namespace wxe
