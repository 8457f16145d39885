// Nothing the user had is lost, nothing outside the run is read: fine-tuning checkpoints under
// hostile or failing conditions (issue 23's fuzz findings). A FIFO that the reader opened
// blocking would hang the test instead of failing it; each such case runs under a watchdog.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "engine/io/safetensors.h"
#include "load/checkpoint.h"
#include "parallel/sharded_checkpoint.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

namespace fs = std::filesystem;

namespace wxe::test {
namespace {

const Shape kX = {1, 7, 1, 32, 64}, kY = {1, 6, 1, 32, 64};

// f's error message, or "<hang>" when it does not return within 20 s (a blocked FIFO read).
template <class F>
std::string error_or_hang(F f) {
  auto task = std::make_shared<std::packaged_task<std::string()>>([f] { return error_of(f); });
  std::future<std::string> r = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (r.wait_for(std::chrono::seconds(20)) != std::future_status::ready) return "<hang>";
  return r.get();
}

// A run with one checkpoint (step 1) in `save`.
FinetuneConfig one_step_run(const std::string& name) {
  const std::string data = make_series(name + "_data", 2, kX, kY, 7);
  FinetuneConfig c = tiny_config(data, tmp_path(name));
  fs::remove_all(c.save);
  c.accum = 1;
  Trainer t(c, open_npy_dir(data, 1));
  run_steps(t, 1);
  t.save_checkpoint();
  return c;
}

TEST(CheckpointSafety, LatestMustNameAStepDirectoryInsideTheRun) {
  FinetuneConfig c = one_step_run("latest_names");
  c.resume = true;
  const std::string data = c.data;
  fs::create_directories(tmp_path("latest_outside/step_000001"));
  for (const std::string& bad : {std::string("../latest_outside/step_000001"), tmp_path("latest_outside/step_000001"),
                                 std::string("step_000009"), std::string("model.onnx")}) {
    spit(c.save + "/latest", bad + "\n");
    const std::string e = error_or_hang([&] { Trainer t(c, open_npy_dir(data, 1)); });
    EXPECT_NE(e.find(c.save + "/latest"), std::string::npos) << bad << ": " << e;
    EXPECT_EQ(e.find("<no error>"), std::string::npos) << bad;
  }
  fs::remove(c.save + "/latest");
  ASSERT_EQ(::mkfifo((c.save + "/latest").c_str(), 0600), 0);
  const std::string e = error_or_hang([&] { Trainer t(c, open_npy_dir(data, 1)); });
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  fs::remove(c.save + "/latest");
  spit(c.save + "/latest", "step_000001\n");
  EXPECT_EQ(error_of([&] { Trainer t(c, open_npy_dir(data, 1)); }), "<no error>");
}

TEST(CheckpointSafety, FifosAreRefusedNotWaitedFor) {
  const std::string dir = tmp_path("fifo_safetensors");
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  const std::string e = error_or_hang([&] { read_safetensors(dir + "/model.safetensors"); });
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
}

TEST(CheckpointSafety, BadNumbersInTheMetadataAreNamed) {
  FinetuneConfig c = one_step_run("bad_meta");
  c.resume = true;
  const std::string opt = c.save + "/step_000001/optimizer.safetensors";
  std::map<std::string, std::string> meta;
  const NamedTensors moments = read_safetensors(opt, &meta);
  for (const char* bad : {"abc", "", "1e20", "7x", "99999999999999999999", "-3"}) {
    std::map<std::string, std::string> m = meta;
    m["adam_step"] = bad;
    write_safetensors(opt, moments, m);
    const std::string e = error_of([&] { Trainer t(c, open_npy_dir(c.data, 1)); });
    EXPECT_NE(e.find("metadata 'adam_step'"), std::string::npos) << bad << ": " << e;
  }
}

TEST(CheckpointSafety, ResumeChecksShapesNotOnlyCounts) {
  FinetuneConfig c = one_step_run("resume_shapes");
  c.resume = true;
  const std::string model = c.save + "/step_000001/model.safetensors";
  std::map<std::string, std::string> meta;
  NamedTensors w = read_safetensors(model, &meta);
  std::string swapped;
  for (auto& [n, t] : w)
    if (t.shape.size() >= 2 && t.shape[0] != t.shape[1] && swapped.empty()) {
      std::swap(t.shape[0], t.shape[1]);  // same elements, another shape
      swapped = n;
    }
  ASSERT_FALSE(swapped.empty());
  write_safetensors(model, w, meta);
  const std::string e = error_of([&] { Trainer t(c, open_npy_dir(c.data, 1)); });
  EXPECT_NE(e.find("'" + swapped + "'"), std::string::npos) << e;
}

// --keep counts by step number: after step 999999 comes step 1000000 (as text it sorts first).
TEST(CheckpointSafety, KeepSortsStepsByNumber) {
  const std::string data = make_series("keep_data", 2, kX, kY, 9);
  FinetuneConfig c = tiny_config(data, tmp_path("keep_numeric"));
  fs::remove_all(c.save);
  c.accum = 1;
  c.keep = 1;
  fs::create_directories(c.save + "/step_999999");
  fs::create_directories(c.save + "/step_1000000");
  Trainer t(c, open_npy_dir(data, 1));
  run_steps(t, 1);
  t.save_checkpoint();  // keeps itself and the newest other: step 1000000
  EXPECT_TRUE(fs::exists(c.save + "/step_000001"));
  EXPECT_TRUE(fs::exists(c.save + "/step_1000000"));
  EXPECT_FALSE(fs::exists(c.save + "/step_999999"));
}

// A save that cannot be written (here: a file size limit, as a full disk) leaves no temporary
// directory, keeps latest on the last good checkpoint, and says which that is; the trainer goes
// on and its next save succeeds.
TEST(CheckpointSafety, AFailedSaveLosesNothing) {
  const std::string data = make_series("failed_save_data", 2, kX, kY, 13);
  FinetuneConfig c = tiny_config(data, tmp_path("failed_save"));
  fs::remove_all(c.save);
  c.accum = 1;
  Trainer t(c, open_npy_dir(data, 1));
  run_steps(t, 1);
  const std::string good = t.save_checkpoint();
  run_steps(t, 1);
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string e = error_of([&] { t.save_checkpoint(); });
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_NE(e.find("step 2: the checkpoint could not be written"), std::string::npos) << e;
  EXPECT_NE(e.find("the last good checkpoint is " + good), std::string::npos) << e;
  for (auto& entry : fs::directory_iterator(c.save))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  EXPECT_EQ(slurp(c.save + "/latest"), "step_000001\n");
  EXPECT_EQ(error_of([&] { t.save_checkpoint(); }), "<no error>");
  EXPECT_EQ(slurp(c.save + "/latest"), "step_000002\n");
}

// index.json: piece files are the checkpoint's own rank_NNNNN.safetensors (no NUL, no other
// name, no symlink out of the directory), and an empty tensor's pieces are opened and checked.
TEST(CheckpointSafety, ShardedIndexPiecesAreChecked) {
  const std::string dir = tmp_path("index_pieces");
  fs::remove_all(dir);
  std::vector<ShardPiece> pieces = {{"w", {2, 3}, {}, randn({2, 3}, 1), true},
                                    {"empty", {0, 6}, {}, Tensor(DType::F32, {0, 6}), true}};
  write_sharded(dir, {pieces});
  const std::string index = slurp(dir + "/index.json");
  ASSERT_NE(index.find("rank_00000.safetensors"), std::string::npos);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string j = index;
    for (size_t p = j.find(from); p != std::string::npos; p = j.find(from, p + to.size())) j.replace(p, from.size(), to);
    spit(dir + "/index.json", j);
  };
  with("rank_00000.safetensors", "rank_00000.safetensors\\u0000x");
  EXPECT_NE(error_of([&] { ShardedCheckpoint ck(dir); }).find("not a rank_NNNNN.safetensors name"), std::string::npos);
  with("rank_00000.safetensors", "model.onnx");
  EXPECT_NE(error_of([&] { ShardedCheckpoint ck(dir); }).find("not a rank_NNNNN.safetensors name"), std::string::npos);
  // a rank file that is a symlink to a file outside the checkpoint
  with("rank_00000.safetensors", "rank_00000.safetensors");
  const std::string outside = tmp_path("index_pieces_outside.safetensors");
  fs::copy_file(dir + "/rank_00000.safetensors", outside, fs::copy_options::overwrite_existing);
  fs::remove(dir + "/rank_00000.safetensors");
  fs::create_symlink(outside, dir + "/rank_00000.safetensors");
  const std::string sym = error_of([&] { ShardedCheckpoint(dir).read("w", {}); });
  EXPECT_NE(sym.find("is a symlink"), std::string::npos) << sym;
  // an empty tensor whose piece file is missing
  fs::remove(dir + "/rank_00000.safetensors");
  EXPECT_NE(error_of([&] { ShardedCheckpoint(dir).read("empty", {}); }).find("rank_00000.safetensors"), std::string::npos);
}


// Resumed state is checked (issue 41): a NaN exp_avg, a negative exp_avg_sq, a NaN EMA or an inf
// parameter is refused naming its file and tensor (was: trained into NaN parameters saved as
// the next step with latest on them, or an EMA carried on NaN).
TEST(CheckpointSafety, ResumedStateMustBeFinite) {
  const std::string data = make_series("resume_state_data", 2, kX, kY, 17);
  FinetuneConfig c = tiny_config(data, tmp_path("resume_state"));
  fs::remove_all(c.save);
  c.accum = 1;
  c.ema = true;
  {
    Trainer t(c, open_npy_dir(data, 1));
    run_steps(t, 1);
    t.save_checkpoint();
  }
  c.resume = true;
  const std::string step = c.save + "/step_000001";
  std::map<std::string, std::string> meta;
  const std::string first = read_safetensors(step + "/ema.safetensors", &meta).at(0).first;
  struct Case {
    const char* file;
    std::string tensor;
    float value;
    const char* want;
  };
  for (const Case& k : {Case{"optimizer", "exp_avg." + first, NAN, "not finite"},
                        Case{"optimizer", "exp_avg_sq." + first, -1.f, "exp_avg_sq must be finite and >= 0"},
                        Case{"ema", first, NAN, "not finite"}, Case{"model", first, INFINITY, "not finite"}}) {
    SCOPED_TRACE(k.tensor);
    const std::string file = step + "/" + k.file + ".safetensors";
    const std::string keep = slurp(file);
    std::map<std::string, std::string> m;
    NamedTensors ts = read_safetensors(file, &m);
    bool found = false;
    for (auto& [n, x] : ts)
      if (n == k.tensor) {
        x = x.clone();
        x.data<float>()[x.numel() / 2] = k.value;
        found = true;
      }
    ASSERT_TRUE(found);
    write_safetensors(file, ts, m);
    const std::string e = error_of([&] { Trainer t(c, open_npy_dir(data, 1)); });
    EXPECT_NE(e.find(file + ": tensor '" + k.tensor + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(k.want), std::string::npos) << e;
    spit(file, keep);
  }
  EXPECT_EQ(error_of([&] { Trainer t(c, open_npy_dir(data, 1)); }), "<no error>");
}

// A step that made the parameters NaN is never saved: latest stays on the last good checkpoint,
// which the error names.
TEST(CheckpointSafety, NonFiniteParametersAreNeverSaved) {
  const std::string data = make_series("nan_save_data", 2, kX, kY, 19);
  FinetuneConfig c = tiny_config(data, tmp_path("nan_save"));
  fs::remove_all(c.save);
  c.accum = 1;
  Trainer t(c, open_npy_dir(data, 1));
  run_steps(t, 1);
  const std::string good = t.save_checkpoint();
  run_steps(t, 1);
  NamedTensors ps = t.parameters();
  ps.at(0).second.data<float>()[0] = NAN;  // as an update from NaN moments leaves them
  const std::string e = error_of([&] { t.save_checkpoint(); });
  EXPECT_NE(e.find("step 2: 1 parameter values are NaN or inf (in '" + ps.at(0).first + "')"), std::string::npos) << e;
  EXPECT_NE(e.find("the last good checkpoint is " + good), std::string::npos) << e;
  EXPECT_EQ(slurp(c.save + "/latest"), "step_000001\n");
  EXPECT_FALSE(fs::exists(c.save + "/step_000002"));
}

// A resume that changes what the run trains says so in one line (was: nothing).
TEST(CheckpointSafety, ResumeSaysWhatItChanges) {
  const std::string data = make_series("resume_changes_data", 2, kX, kY, 23);
  FinetuneConfig c = tiny_config(data, tmp_path("resume_changes"));
  fs::remove_all(c.save);
  c.accum = 1;
  c.ema = true;
  {
    Trainer t(c, open_npy_dir(data, 1));
    run_steps(t, 1);
    t.save_checkpoint();
  }
  c.resume = true;
  testing::internal::CaptureStderr();
  { Trainer same(c, open_npy_dir(data, 1)); }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("warning"), std::string::npos);
  c.accum = 2;
  c.forecast_len = 1;
  c.freeze = {"*bias*"};
  c.schedule.kind = ScheduleKind::Constant;
  c.ema = false;
  testing::internal::CaptureStderr();
  { Trainer other(c, open_npy_dir(data, 1)); }
  const std::string err = testing::internal::GetCapturedStderr();
  for (const char* want : {"wxe: warning: resuming ", "--accum 2 (the checkpoint's 1)", "--freeze *bias* (the checkpoint's (none))",
                           "--schedule constant (the checkpoint's linear-warmup-cosine)", "no --ema (the checkpoint's EMA of the weights is dropped)"})
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n" << err;
}


// Latitudes from a config's data (not a lat.npy) of another length than the model's rows: the
// error names the data, not a DIR/lat.npy that does not exist (issue 41).
TEST(CheckpointSafety, LatitudesOfTheDataAreNamedAsSuch) {
  const std::string data = make_series("lat_named_data", 1, kX, kY, 29);
  FinetuneConfig c = tiny_config(data, tmp_path("lat_named"));
  c.lat = {-10, 0, 10};
  const std::string e = error_of([&] { Trainer t(c, open_npy_dir(data, 1)); });
  EXPECT_NE(e.find(data + ": the data's latitude coordinate: 3 latitudes, the output has 32 rows"), std::string::npos) << e;
}


// A write of latest killed (kill -9) before its rename leaves RUN/.latest.XXXXXX: the next save
// removes it (was: kept forever).
TEST(CheckpointSafety, KilledLatestTempIsRemovedByTheNextSave) {
  const std::string data = make_series("latest_tmp_data", 1, kX, kY, 31);
  FinetuneConfig c = tiny_config(data, tmp_path("latest_tmp"));
  fs::remove_all(c.save);
  c.accum = 1;
  fs::create_directories(c.save);
  spit(c.save + "/.latest.Ab3xYz", "step_000007\n");
  Trainer t(c, open_npy_dir(data, 1));
  run_steps(t, 1);
  t.save_checkpoint();
  EXPECT_FALSE(fs::exists(c.save + "/.latest.Ab3xYz"));
  EXPECT_EQ(slurp(c.save + "/latest"), "step_000001\n");
}

}  // namespace
}  // namespace wxe::test
