#include "data/netcdf.h"

#include <netcdf.h>

#include "engine/ir/error.h"
#include "engine/io/file_util.h"

namespace wxe {

NcFile::NcFile(const std::string& path) : path_(path) {
  if (path.find("://") == std::string::npos) check_regular_file(path);  // a FIFO would block nc_open
  int rc = nc_open(path.c_str(), NC_NOWRITE, &id_);
  if (rc != NC_NOERR) fail(path, ": cannot open as netCDF: ", nc_strerror(rc));
}

NcFile::~NcFile() {
  if (id_ >= 0) nc_close(id_);
}

bool NcFile::has(const std::string& var) const {
  int v;
  return nc_inq_varid(id_, var.c_str(), &v) == NC_NOERR;
}

int NcFile::var_id(const std::string& var) const {
  int v;
  if (nc_inq_varid(id_, var.c_str(), &v) != NC_NOERR) fail(path_, ": no variable '", var, "'");
  return v;
}

std::vector<std::string> NcFile::dims(const std::string& var) const {
  const int v = var_id(var);
  int nd = 0;
  nc_inq_varndims(id_, v, &nd);
  std::vector<int> ids(nd);
  nc_inq_vardimid(id_, v, ids.data());
  std::vector<std::string> out;
  for (int d : ids) {
    char name[NC_MAX_NAME + 1] = {};
    nc_inq_dimname(id_, d, name);
    out.push_back(name);
  }
  return out;
}

std::vector<int64_t> NcFile::shape(const std::string& var) const {
  const int v = var_id(var);
  int nd = 0;
  nc_inq_varndims(id_, v, &nd);
  std::vector<int> ids(nd);
  nc_inq_vardimid(id_, v, ids.data());
  std::vector<int64_t> out;
  for (int d : ids) {
    size_t n = 0;
    nc_inq_dimlen(id_, d, &n);
    out.push_back((int64_t)n);
  }
  return out;
}

std::vector<double> NcFile::read(const std::string& var) const {
  const int v = var_id(var);
  int64_t n = 1;
  for (int64_t d : shape(var)) n *= d;
  std::vector<double> out((size_t)n);
  int rc = nc_get_var_double(id_, v, out.data());
  if (rc != NC_NOERR) fail(path_, ": variable '", var, "': ", nc_strerror(rc));
  return out;
}

std::vector<float> NcFile::read_f32(const std::string& var, const std::vector<size_t>& start,
                                    const std::vector<size_t>& count) const {
  const int v = var_id(var);
  size_t n = 1;
  for (size_t c : count) n *= c;
  std::vector<float> out(n);
  int rc = nc_get_vara_float(id_, v, start.data(), count.data(), out.data());
  if (rc != NC_NOERR) fail(path_, ": variable '", var, "': ", nc_strerror(rc));
  return out;
}

std::vector<std::string> NcFile::variables() const {
  int n = 0;
  nc_inq_nvars(id_, &n);
  std::vector<std::string> out;
  for (int v = 0; v < n; ++v) {
    char name[NC_MAX_NAME + 1] = {};
    nc_inq_varname(id_, v, name);
    out.push_back(name);
  }
  return out;
}

std::string NcFile::attr(const std::string& var, const std::string& name) const {
  const int v = var.empty() ? NC_GLOBAL : var_id(var);
  nc_type t;
  size_t len = 0;
  if (nc_inq_att(id_, v, name.c_str(), &t, &len) != NC_NOERR || t != NC_CHAR) return "";
  std::string s(len, '\0');
  nc_get_att_text(id_, v, name.c_str(), s.data());
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

}  // namespace wxe
