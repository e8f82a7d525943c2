// Built in the cluster suite from the installed header and aapc.pc only: the packaging works.
#include <aapc/client.hpp>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  const std::size_t block = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4096;
  aapc::Client client = aapc::Client::connect();
  const int me = client.rank(), n = client.size();
  aapc::Buffer send = client.allocate(n * block), recv = client.allocate(n * block);
  for (int d = 0; d < n; ++d)
    for (std::size_t k = 0; k < block; ++k) send.data()[d * block + k] = static_cast<std::uint8_t>(me * 31 + d * 7 + k);
  aapc::Result<aapc::Stats> r = client.alltoall(send, recv, block, aapc::Options{});
  if (!r) {
    std::cerr << r.error().message() << "\n";
    return 1;
  }
  for (int s = 0; s < n; ++s)
    for (std::size_t k = 0; k < block; ++k)
      if (recv.data()[s * block + k] != static_cast<std::uint8_t>(s * 31 + me * 7 + k)) {
        std::cerr << "byte " << k << " from rank " << s << " differs\n";
        return 1;
      }
  if (me == 0) std::cout << "exchange ok: " << r->schedule << " in " << r->seconds * 1e3 << " ms\n";
  return 0;
}
