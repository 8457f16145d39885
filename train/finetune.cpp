// `wxe finetune` and `wxe bench --train` over a Trainer (train/trainer.h): the loop with
// progress, training_log.csv, loss_curve.png and checkpoints.
#include "train/finetune.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "train/plan.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double peak_rss_mb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

std::string fmt_time(double s) {
  char b[32];
  int64_t t = (int64_t)std::llround(std::max(0.0, s));
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  else
    std::snprintf(b, sizeof b, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return b;
}

// The memory of a training step on each rank, gathered to rank 0 under a mesh: parameters,
// gradients and AdamW state; the activations at the step's peak, split into the values kept
// for the backward and the transient ones (what the step's peak of tensors held beyond what
// persists after it); the host tensors' peak and the process's peak RSS (which adds the
// program, the libraries' scratch and the allocator's slack). On a device (`dev`) the
// activations are in its memory: they come from its counters, whose peak is added to the line.
// For the step after reset_peaks().
// Returns this rank's figures in bytes, in the order of the line.
std::vector<float> report_memory(const Trainer& t, Mesh* mesh, const char* prefix, Backend* dev) {
  const double param = t.trainable_count() * 4.0, kept = (double)t.executor().kept_bytes();
  const double peak = (double)host_bytes_peak();
  const double dpeak = dev ? (double)dev->bytes_peak() : 0.0;
  const double act = dev ? dpeak - (double)dev->bytes_in_use() : peak - (double)host_bytes_live();
  // ZeRO-3: parameters and gradients are this rank's blocks; the whole parameters gathered at once
  const double held = t.shards_weights() ? (double)t.sharded_param_bytes() : param;
  const std::vector<float> mine = {(float)held, (float)held, (float)t.optimizer_bytes(), (float)kept,
                                   (float)std::max(0.0, act - kept), (float)peak, (float)(peak_rss_mb() * 1e6),
                                   (float)dpeak, (float)t.arena().block_bytes(),
                                   t.shards_weights() ? (float)t.gathered_peak_bytes() : -1.f};
  const int world = mesh ? mesh->world : 1, k = (int)mine.size();
  Tensor every = Tensor::from_f32({1, k}, mine);
  if (world > 1) {
    Tensor all(DType::F32, {world, k});
    mesh->world_comm->all_gather(every, all);
    every = all;
  }
  for (int r = 0; r < world; ++r) {
    const float* e = every.data<float>() + r * k;
    char on_dev[96] = "";
    if (dev) std::snprintf(on_dev, sizeof on_dev, "; %s memory at the peak %.1f MB", dev->name(), e[7] / 1e6);
    char block[64] = "";
    if (e[8] > 0) std::snprintf(block, sizeof block, " (the step's block %.1f MB)", e[8] / 1e6);
    char params[128];
    if (e[9] >= 0)
      std::snprintf(params, sizeof params, "parameters (sharded) %.1f MB, gathered at the peak %.1f MB, gradients "
                    "(sharded) %.1f MB", e[0] / 1e6, e[9] / 1e6, e[1] / 1e6);
    else
      std::snprintf(params, sizeof params, "parameters %.1f MB, gradients %.1f MB", e[0] / 1e6, e[1] / 1e6);
    note("%srank %d: %s, AdamW state %.1f MB, activations at the peak %.1f MB "
         "(kept for the backward %.1f, transient %.1f)%s; host tensors at the peak %.1f MB%s, peak RSS %.0f MB\n",
         prefix, r, params, e[2] / 1e6, (e[3] + e[4]) / 1e6, e[3] / 1e6, e[4] / 1e6, on_dev, e[5] / 1e6, block,
         e[6] / 1e6);
  }
  return mine;
}

// Starts the peaks report_memory() reads (host tensors, and the device's where there is one).
void reset_peaks(Backend* dev) {
  reset_host_peak();
  if (dev) dev->reset_peak();
}

// With activation checkpointing (memory over time) on a device: blocks of 1 MiB and more are
// mapped, and unmapped when freed. A training step frees activations in an order glibc's heap
// cannot give back (its free chunks stay resident, and by default it serves blocks up to 32 MiB
// from the heap once one was freed), so what the memory plan frees would stay in the process
// (wxformer_v2026: 1.34 GB peak RSS instead of 1.63 GB, before the step's block). On the CPU
// the steps' tensors come from the step's block (engine/ir/host_arena.h), which pages nothing
// in or out, and the threshold would cost time: oneDNN's gemm takes its packing buffers from
// malloc on every call, each then mapped and faulted in anew (wxformer_v2026 with
// checkpointing: 615 -> 567 ms per step without it, 24 MB more peak RSS).
void lean_heap(const FinetuneConfig& cfg) {
#ifdef M_MMAP_THRESHOLD
  if (cfg.activation_checkpoint == "blocks" && cfg.device != "cpu") mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

// One fixed input and a zero target (wxe bench --train).
class FixedSource : public SampleSource {
 public:
  FixedSource(Tensor x, Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  int64_t size() const override { return 1; }
  Sample get(int64_t) const override { return {x_, {y_}, {x_}}; }
  std::string describe() const override { return "one fixed input, zero target"; }

 private:
  Tensor x_, y_;
};


struct LogRow {
  int64_t step;
  double loss, lr, grad_norm, samples_per_s, seconds, data_wait;
  std::string tail;  // validation columns: "" or ",v1,v2..." (FinetuneConfig::validate)
};

// data_wait_s: the seconds of step_seconds the step waited for its samples (read ahead or not)
const char* kCsvHeader = "step,loss,lr,grad_norm,samples_per_s,step_seconds,data_wait_s";

std::string csv_row(const LogRow& r) {
  char b[256];
  std::snprintf(b, sizeof b, "%lld,%.9g,%.9g,%.9g,%.4g,%.4g,%.4g", (long long)r.step, r.loss, r.lr, r.grad_norm,
                r.samples_per_s, r.seconds, r.data_wait);
  return b + r.tail;
}

// Rows of an existing log up to `upto` (a resumed run rewrites what came after its checkpoint).
std::vector<LogRow> read_log(const std::string& path, int64_t upto) {
  std::vector<LogRow> rows;
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  const int fixed = line.find(",data_wait_s") != std::string::npos ? 7 : 6;  // a log of before the column: 6
  while (std::getline(f, line)) {
    LogRow r{};
    const int n = fixed == 7 ? std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf,%lf,%lf", (long long*)&r.step, &r.loss,
                                           &r.lr, &r.grad_norm, &r.samples_per_s, &r.seconds, &r.data_wait)
                             : std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf,%lf", (long long*)&r.step, &r.loss,
                                           &r.lr, &r.grad_norm, &r.samples_per_s, &r.seconds);
    if (n == fixed && r.step <= upto) {
      size_t p = 0;
      for (int commas = 0; commas < fixed && p != std::string::npos; ++commas) p = line.find(',', p + (commas > 0));
      r.tail = p == std::string::npos ? "" : line.substr(p);
      rows.push_back(r);
    }
  }
  return rows;
}

void write_log(const std::string& path, const std::vector<LogRow>& rows, const std::vector<std::string>& extra) {
  std::string s = std::string(kCsvHeader);
  for (const std::string& c : extra) s += "," + c;
  s += "\n";
  for (auto& r : rows) s += csv_row(r) + "\n";
  write_file_atomic(path, s);
}

void plot(const FinetuneConfig& cfg, const std::vector<LogRow>& rows) {
  if (!cfg.plot) return;
  std::vector<double> steps, loss;
  for (auto& r : rows) {
    steps.push_back((double)r.step);
    loss.push_back(r.loss);
  }
  try {
    cfg.plot((fs::path(cfg.save) / "loss_curve.png").string(), "wxe finetune " + fs::path(cfg.model).filename().string(),
             steps, loss);
  } catch (const Error& e) {
    note("wxe: warning: loss curve not drawn: %s\n", e.what());
  }
}

// Each distinct Conv / ConvTranspose of the training graph run alone on its shapes (random
// data; min of `reps` timed runs after one warm-up): forward, backward-data (dx; only where the
// step needs it: an input that depends on a trained parameter) and backward-weights (dW, db).
// GFLOP/s counts 2 * multiply-adds, the same count for the three.
void print_conv_profile(const GradExecutor& ex, int reps) {
  const Graph& g = ex.graph();
  std::vector<bool> needs(g.values.size(), false);
  for (int v : ex.trainable()) needs[v] = true;
  for (const Node& n : g.nodes) {
    bool any = false;
    for (int v : n.inputs) any = any || (v >= 0 && needs[v]);
    for (int v : n.outputs) needs[v] = any;
  }
  struct Row {
    const Node* n;
    int count;
    bool dx;
  };
  std::vector<std::pair<std::string, Row>> rows;
  for (const Node& n : g.nodes) {
    if ((n.op != "Conv" && n.op != "ConvTranspose") || n.inputs.size() < 2 || n.inputs[0] < 0 || n.inputs[1] < 0)
      continue;
    std::string key = n.op + shape_str(g.values[n.inputs[0]].shape) + shape_str(g.values[n.inputs[1]].shape);
    for (const char* a : {"strides", "pads", "dilations", "output_padding"})
      if (n.attrs.count(a)) key += str(" ", a[0], shape_str(n.ints(a)));
    if (n.i("group", 1) != 1) key += str(" g", n.i("group", 1));
    const bool bias = n.inputs.size() > 2 && n.inputs[2] >= 0, dx = needs[n.inputs[0]];
    key += str(bias ? " bias" : "", dx ? "" : " (no dx)");
    auto it = std::find_if(rows.begin(), rows.end(), [&](auto& r) { return r.first == key; });
    if (it == rows.end()) rows.push_back({key, {&n, 1, dx}});
    else ++it->second.count;
  }
  if (rows.empty()) return;
  auto filled = [](const Shape& s, uint32_t seed) {
    Tensor t(DType::F32, s);
    for (int64_t i = 0; i < t.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      t.data<float>()[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
    return t;
  };
  auto min_ms = [&](auto&& f) {
    f();
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(best, seconds_since(t0) * 1e3);
    }
    return best;
  };
  std::printf("%-74s %5s %17s %17s %17s  %s\n", "conv (x, w, attributes)", "count", "forward ms GF/s",
              "bwd-data ms GF/s", "bwd-weights ms GF/s", "forward path");
  double total[3] = {0, 0, 0};
  for (auto& [key, r] : rows) {
    const Node& n = *r.n;
    std::vector<Tensor> in;
    for (size_t i = 0; i < n.inputs.size() && i < 3; ++i)
      in.push_back(n.inputs[i] >= 0 ? filled(g.values[n.inputs[i]].shape, 7 + (uint32_t)i) : Tensor());
    Tensor y(DType::F32, g.values[n.outputs[0]].shape), dy = filled(y.shape, 11);
    std::vector<const Tensor*> pin;
    std::vector<Tensor> gr;
    for (auto& t : in) {
      pin.push_back(t.defined() ? &t : nullptr);
      gr.push_back(t.defined() ? Tensor(DType::F32, t.shape) : Tensor());
    }
    const KernelFn fwd = kernel_for(n.op, KernelKind::Fast);
    const BackwardFn bwd = backward_kernel(n.op);
    auto gin = [&](bool data) {
      std::vector<Tensor*> p;
      for (size_t i = 0; i < gr.size(); ++i) p.push_back(gr[i].defined() && (i == 0) == data ? &gr[i] : nullptr);
      return p;
    };
    const Shape& ws = in[1].shape;
    const double gflop = 2.0 * (double)(n.op == "Conv" ? y.numel() : in[0].numel()) * (double)(in[1].numel() / ws[0]) / 1e9;
    const double ms[3] = {min_ms([&] { fwd(n, pin, {&y}); }),
                          r.dx ? min_ms([&] { bwd(n, pin, {&y}, {&dy}, gin(true)); }) : 0.0,
                          min_ms([&] { bwd(n, pin, {&y}, {&dy}, gin(false)); })};
    // a Conv with rows (mark_needed_rows) computes only those in its forward
    const std::vector<int64_t> rows = n.ints("rows");
    const double fwd_share = rows.size() == 2 && y.rank() == 4 && y.shape[2] > 0
                                 ? (double)std::clamp<int64_t>(rows[1] - rows[0], 0, y.shape[2]) / (double)y.shape[2]
                                 : 1.0;
    std::string cells;
    for (int k = 0; k < 3; ++k) {
      total[k] += ms[k] * r.count;
      char c[32];
      std::snprintf(c, sizeof c, " %9.1f %7.1f", ms[k], gflop * (k ? 1.0 : fwd_share) / ms[k] * 1e3);
      cells += ms[k] > 0 ? std::string(c) : std::string(18, ' ');
    }
    std::vector<Shape> shapes;
    for (auto& t : in) shapes.push_back(t.defined() ? t.shape : Shape{});
    const std::string path = cpu_kernel_info().path_of ? cpu_kernel_info().path_of(n, shapes) : "";
    std::printf("%-74s %5d%s  %s\n", key.c_str(), r.count, cells.c_str(), path.c_str());
  }
  std::printf("%-74s %5s %9.1f %7s %9.1f %7s %9.1f\n", "total ms per step (count x min)", "", total[0], "", total[1], "",
              total[2]);
}

// The run's planned peak per rank (train/plan.h), said in one line; a run that will not fit in
// cfg.memory (or what this machine has per rank) stops here, naming the options that would fit:
// the other meshes of as many ranks, else of 2, 4 or 8 times as many. 0 when not planned (a
// device's memory, an ensemble's members).
double check_plan(const FinetuneConfig& cfg, Mesh* mesh, const Tensor& input) {
  if (cfg.device != "cpu" || cfg.ensemble_size > 1) return 0;
  const int world = mesh ? mesh->world : 1;
  PlanRequest r;
  r.model = cfg.model;
  r.dtype = input.dtype;
  r.input = input.shape;
  r.ranks = world;
  r.accum = cfg.accum;
  r.cfg = cfg;
  r.only_tp = mesh ? mesh->tp : 1;
  r.only_domain = mesh ? mesh->domain : 1;
  r.in_mpi = world > 1;
  const bool given = cfg.memory > 0;
  r.memory = given ? cfg.memory : available_per_rank(world);
  const Plan p = plan_run(r);
  WXE_CHECK(!p.rows.empty(), cfg.model, ": no plan for this mesh: ", p.refused.empty() ? "" : p.refused[0]);
  const PlanRow& row = p.rows[0];
  note("wxe: plan: predicted peak %.0f MB per rank (parameters, gradients and AdamW state %.1f MB, activations at "
       "the peak %.1f MB, other tensors %.1f MB, program and slack %.0f MB)\n",
       row.peak / 1e6, (row.params + row.grads + row.adamw) / 1e6, row.activations / 1e6, row.other / 1e6,
       row.overhead / 1e6);
  if (row.fits) return row.peak;
  std::string fit;
  r.only_tp = r.only_domain = 0;
  r.in_mpi = false;
  r.resident = p.resident;  // not the heap this plan left
  for (int ranks : {world, 2 * world, 4 * world, 8 * world}) {
    r.ranks = ranks;
    fit = fitting_options(plan_run(r));
    if (!fit.empty()) break;
  }
  char gb[64];
  std::snprintf(gb, sizeof gb, "predicted %.3g GB per rank > %.3g GB ", row.peak / 1e9, r.memory / 1e9);
  fail(str(gb, given ? "given (--memory)" : "available on this machine per rank", ": ",
           fit.empty() ? str("no mesh of up to ", 8 * world, " ranks with or without --activation-checkpoint blocks fits")
                       : fit + " would fit"));
  return 0;
}

}  // namespace

int run_finetune(const FinetuneConfig& cfg, Mesh* mesh) {
  WXE_CHECK(cfg.steps >= 1, "--steps must be at least 1");
  WXE_CHECK(!cfg.save.empty(), "--save DIR is required");
  auto t_start = std::chrono::steady_clock::now();
  std::unique_ptr<SampleSource> data = cfg.open_data ? cfg.open_data() : open_npy_dir(cfg.data, cfg.forecast_len);
  note("wxe: data: %s\n", data->describe().c_str());
  const double predicted = check_plan(cfg, mesh, data->get(0).input);
  lean_heap(cfg);
  Trainer t(cfg, std::move(data), mesh);
  const bool lead = !mesh || mesh->rank == 0;
  if (mesh && mesh->tp > 1)
    note("wxe: tensor parallel over %d ranks: %d column- and %d row-parallel layers, %d + %d all-reduces per "
         "forward + backward, %zu parameters sharded\n",
         mesh->tp, t.tp_stats().column, t.tp_stats().row, t.tp_stats().all_reduces, t.tp_stats().copies,
         t.tp_slices().size());
  if (mesh && mesh->tp > 1 && t.sp_stats().reduce_scatters)
    note("wxe: sequence parallel: %d reduce-scatters and %d gathers (+%d before replicated ops) keep bands of "
         "latitudes between the tp-sharded layers\n",
         t.sp_stats().reduce_scatters, t.sp_stats().gathers, t.sp_stats().replicated_gathers);
  if (mesh && mesh->world > 1)
    note("wxe: mesh dp %d x tp %d x domain %d: %d micro-batches per step per data-parallel group; optimizer "
         "state %.1f MiB per rank\n",
         mesh->dp, mesh->tp, mesh->domain, cfg.ensemble_size > 1 ? cfg.accum : cfg.accum / mesh->dp,  // an ensemble's: each
         t.optimizer_bytes() / 1048576.0);
  note("wxe: training %lld parameters (%zu tensors); %zu nodes; accum %d, forecast_len %d\n",
       (long long)t.trainable_count(), t.executor().trainable().size(), t.graph().nodes.size(), cfg.accum,
       cfg.forecast_len);
  const std::string log_path = (fs::path(cfg.save) / "training_log.csv").string();
  std::vector<LogRow> rows = cfg.resume ? read_log(log_path, t.steps_done()) : std::vector<LogRow>{};
  if (lead) {
    fs::create_directories(cfg.save);
    write_log(log_path, rows, cfg.validate ? cfg.validate_columns : std::vector<std::string>{});
  }
  const bool had_checkpoint = fs::exists(fs::path(cfg.save) / "latest");
  const bool tty = isatty(fileno(stderr));
  const int64_t first = t.steps_done();
  double run_s = 0;
  std::string last_ckpt;
  if (first >= cfg.steps) note("wxe: already at step %lld of %lld\n", (long long)first, (long long)cfg.steps);
  Backend* dev = cfg.device == "cpu" ? nullptr : &backend_for(cfg.device);
  reset_peaks(dev);
  while (t.steps_done() < cfg.steps) {
    StepLog s;
    try {
      s = t.step();
    } catch (const NonFiniteLoss& e) {  // every rank sees the same all-reduced loss: all stop here
      if (!lead) return 4;
      if (tty && cfg.progress) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "wxe: error: %s\n", e.what());
      const std::string latest = latest_checkpoint(cfg.save);
      if (!latest.empty()) {
        std::fprintf(stderr, "wxe: the last good checkpoint is %s\n", latest.c_str());
      } else {
        std::fprintf(stderr, "wxe: no checkpoint was written\n");
      }
      return 4;
    }
    run_s += s.seconds;
    if (t.steps_done() == first + 1) {  // after the first step: what each rank holds
      if (tty && cfg.progress) std::fprintf(stderr, "\n");
      const std::vector<float> mine = report_memory(t, mesh, "wxe: memory: ", dev);
      if (predicted > 0)
        note("wxe: plan: predicted peak %.0f MB per rank; measured after step 1: %.0f MB (%+.1f%%)\n", predicted / 1e6,
             mine[6] / 1e6, 100.0 * (mine[6] - predicted) / predicted);
    }
    rows.push_back({s.step, s.loss, s.lr, s.grad_norm, s.samples / s.seconds, s.seconds, s.data_wait, ""});
    double valid_loss = NAN;
    if (cfg.validate) {
      std::string& tail = rows.back().tail;
      if ((cfg.validate_every > 0 && s.step % cfg.validate_every == 0) || s.step == cfg.steps) {
        std::vector<double> v = cfg.validate([&](const Tensor& x) { return t.predict(x); });
        WXE_ASSERT(v.size() == cfg.validate_columns.size());
        for (double d : v) tail += str(",", d);
        valid_loss = v[0];
      } else {
        tail = std::string(cfg.validate_columns.size(), ',');
      }
    }
    // a plateau schedule reads the metric of each epoch at its end, as CREDIT's trainer: the
    // validation loss, or without validation the epoch's mean training loss
    const Schedule& sc = t.schedule();
    if (sc.kind == ScheduleKind::Plateau && s.step < cfg.steps && sc.epoch_of(s.step) != sc.epoch_of(s.step - 1)) {
      double m = valid_loss;
      if (std::isnan(m)) {
        double sum = 0;
        int64_t n = 0;
        for (const LogRow& r : rows)
          if (r.step >= 1 && sc.epoch_of(r.step - 1) == sc.epoch_of(s.step - 1)) {
            sum += r.loss;
            ++n;
          }
        m = sum / (double)std::max<int64_t>(n, 1);
      }
      t.record_epoch_metric(m);
    }
    if (lead) {
      std::ofstream f(log_path, std::ios::app);
      f << csv_row(rows.back()) << "\n";
    }
    const int64_t done = s.step - first, left = cfg.steps - s.step;
    const double eta = run_s / done * left;
    if (cfg.progress && !g_quiet) {
      if (tty) {
        const int width = 24, fill = (int)(width * s.step / cfg.steps);
        std::fprintf(stderr, "\r[%s%s] step %lld/%lld  loss %.4e  lr %.2e  %.2f samples/s  data %.0f%%  ETA %s   ",
                     std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), (long long)s.step,
                     (long long)cfg.steps, s.loss, s.lr, s.samples / s.seconds, 100 * s.data_wait / s.seconds,
                     fmt_time(eta).c_str());
        if (!left) std::fprintf(stderr, "\n");
      } else {
        std::fprintf(stderr, "wxe: step %lld/%lld loss %.6e lr %.3e grad_norm %.3e %.2f samples/s data wait %.3f s ETA %s\n",
                     (long long)s.step, (long long)cfg.steps, s.loss, s.lr, s.grad_norm, s.samples / s.seconds,
                     s.data_wait, fmt_time(eta).c_str());
      }
    }
    if (cfg.save_every > 0 && s.step % cfg.save_every == 0 && left > 0) {
      try {
        last_ckpt = t.save_checkpoint();
      } catch (const Error& e) {  // one process: the run goes on in memory, the next save tries again
        if (mesh && mesh->world > 1) throw;
        note("\nwxe: warning: %s; training goes on, the next save tries again\n", e.what());
      }
      if (lead) plot(cfg, rows);
    }
  }
  if (t.steps_done() > first || !had_checkpoint) last_ckpt = t.save_checkpoint();
  if (!lead) return 0;
  plot(cfg, rows);
  std::printf("trained %lld steps in %.1f s; final loss %.6g; checkpoint %s; log %s; peak RSS %.0f MB\n",
              (long long)(t.steps_done() - first), seconds_since(t_start), rows.empty() ? NAN : rows.back().loss,
              last_ckpt.empty() ? "(unchanged)" : last_ckpt.c_str(), log_path.c_str(), peak_rss_mb());
  return 0;
}

int run_train_bench(const std::string& model, const std::string& input, const std::string& weights, int threads,
                    int runs, bool json, const std::string& device, const std::string& activation_checkpoint,
                    const std::string& precision, int nodes) {
  WXE_CHECK(runs >= 1, "--runs must be at least 1");
  Tensor x = read_npy(input);
  // the output shape comes from a throwaway import (gone before the trainer loads its own copy
  // of the weights); the target is zeros of it
  Tensor y;
  {
    Graph probe = import_onnx(model);
    WXE_CHECK(probe.inputs.size() == 1, model, ": bench --train needs a model with one input");
    prepare_graph(probe, {{probe.values[probe.inputs[0]].name, {x.dtype, x.shape}}});
    y = Tensor::zeros(DType::F32, probe.values[probe.outputs[0]].shape);
  }
  FinetuneConfig cfg;
  cfg.model = model;
  cfg.weights = weights;
  cfg.threads = threads;
  cfg.schedule.lr = 1e-4;
  cfg.device = device;
  cfg.activation_checkpoint = activation_checkpoint;
  cfg.precision = precision;
  lean_heap(cfg);
  Trainer t(cfg, std::make_unique<FixedSource>(x, y));
  t.step();  // warm-up
  Backend* dev = device == "cpu" ? nullptr : &backend_for(device);
  reset_peaks(dev);
  std::map<std::string, OpProfile> warm = t.executor().profile();
  std::vector<double> warm_nodes = t.executor().node_profile();
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    StepLog s = t.step();
    ms.push_back(s.seconds * 1e3);
    std::fprintf(stderr, "wxe: training step %d/%d: %.1f ms (loss %.4g)\n", r + 1, runs, ms.back(), s.loss);
  }
  // the steps' memory, before the per-op and per-conv profiles below (which time convolutions
  // again, on tensors of their own)
  const double rss = peak_rss_mb();
  const std::vector<float> mem = report_memory(t, nullptr, "wxe: memory: ", dev);
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  int profiled = runs;
  if (dev) {  // timing each op waits for each kernel: one more step, after the timed ones
    t.set_profile(true);
    warm = t.executor().profile();
    warm_nodes = t.executor().node_profile();
    t.step();
    profiled = 1;
  }
  std::vector<std::pair<double, std::string>> by_op;
  for (auto& [op, p] : t.executor().profile()) by_op.push_back({(p.ms - warm[op].ms) / profiled, op});
  std::sort(by_op.rbegin(), by_op.rend());
  if (!by_op.empty()) std::printf("%-36s %10s\n", "op type (forward / backward)", "ms/step");
  for (size_t i = 0; i < by_op.size() && i < 20; ++i) std::printf("%-36s %10.2f\n", by_op[i].second.c_str(), by_op[i].first);
  if (nodes > 0) std::printf("%s", slowest_nodes(t.executor().graph(), t.executor().node_profile(), warm_nodes, profiled, nodes).c_str());
  if (device == "cpu") std::printf("%s", cpu_paths_report(t.executor().graph()).c_str());
  if (device == "cpu") print_conv_profile(t.executor(), 3);
  // what ran: bf16 only where the CPU multiplies it natively (the Trainer said so otherwise)
  std::string why;
  const std::string ran =
      device == "cpu" && cpu_precision(precision == "bf16" ? Precision::BF16 : Precision::F32, &why) == Precision::F32
          ? "fp32"
          : precision;
  std::printf("training step over %d runs: min %.1f ms, median %.1f ms, max %.1f ms; peak RSS %.1f MB; threads %d; "
              "device %s; precision %s; %lld trainable parameters\n",
              runs, sorted.front(), median, sorted.back(), rss, threads, device.c_str(), ran.c_str(),
              (long long)t.trainable_count());
  if (json)
    std::printf("{\"model\": \"%s\", \"mode\": \"train\", \"device\": \"%s\", \"precision\": \"%s\", \"threads\": %d, \"runs\": %d, "
                "\"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, \"peak_rss_mb\": %.1f, \"params_mb\": %.1f, "
                "\"grads_mb\": %.1f, \"adamw_mb\": %.1f, \"kept_mb\": %.1f, \"transient_mb\": %.1f, "
                "\"tensors_peak_mb\": %.1f, \"device_peak_mb\": %.1f, \"step_block_mb\": %.1f}\n",
                model.c_str(), device.c_str(), ran.c_str(), threads, runs, median, sorted.front(), sorted.back(), rss,
                mem[0] / 1e6, mem[1] / 1e6, mem[2] / 1e6, mem[3] / 1e6, mem[4] / 1e6, mem[5] / 1e6, mem[7] / 1e6,
                mem[8] / 1e6);
  return 0;
}

}  // namespace wxe
