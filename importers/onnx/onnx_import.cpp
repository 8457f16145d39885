#include "importers/onnx/onnx_import.h"

#include <onnx/onnx_pb.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine/ops.h"

namespace wxe {

namespace {

constexpr int kMinOpset = 13, kMaxOpset = 21;

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

// Reads `length` bytes at `offset` of an external data file next to the model.
void read_external(const onnx::TensorProto& tp, const std::filesystem::path& dir, Tensor& t,
                   const std::string& where) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (auto& kv : tp.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = std::stoll(kv.value());
    else if (kv.key() == "length") length = std::stoll(kv.value());
  }
  WXE_CHECK(!location.empty(), where, ": external data without a location");
  std::filesystem::path file = dir / location;
  std::ifstream f(file, std::ios::binary);
  WXE_CHECK(f.good(), where, ": cannot open external data file ", file.string());
  f.seekg(0, std::ios::end);
  int64_t size = f.tellg();
  if (length < 0) length = (int64_t)t.nbytes();
  WXE_CHECK(length == (int64_t)t.nbytes(), where, ": external data length ", length,
            " does not match shape ", shape_str(t.shape), " (", t.nbytes(), " bytes)");
  WXE_CHECK(offset >= 0 && offset + length <= size, where, ": external data ", file.string(),
            " is truncated (needs bytes ", offset, "..", offset + length, ", file has ", size, ")");
  f.seekg(offset);
  f.read((char*)t.raw(), length);
  WXE_CHECK(f.good(), where, ": failed reading external data ", file.string());
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

}  // namespace

Graph import_onnx(const std::string& path) {
  register_cpu_kernels();
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
  for (auto& np : gp.node()) {
    std::string op = np.domain().empty() || np.domain() == "ai.onnx"
                         ? np.op_type()
                         : np.domain() + "." + np.op_type();
    if (!op_known(op) && !unsupported.count(op))
      unsupported[op] = np.name().empty() ? "(unnamed)" : np.name();
  }
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
  for (auto& np : gp.node()) {
    Node n;
    n.op = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    if (!n.domain.empty()) n.op = n.domain + "." + n.op;
    n.name = np.name();
    std::string where = path + ": node " + (n.name.empty() ? n.op : n.name);
    for (auto& a : np.attribute()) n.attrs[a.name()] = attr_from_proto(a, dir, where);
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
    for (auto& out : np.output()) n.outputs.push_back(value_of(out));
    g.nodes.push_back(std::move(n));
  }
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
