#include "engine/io/file_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "engine/ir/error.h"

namespace wxe {

namespace {

// Temporary files alive now, for the signal handler (fixed storage: it may not allocate).
constexpr int kSlots = 64;
constexpr size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
std::atomic<bool> g_used[kSlots];
std::mutex g_install;
bool g_installed = false;
// Temporary directories alive now (TempDirGuard): the directory, then the files it may hold.
constexpr int kDirSlots = 4, kDirFiles = 8;
char g_dirs[kDirSlots][1 + kDirFiles][kPathMax];
std::atomic<bool> g_dir_used[kDirSlots];

extern "C" void remove_temps_and_reraise(int sig) {
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].load()) ::unlink(g_paths[i]);
  for (int i = 0; i < kDirSlots; ++i)
    if (g_dir_used[i].load()) {
      for (int k = 1; k <= kDirFiles; ++k)
        if (g_dirs[i][k][0]) ::unlink(g_dirs[i][k]);
      ::rmdir(g_dirs[i][0]);
    }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Handlers only where the signal still has its default action (MPI or a caller may own it).
void install_handlers() {
  std::lock_guard<std::mutex> lock(g_install);
  if (g_installed) return;
  g_installed = true;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old;
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_temps_and_reraise;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

int take_slot(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_used[i].load() || !g_used[i].compare_exchange_strong(expected, true)) continue;
    // the handler may see the slot before the name is complete: harmless (unlink fails)
    std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
    return i;
  }
  return -1;
}

}  // namespace

TempFile::TempFile(const std::string& path, const std::string& suffix) : path_(path) {
  install_handlers();
  std::filesystem::path p(path);
  std::string dir = p.parent_path().string();
  std::string pattern = (dir.empty() ? "" : dir + "/") + "." + p.filename().string() + ".XXXXXX" + suffix;
  std::string buf = pattern;
  fd_ = ::mkstemps(buf.data(), (int)suffix.size());
  WXE_CHECK(fd_ >= 0, path, ": cannot create a temporary file in ", dir.empty() ? "." : dir, " (",
            std::strerror(errno), ")");
  tmp_ = buf;
  slot_ = take_slot(tmp_);
}

TempDirGuard::TempDirGuard(const std::string& dir, const std::vector<std::string>& files) {
  install_handlers();
  if (dir.size() + 256 >= kPathMax || files.size() > (size_t)kDirFiles) return;
  for (int i = 0; i < kDirSlots; ++i) {
    bool expected = false;
    if (g_dir_used[i].load() || !g_dir_used[i].compare_exchange_strong(expected, true)) continue;
    // the handler may see the slot half written: harmless (unlink and rmdir fail)
    for (int k = 0; k <= kDirFiles; ++k) g_dirs[i][k][0] = '\0';
    for (size_t k = 0; k < files.size(); ++k) {
      const std::string p = dir + "/" + files[k];
      if (p.size() < kPathMax) std::memcpy(g_dirs[i][k + 1], p.c_str(), p.size() + 1);
    }
    std::memcpy(g_dirs[i][0], dir.c_str(), dir.size() + 1);
    slot_ = i;
    return;
  }
}

TempDirGuard::~TempDirGuard() {
  if (slot_ >= 0) g_dir_used[slot_].store(false);
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(tmp_.c_str());
  if (slot_ >= 0) g_used[slot_].store(false);
}

void TempFile::write(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    WXE_CHECK(w > 0, path_, ": write failed (", std::strerror(errno), ")");
    done += (size_t)w;
  }
}

void TempFile::commit() {
  struct stat st;
  mode_t mode;
  if (::stat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    mode = st.st_mode & 07777;  // an overwrite keeps the permissions
  } else {
    mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  WXE_CHECK(::fchmod(fd_, mode) == 0, path_, ": chmod failed (", std::strerror(errno), ")");
  WXE_CHECK(::fsync(fd_) == 0, path_, ": fsync failed (", std::strerror(errno), ")");
  int rc = ::close(fd_);
  fd_ = -1;
  WXE_CHECK(rc == 0, path_, ": close failed (", std::strerror(errno), ")");
  WXE_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, path_, ": rename failed (", std::strerror(errno), ")");
  done_ = true;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void check_regular_file(const std::string& path) {
  struct stat st;
  WXE_CHECK(::stat(path.c_str(), &st) == 0, path, ": cannot open file (", std::strerror(errno), ")");
  WXE_CHECK(!S_ISDIR(st.st_mode), path, ": is a directory, not a file");
  WXE_CHECK(S_ISREG(st.st_mode), path, ": is not a regular file (a FIFO, socket or device)");
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  TempFile t(path);
  t.write(bytes);
  t.commit();
}

}  // namespace wxe
