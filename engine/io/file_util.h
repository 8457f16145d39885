// Writing files safely: a temporary file beside the target, created with a fresh
// unpredictable name (mkstemp: O_EXCL, so a planted file or symlink is never opened),
// fsynced, given the mode of the file it replaces, renamed over the target. On an error,
// and on SIGINT/SIGTERM/SIGHUP while it exists, the temporary file is removed.
#pragma once
#include <string>
#include <vector>

namespace wxe {

class TempFile {
 public:
  // A new empty file "<dir of path>/.<name of path>.XXXXXX<suffix>", mode 0600 until commit.
  explicit TempFile(const std::string& path, const std::string& suffix = "");
  ~TempFile();  // removes the file unless committed
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& name() const { return tmp_; }
  int fd() const { return fd_; }
  void write(const std::string& bytes);  // all of it, or an Error naming the target
  // fsync, mode (the replaced file's, else 0666 minus the umask), rename over the target,
  // fsync of the directory.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // in the signal handler's list
  bool done_ = false;
};

// A directory being filled with files before it is renamed into place (a checkpoint's
// step_N.tmpPID): while the guard lives, SIGINT/SIGTERM/SIGHUP remove `files` (plain names, at
// most 8) from it and then the directory, as TempFile does for its file. Removing it on an
// error stays the caller's.
class TempDirGuard {
 public:
  TempDirGuard(const std::string& dir, const std::vector<std::string>& files);
  ~TempDirGuard();
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;

 private:
  int slot_ = -1;
};

// An Error naming `path` unless it is a regular file (after symlinks): "cannot open" when
// missing, "is a directory" / "is not a regular file" otherwise (a FIFO would block a read).
void check_regular_file(const std::string& path);

// Writes `bytes` to `path` atomically through a TempFile.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace wxe
