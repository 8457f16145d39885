// Hostile and careless input (issue 11): one regression test per class of bug. Every bad file
// is made here; each must give one Error naming the file, node or tensor, never a crash, a hang
// or a read outside the model's directory.
#include <onnx/onnx_pb.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/io/file_util.h"
#include "engine/io/glob.h"
#include "engine/passes/layout_rules.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "parallel/mesh.h"
#include "parallel/shard.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("wxe_hostile_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

onnx::ValueInfoProto* add_float_input(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims) {
  auto* in = g->add_input();
  in->set_name(name);
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  return in;
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> ins,
                          std::vector<std::string> outs) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(op + "_" + std::to_string(g->node_size()));
  for (auto& i : ins) n->add_input(i);
  for (auto& o : outs) n->add_output(o);
  return n;
}

void add_int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void add_i64_init(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims((int64_t)v.size());
  for (int64_t x : v) t->add_int64_data(x);
}

onnx::ModelProto model_with(std::function<void(onnx::GraphProto*)> body) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_float_input(g, "x", {2, 4});
  g->add_output()->set_name("y");
  body(g);
  return m;
}

std::string save(const onnx::ModelProto& m, const fs::path& path) {
  std::ofstream f(path, std::ios::binary);
  m.SerializeToOstream(&f);
  return path.string();
}

// import + shape inference with constant folding: where hostile shapes and attributes bite
std::string load_error(const std::string& path) {
  return error_of([&] {
    Graph g = import_onnx(path);
    simplify(g, {{"x", {DType::F32, {2, 4}}}});
  });
}

// y = x * w, w external at `location`
onnx::ModelProto external_model(const std::string& location, const std::string& offset = "0",
                                const std::string& length = "16") {
  return model_with([&](onnx::GraphProto* g) {
    auto* w = g->add_initializer();
    w->set_name("w");
    w->set_data_type(onnx::TensorProto::FLOAT);
    w->add_dims(4);
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    for (auto [k, v] : {std::pair<std::string, std::string>{"location", location}, {"offset", offset}, {"length", length}}) {
      auto* e = w->add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    add_node(g, "Mul", {"x", "w"}, {"y"});
  });
}

}  // namespace

// Security: `location` may not leave the model's directory (absolute, "..", a symlink out).
TEST(HostileInput, ExternalDataStaysInsideTheModelDirectory) {
  fs::path root = fresh_dir("ext");
  fs::create_directories(root / "model");
  float w[4] = {1, 2, 3, 4};
  std::ofstream(root / "secret.bin", std::ios::binary).write((const char*)w, sizeof w);
  std::ofstream(root / "model/ok.bin", std::ios::binary).write((const char*)w, sizeof w);
  fs::create_symlink(root / "secret.bin", root / "model/link.bin");
  EXPECT_EQ(load_error(save(external_model("ok.bin"), root / "model/ok.onnx")), "<no error>");
  std::string e = load_error(save(external_model((root / "secret.bin").string()), root / "model/abs.onnx"));
  EXPECT_NE(e.find("must be a relative path"), std::string::npos) << e;
  EXPECT_NE(e.find("initializer 'w'"), std::string::npos) << e;
  e = load_error(save(external_model("../secret.bin"), root / "model/dotdot.onnx"));
  EXPECT_NE(e.find("outside the model's directory"), std::string::npos) << e;
  e = load_error(save(external_model("sub/../../secret.bin"), root / "model/dotdot2.onnx"));
  EXPECT_NE(e.find("outside the model's directory"), std::string::npos) << e;
  e = load_error(save(external_model("link.bin"), root / "model/link.onnx"));
  EXPECT_NE(e.find("outside the model's directory"), std::string::npos) << e;
  e = load_error(save(external_model("/etc/passwd"), root / "model/passwd.onnx"));
  EXPECT_NE(e.find("relative path"), std::string::npos) << e;
}

// A FIFO (or a directory) as external data: an error at once, not a read that never returns.
TEST(HostileInput, ExternalDataMustBeARegularFile) {
  fs::path root = fresh_dir("fifo");
  ASSERT_EQ(::mkfifo((root / "pipe.bin").c_str(), 0600), 0);
  fs::create_directories(root / "dir.bin");
  auto t0 = std::chrono::steady_clock::now();
  std::string e = load_error(save(external_model("pipe.bin"), root / "fifo.onnx"));
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  EXPECT_NE(e.find("pipe.bin"), std::string::npos) << e;
  e = load_error(save(external_model("dir.bin"), root / "dir.onnx"));
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // the model itself as a FIFO or a directory
  ASSERT_EQ(::mkfifo((root / "model_pipe.onnx").c_str(), 0600), 0);
  e = load_error((root / "model_pipe.onnx").string());
  EXPECT_NE(e.find("model_pipe.onnx: is not a regular file"), std::string::npos) << e;
  e = load_error(root.string());
  EXPECT_NE(e.find(root.string() + ": is a directory"), std::string::npos) << e;
}

// offset + length near INT64_MAX, negative or non-numeric: no overflow, the file named.
TEST(HostileInput, ExternalDataOffsetsCannotOverflow) {
  fs::path root = fresh_dir("offset");
  float w[4] = {1, 2, 3, 4};
  std::ofstream(root / "w.bin", std::ios::binary).write((const char*)w, sizeof w);
  std::string e = load_error(save(external_model("w.bin", "9223372036854775800", "16"), root / "big.onnx"));
  EXPECT_NE(e.find("w.bin is truncated"), std::string::npos) << e;
  e = load_error(save(external_model("w.bin", "-8", "16"), root / "neg.onnx"));
  EXPECT_NE(e.find("not a non-negative 64-bit number"), std::string::npos) << e;
  e = load_error(save(external_model("w.bin", "0", "99999999999999999999"), root / "huge.onnx"));
  EXPECT_NE(e.find("not a non-negative 64-bit number"), std::string::npos) << e;
}

// Element counts and byte sizes that overflow: an Error, never a small allocation written past.
TEST(HostileInput, HugeShapesAreErrorsNotOverflows) {
  const int64_t big = int64_t(1) << 62;
  EXPECT_NE(error_of([&] { numel({big, 4}); }).find("too many elements"), std::string::npos);
  EXPECT_NE(error_of([&] { Tensor t(DType::F32, {big, 1}); }).find("no valid byte size"), std::string::npos);
  EXPECT_NE(error_of([&] { Tensor t(DType::F32, {int64_t(1) << 50}); }).find("more than the"), std::string::npos);
  fs::path root = fresh_dir("huge");
  // ConstantOfShape (2^62, 4), Expand to (2^62, 4), Range over 1e30: the node is named
  std::string e = load_error(save(model_with([&](onnx::GraphProto* g) {
    add_i64_init(g, "shape", {big, 4});
    add_node(g, "ConstantOfShape", {"shape"}, {"c"});
    add_node(g, "Add", {"x", "c"}, {"y"});
  }), root / "cos.onnx"));
  EXPECT_NE(e.find("ConstantOfShape"), std::string::npos) << e;
  e = load_error(save(model_with([&](onnx::GraphProto* g) {
    add_i64_init(g, "shape", {big, 2, 4});
    add_node(g, "Expand", {"x", "shape"}, {"y"});
  }), root / "expand.onnx"));
  EXPECT_NE(e.find("Expand"), std::string::npos) << e;
  e = load_error(save(model_with([&](onnx::GraphProto* g) {
    for (auto [n, v] : {std::pair<const char*, float>{"s", 0.f}, {"l", 1e30f}, {"d", 1.f}}) {
      auto* t = g->add_initializer();
      t->set_name(n);
      t->set_data_type(onnx::TensorProto::FLOAT);
      t->add_float_data(v);
    }
    add_node(g, "Range", {"s", "l", "d"}, {"r"});
    add_node(g, "Add", {"x", "r"}, {"y"});
  }), root / "range.onnx"));
  EXPECT_NE(e.find("Range"), std::string::npos) << e;
  // ConvTranspose whose strides overflow the output size; Softmax over a (2^62, 4) input
  for (int64_t stride : {int64_t(1) << 40, int64_t(1) << 31}) {
    e = load_error(save(model_with([&](onnx::GraphProto* g) {
      add_i64_init(g, "shape", {1, 2, 2, 2});
      add_node(g, "Reshape", {"x", "shape"}, {"r"});
      auto* w = g->add_initializer();
      w->set_name("w");
      w->set_data_type(onnx::TensorProto::FLOAT);
      for (int d : {2, 1, 1, 1}) w->add_dims(d);
      w->set_raw_data(std::string(8, '\0'));
      auto* ct = add_node(g, "ConvTranspose", {"r", "w"}, {"y"});
      auto* a = ct->add_attribute();
      a->set_name("strides");
      a->set_type(onnx::AttributeProto::INTS);
      a->add_ints(stride);
      a->add_ints(stride);
    }), root / "convt.onnx"));
    EXPECT_NE(e.find("ConvTranspose"), std::string::npos) << e;
  }
  e = load_error(save(model_with([&](onnx::GraphProto* g) {
    add_i64_init(g, "shape", {big, 4});
    add_node(g, "ConstantOfShape", {"shape"}, {"c"});
    add_node(g, "Softmax", {"c"}, {"y"});
  }), root / "softmax.onnx"));
  EXPECT_NE(e.find("node"), std::string::npos) << e;
  // an .npy of shape (2^62, 1): the file named, nothing allocated
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 1), }";
  h.append(63 - (10 + h.size()) % 64, ' ');
  h += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + char(h.size() & 255) + char(h.size() >> 8) + h;
  spit((root / "huge.npy").string(), bytes + std::string(64, '\0'));
  e = error_of([&] { read_npy((root / "huge.npy").string()); });
  EXPECT_NE(e.find("huge.npy"), std::string::npos) << e;
  EXPECT_NE(e.find("no valid byte size"), std::string::npos) << e;
}

// Nodes with missing or empty inputs/outputs, or not an ONNX op: refused at import.
TEST(HostileInput, NodeArityIsCheckedAtImport) {
  fs::path root = fresh_dir("arity");
  auto err = [&](const std::string& name, std::function<void(onnx::GraphProto*)> body) {
    return load_error(save(model_with(body), root / (name + ".onnx")));
  };
  std::string e = err("add1", [](onnx::GraphProto* g) { add_node(g, "Add", {"x"}, {"y"}); });
  EXPECT_NE(e.find("Add_1 (Add): has 1 inputs, needs 2"), std::string::npos) << e;
  e = err("empty_in", [](onnx::GraphProto* g) { add_node(g, "Relu", {""}, {"y"}); });
  EXPECT_NE(e.find("required input 0 is empty"), std::string::npos) << e;
  e = err("no_out", [](onnx::GraphProto* g) {
    add_node(g, "Relu", {"x"}, {});
    add_node(g, "Relu", {"x"}, {"y"});
  });
  EXPECT_NE(e.find("has 0 outputs"), std::string::npos) << e;
  e = err("empty_out", [](onnx::GraphProto* g) { add_node(g, "Relu", {"x"}, {""}); });
  EXPECT_NE(e.find("required output 0 is empty"), std::string::npos) << e;
  e = err("internal", [](onnx::GraphProto* g) { add_node(g, "Linear", {"x"}, {"y"}); });
  EXPECT_NE(e.find("Linear is not an ONNX op"), std::string::npos) << e;
  e = err("own_attr", [](onnx::GraphProto* g) {  // a Conv told to compute one row only
    auto* n = add_node(g, "Conv", {"x", "x"}, {"y"});
    auto* a = n->add_attribute();
    a->set_name("rows");
    a->set_type(onnx::AttributeProto::INTS);
    a->add_ints(0);
    a->add_ints(1);
  });
  EXPECT_NE(e.find("attribute 'rows' is wxe's own"), std::string::npos) << e;
  e = err("twice", [](onnx::GraphProto* g) {
    add_node(g, "Relu", {"x"}, {"y"});
    add_node(g, "Neg", {"x"}, {"y"});
  });
  EXPECT_NE(e.find("already"), std::string::npos) << e;
  e = err("const_int", [](onnx::GraphProto* g) {
    add_int_attr(add_node(g, "Constant", {}, {"c"}), "value", 3);  // 'value' must be a tensor
    add_node(g, "Add", {"x", "c"}, {"y"});
  });
  EXPECT_NE(e.find("not a tensor"), std::string::npos) << e;
}

// Every registered op is either an ONNX op with an arity rule or one of wxe's own ops, which
// a file may not contain: a new op without its arity line fails here.
TEST(HostileInput, EveryOpHasAnArityRuleOrIsInternal) {
  register_cpu_kernels();
  std::vector<std::string> importable = onnx_importable_ops();
  const std::set<std::string> internal = {"AllReduceTP", "ChannelLayerNorm", "ConvChannelsLast", "CopyToTP",
                                          "DepthToSpaceChannelsLast", "Linear", "PlaneGather", "SpectralNorm",
                                          "WindowAttention"};
  for (const std::string& op : known_ops()) {
    if (op.find('.') != std::string::npos) continue;  // another domain
    bool onnx = std::count(importable.begin(), importable.end(), op) > 0;
    EXPECT_TRUE(onnx != (internal.count(op) > 0)) << op;
  }
}

// INT_MIN / -1 and INT_MIN % -1 trap (SIGFPE) in C++: integer Div/Mod wrap instead.
TEST(HostileInput, IntegerDivModOfIntMinByMinusOne) {
  register_cpu_kernels();
  for (const char* op : {"Div", "Mod"}) {
    Node n;
    n.op = op;
    n.name = op;
    Tensor a = Tensor::from_i64({INT64_MIN, 7}), b = Tensor::from_i64({-1, -1}), c(DType::I64, {2});
    kernel_for(op, KernelKind::Reference)(n, {&a, &b}, {&c});
    EXPECT_EQ(c.data<int64_t>()[0], std::string(op) == "Div" ? INT64_MIN : 0) << op;
    EXPECT_EQ(c.data<int64_t>()[1], std::string(op) == "Div" ? -7 : 0) << op;
    Tensor a32(DType::I32, {1}), b32(DType::I32, {1}), c32(DType::I32, {1});
    a32.data<int32_t>()[0] = INT32_MIN;
    b32.data<int32_t>()[0] = -1;
    kernel_for(op, KernelKind::Reference)(n, {&a32, &b32}, {&c32});
    EXPECT_EQ(c32.data<int32_t>()[0], std::string(op) == "Div" ? INT32_MIN : 0) << op;
  }
  // and folded at import: Div(INT64_MIN, -1) of two initializers
  fs::path root = fresh_dir("divfold");
  std::string e = load_error(save(model_with([&](onnx::GraphProto* g) {
    add_i64_init(g, "a", {INT64_MIN});
    add_i64_init(g, "b", {-1});
    add_node(g, "Div", {"a", "b"}, {"q"});
    add_node(g, "Mod", {"a", "b"}, {"r"});
    add_node(g, "Add", {"q", "r"}, {"s"});
    add_int_attr(add_node(g, "Cast", {"s"}, {"f"}), "to", onnx::TensorProto::FLOAT);
    add_node(g, "Add", {"x", "f"}, {"y"});
  }), root / "div.onnx"));
  EXPECT_EQ(e, "<no error>");
}

// DepthToSpace blocksize near sqrt(INT64_MAX), a to_qkv of 0 rows: errors, not UB.
TEST(HostileInput, DepthToSpaceBlocksizeAndEmptyQkv) {
  fs::path root = fresh_dir("d2s");
  for (int64_t b : {int64_t(3037000500), int64_t(1) << 40, int64_t(-1)}) {
    std::string e = load_error(save(model_with([&](onnx::GraphProto* g) {
      add_i64_init(g, "shape", {1, 4, 1, 2});
      add_node(g, "Reshape", {"x", "shape"}, {"r"});
      add_int_attr(add_node(g, "DepthToSpace", {"r"}, {"y"}), "blocksize", b);
    }), root / "d2s.onnx"));
    EXPECT_NE(e.find("DepthToSpace"), std::string::npos) << e;
    EXPECT_NE(e.find("blocksize"), std::string::npos) << e;
  }
  NamedTensors w;
  w.push_back({"layers.0.attn.to_qkv.weight", Tensor(DType::F32, {0, 4, 1, 1})});
  std::string e = error_of([&] { layout::convert_state_dict(w); });
  EXPECT_NE(e.find("to_qkv.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("positive multiple of 3"), std::string::npos) << e;
}

// Globs: one matcher for --freeze and plan files, no exponential backtracking or deep recursion.
TEST(HostileInput, GlobMatchingIsFastOnHostilePatterns) {
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(glob_match(std::string(40, '*') + "Z", std::string(5000, 'a')));
  EXPECT_FALSE(glob_match("*a*a*a*a*a*a*a*a*a*a*b", std::string(2000, 'a')));
  EXPECT_TRUE(glob_match(std::string(100000, '*'), "x"));  // no recursion as deep as the pattern
  EXPECT_TRUE(glob_match("*.to_q.weight", "layers.0.1.to_q.weight"));
  EXPECT_FALSE(glob_match("*.to_q.weight", "layers.0.1.to_k.weight"));
  // a plan file through the TP planner (parallel/shard.cpp used its own recursive matcher)
  Graph g;
  Value x, w, y;
  x.name = "x";
  x.shape = {2, 4};
  x.shape_known = true;
  w.name = std::string(60, 'a') + ".weight";
  w.shape = {4, 4};
  w.shape_known = true;
  w.is_param = true;
  w.constant = std::make_shared<Tensor>(Tensor::zeros(DType::F32, {4, 4}));
  y.name = "y";
  int xi = g.add_value(x), wi = g.add_value(w), yi = g.add_value(y);
  Node lin;
  lin.op = "Linear";
  lin.name = "lin";
  lin.inputs = {xi, wi};
  lin.outputs = {yi};
  g.nodes.push_back(lin);
  g.inputs = {xi};
  g.outputs = {yi};
  std::string plan = (fresh_dir("plan") / "plan.json").string();
  spit(plan, "{\"" + std::string(40, '*') + "Z\": \"colwise\"}");
  TpPlan p;
  std::string e = error_of([&] { apply_plan_file(p, g, plan); });
  EXPECT_NE(e.find("matches no Linear weight"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// Output files: a fresh temp name (a planted symlink at the old predictable name is never
// followed), the original permissions kept, nothing left behind on an error or a signal.
TEST(HostileInput, AtomicWritesAreSafe) {
  fs::path root = fresh_dir("atomic");
  const std::string out = (root / "out.npy").string(), victim = (root / "victim").string();
  spit(victim, "precious");
  fs::create_symlink(victim, out + ".tmp." + std::to_string(::getpid()));  // the old temp name
  write_npy(out, Tensor::from_f32({2}, {1, 2}));
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(read_npy(out).data<float>()[1], 2.f);
  // an overwrite keeps the mode
  ASSERT_EQ(::chmod(out.c_str(), 0640), 0);
  write_npy(out, Tensor::from_f32({1}, {3}));
  struct stat st;
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  // the target is a directory: rename fails, the temp file goes
  fs::create_directories(root / "taken.npy" / "x");
  EXPECT_NE(error_of([&] { write_npy((root / "taken.npy").string(), Tensor::from_f32({1}, {1})); }).find("taken.npy"),
            std::string::npos);
  // killed by SIGTERM while the temp file exists: it is removed
  pid_t pid = ::fork();
  if (pid == 0) {
    TempFile t((root / "killed.npy").string());
    ::raise(SIGTERM);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  int entries = 0;
  for (auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "out.npy" || n == "victim" || n == "taken.npy" || n.rfind("out.npy.tmp.", 0) == 0) << n;
    ++entries;
  }
  EXPECT_EQ(entries, 4);
}

// A checkpoint's temporary directory (step_N.tmpPID) filled when SIGTERM comes goes with its
// files (issue 41: it stayed until the next save).
TEST(HostileInput, TempDirectoriesGoOnSignals) {
  fs::path root = fresh_dir("tempdir");
  const fs::path dir = root / "step_000003.tmp123";
  pid_t pid = ::fork();
  if (pid == 0) {
    fs::create_directories(dir);
    TempDirGuard g(dir.string(), {"model.safetensors", "trainer_state.json"});
    write_file_atomic((dir / "model.safetensors").string(), "weights");
    TempFile half((dir / "trainer_state.json").string());  // a file being written
    ::raise(SIGTERM);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  EXPECT_FALSE(fs::exists(dir));
}

// A checkpoint whose names all carry a prefix: a short error with the first names and the
// prefix to strip, not one line listing every tensor.
TEST(HostileInput, WeightNameMismatchIsShortAndSuggestsThePrefix) {
  Graph g;
  Value x;
  x.name = "x";
  x.shape = {2};
  x.shape_known = true;
  g.inputs = {g.add_value(x)};
  NamedTensors w;
  for (int i = 0; i < 300; ++i) {
    Value p;
    p.name = "layers." + std::to_string(i) + ".attention.to_out.weight";
    p.shape = {2};
    p.shape_known = true;
    p.is_param = true;
    p.constant = std::make_shared<Tensor>(Tensor::zeros(DType::F32, {2}));
    Value y;
    y.name = "y" + std::to_string(i);
    Node n;
    n.op = "Add";
    n.name = "add" + std::to_string(i);
    n.inputs = {g.inputs[0], g.add_value(p)};
    n.outputs = {g.add_value(y)};
    g.nodes.push_back(n);
    g.outputs.push_back(n.outputs[0]);
    w.push_back({"module." + p.name, Tensor::zeros(DType::F32, {2})});
  }
  std::string e = error_of([&] { load_weights(g, w, "ckpt.pt"); });
  EXPECT_LT(e.size(), 600u) << e;
  EXPECT_NE(e.find("missing 300"), std::string::npos) << e;
  EXPECT_NE(e.find("and 296 more"), std::string::npos) << e;
  EXPECT_NE(e.find("prefix 'module.': strip it"), std::string::npos) << e;
}

// A world of `n` ranks seen from rank 0 whose collectives and splits fail: make_mesh must refuse
// bad sizes before it calls any.
class NoCallsWorld : public Communicator {
 public:
  explicit NoCallsWorld(int n) : n_(n) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  void all_reduce_sum(Tensor&) override { fail("collective called"); }
  void all_gather(const Tensor&, Tensor&) override { fail("collective called"); }
  void reduce_scatter_sum(const Tensor&, Tensor&) override { fail("collective called"); }
  void broadcast(Tensor&, int) override { fail("collective called"); }
  void barrier() override { fail("collective called"); }
  std::unique_ptr<Communicator> split(int, int) override { fail("split called"); }
  [[noreturn]] void abort(const std::string& m, int) override { fail("abort: ", m); }

 private:
  int n_;
};

// --tp x --domain past INT_MAX (issue 41): the int product wrapped to -2, so 2 ranks "divided"
// into tp 2 x domain INT_MAX and the mesh asserted (or divided by 0: SIGFPE).
TEST(HostileInput, MeshSizesPastIntMaxAreRefused) {
  struct Case {
    int world, tp, domain;
  };
  for (const Case& c : {Case{2, 2, INT_MAX}, Case{4, 4, INT_MAX / 2 + 1}, Case{2, 65536, 65536}, Case{2, 1, INT_MIN}}) {
    const std::string e = error_of([&] { make_mesh(std::make_unique<NoCallsWorld>(c.world), c.tp, c.domain); });
    EXPECT_TRUE(e.find("is not divisible by --tp") != std::string::npos || e.find("must be at least 1") != std::string::npos)
        << c.world << " " << c.tp << " " << c.domain << ": " << e;
  }
}
