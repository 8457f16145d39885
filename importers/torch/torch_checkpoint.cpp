#include "importers/torch/torch_checkpoint.h"

#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "importers/torch/pickle.h"
#include "importers/torch/zip.h"

namespace wxe {

namespace {

using torch_pickle::Kind;
using torch_pickle::TensorInfo;
using torch_pickle::Unpickler;

constexpr uint64_t kMaxPickleBytes = (1ull << 31) - 1;

std::string printable(const std::string& s, size_t max = 120) {
  std::string r;
  for (char c : s.substr(0, max)) r += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max) r += "...";
  return r;
}

// Copies a strided view (in elements of size es) out of `src` into contiguous `dst`.
void gather(uint8_t* dst, const uint8_t* src, size_t es, int64_t offset,
            const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
  int64_t n = 1;
  for (int64_t s : size) n *= s;
  if (n == 0) return;
  int nd = (int)size.size();
  if (nd == 0) {
    std::memcpy(dst, src + offset * es, es);
    return;
  }
  int64_t inner = size[nd - 1], istride = stride[nd - 1];
  std::vector<int64_t> idx(nd, 0);
  int64_t base = offset;
  for (int64_t done = 0; done < n; done += inner) {
    if (istride == 1) {
      std::memcpy(dst, src + base * es, inner * es);
    } else {
      const uint8_t* s = src + base * es;
      switch (es) {
        case 1: for (int64_t j = 0; j < inner; ++j) dst[j] = s[j * istride]; break;
        case 2: for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + 2 * j, s + 2 * j * istride, 2); break;
        case 4: for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + 4 * j, s + 4 * j * istride, 4); break;
        case 8: for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + 8 * j, s + 8 * j * istride, 8); break;
        default: for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + es * j, s + es * j * istride, es);
      }
    }
    dst += inner * es;
    for (int d = nd - 2; d >= 0; --d) {
      base += stride[d];
      if (++idx[d] < size[d]) break;
      base -= stride[d] * size[d];
      idx[d] = 0;
    }
  }
}

bool is_contiguous(const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
  int64_t expect = 1;
  for (size_t d = size.size(); d-- > 0;) {
    if (size[d] == 0) return true;
    if (size[d] != 1 && stride[d] != expect) return false;
    expect *= size[d];
  }
  return true;
}

std::string key_text(const Unpickler& up, int32_t id) {
  if (up.kind(id) == Kind::Str) return up.str(id);
  if (up.kind(id) == Kind::Int) return std::to_string(up.obj(id).i);
  return "<" + up.describe(id) + ">";
}

StateDict read_impl(const std::string& path, std::vector<std::string>* other_keys) {
  torch_zip::Reader zip(path);

  // <prefix>/data.pkl; the prefix (archive name) varies.
  const torch_zip::Entry* pkl = nullptr;
  std::string prefix;
  for (const auto& e : zip.entries()) {
    if (!ends_with(e.name, "data.pkl")) continue;
    std::string pre = e.name.substr(0, e.name.size() - 8);
    if (pre.empty() || pre.find('/') == pre.size() - 1) {
      pkl = &e;
      prefix = pre;
      break;
    }
  }
  WXE_CHECK(pkl, path, ": not a torch.save checkpoint (the zip has no <archive>/data.pkl)");
  for (const auto& e : zip.entries())
    WXE_CHECK(e.name.compare(0, prefix.size() + 5, prefix + "code/") != 0, path,
              ": a TorchScript archive (torch.jit.save), not a torch.save checkpoint");
  if (const torch_zip::Entry* bo = zip.find(prefix + "byteorder")) {
    WXE_CHECK(bo->usize <= 16, path, ": corrupt byteorder entry");
    std::string order = zip.read(*bo);
    WXE_CHECK(order == "little", path, ": byte order '", printable(order),
              "' is not supported (only little-endian checkpoints)");
  }
  WXE_CHECK(pkl->usize <= kMaxPickleBytes, path, ": data.pkl is ", pkl->usize,
            " bytes, more than any state dict needs");
  std::string bytes = zip.read(*pkl);

  auto lookup = [&](const std::string& key, uint64_t* nbytes) {
    const torch_zip::Entry* e = zip.find(prefix + "data/" + key);
    if (!e) return false;
    *nbytes = e->usize;
    return true;
  };
  Unpickler up(path + ": data.pkl", reinterpret_cast<const uint8_t*>(bytes.data()),
               bytes.size(), lookup);
  int32_t root = up.load();
  bytes.clear();
  bytes.shrink_to_fit();

  WXE_CHECK(up.kind(root) == Kind::Dict, path, ": the checkpoint holds a ",
            torch_pickle::kind_name(up.kind(root)), ", not a dict (state dict or trainer checkpoint)");
  int32_t sd = -1;
  std::string chosen;
  for (const char* name : {"model_state_dict", "state_dict", "model"}) {
    int32_t v = up.dict_get(root, name);
    if (v >= 0 && up.kind(v) == Kind::Dict) {
      sd = v;
      chosen = name;
      break;
    }
  }
  const std::vector<int32_t>& top = up.seq(root);
  if (sd < 0) {
    bool all_tensors = true;
    for (size_t i = 1; i < top.size(); i += 2) all_tensors &= up.kind(top[i]) == Kind::Tensor;
    if (!all_tensors) {
      std::string keys;
      for (size_t i = 0; i < top.size() && i < 40; i += 2)
        keys += (i ? ", " : "") + printable(key_text(up, top[i]), 60);
      if (top.size() > 40) keys += ", ...";
      fail(path, ": no state dict found (no model_state_dict / state_dict / model dict, and "
           "the top-level dict holds more than tensors); top-level keys: ", keys);
    }
    sd = root;
  }
  if (other_keys) {
    other_keys->clear();
    if (sd != root)
      for (size_t i = 0; i < top.size(); i += 2) {
        std::string k = key_text(up, top[i]);
        if (!(up.kind(top[i]) == Kind::Str && k == chosen)) other_keys->push_back(k);
      }
  }

  // Validate the returned entries first (messages name the key), then every other tensor.
  const std::vector<int32_t>& items = up.seq(sd);
  std::string where = chosen.empty() ? "" : " in " + chosen;
  for (size_t i = 0; i < items.size(); i += 2) {
    WXE_CHECK(up.kind(items[i]) == Kind::Str, path, ": state dict", where, " has a non-string key (",
              up.describe(items[i]), ")");
    const std::string& key = up.str(items[i]);
    int32_t v = items[i + 1];
    WXE_CHECK(up.kind(v) == Kind::Tensor, path, ": state dict entry '", printable(key), "'", where,
              " is ", up.describe(v), ", not a tensor");
    const TensorInfo& t = up.tensor(v);
    WXE_CHECK(t.in_bounds, path, ": tensor '", printable(key), "': ", up.explain_bounds(t));
    DType dt;
    WXE_CHECK(torch_pickle::to_dtype(t.type, &dt), path, ": tensor '", printable(key),
              "' has dtype ", torch_pickle::scalar_name(t.type), ", which wxe does not support");
  }
  for (const TensorInfo& t : up.tensors())
    WXE_CHECK(t.in_bounds, path, ": a tensor outside the state dict: ", up.explain_bounds(t));

  // Materialize, one storage at a time (each zip entry is read and CRC-checked once).
  const auto& storages = up.storages();
  std::vector<std::string> order;
  std::unordered_map<std::string, std::vector<size_t>> users;  // storage key -> item indices
  uint64_t storage_bytes = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    const std::string& skey = storages[up.tensor(items[i + 1]).storage].key;
    auto& u = users[skey];
    if (u.empty()) {
      order.push_back(skey);
      storage_bytes += zip.find(prefix + "data/" + skey)->usize;
    }
    u.push_back(i);
  }
  // Overlapping views (stride 0, expand) may be larger than their storage; cap the total so
  // that a hostile file cannot make us allocate without bound.
  uint64_t out_budget = 2 * storage_bytes + (256ull << 20);
  StateDict result;
  result.tensors.resize(items.size() / 2);
  for (const std::string& skey : order) {
    const torch_zip::Entry* e = zip.find(prefix + "data/" + skey);
    auto buf = std::make_shared<Storage>(e->usize);
    zip.read(*e, buf->data);
    const std::vector<size_t>& u = users[skey];
    for (size_t i : u) {
      const std::string& key = up.str(items[i]);
      const TensorInfo& t = up.tensor(items[i + 1]);
      DType dt;
      torch_pickle::to_dtype(t.type, &dt);
      std::vector<int64_t> size = up.ints(t.size), stride = up.ints(t.stride);
      size_t es = dtype_size(dt);
      uint64_t nbytes;
      WXE_CHECK(!__builtin_mul_overflow((uint64_t)t.numel, (uint64_t)es, &nbytes) &&
                    nbytes <= out_budget,
                path, ": tensor '", printable(key), "' of size ", t.numel,
                " elements is too large for its storage '", printable(skey), "'");
      out_budget -= nbytes;
      Tensor out;
      if (u.size() == 1 && t.offset == 0 && is_contiguous(size, stride) && nbytes == e->usize) {
        out.dtype = dt;
        out.shape = size;
        out.storage = buf;  // the tensor is its whole storage: no copy
      } else {
        out = Tensor(dt, size);
        gather(static_cast<uint8_t*>(out.raw()), buf->data, es, t.offset, size, stride);
      }
      result.tensors[i / 2] = {key, std::move(out)};
    }
  }
  return result;
}

}  // namespace

StateDict read_torch_state_dict(const std::string& path, std::vector<std::string>* other_keys) {
  try {
    return read_impl(path, other_keys);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(path, ": out of memory while reading the checkpoint");
  } catch (const std::length_error&) {
    fail(path, ": corrupt checkpoint (impossible size)");
  }
}

}  // namespace wxe
