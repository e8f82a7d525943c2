#include "aapc/wire/auth.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace aapc::engine {

Result<FrameKey> load_cluster_key(const std::string& path) {
  auto bad = [&](Errc code, const std::string& what) { return Error(code, "cluster key " + path + ": " + what); };
  // O_NOFOLLOW: the mode checked is the mode of the file read, not of a link's target swapped
  // in between.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return bad(Errc::kIo, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return bad(Errc::kIo, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return bad(Errc::kInvalidArgument, "not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return bad(Errc::kPermission, std::string("mode ") + mode + " lets others read the secret; make it mode 0600 (chmod 600 " + path + ")");
  }
  std::vector<std::uint8_t> data(200);
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return bad(Errc::kIo, std::strerror(e));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  data.resize(got);
  FrameKey key;
  if (data.size() == kKeyLen) {
    std::memcpy(key.bytes.data(), data.data(), kKeyLen);
  } else {
    while (!data.empty() && (data.back() == '\n' || data.back() == '\r')) data.pop_back();
    std::size_t used = 0;
    const bool hex = data.size() == 2 * kKeyLen &&
                     sodium_hex2bin(key.bytes.data(), kKeyLen, reinterpret_cast<const char*>(data.data()), data.size(), nullptr, &used, nullptr) == 0 &&
                     used == kKeyLen;
    sodium_memzero(data.data(), data.size());
    if (!hex)
      return bad(Errc::kInvalidArgument, "holds " + std::to_string(got) +
                                             " bytes; a key is 32 random bytes or 64 hex digits (head -c 32 /dev/urandom > FILE, or openssl rand -hex 32 > FILE)");
  }
  sodium_memzero(data.data(), data.size());
  return key;
}

}  // namespace aapc::engine
