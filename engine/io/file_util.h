// Writing files safely: a temporary file beside the target, created with a fresh
// unpredictable name (mkstemp: O_EXCL, so a planted file or symlink is never opened),
// fsynced, given the mode of the file it replaces, renamed over the target. On an error,
// and on SIGINT/SIGTERM/SIGHUP while it exists, the temporary file is removed.
#pragma once
#include <string>

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

// An Error naming `path` unless it is a regular file (after symlinks): "cannot open" when
// missing, "is a directory" / "is not a regular file" otherwise (a FIFO would block a read).
void check_regular_file(const std::string& path);

// Writes `bytes` to `path` atomically through a TempFile.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace wxe
