#include "core/Files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/Error.h"

namespace mt {

namespace {

const char* fileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

std::string limitText(uint64_t bytes) {
  char buf[48];
  if (bytes >= (1ull << 20))
    std::snprintf(buf, sizeof(buf), "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

bool fail(std::string* why, const std::string& text) {
  if (why) *why = text;
  return false;
}

}  // namespace

bool readWholeFile(const std::string& path, std::string* out, std::string* why, uint64_t maxBytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer before its type is known.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fail(why, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    return fail(why, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(why, std::string("not a regular file (") + fileKind(st.st_mode) + ")");
  }
  if (static_cast<uint64_t>(st.st_size) > maxBytes) {
    ::close(fd);
    return fail(why, "holds " + std::to_string(st.st_size) + " bytes, more than the " + limitText(maxBytes) +
                         " such a file may have");
  }
  // Read to the end, never past the limit: a file still growing, or one whose size the kernel
  // does not know (/proc), is bounded all the same.
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      return fail(why, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > maxBytes) {
      ::close(fd);
      return fail(why, "holds more than the " + limitText(maxBytes) + " such a file may have");
    }
  }
  ::close(fd);
  *out = std::move(text);
  return true;
}

void writeFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  auto failWith = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    throw IoError("cannot write " + path + ": " + what + ": " + std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot write " + path + ": creating " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      failWith("writing", err);
    }
    done += static_cast<size_t>(n);
  }
  // Network filesystems report a full disk or quota at fsync or close, not at write.
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    failWith("flushing", err);
  }
  if (::close(fd) != 0) failWith("closing", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) failWith("renaming " + tmp + " over it", errno);
}

}  // namespace mt
