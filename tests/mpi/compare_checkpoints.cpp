// Compares the parameters of two fine-tuning checkpoints (train/finetune.h, either layout:
// one process's or sharded), for the MPI training tests.
// Usage: wxe_compare_checkpoints A B TOL   (TOL 0: bit for bit)
// Passes (exit 0) when both hold the same parameters with the same shapes and, over all of
// them together, |A - B|_2 <= TOL |B|_2, and no single tensor has a relative L2 error above
// 1000 TOL measured against the largest tensor norm's 1e-3 (Adam moves tensors whose gradient
// is rounding noise by noise). Prints the worst tensors. Exit 1 otherwise, 2 on bad input.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "train/finetune.h"

int main(int argc, char** argv) {
  using namespace wxe;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s A B TOL\n", argv[0]);
    return 2;
  }
  try {
    const double tol = std::stod(argv[3]);
    TrainCheckpoint a = open_train_checkpoint(argv[1]), b = open_train_checkpoint(argv[2]);
    std::vector<std::string> names = b.parameter_names();
    if (a.parameter_names().size() != names.size()) {
      std::fprintf(stderr, "%s has %zu parameters, %s %zu\n", argv[1], a.parameter_names().size(), argv[2],
                   names.size());
      return 1;
    }
    double d2 = 0, n2 = 0, largest = 0;
    std::vector<std::pair<double, double>> per;  // (|a-b|, |b|)
    for (const std::string& n : names) {
      Tensor x = a.get(n, {}), y = b.get(n, {});
      if (x.shape != y.shape || x.dtype != DType::F32 || y.dtype != DType::F32) {
        std::fprintf(stderr, "%s: %s vs %s\n", n.c_str(), shape_str(x.shape).c_str(), shape_str(y.shape).c_str());
        return 1;
      }
      if (tol == 0 && std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0) {
        std::fprintf(stderr, "%s differs (bit for bit required)\n", n.c_str());
        return 1;
      }
      double d = 0, s = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double u = x.data<float>()[i], v = y.data<float>()[i];
        d += (u - v) * (u - v);
        s += v * v;
      }
      d2 += d;
      n2 += s;
      largest = std::max(largest, std::sqrt(s));
      per.push_back({std::sqrt(d), std::sqrt(s)});
    }
    const double total = std::sqrt(d2 / std::max(n2, 1e-30));
    double worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < per.size(); ++i) {
      const double e = per[i].first / std::max(per[i].second, 1e-3 * largest);
      if (e > worst) worst = e, wi = i;
    }
    std::printf("%zu parameters: relative L2 %.3g over all; worst tensor %s %.3g\n", names.size(), total,
                names.empty() ? "-" : names[wi].c_str(), worst);
    return total <= tol && worst <= 1000 * tol ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
