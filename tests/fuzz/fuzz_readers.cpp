// Seeded mutation fuzzing of the readers of untrusted files (issue 11): the ONNX importer
// (with shape inference and constant folding), .npy, plan JSON, the restricted unpickler,
// safetensors, zarr (.zarray metadata, blosc/zstd/zlib/gzip chunks) and the mesh sizes (--tp, --domain). ctest runs it built with -fsanitize=address,undefined (CMakeLists.txt,
// target wxe_fuzz_readers) for a fixed number of mutations per target from a fixed seed, so a
// run is reproducible and takes seconds. Contract checked: every input either loads or throws
// wxe::Error; anything else (a crash, a sanitizer report, another exception) fails.
//
//   wxe_fuzz_readers [ITERATIONS [SEED]]      mutate every target's seeds
//   wxe_fuzz_readers TARGET FILE              run one input (reproduce a failure)
//
// On a failure the input is in $TMPDIR/wxe_fuzz_<pid>/<target>.in. Built with
// -DWXE_LIBFUZZER=<target> and -fsanitize=fuzzer (clang) it is a libFuzzer target instead.
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/zarr.h"
#include "engine/io/json.h"
#include "engine/ir/ops.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "engine/io/safetensors.h"
#include "importers/onnx/onnx_import.h"
#include "importers/torch/pickle.h"
#include "importers/torch/zip.h"
#include "models/credit_modules.h"
#include "parallel/mesh.h"
#include "parallel/shard.h"

using namespace wxe;
namespace fs = std::filesystem;

namespace {

fs::path g_dir;  // per-process scratch folder

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string spit(const std::string& name, const std::string& bytes) {
  std::string p = (g_dir / name).string();
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), (std::streamsize)bytes.size());
  return p;
}

// ---- targets: bytes in, Error or success out ----

void run_onnx(const std::string& bytes) {
  Graph g = import_onnx(spit("onnx.in", bytes));
  std::map<std::string, InputSpec> given;
  for (int id : g.inputs) {
    Shape s = g.values[id].shape;
    for (int64_t& d : s)
      if (d < 0 || d > 64) d = 2;  // keep dynamic dims small
    given[g.values[id].name] = {g.values[id].dtype, s};
  }
  simplify(g, given);
}

void run_npy(const std::string& bytes) {
  std::string p = spit("npy.in", bytes);
  read_npy_header(p);
  read_npy(p);
}

// zarr: a copy of a fixture store (tests/data/zarr) whose f/.zarray or chunk f/0.0.0 is the
// input, read whole.
void run_zarr(const std::string& store, const std::string& file, const std::string& bytes) {
  const fs::path dir = g_dir / (store + "_" + std::to_string(std::hash<std::string>()(file)) + ".zarr");
  if (!fs::exists(dir)) fs::copy(std::string(WXE_SOURCE_DIR) + "/tests/data/zarr/" + store + ".zarr", dir,
                                 fs::copy_options::recursive);
  std::ofstream((dir / file).string(), std::ios::binary | std::ios::trunc).write(bytes.data(), (std::streamsize)bytes.size());
  ZarrStore z(dir.string());
  z.read("f");
}

// mesh: "WORLD TP DOMAIN" (any ints) through make_mesh's checks of the sizes.
void run_mesh(const std::string& bytes) {
  long long v[3] = {0, 0, 0};
  std::istringstream in(bytes);
  for (long long& x : v) in >> x;
  auto to_int = [](long long x) { return (int)std::max<long long>(INT_MIN, std::min<long long>(INT_MAX, x)); };
  check_mesh_sizes(std::max(1, to_int(v[0])), to_int(v[1]), to_int(v[2]));
}

// A graph with three Linear weights for plan files to match.
Graph plan_graph() {
  Graph g;
  Value x;
  x.name = "x";
  x.shape = {2, 8};
  x.shape_known = true;
  g.inputs = {g.add_value(x)};
  int cur = g.inputs[0];
  for (const char* w : {"blocks.0.attn.to_q.weight", "blocks.0.attn.to_out.weight", "blocks.0.ff.layers.1.weight"}) {
    Value v;
    v.name = w;
    v.shape = {8, 8};
    v.shape_known = true;
    v.is_param = true;
    v.constant = std::make_shared<Tensor>(Tensor::zeros(DType::F32, {8, 8}));
    Value y;
    y.name = std::string(w) + ".out";
    y.shape = {2, 8};
    y.shape_known = true;
    Node n;
    n.op = "Linear";
    n.name = w;
    n.inputs = {cur, g.add_value(v)};
    n.outputs = {g.add_value(y)};
    cur = n.outputs[0];
    g.nodes.push_back(n);
  }
  g.outputs = {cur};
  return g;
}

void run_plan(const std::string& bytes) {
  static const Graph g = plan_graph();
  TpPlan plan;
  apply_plan_file(plan, g, spit("plan.in", bytes));
}

std::map<std::string, uint64_t> g_storages;  // the seed archive's storages: key -> bytes

void run_pickle(const std::string& bytes) {
  torch_pickle::Unpickler u("fuzz: data.pkl", (const uint8_t*)bytes.data(), bytes.size(),
                            [](const std::string& key, uint64_t* nbytes) {
                              auto it = g_storages.find(key);
                              if (it == g_storages.end()) return false;
                              *nbytes = it->second;
                              return true;
                            });
  int32_t top = u.load();
  u.describe(top);
  for (const auto& t : u.tensors())
    if (!t.in_bounds) u.explain_bounds(t);
}

void run_safetensors(const std::string& bytes) {
  std::string p = spit("st.in", bytes);
  std::map<std::string, std::string> meta;
  read_safetensors_header(p, &meta);
  auto all = read_safetensors(p, &meta);
  if (!all.empty()) {  // a sliced read of the first tensor too
    std::map<std::string, TensorSlice> slices{{all[0].first, TensorSlice{0, 2, 1}}};
    read_safetensors(p, nullptr, &slices);
  }
}

// ---- seeds ----

onnx::NodeProto* node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                      std::vector<std::string> out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(op + std::to_string(g->node_size()));
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}
void attr_i(onnx::NodeProto* n, const std::string& k, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void attr_ints(onnx::NodeProto* n, const std::string& k, std::vector<int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
// an int64 Constant node (initializers are parameters, which constant folding keeps)
void init_i64(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> v, bool scalar = false) {
  auto* n = g->add_node();
  n->set_op_type("Constant");
  n->set_name("const_" + name);
  n->add_output(name);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  if (!scalar) t->add_dims((int64_t)v.size());
  for (int64_t x : v) t->add_int64_data(x);
}
void init_f32(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) t->add_dims(d), n *= d;
  std::string raw((size_t)n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    float v = 0.01f * (float)(i % 17) - 0.05f;
    std::memcpy(&raw[(size_t)i * 4], &v, 4);
  }
  t->set_raw_data(raw);
}

// The shape-arithmetic chains of exported CREDIT graphs and the ops whose sizes come from
// the file: Shape, integer Div/Mod/Concat/Reshape, ConstantOfShape, Range, Expand, Slice, Split,
// DepthToSpace, Pad, Conv, ConvTranspose, Softmax, integer Div/Mod, Transpose, MatMul.
onnx::ModelProto onnx_seed() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {1, 4, 4, 4}) tt->mutable_shape()->add_dim()->set_dim_value(d);
  g->add_output()->set_name("y");
  init_i64(g, "i1", {0});
  init_i64(g, "two", {2}, true);
  init_i64(g, "m1", {-1});
  node(g, "Shape", {"x"}, {"sx"});  // read by nothing until a mutation points an input at it
  init_i64(g, "b", {2}, true);
  node(g, "Div", {"b", "two"}, {"bh"});
  node(g, "Mod", {"b", "two"}, {"bm"});
  node(g, "Add", {"bh", "bm"}, {"bb"});
  node(g, "Unsqueeze", {"bb", "i1"}, {"bu"});
  init_i64(g, "rest", {4, 16});
  attr_i(node(g, "Concat", {"bu", "rest"}, {"shp"}), "axis", 0);
  node(g, "Reshape", {"x", "shp"}, {"r"});
  attr_i(node(g, "Softmax", {"r"}, {"sm"}), "axis", -1);
  init_i64(g, "shp4", {1, 4, 4, 4});
  node(g, "Reshape", {"sm", "shp4"}, {"r4"});
  init_f32(g, "cw", {8, 4, 1, 1});
  auto* conv = node(g, "Conv", {"r4", "cw"}, {"c"});
  attr_ints(conv, "kernel_shape", {1, 1});
  attr_ints(conv, "strides", {1, 1});
  attr_ints(conv, "pads", {0, 0, 0, 0});
  attr_i(node(g, "DepthToSpace", {"c"}, {"d2s"}), "blocksize", 2);  // (1, 2, 8, 8)
  init_f32(g, "tw", {2, 2, 2, 2});
  auto* ct = node(g, "ConvTranspose", {"d2s", "tw"}, {"ct"});  // (1, 2, 16, 16)
  attr_ints(ct, "kernel_shape", {2, 2});
  attr_ints(ct, "strides", {2, 2});
  init_i64(g, "pads", {0, 0, 1, 1, 0, 0, 1, 1});
  node(g, "Pad", {"ct", "pads"}, {"p"});  // (1, 2, 18, 18)
  init_i64(g, "st", {1, 1});
  init_i64(g, "en", {17, 17});
  init_i64(g, "ax", {2, 3});
  node(g, "Slice", {"p", "st", "en", "ax"}, {"sl"});  // (1, 2, 16, 16)
  init_i64(g, "cos_shape", {1, 1, 16, 16});
  node(g, "ConstantOfShape", {"cos_shape"}, {"zeros_i"});
  attr_i(node(g, "Cast", {"zeros_i"}, {"zeros"}), "to", onnx::TensorProto::FLOAT);
  node(g, "Add", {"sl", "zeros"}, {"a"});
  init_i64(g, "rs", {0}, true);
  init_i64(g, "rl", {16}, true);
  init_i64(g, "rd", {1}, true);
  node(g, "Range", {"rs", "rl", "rd"}, {"rng"});
  attr_i(node(g, "Cast", {"rng"}, {"rngf"}), "to", onnx::TensorProto::FLOAT);
  node(g, "Mul", {"a", "rngf"}, {"am"});
  init_i64(g, "ex", {1, 2, 16, 16});
  node(g, "Expand", {"am", "ex"}, {"e"});
  init_i64(g, "split", {1, 1});
  auto* sp = node(g, "Split", {"e", "split"}, {"s0", "s1"});
  attr_i(sp, "axis", 1);
  attr_ints(node(g, "Transpose", {"s1"}, {"t"}), "perm", {0, 1, 3, 2});
  node(g, "MatMul", {"s0", "t"}, {"y"});
  return m;
}

std::string npy_seed() {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }";
  h.append(63 - (10 + h.size()) % 64, ' ');
  h += '\n';
  std::string b = std::string("\x93NUMPY\x01\x00", 8) + char(h.size() & 255) + char(h.size() >> 8) + h;
  return b + std::string(2 * 3 * 4 * 4, '\x3f');
}

// the data.pkl of a torch.save zip; its storages (<prefix>/data/<key>) into g_storages
std::string pickle_of(const std::string& pt) {
  torch_zip::Reader z(pt);
  std::string pkl;
  for (const auto& e : z.entries()) {
    if (e.name.size() >= 8 && e.name.compare(e.name.size() - 8, 8, "data.pkl") == 0) pkl = z.read(e);
    size_t d = e.name.find("/data/");
    if (d != std::string::npos) g_storages[e.name.substr(d + 6)] = e.usize;
  }
  return pkl;
}

// ---- mutation ----

const int64_t kInteresting[] = {0, 1, -1, 2, 3, 255, 65535, INT32_MAX, INT32_MIN, (int64_t)1 << 31, (int64_t)1 << 32,
                                (int64_t)1 << 62, INT64_MAX, INT64_MIN, (int64_t)3037000500};
const char* const kNumbers[] = {"0", "-1", "1", "65536", "4611686018427387904", "9223372036854775807",
                                "18446744073709551616", "-9223372036854775808", "1e308", "3037000500"};

struct Mutator {
  std::mt19937_64 rng;
  explicit Mutator(uint64_t seed) : rng(seed) {}
  size_t below(size_t n) { return n ? (size_t)(rng() % n) : 0; }
  int64_t interesting() { return kInteresting[below(sizeof kInteresting / sizeof kInteresting[0])]; }

  // byte-level: flips, interesting bytes and integers, cuts, inserts, a digit run replaced
  std::string bytes(std::string s) {
    for (int k = 1 + (int)below(4); k-- > 0;) {
      switch (below(8)) {
        case 0:
          if (!s.empty()) s[below(s.size())] ^= (char)(1u << below(8));
          break;
        case 1:
          if (!s.empty()) s[below(s.size())] = "\x00\xff\x7f\x80\x01"[below(5)];
          break;
        case 2:
          if (s.size() >= 8) {
            int64_t v = interesting();
            std::memcpy(&s[below(s.size() - 7)], &v, 8);
          }
          break;
        case 3:
          if (s.size() >= 4) {
            int32_t v = (int32_t)interesting();
            std::memcpy(&s[below(s.size() - 3)], &v, 4);
          }
          break;
        case 4: s.resize(below(s.size() + 1)); break;
        case 5: s.insert(below(s.size() + 1), std::string(1 + below(16), (char)below(256))); break;
        case 6:
          if (!s.empty()) {
            size_t a = below(s.size()), n = 1 + below(std::min<size_t>(64, s.size() - a));
            s.insert(below(s.size() + 1), s.substr(a, n));
          }
          break;
        default: {  // a number in a text header
          std::vector<size_t> digits;
          for (size_t i = 0; i < s.size() && digits.size() < 4096; ++i)
            if (s[i] >= '0' && s[i] <= '9' && (i == 0 || s[i - 1] < '0' || s[i - 1] > '9')) digits.push_back(i);
          if (digits.empty()) break;
          size_t a = digits[below(digits.size())], e = a;
          while (e < s.size() && s[e] >= '0' && s[e] <= '9') ++e;
          s.replace(a, e - a, kNumbers[below(sizeof kNumbers / sizeof kNumbers[0])]);
        }
      }
    }
    return s;
  }

  // structure-aware: attributes, dims, integer payloads, names, op types of a parsed model
  std::string onnx(const onnx::ModelProto& seed) {
    onnx::ModelProto m = seed;
    auto* g = m.mutable_graph();
    static const char* const ops[] = {"Reshape", "Expand", "Range", "ConstantOfShape", "DepthToSpace", "Softmax",
                                      "ConvTranspose", "Div", "Mod", "Slice", "Split", "Gather", "Concat", "Pad",
                                      "Tile", "Linear", "Einsum", "Resize", "Identity"};
    for (int k = 1 + (int)below(3); k-- > 0;) {
      switch (below(7)) {
        case 0: {  // an attribute's int(s)
          auto* n = g->mutable_node((int)below(g->node_size()));
          if (!n->attribute_size()) break;
          auto* a = n->mutable_attribute((int)below(n->attribute_size()));
          if (a->type() == onnx::AttributeProto::INT) a->set_i(interesting());
          else if (a->ints_size()) a->set_ints((int)below(a->ints_size()), interesting());
          break;
        }
        case 1: {  // an initializer's dims or values
          auto* t = g->mutable_initializer((int)below(g->initializer_size()));
          if (t->int64_data_size() && below(2)) t->set_int64_data((int)below(t->int64_data_size()), interesting());
          else if (t->dims_size()) t->set_dims((int)below(t->dims_size()), interesting());
          else t->add_dims(interesting());
          break;
        }
        case 2: {  // an input or output name: emptied, dropped or pointed elsewhere
          auto* n = g->mutable_node((int)below(g->node_size()));
          auto* names = below(2) ? n->mutable_input() : n->mutable_output();
          if (names->empty()) break;
          int i = (int)below(names->size());
          switch (below(3)) {
            case 0: names->Mutable(i)->clear(); break;
            case 1: names->RemoveLast(); break;
            default: *names->Mutable(i) = g->node((int)below(g->node_size())).output(0);
          }
          break;
        }
        case 3:
          g->mutable_node((int)below(g->node_size()))->set_op_type(ops[below(sizeof ops / sizeof ops[0])]);
          break;
        case 4: {  // the graph input's dims
          auto* sh = g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
          if (sh->dim_size()) sh->mutable_dim((int)below(sh->dim_size()))->set_dim_value(interesting());
          break;
        }
        case 5: {  // an external-data reference to somewhere else
          auto* t = g->mutable_initializer((int)below(g->initializer_size()));
          t->set_data_location(onnx::TensorProto::EXTERNAL);
          t->clear_external_data();
          auto* e = t->add_external_data();
          e->set_key("location");
          e->set_value(below(2) ? "/etc/passwd" : "../onnx.in");
          break;
        }
        default:
          return bytes(m.SerializeAsString());
      }
    }
    return m.SerializeAsString();
  }
};

struct Target {
  std::string name;
  std::function<void(const std::string&)> run;
  std::vector<std::string> seeds;
  bool structured_onnx = false;
};

enum class Outcome { Loaded, Refused, Bad };

// Runs one input: it must load or throw wxe::Error (the contract); a crash or a sanitizer
// report ends the process with the input left in <target>.in.
Outcome run_one(const Target& t, const std::string& input) {
  spit(t.name + ".in", input);
  try {
    t.run(input);
  } catch (const Error&) {
    return Outcome::Refused;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz %s: %s instead of wxe::Error: %s (input: %s)\n", t.name.c_str(), typeid(e).name(),
                 e.what(), (g_dir / (t.name + ".in")).c_str());
    return Outcome::Bad;
  }
  return Outcome::Loaded;
}

std::vector<Target> targets() {
  const std::string src = WXE_SOURCE_DIR;
  std::vector<Target> ts;
  ts.push_back({"onnx", run_onnx, {onnx_seed().SerializeAsString(), slurp(src + "/tests/data/nextgen_block.onnx")}, true});
  ts.push_back({"npy", run_npy, {npy_seed(), slurp(src + "/tests/data/nextgen_block_x.npy")}});
  ts.push_back({"plan", run_plan,
                {"{\"*.to_q.weight\": \"colwise\", \"*.to_out.weight\": \"rowwise\", \"blocks.?.ff.*\": \"replicate\"}",
                 "{\"" + std::string(20, '*') + "Z\": \"colwise\"}"}});
  ts.push_back({"pickle", run_pickle,
                // braced lists evaluate in order: bare.pt's storage sizes are the ones kept
                {pickle_of(src + "/tests/data/pt/evil_os_system.pt"), pickle_of(src + "/tests/data/pt/bare.pt")}});
  ts.push_back({"safetensors", run_safetensors,
                {slurp(src + "/tests/data/pt/py_written.safetensors"), slurp(src + "/tests/data/nextgen_block.safetensors")}});
  const std::string z = src + "/tests/data/zarr/";
  // issue 41's hostile metadata as seeds too: a shape whose size wraps, a chunk of GiBs over a
  // small chunk file, a uint64 fill_value of 2^64 - 1
  auto zarray = [](const std::string& shape, const std::string& chunks, const std::string& rest) {
    return "{\"zarr_format\": 2, \"shape\": " + shape + ", \"chunks\": " + chunks + ", " + rest +
           ", \"order\": \"C\", \"filters\": null}";
  };
  const std::string blosc = "\"dtype\": \"<f4\", \"fill_value\": 0, \"compressor\": {\"id\": \"blosc\"}";
  ts.push_back({"zarray", [](const std::string& b) { run_zarr("blosc", "f/.zarray", b); },
                {slurp(z + "blosc.zarr/f/.zarray"), slurp(z + "zstd.zarr/s/.zarray"),
                 zarray("[3, 6148914691236517206, 7]", "[2, 3, 4]", blosc), zarray("[3, 5, 7]", "[1024, 1024, 768]", blosc),
                 zarray("[3, 5, 7]", "[2, 3, 4]", "\"dtype\": \"<u8\", \"fill_value\": 18446744073709551615, \"compressor\": null")}});
  for (const char* codec : {"blosc", "zstd", "zlib", "gzip"})
    ts.push_back({std::string("zchunk_") + codec, [codec](const std::string& b) { run_zarr(codec, "f/0.0.0", b); },
                  {slurp(z + codec + ".zarr/f/0.0.0")}});
  // the mesh options: any --tp and --domain (their product past INT_MAX too) over a world size
  ts.push_back({"mesh", run_mesh, {"2 2 2147483647", "4 4 1073741824", "8 2 2"}});
  return ts;
}

}  // namespace

#ifdef WXE_LIBFUZZER  // clang -fsanitize=fuzzer: one target per binary, chosen at build time
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::vector<Target> ts = [] {
    g_dir = fs::temp_directory_path() / ("wxe_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(g_dir);
    set_max_alloc_bytes(64 << 20);
    register_credit_modules();
    return targets();
  }();
  for (const Target& t : ts)
    if (t.name == WXE_LIBFUZZER && run_one(t, std::string((const char*)data, size)) == Outcome::Bad) std::abort();
  return 0;
}
#else
int main(int argc, char** argv) {
  g_dir = fs::temp_directory_path() / ("wxe_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(g_dir);
  set_max_alloc_bytes(64 << 20);  // a hostile shape fails fast instead of paging
  register_cpu_kernels();
  register_credit_modules();
  std::vector<Target> ts = targets();
  if (argc == 3 && !std::isdigit((unsigned char)argv[1][0])) {  // TARGET FILE
    for (const Target& t : ts)
      if (t.name == argv[1]) return run_one(t, slurp(argv[2])) == Outcome::Bad ? 1 : 0;
    std::fprintf(stderr, "unknown target %s\n", argv[1]);
    return 2;
  }
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 400;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 11;
  int failures = 0;
  for (const Target& t : ts) {
    int loaded = 0;  // a seed may be refused (a hostile one), but at least one must load
    for (const std::string& s : t.seeds) {
      if (s.empty()) continue;
      try {
        t.run(s);
        ++loaded;
      } catch (const Error& e) {
        std::printf("fuzz %s: seed refused: %s\n", t.name.c_str(), e.what());
      }
    }
    if (!loaded) {
      std::fprintf(stderr, "fuzz %s: no seed loads\n", t.name.c_str());
      ++failures;
    }
    Mutator mu(seed);
    std::vector<onnx::ModelProto> parsed;
    if (t.structured_onnx)
      for (const std::string& s : t.seeds) parsed.emplace_back().ParseFromString(s);
    int errors = 0;
    for (int i = 0; i < iterations; ++i) {
      size_t k = mu.below(t.seeds.size());
      std::string input = t.structured_onnx && mu.below(4) ? mu.onnx(parsed[k]) : mu.bytes(t.seeds[k]);
      Outcome o = run_one(t, input);
      errors += o == Outcome::Refused;
      failures += o == Outcome::Bad;
    }
    std::printf("fuzz %-12s %d mutations (seed %llu): %d refused with an error, %d loaded\n", t.name.c_str(),
                iterations, (unsigned long long)seed, errors, iterations - errors);
    std::fflush(stdout);
  }
  fs::remove_all(g_dir);
  return failures ? 1 : 0;
}
#endif
