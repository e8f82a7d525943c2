// The XDP program under aapcd's AF_XDP port (nic::open_iface): aapc's frames (EtherType
// 0x88B5, docs/design.md "The wire") go to the AF_XDP socket of the queue they arrive on;
// every other frame goes on to the kernel, so IP traffic on the same interface (ssh, an MPI
// job's TCP) is untouched. libxdp's default program would take every frame of the queue.
// Built with clang -target bpf and embedded in the nic library (embed.py).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define AAPC_ETHERTYPE 0x88B5

// DPDK's net_af_xdp puts each queue's socket here (by this name), keyed by queue.
struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, 256);
  __type(key, __u32);
  __type(value, __u32);
} xsks_map SEC(".maps");

SEC("xdp")
int aapc_xdp(struct xdp_md* ctx) {
  const void* data = (const void*)(long)ctx->data;
  const void* end = (const void*)(long)ctx->data_end;
  const struct ethhdr* eth = data;
  if ((const void*)(eth + 1) > end || eth->h_proto != bpf_htons(AAPC_ETHERTYPE)) return XDP_PASS;
  // A queue without a socket passes the frame on rather than dropping it.
  return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "GPL";
