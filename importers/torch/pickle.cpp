#include "importers/torch/pickle.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/ir/error.h"

namespace wxe::torch_pickle {

namespace {

struct TypeInfo {
  ScalarType t;
  size_t size;
  const char* name;
};
const TypeInfo kTypes[] = {
    {ScalarType::F32, 4, "float32"},      {ScalarType::F64, 8, "float64"},
    {ScalarType::F16, 2, "float16"},      {ScalarType::BF16, 2, "bfloat16"},
    {ScalarType::I64, 8, "int64"},        {ScalarType::I32, 4, "int32"},
    {ScalarType::I16, 2, "int16"},        {ScalarType::I8, 1, "int8"},
    {ScalarType::U8, 1, "uint8"},         {ScalarType::Bool, 1, "bool"},
    {ScalarType::U16, 2, "uint16"},       {ScalarType::U32, 4, "uint32"},
    {ScalarType::U64, 8, "uint64"},       {ScalarType::C64, 8, "complex64"},
    {ScalarType::C128, 16, "complex128"}, {ScalarType::F8E4M3FN, 1, "float8_e4m3fn"},
    {ScalarType::F8E5M2, 1, "float8_e5m2"}, {ScalarType::F8E4M3FNUZ, 1, "float8_e4m3fnuz"},
    {ScalarType::F8E5M2FNUZ, 1, "float8_e5m2fnuz"},
};

struct Allowed {
  GlobalId id;
  ScalarType type;
  bool untyped;
};

// The allow-list: "module.name" -> meaning. Nothing else resolves.
const std::unordered_map<std::string, Allowed>& allow_list() {
  static const std::unordered_map<std::string, Allowed> m = [] {
    std::unordered_map<std::string, Allowed> r;
    auto add = [&](const std::string& n, GlobalId id, ScalarType t = ScalarType::F32,
                   bool untyped = false) { r[n] = Allowed{id, t, untyped}; };
    add("collections.OrderedDict", GlobalId::OrderedDict);
    for (const char* b : {"builtins", "__builtin__"}) {
      add(std::string(b) + ".set", GlobalId::Set);
      add(std::string(b) + ".frozenset", GlobalId::FrozenSet);
    }
    add("_codecs.encode", GlobalId::CodecsEncode);  // how protocol 2 pickles `bytes`
    add("torch._utils._rebuild_tensor_v2", GlobalId::RebuildTensorV2);
    add("torch._utils._rebuild_tensor_v3", GlobalId::RebuildTensorV3);
    add("torch._utils._rebuild_parameter", GlobalId::RebuildParameter);
    add("torch._utils._rebuild_parameter_with_state", GlobalId::RebuildParameterWithState);
    const std::pair<const char*, ScalarType> storages[] = {
        {"Float", ScalarType::F32},  {"Double", ScalarType::F64},
        {"Half", ScalarType::F16},   {"BFloat16", ScalarType::BF16},
        {"Long", ScalarType::I64},   {"Int", ScalarType::I32},
        {"Short", ScalarType::I16},  {"Char", ScalarType::I8},
        {"Byte", ScalarType::U8},    {"Bool", ScalarType::Bool},
        {"ComplexFloat", ScalarType::C64}, {"ComplexDouble", ScalarType::C128}};
    for (auto& s : storages) add(std::string("torch.") + s.first + "Storage", GlobalId::StorageType, s.second);
    add("torch.UntypedStorage", GlobalId::StorageType, ScalarType::U8, true);
    add("torch.storage.UntypedStorage", GlobalId::StorageType, ScalarType::U8, true);
    const std::pair<const char*, ScalarType> dtypes[] = {
        {"float32", ScalarType::F32}, {"float", ScalarType::F32},
        {"float64", ScalarType::F64}, {"double", ScalarType::F64},
        {"float16", ScalarType::F16}, {"half", ScalarType::F16},
        {"bfloat16", ScalarType::BF16}, {"int64", ScalarType::I64},
        {"long", ScalarType::I64},    {"int32", ScalarType::I32},
        {"int", ScalarType::I32},     {"int16", ScalarType::I16},
        {"short", ScalarType::I16},   {"int8", ScalarType::I8},
        {"uint8", ScalarType::U8},    {"bool", ScalarType::Bool},
        {"uint16", ScalarType::U16},  {"uint32", ScalarType::U32},
        {"uint64", ScalarType::U64},  {"complex64", ScalarType::C64},
        {"cfloat", ScalarType::C64},  {"complex128", ScalarType::C128},
        {"cdouble", ScalarType::C128}, {"float8_e4m3fn", ScalarType::F8E4M3FN},
        {"float8_e5m2", ScalarType::F8E5M2}, {"float8_e4m3fnuz", ScalarType::F8E4M3FNUZ},
        {"float8_e5m2fnuz", ScalarType::F8E5M2FNUZ}};
    for (auto& d : dtypes) add(std::string("torch.") + d.first, GlobalId::Dtype, d.second);
    return r;
  }();
  return m;
}

// For messages: printable ASCII, bounded.
std::string printable(std::string_view s, size_t max = 120) {
  std::string r;
  for (char c : s.substr(0, max)) r += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max) r += "...";
  return r;
}

constexpr size_t kMaxDims = 64;
constexpr size_t kMaxGlobalName = 256;
constexpr size_t kMaxStorageKey = 4096;

}  // namespace

size_t scalar_size(ScalarType t) { return kTypes[(int)t].size; }
const char* scalar_name(ScalarType t) { return kTypes[(int)t].name; }

bool to_dtype(ScalarType t, DType* out) {
  switch (t) {
    case ScalarType::F32: *out = DType::F32; return true;
    case ScalarType::F64: *out = DType::F64; return true;
    case ScalarType::F16: *out = DType::F16; return true;
    case ScalarType::BF16: *out = DType::BF16; return true;
    case ScalarType::I64: *out = DType::I64; return true;
    case ScalarType::I32: *out = DType::I32; return true;
    case ScalarType::I8: *out = DType::I8; return true;
    case ScalarType::U8: *out = DType::U8; return true;
    case ScalarType::Bool: *out = DType::Bool; return true;
    default: return false;
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
  }
  return "?";
}

Unpickler::Unpickler(std::string where, const uint8_t* data, size_t n, StorageLookup lookup)
    : where_(std::move(where)), data_(data), n_(n), lookup_(std::move(lookup)) {
  // Real pickles use a few bytes of object model per pickle byte; adversarial ones are cut
  // off here instead of exhausting memory.
  budget_ = 16 * (uint64_t)n + (64u << 20);
}

void Unpickler::bad(const std::string& msg) const {
  fail(where_, ": ", msg, " (pickle byte ", op_pos_, ")");
}

uint8_t Unpickler::byte() {
  if (pos_ >= n_) bad("truncated pickle (no STOP opcode)");
  return data_[pos_++];
}

const uint8_t* Unpickler::take(uint64_t n) {
  if (n > n_ - pos_) bad("truncated pickle (an argument runs past the end)");
  const uint8_t* p = data_ + pos_;
  pos_ += n;
  return p;
}

uint64_t Unpickler::le(int nbytes) {
  const uint8_t* p = take(nbytes);
  uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string Unpickler::line() {
  size_t e = pos_;
  while (e < n_ && data_[e] != '\n') ++e;
  if (e >= n_) bad("truncated pickle (unterminated text argument)");
  std::string s((const char*)data_ + pos_, e - pos_);
  pos_ = e + 1;
  return s;
}

void Unpickler::charge(uint64_t bytes) {
  if (bytes > budget_) bad("pickle builds more objects than its size allows (corrupt or hostile)");
  budget_ -= bytes;
}

int32_t Unpickler::new_obj(Obj o) {
  charge(sizeof(Obj));
  if (objs_.size() >= 0x7fffffff) bad("too many objects");
  objs_.push_back(o);
  return (int32_t)objs_.size() - 1;
}

int32_t Unpickler::new_int(int64_t v) {
  Obj o;
  o.kind = Kind::Int;
  o.i = v;
  return new_obj(o);
}

int32_t Unpickler::new_seq(Kind k, std::vector<int32_t> items) {
  charge(sizeof(std::vector<int32_t>) + 16 + items.size() * sizeof(int32_t));
  Obj o;
  o.kind = k;
  o.ref = (int32_t)seqs_.size();
  seqs_.push_back(std::move(items));
  return new_obj(o);
}

int32_t Unpickler::new_str(Kind k, std::string_view s) {
  Obj o;
  o.kind = k;
  auto it = str_index_.find(s);
  if (it != str_index_.end()) {
    o.ref = it->second;
  } else {
    charge(s.size() + 96);
    strs_.emplace_back(s);
    o.ref = (int32_t)strs_.size() - 1;
    str_index_.emplace(std::string_view(strs_.back()), o.ref);
  }
  return new_obj(o);
}

void Unpickler::push(int32_t id) { stack_.push_back(id); }

int32_t Unpickler::pop() {
  if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size()))
    bad("stack underflow");
  int32_t v = stack_.back();
  stack_.pop_back();
  return v;
}

int32_t Unpickler::top() const {
  if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size()))
    bad("stack underflow");
  return stack_.back();
}

std::vector<int32_t> Unpickler::pop_mark() {
  if (marks_.empty()) bad("MARK expected but missing");
  size_t k = marks_.back();
  marks_.pop_back();
  std::vector<int32_t> items(stack_.begin() + k, stack_.end());
  stack_.resize(k);
  return items;
}

void Unpickler::memo_put(uint64_t key) {
  int32_t v = top();
  auto r = memo_.insert_or_assign(key, v);
  if (r.second) charge(48);
}

int32_t Unpickler::memo_get(uint64_t key) {
  auto it = memo_.find(key);
  if (it == memo_.end()) bad(wxe::str("memo key ", key, " was never stored"));
  return it->second;
}

// A hashable key for dict de-duplication (Python semantics for str/bytes/int/bool/float/None
// keys; identity for globals, storages and tensors). "" = do not de-duplicate (tuples).
std::string Unpickler::key_of(int32_t id) const {
  const Obj& o = objs_[id];
  switch (o.kind) {
    case Kind::Str: return "s" + std::to_string(o.ref);
    case Kind::Bytes: return "b" + std::to_string(o.ref);
    case Kind::BigInt: return "L" + std::to_string(o.ref);
    case Kind::Int:
    case Kind::Bool: return "i" + std::to_string(o.i);
    case Kind::Float: {
      double d;
      std::memcpy(&d, &o.i, 8);
      if (d == std::floor(d) && std::fabs(d) < 9.2e18) return "i" + std::to_string((int64_t)d);
      return "f" + std::to_string(o.i);
    }
    case Kind::None: return "n";
    case Kind::Tuple: return "";
    case Kind::List:
    case Kind::Dict: bad(wxe::str("unhashable dict key (", kind_name(o.kind), ")"));
    default: return "o" + std::to_string(id);
  }
}

void Unpickler::set_item(int32_t dict, int32_t key, int32_t value) {
  if (objs_[dict].kind != Kind::Dict)
    bad(wxe::str("SETITEM on a ", kind_name(objs_[dict].kind), ", not a dict"));
  std::vector<int32_t>& items = seqs_[objs_[dict].ref];
  std::string k = key_of(key);
  if (!k.empty()) {
    auto& index = dict_index_[objs_[dict].ref];
    auto it = index.find(k);
    if (it != index.end()) {
      items[it->second + 1] = value;
      return;
    }
    charge(k.size() + 64);
    index.emplace(std::move(k), (uint32_t)items.size());
  }
  charge(2 * sizeof(int32_t) * 2);
  items.push_back(key);
  items.push_back(value);
}

void Unpickler::append(int32_t list, int32_t value) {
  Kind k = objs_[list].kind;
  if (k != Kind::List) bad(wxe::str("APPEND on a ", kind_name(k), ", not a list"));
  charge(2 * sizeof(int32_t));
  seqs_[objs_[list].ref].push_back(value);
}

int32_t Unpickler::dict_get(int32_t dict_id, const std::string& key) const {
  const std::vector<int32_t>& items = seq(dict_id);
  for (size_t i = 0; i + 1 < items.size(); i += 2)
    if (kind(items[i]) == Kind::Str && str(items[i]) == key) return items[i + 1];
  return -1;
}

int64_t Unpickler::as_int(int32_t id, const char* what) const {
  Kind k = objs_[id].kind;
  if (k != Kind::Int && k != Kind::Bool) bad(wxe::str(what, " is a ", kind_name(k), ", not an int"));
  return objs_[id].i;
}

int32_t Unpickler::int_tuple(int32_t id, const char* what) const {
  Kind k = objs_[id].kind;
  if (k != Kind::Tuple && k != Kind::List) bad(wxe::str(what, " is a ", kind_name(k), ", not a tuple"));
  const auto& items = seq(id);
  if (items.size() > kMaxDims) bad(wxe::str(what, " has ", items.size(), " dimensions"));
  for (int32_t v : items) {
    int64_t x = as_int(v, what);
    if (x < 0) bad(wxe::str(what, " has a negative entry ", x));
  }
  return id;
}

std::vector<int64_t> Unpickler::ints(int32_t tuple_id) const {
  std::vector<int64_t> r;
  for (int32_t v : seq(tuple_id)) r.push_back(objs_[v].i);
  return r;
}

std::string Unpickler::describe(int32_t id) const {
  const Obj& o = objs_[id];
  switch (o.kind) {
    case Kind::Int: return wxe::str("int ", o.i);
    case Kind::Bool: return o.i ? "True" : "False";
    case Kind::Str: return "str '" + printable(strs_[o.ref], 60) + "'";
    case Kind::Global: return "global " + printable(strs_[o.ref]);
    default: return kind_name(o.kind);
  }
}

int32_t Unpickler::global(const std::string& module, const std::string& name) {
  if (module.size() > kMaxGlobalName || name.size() > kMaxGlobalName)
    bad("disallowed global '" + printable(module, 60) + "." + printable(name, 60) +
        "' (not a state-dict type; nothing was executed)");
  std::string full = module + "." + name;
  const auto& al = allow_list();
  auto it = al.find(full);
  if (it == al.end())
    bad("disallowed global '" + printable(full) +
        "' (not a state-dict type; refusing to load, nothing was executed)");
  Obj o;
  o.kind = Kind::Global;
  o.tag = (uint8_t)it->second.id;
  o.tag2 = (uint8_t)it->second.type;
  o.i = it->second.untyped ? 1 : 0;
  int32_t name_id = new_str(Kind::Str, full);
  o.ref = objs_[name_id].ref;
  return new_obj(o);
}

int32_t Unpickler::persistent_load(int32_t pid) {
  // ('storage', storage_type, key, location, numel)
  if (kind(pid) != Kind::Tuple) bad(wxe::str("persistent id is a ", kind_name(kind(pid)), ", not a tuple"));
  const auto& t = seq(pid);
  if (t.size() != 5 || kind(t[0]) != Kind::Str || str(t[0]) != "storage")
    bad("unsupported persistent id (expected ('storage', type, key, location, numel))");
  const Obj& type = obj(t[1]);
  if (type.kind != Kind::Global || (GlobalId)type.tag != GlobalId::StorageType)
    bad(wxe::str("persistent id: storage type is ", describe(t[1])));
  if (kind(t[2]) != Kind::Str) bad(wxe::str("persistent id: key is a ", kind_name(kind(t[2]))));
  const std::string& key = str(t[2]);
  if (key.size() > kMaxStorageKey) bad("persistent id: storage key too long");
  if (kind(t[3]) != Kind::Str) bad(wxe::str("persistent id: location is a ", kind_name(kind(t[3]))));
  int64_t numel = as_int(t[4], "persistent id numel");
  if (numel < 0) bad(wxe::str("storage '", printable(key), "' has negative size ", numel));
  StorageInfo s;
  s.key = key;
  s.type = (ScalarType)type.tag2;
  s.numel = (uint64_t)numel;
  if (!lookup_(key, &s.nbytes))
    bad(wxe::str("storage '", printable(key), "' is missing from the archive (no data/",
            printable(key), " entry)"));
  size_t es = scalar_size(s.type);
  if (s.numel > s.nbytes / es || s.numel * es != s.nbytes)
    bad(wxe::str("storage '", printable(key), "' holds ", s.nbytes, " bytes but the pickle says ",
            numel, " ", scalar_name(s.type), " elements"));
  charge(sizeof(StorageInfo) + key.size());
  Obj o;
  o.kind = Kind::Storage;
  o.tag = (uint8_t)s.type;
  o.ref = (int32_t)storages_.size();
  storages_.push_back(std::move(s));
  return new_obj(o);
}

std::string Unpickler::explain_bounds(const TensorInfo& t) const {
  const StorageInfo& s = storages_[t.storage];
  std::string sz = "(", st = "(";
  for (int64_t v : ints(t.size)) sz += std::to_string(v) + ",";
  for (int64_t v : ints(t.stride)) st += std::to_string(v) + ",";
  sz.back() == ',' ? (void)(sz.back() = ')') : (void)(sz += ')');
  st.back() == ',' ? (void)(st.back() = ')') : (void)(st += ')');
  return wxe::str("offset ", t.offset, ", size ", sz, ", stride ", st, " of ", scalar_name(t.type),
             " reads past the end of storage '", printable(s.key), "' (", s.nbytes, " bytes)");
}

int32_t Unpickler::rebuild_tensor(const std::vector<int32_t>& a, bool v3) {
  const char* fn = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
  size_t lo = v3 ? 7 : 6;
  if (a.size() < lo || a.size() > lo + 1)
    bad(wxe::str(fn, " expects ", lo, " or ", lo + 1, " arguments, got ", a.size()));
  if (kind(a[0]) != Kind::Storage) bad(wxe::str(fn, ": first argument is ", describe(a[0]), ", not a storage"));
  TensorInfo t;
  t.storage = obj(a[0]).ref;
  t.type = (ScalarType)obj(a[0]).tag;
  if (v3) {
    const Obj& d = obj(a[6]);
    if (d.kind != Kind::Global || (GlobalId)d.tag != GlobalId::Dtype)
      bad(wxe::str(fn, ": dtype argument is ", describe(a[6])));
    t.type = (ScalarType)d.tag2;
  }
  t.offset = as_int(a[1], "storage offset");
  if (t.offset < 0) bad(wxe::str(fn, ": negative storage offset ", t.offset));
  t.size = int_tuple(a[2], "tensor size");
  t.stride = int_tuple(a[3], "tensor stride");
  if (seq(t.size).size() != seq(t.stride).size())
    bad(wxe::str(fn, ": size has ", seq(t.size).size(), " dimensions but stride has ",
            seq(t.stride).size()));
  std::vector<int64_t> size = ints(t.size), stride = ints(t.stride);
  // numel (overflow-checked) and the largest element index read.
  int64_t numel = 1, last = t.offset;
  bool overflow = false;
  for (size_t d = 0; d < size.size(); ++d) overflow |= __builtin_mul_overflow(numel, size[d], &numel);
  if (overflow) bad(wxe::str(fn, ": tensor size overflows"));
  t.numel = numel;
  const StorageInfo& s = storages_[t.storage];
  uint64_t cap = s.nbytes / scalar_size(t.type);  // elements of the tensor's type
  if (numel > 0) {
    for (size_t d = 0; d < size.size(); ++d) {
      int64_t step;
      overflow |= __builtin_mul_overflow(size[d] - 1, stride[d], &step);
      overflow |= __builtin_add_overflow(last, step, &last);
    }
    t.in_bounds = !overflow && (uint64_t)last < cap;
  }
  charge(sizeof(TensorInfo));
  Obj o;
  o.kind = Kind::Tensor;
  o.tag = (uint8_t)t.type;
  o.ref = (int32_t)tensors_.size();
  tensors_.push_back(t);
  return new_obj(o);
}

int32_t Unpickler::reduce(int32_t callable, int32_t args) {
  const Obj c = obj(callable);  // a copy: new objects may reallocate objs_
  if (c.kind != Kind::Global) bad(wxe::str("REDUCE calls a ", kind_name(c.kind)));
  if (kind(args) != Kind::Tuple) bad(wxe::str("REDUCE arguments are a ", kind_name(kind(args))));
  if (seq(args).size() > 8) bad(wxe::str("REDUCE with ", seq(args).size(), " arguments"));
  const std::vector<int32_t> a = seq(args);
  switch ((GlobalId)c.tag) {
    case GlobalId::OrderedDict: {
      int32_t d = new_seq(Kind::Dict);
      if (a.size() > 1) bad("OrderedDict() takes at most one argument");
      if (a.size() == 1) {
        Kind k = kind(a[0]);
        if (k == Kind::Dict) {
          std::vector<int32_t> items = seq(a[0]);
          charge(items.size() * 8);
          for (size_t i = 0; i + 1 < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        } else if (k == Kind::List || k == Kind::Tuple) {
          std::vector<int32_t> pairs = seq(a[0]);
          charge(pairs.size() * 8);
          for (int32_t p : pairs) {
            Kind pk = kind(p);
            if ((pk != Kind::List && pk != Kind::Tuple) || seq(p).size() != 2)
              bad("OrderedDict() argument is not a sequence of pairs");
            set_item(d, seq(p)[0], seq(p)[1]);
          }
        } else {
          bad(wxe::str("OrderedDict() argument is a ", kind_name(k)));
        }
      }
      return d;
    }
    case GlobalId::Set:
    case GlobalId::FrozenSet: {
      if (a.empty()) return new_seq(Kind::List);
      Kind k = kind(a[0]);
      if (a.size() != 1 || (k != Kind::List && k != Kind::Tuple)) bad("set() takes a list");
      return new_seq(Kind::List, seq(a[0]));  // new_seq charges the copy
    }
    case GlobalId::CodecsEncode: {
      if (a.size() != 2 || kind(a[0]) != Kind::Str || kind(a[1]) != Kind::Str)
        bad("_codecs.encode expects (str, encoding)");
      const std::string& s = str(a[0]);
      const std::string& enc = str(a[1]);
      charge(s.size());
      if (enc == "utf-8" || enc == "utf8") return new_str(Kind::Bytes, s);
      if (enc != "latin1" && enc != "latin-1" && enc != "iso-8859-1")
        bad("_codecs.encode: unsupported encoding '" + printable(enc) + "'");
      std::string out;  // UTF-8 -> code points < 256
      for (size_t i = 0; i < s.size(); ++i) {
        uint8_t b = (uint8_t)s[i];
        if (b < 0x80) {
          out += (char)b;
        } else if ((b & 0xe0) == 0xc0 && i + 1 < s.size() && b <= 0xc3) {
          out += (char)(((b & 0x1f) << 6) | ((uint8_t)s[++i] & 0x3f));
        } else {
          bad("_codecs.encode: string is not latin-1");
        }
      }
      return new_str(Kind::Bytes, out);
    }
    case GlobalId::RebuildTensorV2: return rebuild_tensor(a, false);
    case GlobalId::RebuildTensorV3: return rebuild_tensor(a, true);
    case GlobalId::RebuildParameter:
    case GlobalId::RebuildParameterWithState: {
      size_t want = (GlobalId)c.tag == GlobalId::RebuildParameter ? 3 : 4;
      if (a.size() != want || kind(a[0]) != Kind::Tensor)
        bad(wxe::str(printable(strs_[c.ref]), " expects (tensor, requires_grad, hooks",
                want == 4 ? ", state)" : ")"));
      return a[0];
    }
    case GlobalId::StorageType:
    case GlobalId::Dtype: break;
  }
  bad(wxe::str("REDUCE: ", printable(strs_[c.ref]), " is not callable here"));
}

int32_t Unpickler::load() {
  pos_ = 0;
  for (;;) {
    op_pos_ = pos_;
    uint8_t op = byte();
    switch (op) {
      case 0x80: {  // PROTO
        uint8_t proto = byte();
        if (proto > 5) bad(wxe::str("unsupported pickle protocol ", (int)proto));
        break;
      }
      case 0x95: {  // FRAME: framing is only a hint for buffered readers
        uint64_t len = le(8);
        if (len > n_ - pos_) bad("truncated pickle (frame runs past the end)");
        break;
      }
      case '.': {  // STOP: exactly one object, no open MARK (as pickle.dump writes)
        if (!marks_.empty()) bad("STOP with an open MARK");
        if (stack_.size() != 1) bad(wxe::str("STOP leaves ", stack_.size(), " objects on the stack"));
        return stack_.back();
      }
      case '(': marks_.push_back(stack_.size()); break;
      case '0': pop(); break;
      case '1': pop_mark(); break;
      case '2': push(top()); break;
      case '}': push(new_seq(Kind::Dict)); break;
      case ']': push(new_seq(Kind::List)); break;
      case ')': push(new_seq(Kind::Tuple)); break;
      case 0x8f: push(new_seq(Kind::List)); break;  // EMPTY_SET
      case 't': push(new_seq(Kind::Tuple, pop_mark())); break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        size_t k = op - 0x84;
        std::vector<int32_t> items(k);
        for (size_t i = k; i-- > 0;) items[i] = pop();
        push(new_seq(Kind::Tuple, std::move(items)));
        break;
      }
      case 'l': push(new_seq(Kind::List, pop_mark())); break;
      case 0x91: push(new_seq(Kind::List, pop_mark())); break;  // FROZENSET
      case 'd': {  // DICT
        std::vector<int32_t> items = pop_mark();
        if (items.size() % 2) bad("DICT with an odd number of items");
        int32_t d = new_seq(Kind::Dict);
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        push(d);
        break;
      }
      case 'a': {  // APPEND
        int32_t v = pop();
        append(top(), v);
        break;
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS (sets are lists here)
        std::vector<int32_t> items = pop_mark();
        int32_t l = top();
        for (int32_t v : items) append(l, v);
        break;
      }
      case 's': {  // SETITEM
        int32_t v = pop();
        int32_t k = pop();
        set_item(top(), k, v);
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<int32_t> items = pop_mark();
        if (items.size() % 2) bad("SETITEMS with an odd number of items");
        int32_t d = top();
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        break;
      }
      case 'J': push(new_int((int32_t)(uint32_t)le(4))); break;  // BININT
      case 'K': push(new_int(byte())); break;                    // BININT1
      case 'M': push(new_int((int64_t)le(2))); break;            // BININT2
      case 0x8a:     // LONG1
      case 0x8b: {   // LONG4
        uint64_t len = op == 0x8a ? byte() : le(4);
        if (op == 0x8b && len > 0x7fffffffu) bad("negative LONG4 length");
        const uint8_t* p = take(len);
        if (len <= 8) {
          uint64_t v = 0;
          for (size_t i = len; i-- > 0;) v = (v << 8) | p[i];
          if (len > 0 && len < 8 && (p[len - 1] & 0x80)) v |= ~uint64_t(0) << (8 * len);  // sign
          push(new_int((int64_t)v));
        } else {
          int32_t id = new_str(Kind::Str, std::string_view((const char*)p, len));
          objs_[id].kind = Kind::BigInt;
          push(id);
        }
        break;
      }
      case 'I':    // INT (text)
      case 'L': {  // LONG (text)
        std::string s = line();
        if (op == 'I' && s == "01") { Obj o; o.kind = Kind::Bool; o.i = 1; push(new_obj(o)); break; }
        if (op == 'I' && s == "00") { Obj o; o.kind = Kind::Bool; o.i = 0; push(new_obj(o)); break; }
        if (!s.empty() && s.back() == 'L') s.pop_back();
        char* end = nullptr;
        errno = 0;
        long long v = s.empty() ? 0 : std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end || errno) bad("malformed or too large text integer");
        push(new_int(v));
        break;
      }
      case 'F': {  // FLOAT (text)
        std::string s = line();
        char* end = nullptr;
        double d = s.empty() ? 0 : std::strtod(s.c_str(), &end);
        if (s.empty() || *end) bad("malformed text float");
        Obj o;
        o.kind = Kind::Float;
        std::memcpy(&o.i, &d, 8);
        push(new_obj(o));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        const uint8_t* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
        Obj o;
        o.kind = Kind::Float;
        o.i = (int64_t)bits;
        push(new_obj(o));
        break;
      }
      case 'N': push(new_obj(Obj{})); break;
      case 0x88:
      case 0x89: {
        Obj o;
        o.kind = Kind::Bool;
        o.i = op == 0x88;
        push(new_obj(o));
        break;
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'T':     // BINSTRING (py2 str)
      case 'U':     // SHORT_BINSTRING
      case 'B':     // BINBYTES
      case 'C':     // SHORT_BINBYTES
      case 0x8e:    // BINBYTES8
      case 0x96: {  // BYTEARRAY8
        uint64_t len;
        if (op == 0x8c || op == 'U' || op == 'C') len = byte();
        else if (op == 0x8d || op == 0x8e || op == 0x96) len = le(8);
        else len = le(4);
        if (op == 'T' && len > 0x7fffffffu) bad("negative BINSTRING length");
        const uint8_t* p = take(len);
        bool is_bytes = op == 'B' || op == 'C' || op == 0x8e || op == 0x96;
        push(new_str(is_bytes ? Kind::Bytes : Kind::Str, std::string_view((const char*)p, len)));
        break;
      }
      case 'q': memo_put(byte()); break;                  // BINPUT
      case 'r': memo_put(le(4)); break;                   // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;           // MEMOIZE
      case 'h': push(memo_get(byte())); break;            // BINGET
      case 'j': push(memo_get(le(4))); break;             // LONG_BINGET
      case 'p':                                           // PUT (text)
      case 'g': {                                         // GET (text)
        std::string s = line();
        char* end = nullptr;
        errno = 0;
        unsigned long long k = s.empty() ? 0 : std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || *end || errno || s[0] == '-') bad("malformed memo key");
        if (op == 'p') memo_put(k); else push(memo_get(k));
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module = line();
        std::string name = line();
        push(global(module, name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        int32_t name = pop();
        int32_t module = pop();
        if (kind(name) != Kind::Str || kind(module) != Kind::Str)
          bad("STACK_GLOBAL needs two strings");
        push(global(str(module), str(name)));
        break;
      }
      case 'R': {  // REDUCE
        int32_t args = pop();
        int32_t fn = pop();
        push(reduce(fn, args));
        break;
      }
      case 0x81:    // NEWOBJ: cls.__new__(cls, *args)
      case 0x92: {  // NEWOBJ_EX: cls.__new__(cls, *args, **kwargs)
        if (op == 0x92) {
          int32_t kw = pop();
          if (kind(kw) != Kind::Dict || !seq(kw).empty()) bad("NEWOBJ_EX with keyword arguments");
        }
        int32_t args = pop();
        int32_t cls = pop();
        const Obj c = obj(cls);
        if (c.kind != Kind::Global ||
            ((GlobalId)c.tag != GlobalId::OrderedDict && (GlobalId)c.tag != GlobalId::Set &&
             (GlobalId)c.tag != GlobalId::FrozenSet))
          bad(wxe::str("NEWOBJ of ", describe(cls), " is not allowed"));
        if (kind(args) != Kind::Tuple) bad("NEWOBJ arguments are not a tuple");
        push(new_seq((GlobalId)c.tag == GlobalId::OrderedDict ? Kind::Dict : Kind::List));
        break;
      }
      case 'b': {  // BUILD: obj.__setstate__(state) -- only attributes of OrderedDict/tensors
        pop();  // state (e.g. {'_metadata': ...} of a state dict), ignored
        Kind k = kind(top());
        if (k != Kind::Dict && k != Kind::Tensor) bad(wxe::str("BUILD on a ", kind_name(k), " is not allowed"));
        break;
      }
      case 'Q': {  // BINPERSID
        int32_t pid = pop();
        push(persistent_load(pid));
        break;
      }
      default:
        bad(wxe::str("unsupported or unknown pickle opcode 0x", "0123456789abcdef"[op >> 4],
                "0123456789abcdef"[op & 15]));
    }
  }
}

}  // namespace wxe::torch_pickle
