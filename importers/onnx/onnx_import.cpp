#include "importers/onnx/onnx_import.h"

#include <google/protobuf/unknown_field_set.h>
#include <onnx/onnx_pb.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "engine/io/file_util.h"
#include "engine/ir/ops.h"

namespace wxe {

namespace {

constexpr int kMinOpset = 13, kMaxOpset = 21;

// The module a torch 2 (dynamo) export put a node in: its metadata_props entry "namespace",
// e.g. ": CrossFormer/layers.2.1: Transformer/layers.2.1.layers.0.0.to_out: Conv2d/conv2d_25:
// aten.conv2d.default", gives the module path before the last '/'. NodeProto.metadata_props
// (field 9) is newer than the ONNX release this builds against, so it is read from the unknown
// fields. "" when there is none.
std::string dynamo_module(const onnx::NodeProto& np) {
  const auto& unknown = np.GetReflection()->GetUnknownFields(np);
  std::string from_scopes;
  for (int i = 0; i < unknown.field_count(); ++i) {
    const auto& f = unknown.field(i);
    if (f.number() != 9 || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto e;
    if (!e.ParseFromString(f.length_delimited())) continue;
    if (e.key() == "pkg.torch.onnx.name_scopes") {
      // "['', 'layers.0', 'layers.0.to_out', 'conv2d_5']": the module paths, then the node; a file
      // stripped of the other metadata (tests/data/structw_*) has only this
      std::vector<std::string> scopes;
      const std::string& v = e.value();
      for (size_t a = v.find('\''); a != std::string::npos; a = v.find('\'', a + 1)) {
        const size_t b = v.find('\'', a + 1);
        if (b == std::string::npos) break;
        scopes.push_back(v.substr(a + 1, b - a - 1));
        a = b;
      }
      if (scopes.size() >= 2) from_scopes = scopes[scopes.size() - 2];
      continue;
    }
    if (e.key() != "namespace") continue;
    const std::string& ns = e.value();
    const size_t last = ns.rfind('/');
    if (last == std::string::npos || last == 0) return "";
    const size_t first = ns.rfind('/', last - 1);
    const std::string scope = ns.substr(first == std::string::npos ? 0 : first + 1, last - (first + 1));
    return scope.substr(0, scope.find(':'));  // "layers.2.1.layers.0.0.to_out: ...Conv2d" -> the path
  }
  return from_scopes;
}

DType from_onnx_type(int t, const std::string& what) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return DType::F32;
    case onnx::TensorProto::DOUBLE: return DType::F64;
    case onnx::TensorProto::FLOAT16: return DType::F16;
    case onnx::TensorProto::BFLOAT16: return DType::BF16;
    case onnx::TensorProto::INT64: return DType::I64;
    case onnx::TensorProto::INT32: return DType::I32;
    case onnx::TensorProto::INT8: return DType::I8;
    case onnx::TensorProto::UINT8: return DType::U8;
    case onnx::TensorProto::BOOL: return DType::Bool;
  }
  fail(what, ": unsupported element type ", t);
}

// An external-data offset or length: a plain decimal number, or an error naming the tensor.
int64_t parse_size(const std::string& v, const std::string& key, const std::string& where) {
  int64_t r = -1;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), r);
  WXE_CHECK(ec == std::errc() && end == v.data() + v.size() && r >= 0, where, ": external data ", key, " '", v,
            "' is not a non-negative 64-bit number");
  return r;
}

// Reads `length` bytes at `offset` of an external data file. Only regular files inside the
// model's directory (after resolving symlinks) are read: `location` comes from the file and
// must not reach /etc/passwd through an absolute path, `..` or a link, nor block on a FIFO.
void read_external(const onnx::TensorProto& tp, const std::filesystem::path& dir, Tensor& t,
                   const std::string& where) {
  namespace fs = std::filesystem;
  std::string location;
  int64_t offset = 0, length = -1;
  for (auto& kv : tp.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = parse_size(kv.value(), "offset", where);
    else if (kv.key() == "length") length = parse_size(kv.value(), "length", where);
  }
  WXE_CHECK(!location.empty(), where, ": external data without a location");
  WXE_CHECK(location.find('\0') == std::string::npos && !fs::path(location).is_absolute(), where,
            ": external data location '", location, "' must be a relative path inside the model's directory");
  std::error_code ec;
  fs::path root = fs::canonical(dir.empty() ? fs::path(".") : dir, ec);
  WXE_CHECK(!ec, where, ": cannot resolve the model's directory ", dir.string());
  fs::path file = fs::weakly_canonical(root / location, ec);
  WXE_CHECK(!ec, where, ": cannot resolve external data file ", (dir / location).string());
  auto rel = file.lexically_relative(root);
  WXE_CHECK(!rel.empty() && *rel.begin() != "..", where, ": external data location '", location,
            "' resolves to ", file.string(), ", outside the model's directory ", root.string());
  WXE_CHECK(fs::is_regular_file(file, ec), where, ": external data ", file.string(),
            " is not a regular file (missing, a directory, a FIFO or a device)");
  // O_NONBLOCK: should the path have become a FIFO since the check, open does not wait
  int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  WXE_CHECK(fd >= 0, where, ": cannot open external data file ", file.string(), " (", std::strerror(errno), ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(where, ": external data ", file.string(), " is not a regular file");
  }
  int64_t size = st.st_size;
  if (length < 0) length = (int64_t)t.nbytes();
  if (length != (int64_t)t.nbytes() || offset > size || length > size - offset) {
    ::close(fd);
    WXE_CHECK(length == (int64_t)t.nbytes(), where, ": external data length ", length, " does not match shape ",
              shape_str(t.shape), " (", t.nbytes(), " bytes)");
    fail(where, ": external data ", file.string(), " is truncated (needs ", length, " bytes at offset ", offset,
         ", file has ", size, ")");
  }
  int64_t done = 0;
  while (done < length) {
    ssize_t r = ::pread(fd, (char*)t.raw() + done, (size_t)(length - done), offset + done);
    if (r <= 0) break;
    done += r;
  }
  ::close(fd);
  WXE_CHECK(done == length, where, ": failed reading external data ", file.string());
}

Tensor tensor_from_proto(const onnx::TensorProto& tp, const std::filesystem::path& dir,
                         const std::string& where) {
  Shape shape(tp.dims().begin(), tp.dims().end());
  for (int64_t d : shape) WXE_CHECK(d >= 0, where, ": negative dimension");
  Tensor t(from_onnx_type(tp.data_type(), where), shape);
  int64_t n = t.numel();
  auto need = [&](int64_t have) {
    WXE_CHECK(have == n, where, ": holds ", have, " values but shape ", shape_str(shape),
              " needs ", n);
  };
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    read_external(tp, dir, t, where);
  } else if (tp.has_raw_data()) {
    WXE_CHECK(tp.raw_data().size() == t.nbytes(), where, ": raw data has ",
              tp.raw_data().size(), " bytes but shape ", shape_str(shape), " needs ", t.nbytes());
    if (n) std::memcpy(t.raw(), tp.raw_data().data(), t.nbytes());
  } else {
    switch (t.dtype) {
      case DType::F32:
        need(tp.float_data_size());
        for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = tp.float_data(i);
        break;
      case DType::F64:
        need(tp.double_data_size());
        for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = tp.double_data(i);
        break;
      case DType::I64:
        need(tp.int64_data_size());
        for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = tp.int64_data(i);
        break;
      case DType::I32: case DType::I8: case DType::U8: case DType::Bool:
      case DType::F16: case DType::BF16:
        need(tp.int32_data_size());
        for (int64_t i = 0; i < n; ++i) {
          int32_t v = tp.int32_data(i);
          switch (t.dtype) {
            case DType::I32: t.data<int32_t>()[i] = v; break;
            case DType::I8: t.data<int8_t>()[i] = (int8_t)v; break;
            case DType::F16: case DType::BF16: t.data<uint16_t>()[i] = (uint16_t)v; break;
            default: t.data<uint8_t>()[i] = (uint8_t)v; break;
          }
        }
        break;
    }
  }
  return t;
}

Attr attr_from_proto(const onnx::AttributeProto& a, const std::filesystem::path& dir,
                     const std::string& where) {
  Attr r;
  switch (a.type()) {
    case onnx::AttributeProto::INT: r.kind = Attr::Int; r.i = a.i(); break;
    case onnx::AttributeProto::FLOAT: r.kind = Attr::Float; r.f = a.f(); break;
    case onnx::AttributeProto::STRING: r.kind = Attr::String; r.s = a.s(); break;
    case onnx::AttributeProto::INTS:
      r.kind = Attr::Ints;
      r.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      r.kind = Attr::Floats;
      r.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case onnx::AttributeProto::TENSOR:
      r.kind = Attr::Tensor_;
      r.t = std::make_shared<Tensor>(tensor_from_proto(a.t(), dir, where + " attribute " + a.name()));
      break;
    default:
      fail(where, ": attribute '", a.name(), "' has unsupported type ", (int)a.type(),
           " (subgraphs are not supported)");
  }
  return r;
}

// Inputs and outputs per ONNX op: the first min_in inputs and min_out outputs must be given
// (non-empty names); at most max_in / max_out. Ops not listed (wxe's own fused and collective
// ops) are not ONNX ops and are refused at import. A new ONNX op needs its line here
// (tests/hostile_input_test.cpp fails for a registered op that is in neither list).
struct Arity {
  int min_in, max_in, min_out = 1, max_out = 1;
};
const std::map<std::string, Arity>& onnx_arities() {
  static const std::map<std::string, Arity> t = {
      {"Abs", {1, 1}}, {"Add", {2, 2}}, {"AveragePool", {1, 1}}, {"And", {2, 2}}, {"Cast", {1, 1}}, {"CastLike", {2, 2}},
      {"Ceil", {1, 1}}, {"Clip", {1, 3}}, {"Concat", {1, INT_MAX}}, {"Constant", {0, 0}},
      {"ConstantOfShape", {1, 1}}, {"Conv", {2, 3}}, {"ConvTranspose", {2, 3}}, {"Cos", {1, 1}},
      {"DepthToSpace", {1, 1}}, {"Div", {2, 2}}, {"Einsum", {1, INT_MAX}}, {"Equal", {2, 2}},
      {"Erf", {1, 1}}, {"Exp", {1, 1}}, {"Expand", {2, 2}}, {"Flatten", {1, 1}}, {"Floor", {1, 1}},
      {"Gather", {2, 2}}, {"GatherND", {2, 2}}, {"Gelu", {1, 1}}, {"Gemm", {2, 3}}, {"GlobalAveragePool", {1, 1}}, {"Greater", {2, 2}},
      {"GreaterOrEqual", {2, 2}}, {"GroupNormalization", {3, 3}}, {"Identity", {1, 1}}, {"If", {1, 1, 1, INT_MAX}},
      {"InstanceNormalization", {3, 3}}, {"LayerNormalization", {2, 3, 1, 3}}, {"LeakyRelu", {1, 1}},
      {"Less", {2, 2}}, {"LessOrEqual", {2, 2}}, {"Log", {1, 1}}, {"MatMul", {2, 2}}, {"MaxPool", {1, 1}},
      {"Max", {1, INT_MAX}}, {"Min", {1, INT_MAX}}, {"Mod", {2, 2}}, {"Mul", {2, 2}}, {"Neg", {1, 1}},
      {"Not", {1, 1}}, {"Or", {2, 2}}, {"Pad", {2, 4}}, {"Pow", {2, 2}}, {"RandomNormal", {0, 0}}, {"RandomNormalLike", {1, 1}}, {"Range", {3, 3}},
      {"Reciprocal", {1, 1}}, {"ReduceL1", {1, 2}}, {"ReduceL2", {1, 2}}, {"ReduceLogSum", {1, 2}},
      {"ReduceLogSumExp", {1, 2}}, {"ReduceMax", {1, 2}}, {"ReduceMean", {1, 2}}, {"ReduceMin", {1, 2}},
      {"ReduceProd", {1, 2}}, {"ReduceSum", {1, 2}}, {"ReduceSumSquare", {1, 2}}, {"Relu", {1, 1}}, {"Reshape", {2, 2}}, {"Resize", {1, 4}}, {"ScatterND", {3, 3}}, {"Shape", {1, 1}},
      {"Sigmoid", {1, 1}}, {"Sin", {1, 1}}, {"Size", {1, 1}}, {"Slice", {3, 5}}, {"Softmax", {1, 1}},
      {"Softplus", {1, 1}}, {"Split", {1, 2, 1, INT_MAX}}, {"Sqrt", {1, 1}}, {"Squeeze", {1, 2}},
      {"Sub", {2, 2}}, {"Sum", {1, INT_MAX}}, {"Tanh", {1, 1}}, {"Tile", {2, 2}}, {"Transpose", {1, 1}},
      {"Unsqueeze", {2, 2}}, {"Where", {3, 3}}, {"Xor", {2, 2}},
  };
  return t;
}

void check_arity(const onnx::NodeProto& np, const std::string& op, const std::string& where) {
  auto it = onnx_arities().find(op);
  WXE_CHECK(it != onnx_arities().end(), where, ": ", op, " is not an ONNX op wxe reads");
  const Arity& a = it->second;
  WXE_CHECK(np.input_size() >= a.min_in && np.input_size() <= a.max_in, where, " (", op, "): has ",
            np.input_size(), " inputs, needs ", a.min_in, a.max_in == a.min_in ? "" : " or more",
            a.max_in == a.min_in || a.max_in == INT_MAX ? "" : str(" (at most ", a.max_in, ")"));
  WXE_CHECK(np.output_size() >= a.min_out && np.output_size() <= a.max_out, where, " (", op, "): has ",
            np.output_size(), " outputs, needs ", a.min_out,
            a.max_out == a.min_out ? "" : a.max_out == INT_MAX ? " or more" : str(" to ", a.max_out));
  for (int i = 0; i < a.min_in; ++i)
    WXE_CHECK(!np.input(i).empty(), where, " (", op, "): required input ", i, " is empty");
  for (int i = 0; i < a.min_out; ++i)
    WXE_CHECK(!np.output(i).empty(), where, " (", op, "): required output ", i, " is empty");
}

}  // namespace

std::vector<std::string> onnx_importable_ops() {
  std::vector<std::string> r;
  for (auto& kv : onnx_arities()) r.push_back(kv.first);
  return r;
}

Graph import_onnx(const std::string& path) {
  register_cpu_kernels();
  check_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  WXE_CHECK(f.good(), path, ": cannot open file");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  onnx::ModelProto model;
  WXE_CHECK(!bytes.empty(), path, ": file is empty");
  WXE_CHECK(model.ParseFromString(bytes), path,
            ": not a valid ONNX model (protobuf parse failed; truncated or corrupt file?)");
  bytes.clear();
  bytes.shrink_to_fit();
  WXE_CHECK(model.has_graph() && model.graph().node_size() > 0, path,
            ": not a valid ONNX model (no graph or no nodes)");

  Graph g;
  g.source = path;
  g.opset = -1;
  for (auto& os : model.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") g.opset = (int)os.version();
  WXE_CHECK(g.opset >= kMinOpset && g.opset <= kMaxOpset, path, ": opset ", g.opset,
            " is not supported (wxe reads opsets ", kMinOpset, " to ", kMaxOpset, ")");

  const onnx::GraphProto& gp = model.graph();
  // Every unsupported op type, one node name each, before any other work.
  std::map<std::string, std::string> unsupported;
  std::function<void(const onnx::GraphProto&)> check_ops = [&](const onnx::GraphProto& sg) {
    for (auto& np : sg.node()) {
      std::string op = np.domain().empty() || np.domain() == "ai.onnx"
                           ? np.op_type()
                           : np.domain() + "." + np.op_type();
      if (!op_known(op) && !unsupported.count(op))
        unsupported[op] = np.name().empty() ? "(unnamed)" : np.name();
      for (auto& a : np.attribute())
        if (a.type() == onnx::AttributeProto::GRAPH) check_ops(a.g());
    }
  };
  check_ops(gp);
  if (!unsupported.empty()) {
    std::string list;
    for (auto& kv : unsupported) list += (list.empty() ? "" : ", ") + kv.first + " (node " + kv.second + ")";
    fail(path, ": unsupported op types: ", list);
  }

  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::map<std::string, int> by_name;
  auto value_of = [&](const std::string& name) -> int {
    auto it = by_name.find(name);
    if (it != by_name.end()) return it->second;
    Value v;
    v.name = name;
    int id = g.add_value(v);
    by_name[name] = id;
    return id;
  };

  for (auto& tp : gp.initializer()) {
    std::string where = path + ": initializer '" + tp.name() + "'";
    int id = value_of(tp.name());
    Value& v = g.values[id];
    v.constant = std::make_shared<Tensor>(tensor_from_proto(tp, dir, where));
    v.dtype = v.constant->dtype;
    v.shape = v.constant->shape;
    v.shape_known = true;
    v.is_param = true;
  }
  for (auto& vi : gp.input()) {
    int id = value_of(vi.name());
    Value& v = g.values[id];
    if (v.is_const()) continue;  // old exporters list initializers as inputs too
    const auto& tt = vi.type().tensor_type();
    v.dtype = from_onnx_type(tt.elem_type(), path + ": input '" + vi.name() + "'");
    v.shape.clear();
    for (auto& d : tt.shape().dim()) v.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
    g.inputs.push_back(id);
  }
  std::set<int> produced;
  // Imports the nodes of a graph (the main one or an If branch) into `into`, in order. An If
  // becomes, in place: its then-branch's nodes, its else-branch's nodes (each tagged with the
  // attribute if_branch = "|<id>.then" or "|<id>.else", nested Ifs appending theirs), then the
  // If node itself with inputs (cond, then outputs..., else outputs...) and attribute if_id.
  // passes.h fold_if keeps one branch. ONNX names are unique across a model, so branches share
  // the main graph's values.
  std::function<void(const onnx::GraphProto&, std::vector<Node>&, const std::string&)> import_nodes;
  int if_count = 0;
  auto import_branch = [&](const onnx::GraphProto& bp, const std::string& where, std::vector<Node>& into,
                           const std::string& tag) {
    for (auto& tp : bp.initializer()) {
      int id = value_of(tp.name());
      Value& v = g.values[id];
      v.constant = std::make_shared<Tensor>(tensor_from_proto(tp, dir, where + " initializer '" + tp.name() + "'"));
      v.dtype = v.constant->dtype;
      v.shape = v.constant->shape;
      v.shape_known = true;
    }
    WXE_CHECK(bp.input_size() == 0, where, ": an If branch with inputs is not valid ONNX");
    import_nodes(bp, into, tag);
    std::vector<int> outs;
    for (auto& vi : bp.output()) {
      WXE_CHECK(by_name.count(vi.name()), where, ": branch output '", vi.name(), "' is never produced");
      outs.push_back(by_name[vi.name()]);
    }
    return outs;
  };
  import_nodes = [&](const onnx::GraphProto& from, std::vector<Node>& into, const std::string& tag) {
  for (auto& np : from.node()) {
    Node n;
    n.op = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    if (!n.domain.empty()) n.op = n.domain + "." + n.op;
    n.name = np.name();
    // a dynamo export's node in a module gets the TorchScript exporter's form "/module/name"
    // (passes.h scope_module), so the passes find its module the same way
    if (!n.name.empty() && n.name[0] != '/') {
      const std::string module = dynamo_module(np);
      if (!module.empty()) n.name = "/" + module + "/" + n.name;
    }
    std::string where = path + ": node " + (n.name.empty() ? n.op : n.name);
    if (n.domain.empty()) check_arity(np, n.op, where);
    for (auto& a : np.attribute()) {
      WXE_CHECK(a.type() != onnx::AttributeProto::GRAPH || n.op == "If", where, ": attribute '", a.name(),
                "': subgraphs are supported only in If");
      // the attributes wxe's passes give ONNX ops (engine/passes/fuse.h): never a file's
      for (const char* own : {"rows", "constant_weights", "precision", "channels_last_output", "if_branch", "if_id"})
        WXE_CHECK(!n.domain.empty() || a.name() != own, where, " (", n.op, "): attribute '", a.name(), "' is wxe's own, not ONNX's");
      if (a.type() != onnx::AttributeProto::GRAPH) n.attrs[a.name()] = attr_from_proto(a, dir, where);
    }
    if (!tag.empty()) n.attrs["if_branch"] = attr_s(tag);
    // torch.onnx.export shares one initializer between parameters of equal value and gives
    // each other parameter its name back through an Identity: make it a parameter again.
    if (n.op == "Identity" && np.input_size() == 1 && np.output_size() == 1 && by_name.count(np.input(0)) &&
        g.values[by_name[np.input(0)]].is_param && !by_name.count(np.output(0))) {
      Value copy = g.values[by_name[np.input(0)]];
      copy.name = np.output(0);
      int id = g.add_value(copy);
      by_name[copy.name] = id;
      continue;
    }
    for (auto& in : np.input()) n.inputs.push_back(in.empty() ? -1 : value_of(in));
    if (n.op == "If") {
      const onnx::GraphProto *then_g = nullptr, *else_g = nullptr;
      for (auto& a : np.attribute())
        if (a.type() == onnx::AttributeProto::GRAPH) (a.name() == "then_branch" ? then_g : else_g) = &a.g();
      WXE_CHECK(then_g && else_g, where, " (If): needs then_branch and else_branch");
      const std::string id = "if" + std::to_string(if_count++);
      std::vector<int> t = import_branch(*then_g, where + " then_branch", into, tag + "|" + id + ".then");
      std::vector<int> e = import_branch(*else_g, where + " else_branch", into, tag + "|" + id + ".else");
      WXE_CHECK((int)t.size() == np.output_size() && (int)e.size() == np.output_size(), where,
                " (If): branches must have as many outputs as the If (", np.output_size(), ")");
      n.inputs.insert(n.inputs.end(), t.begin(), t.end());
      n.inputs.insert(n.inputs.end(), e.begin(), e.end());
      n.attrs["if_id"] = attr_s(id);
    }
    for (auto& out : np.output()) {
      if (out.empty()) {  // an optional output nobody reads: a value of its own
        Value v;
        v.name = n.name + ":unused" + std::to_string(n.outputs.size());
        n.outputs.push_back(g.add_value(v));
        continue;
      }
      int id = value_of(out);
      WXE_CHECK(!produced.count(id) && !g.values[id].is_const() &&
                    std::find(g.inputs.begin(), g.inputs.end(), id) == g.inputs.end(),
                where, ": output '", out, "' is already an initializer, an input or another node's output");
      produced.insert(id);
      n.outputs.push_back(id);
    }
    into.push_back(std::move(n));
  }
  };
  import_nodes(gp, g.nodes, "");
  for (auto& vi : gp.output()) {
    auto it = by_name.find(vi.name());
    WXE_CHECK(it != by_name.end(), path, ": graph output '", vi.name(), "' is never produced");
    g.outputs.push_back(it->second);
  }
  WXE_CHECK(!g.outputs.empty(), path, ": graph has no outputs");
  // a value read by a node but never produced, and not an input or constant
  std::vector<int> prod = g.producers();
  for (auto& n : g.nodes)
    for (int i : n.inputs)
      WXE_CHECK(i < 0 || prod[i] >= 0 || g.values[i].is_const() ||
                    std::find(g.inputs.begin(), g.inputs.end(), i) != g.inputs.end(),
                path, ": node ", n.name, " reads '", g.values[i].name,
                "', which is neither an input, an initializer nor a node output (truncated file?)");
  topo_sort(g);
  return g;
}

}  // namespace wxe
